// Behaviour check of torch_xla's runtime/cache.h PersistentCache, compiled by
// tests/test_torch_xla_patches.py against a patched pytorch/xla checkout and
// the real torch headers and libraries (TORCH_LAZY_COUNTER, TORCH_WARN).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures. A check that throws out of the cache is reported as
// FAIL: the cache must never throw into training.
//
// The failures are real ones, made with files: a leftover temporary file, a
// saved entry cut short or with a byte changed, a directory at an entry's name
// (open(2) succeeds, read(2) fails with EISDIR, as a read can fail with ESTALE
// on NFS), a cache directory removed under a writer. They work as root too.

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/lazy/core/metrics.h>

#include "check_report.h"
#include "torch_xla/csrc/runtime/cache.h"

// fsync(2) and rename(2) of the whole program come through here while a check
// records them (then they go to the kernel as libc's would): the order of a
// write's system calls is what makes it durable, and no file can show it.
namespace syscalls {
std::mutex mutex;
bool recording = false;
std::vector<std::string> events;

std::string PathOf(int fd) {
  char path[PATH_MAX] = {};
  std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t size = ::readlink(link.c_str(), path, sizeof(path) - 1);
  return size < 0 ? "?" : std::string(path, static_cast<size_t>(size));
}

void Record(const std::string& event) {
  std::lock_guard<std::mutex> lock(mutex);
  if (recording) events.push_back(event);
}
}  // namespace syscalls

extern "C" int fsync(int fd) {
  syscalls::Record("fsync " + syscalls::PathOf(fd));
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

// Listing the directory (opendir(3)), told apart from opening it to fsync it.
extern "C" DIR* opendir(const char* name) {
  using Opendir = DIR* (*)(const char*);
  static Opendir real = reinterpret_cast<Opendir>(::dlsym(RTLD_NEXT, "opendir"));
  syscalls::Record(std::string("opendir ") + name);
  return real(name);
}

extern "C" int rename(const char* from, const char* to) {
  syscalls::Record(std::string("rename ") + from + " " + to);
  return static_cast<int>(
      ::syscall(SYS_renameat, AT_FDCWD, from, AT_FDCWD, to));
}

namespace fs = std::filesystem;
using torch_xla::runtime::util::PersistentCache;
using Value = std::shared_ptr<std::string>;
using Cache = PersistentCache<int, std::string>;

namespace {

using check_report::failures;
using check_report::Report;

// Runs `check`; an exception escaping it is a failure of that check.
void Run(const std::string& name, const std::function<std::string()>& check) {
  try {
    std::string why = check();
    Report(name, why);
  } catch (const std::exception& error) {
    Report(name, std::string("threw: ") + error.what());
  }
}

// Runs `check` in a child process: a cache that crashes (a use of an evicted
// element) fails that check, not the whole program.
void RunIsolated(const std::string& name,
                 const std::function<std::string()>& check) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    Report(name, std::string("pipe: ") + std::strerror(errno));
    return;
  }
  std::cout.flush();
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string why;
    try {
      why = check();
    } catch (const std::exception& error) {
      why = std::string("threw: ") + error.what();
    }
    ssize_t ignored = ::write(pipe_fds[1], why.data(), why.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string why;
  char buffer[512];
  ssize_t count;
  while ((count = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) {
    why.append(buffer, static_cast<size_t>(count));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    // AddressSanitizer ends the process with status 1 on a use after free.
    why = "the check's process died (" +
          (WIFEXITED(status)
               ? "exit status " + std::to_string(WEXITSTATUS(status))
               : "signal " + std::to_string(
                                 WIFSIGNALED(status) ? WTERMSIG(status) : 0)) +
          ")" + (why.empty() ? "" : ": " + why);
  }
  Report(name, why);
}

// A value the client cannot serialize: SerializeComputation throws then.
const char kUnserializable[] = "unserializable";

std::string Serialize(const Value& value) {
  if (*value == kUnserializable) throw std::runtime_error("cannot serialize");
  return *value;
}

// A value whose load throws (DeserializeComputation's XLA_CHECK, a missing
// client, ...).
const char kThrowsOnLoad[] = "throws on load";

// An empty value is one the client cannot load now (out of memory, a busy
// device): the deserialize function returns null.
Value Deserialize(const std::string& text) {
  if (text.empty()) return nullptr;
  if (text == kThrowsOnLoad) throw std::runtime_error("cannot load");
  return std::make_shared<std::string>(text);
}

std::unique_ptr<Cache> MakeCache(const fs::path& dir, bool readonly) {
  return std::make_unique<Cache>(16, dir.string(), readonly, Serialize,
                                 Deserialize);
}

fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() /
                 ("pcache-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

int64_t Counter(const std::string& name) {
  torch::lazy::CounterData* counter = torch::lazy::GetCounter(name);
  return counter == nullptr ? 0 : counter->Value();
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ",") + name;
  return out;
}

void WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

// Sets the file's modification time `seconds` into the past.
void MakeOld(const fs::path& path, int seconds) {
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = std::time(nullptr) - seconds;
  times[0].tv_nsec = times[1].tv_nsec = 0;
  if (::utimensat(AT_FDCWD, path.c_str(), times, 0) != 0) {
    throw std::runtime_error("utimensat " + path.string() + ": " +
                             std::strerror(errno));
  }
}

// A second thread watches the entry's path while large entries are written:
// every time the file exists it must already have its final size (the value,
// plus the footer where the entry has one). An in-place write is seen
// partially written almost at once.
std::string NoReaderSeesAPartialEntry() {
  fs::path dir = FreshDir("atomic");
  auto cache = MakeCache(dir, /*readonly=*/false);
  const size_t size = 32 << 20;
  const int entries = 6;
  std::atomic<bool> done{false};
  std::vector<std::set<int64_t>> seen_sizes(entries);
  std::thread reader([&] {
    while (!done.load()) {
      for (int key = 0; key < entries; ++key) {
        struct stat info;
        std::string path = (dir / std::to_string(key)).string();
        if (::stat(path.c_str(), &info) == 0) {
          seen_sizes[key].insert(info.st_size);
        }
      }
    }
  });
  for (int key = 0; key < entries; ++key) {
    cache->Add(key, std::make_shared<std::string>(size, 'a' + key));
  }
  done = true;
  reader.join();
  for (int key = 0; key < entries; ++key) {
    fs::path entry = dir / std::to_string(key);
    std::string contents = ReadFile(entry);
    if (contents.size() < size ||
        contents.compare(0, size, std::string(size, 'a' + key)) != 0) {
      return "entry " + std::to_string(key) + " does not hold what was added";
    }
    for (int64_t seen : seen_sizes[key]) {
      if (seen != static_cast<int64_t>(contents.size())) {
        return "a reader saw entry " + std::to_string(key) + " with " +
               std::to_string(seen) + " bytes instead of " +
               std::to_string(contents.size());
      }
    }
  }
  std::vector<std::string> names = Names(dir);
  if (names.size() != static_cast<size_t>(entries)) {
    return "the directory holds more than the entries: " + Join(names);
  }
  fs::remove_all(dir);
  return "";
}

std::string ReaderCreatesNothing() {
  fs::path dir = FreshDir("ro-missing");
  auto cache = MakeCache(dir, /*readonly=*/true);
  cache->Add(1, std::make_shared<std::string>("one"));
  if (fs::exists(dir)) return "a read-only cache created " + dir.string();
  return "";
}

std::string ReaderWritesAndDeletesNothing() {
  fs::path dir = FreshDir("ro");
  fs::create_directories(dir);
  { std::ofstream(dir / "7", std::ios::binary); }  // an entry that cannot load
  // A crash leftover that a writer would remove before writing entry 1.
  const std::string leftover = "1.tmp.otherhost.00000000000000aa";
  WriteFile(dir / leftover, "partial");
  MakeOld(dir / leftover, 2 * 60 * 60);
  auto cache = MakeCache(dir, /*readonly=*/true);
  cache->Add(1, std::make_shared<std::string>("one"));
  Value loaded = cache->Get(7);
  std::vector<std::string> names = Names(dir);
  std::sort(names.begin(), names.end());
  fs::remove_all(dir);
  if (loaded != nullptr) return "an empty entry loaded";
  if (names != std::vector<std::string>{leftover, "7"}) {
    return "a read-only cache changed the directory to: " + Join(names);
  }
  return "";
}

// A finished write is durable before it is visible: the temporary file is
// fsync'ed before the rename, and the directory after it (a rename is data of
// the directory). Without them a power loss can keep a renamed entry with lost
// data, or lose the rename.
std::string FinishedWriteIsDurableBeforeItIsVisible() {
  fs::path dir = FreshDir("durable");
  auto cache = MakeCache(dir, /*readonly=*/false);
  {
    std::lock_guard<std::mutex> lock(syscalls::mutex);
    syscalls::events.clear();
    syscalls::recording = true;
  }
  cache->Add(12, std::make_shared<std::string>("twelve"));
  std::vector<std::string> events;
  {
    std::lock_guard<std::mutex> lock(syscalls::mutex);
    syscalls::recording = false;
    events.swap(syscalls::events);
  }
  const std::string canonical_dir = fs::canonical(dir).string();
  fs::remove_all(dir);
  auto index = [&events](const std::function<bool(const std::string&)>& is) {
    for (size_t i = 0; i < events.size(); ++i) {
      if (is(events[i])) return static_cast<long>(i);
    }
    return -1L;
  };
  const long renamed = index([&](const std::string& event) {
    return event.rfind("rename ", 0) == 0 &&
           event.size() > 3 && event.substr(event.size() - 3) == "/12";
  });
  if (renamed < 0) {
    return "the entry was not renamed into place (system calls: " +
           Join(events) + ")";
  }
  const std::string tmp = events[renamed].substr(
      7, events[renamed].find(' ', 7) - 7);
  const long file_synced = index([&](const std::string& event) {
    return event == "fsync " + fs::weakly_canonical(tmp).string();
  });
  const long dir_synced = index(
      [&](const std::string& event) { return event == "fsync " + canonical_dir; });
  if (file_synced < 0 || file_synced > renamed) {
    return "the file is not fsync'ed before its rename (system calls: " +
           Join(events) + ")";
  }
  if (dir_synced < renamed) {
    return "the directory is not fsync'ed after the rename (system calls: " +
           Join(events) + ")";
  }
  return "";
}

// With a memory size of 0 the cache keeps no reference to what it loads or
// saves: the caller's own in-memory cache is the only one (XLAGraphExecutor),
// so an executable it evicts is freed.
std::string MemorySizeZeroKeepsNoReference() {
  fs::path dir = FreshDir("no-memory");
  Cache cache(0, dir.string(), /*readonly=*/false, Serialize, Deserialize);
  std::weak_ptr<std::string> added;
  {
    auto value = std::make_shared<std::string>("added");
    added = value;
    Value returned = cache.Add(13, value);
    if (returned != value) return "Add does not return the value";
  }
  std::weak_ptr<std::string> loaded;
  {
    Value value = cache.Get(13);
    if (value == nullptr || *value != "added") {
      fs::remove_all(dir);
      return "the saved entry does not load";
    }
    loaded = value;
  }
  fs::remove_all(dir);
  if (!added.expired()) return "the cache keeps the value it saved";
  if (!loaded.expired()) return "the cache keeps the value it loaded";
  return "";
}

std::string ReaderLoadsWhatTheWriterSaved() {
  fs::path dir = FreshDir("rw");
  MakeCache(dir, /*readonly=*/false)
      ->Add(3, std::make_shared<std::string>("three"));
  Value loaded = MakeCache(dir, /*readonly=*/true)->Get(3);
  fs::remove_all(dir);
  if (loaded == nullptr || *loaded != "three") return "no hit on the entry";
  return "";
}

std::string WriterRemovesAnEntryThatFailsToLoad() {
  fs::path dir = FreshDir("rw-bad");
  fs::create_directories(dir);
  { std::ofstream(dir / "7", std::ios::binary); }
  Value loaded = MakeCache(dir, /*readonly=*/false)->Get(7);
  bool still_there = fs::exists(dir / "7");
  fs::remove_all(dir);
  if (loaded != nullptr) return "an empty entry loaded";
  if (still_there) return "the writer kept an entry that cannot load";
  return "";
}

// The entry's name is taken by a non-empty directory, so deleting the failed
// entry fails: that must be reported, not thrown into training.
std::string FailedDeleteDoesNotThrow() {
  fs::path dir = FreshDir("rw-undeletable");
  fs::create_directories(dir / "7" / "blocker");
  Value loaded = MakeCache(dir, /*readonly=*/false)->Get(7);
  fs::remove_all(dir);
  if (loaded != nullptr) return "a directory loaded as an entry";
  return "";
}

// The directory disappears under a running writer: Add must report and count
// the failure, keep the value in memory, and not throw.
std::string FailedWriteIsCountedNotThrown() {
  fs::path dir = FreshDir("rw-gone");
  auto cache = MakeCache(dir, /*readonly=*/false);
  fs::remove_all(dir);
  int64_t before = Counter("PersistentCacheWriteFailure");
  Value added = cache->Add(5, std::make_shared<std::string>("five"));
  int64_t after = Counter("PersistentCacheWriteFailure");
  Value again = cache->Get(5);
  bool recreated = fs::exists(dir);
  fs::remove_all(dir);
  if (added == nullptr || again == nullptr || *again != "five") {
    return "the value is not kept in memory";
  }
  if (after != before + 1) {
    return "PersistentCacheWriteFailure went from " + std::to_string(before) +
           " to " + std::to_string(after);
  }
  if (recreated) return "the failed write left files behind";
  return "";
}

// The cache directory cannot be created (its parent is a regular file): the
// writer must start anyway, and run without persisting.
std::string UncreatableDirectoryDoesNotThrow() {
  fs::path parent = FreshDir("not-a-dir");
  { std::ofstream(parent.string(), std::ios::binary) << "x"; }
  auto cache = MakeCache(parent / "cache", /*readonly=*/false);
  Value added = cache->Add(9, std::make_shared<std::string>("nine"));
  fs::remove(parent);
  if (added == nullptr) return "Add returned nothing";
  return "";
}

// The host name as the patched cache.h puts it into temporary file names:
// letters, digits and '-' kept, every other byte '_', at most 64 bytes.
std::string HostForPath() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string host;
  for (const char* c = name; *c != '\0' && host.size() < 64; ++c) {
    bool keep = std::isalnum(static_cast<unsigned char>(*c)) || *c == '-';
    host.push_back(keep ? *c : '_');
  }
  return host.empty() ? "unknown-host" : host;
}

// The documented entry format: the value, then the 24-byte footer "XLAPCF01",
// the value's length and its 64-bit FNV-1a hash, both uint64 little-endian.
// FNV-1a of "foobar" is 0x85944171f73967e8 (the FNV reference test vector).
std::string EntryIsTheValueAndAFooter() {
  fs::path dir = FreshDir("format");
  MakeCache(dir, /*readonly=*/false)
      ->Add(13, std::make_shared<std::string>("foobar"));
  std::string contents = ReadFile(dir / "13");
  fs::remove_all(dir);
  const std::string expected = std::string("foobar") + "XLAPCF01" +
                               std::string("\x06\0\0\0\0\0\0\0", 8) +
                               "\xe8\x67\x39\xf7\x71\x41\x94\x85";
  if (contents != expected) {
    std::ostringstream shown;
    for (unsigned char c : contents) {
      shown << (std::isprint(c) ? std::string(1, c)
                                : "\\x" + std::to_string(c) + ";");
    }
    return "entry 13 holds " + shown.str();
  }
  return "";
}

// A writer killed between creating "<entry>.tmp.<pid>.<n>" and the rename
// leaves that file behind; a restarted container runs its trainer under the
// same pid, so the next process computed the same name and O_EXCL refused it
// on every run: the entry was never saved again. The leftover here has this
// process's pid and the first counter value of a new cache.
std::string CrashLeftoverDoesNotBlockSaving() {
  fs::path dir = FreshDir("leftover");
  fs::create_directories(dir);
  WriteFile(dir / ("4.tmp." + std::to_string(::getpid()) + ".1"), "partial");
  int64_t failures_before = Counter("PersistentCacheWriteFailure");
  MakeCache(dir, /*readonly=*/false)
      ->Add(4, std::make_shared<std::string>("four"));
  int64_t failures_after = Counter("PersistentCacheWriteFailure");
  Value loaded = MakeCache(dir, /*readonly=*/true)->Get(4);
  fs::remove_all(dir);
  if (failures_after != failures_before) {
    return "the save failed (PersistentCacheWriteFailure went from " +
           std::to_string(failures_before) + " to " +
           std::to_string(failures_after) + ")";
  }
  if (loaded == nullptr || *loaded != "four") return "entry 4 was not saved";
  return "";
}

// Watches the directory with inotify while two caches (the same process, so
// the same pid) each write entry 1: each temporary file must be named
// "1.tmp.<host>.<16 hex digits>", and the two names must differ.
std::string TemporaryNamesCarryHostAndRandomPart() {
  fs::path dir = FreshDir("names");
  fs::create_directories(dir);
  int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  // Also the renames and deletes, so that inotify does not merge two creations
  // of one name into one event.
  const uint32_t events = IN_CREATE | IN_MOVED_TO | IN_DELETE;
  if (watch < 0 || ::inotify_add_watch(watch, dir.c_str(), events) < 0) {
    return std::string("inotify: ") + std::strerror(errno);
  }
  MakeCache(dir, /*readonly=*/false)
      ->Add(1, std::make_shared<std::string>("one"));
  fs::remove(dir / "1");
  MakeCache(dir, /*readonly=*/false)
      ->Add(1, std::make_shared<std::string>("one"));
  std::vector<std::string> created;
  alignas(struct inotify_event) char buffer[64 * 1024];
  ssize_t length = ::read(watch, buffer, sizeof(buffer));
  for (ssize_t at = 0; at < length;) {
    auto* event = reinterpret_cast<struct inotify_event*>(buffer + at);
    if ((event->mask & IN_CREATE) && event->len > 0) {
      created.push_back(event->name);
    }
    at += sizeof(struct inotify_event) + event->len;
  }
  ::close(watch);
  fs::remove_all(dir);
  const std::regex pattern("1\\.tmp\\." + HostForPath() + "\\.[0-9a-f]{16}");
  if (created.size() != 2) {
    return "expected two temporary files, saw created: " + Join(created);
  }
  for (const auto& name : created) {
    if (!std::regex_match(name, pattern)) {
      return name + " is not 1.tmp." + HostForPath() + ".<16 hex digits>";
    }
  }
  if (created[0] == created[1]) {
    return "both writers used the temporary name " + created[0];
  }
  return "";
}

// A writer that starts removes the crash leftovers of every entry that are
// more than an hour old, before any Add: a leftover of an entry that is never
// written again must not stay forever. A younger one may belong to a live
// writer on another host and is kept, as are entries.
std::string StaleTemporaryFilesAreRemovedWhenAWriterStarts() {
  fs::path dir = FreshDir("stale");
  fs::create_directories(dir);
  const std::string stale = "4.tmp.hosta.00000000000000aa";
  const std::string young = "4.tmp.hostb.00000000000000bb";
  const std::string other = "5.tmp.hosta.00000000000000cc";
  const std::string prefixed = "40.tmp.hosta.00000000000000dd";
  for (const auto& name : {stale, young, other, prefixed}) {
    WriteFile(dir / name, "partial");
    if (name != young) MakeOld(dir / name, 2 * 60 * 60);
  }
  WriteFile(dir / "3", "an entry");
  MakeOld(dir / "3", 2 * 60 * 60);
  MakeCache(dir, /*readonly=*/false);
  std::vector<std::string> names = Names(dir);
  std::sort(names.begin(), names.end());
  fs::remove_all(dir);
  std::vector<std::string> expected = {"3", young};
  std::sort(expected.begin(), expected.end());
  if (names != expected) {
    return "the directory holds " + Join(names) + " instead of " +
           Join(expected);
  }
  return "";
}

// The sweep removes only what the cache itself leaves behind: names of the
// exact form "<entry>.tmp.<host>.<16 lowercase hex digits>". A cache directory
// can hold other files (a report.tmp.txt, an editor's backup of a leftover),
// and an old one of those must survive a writer's start.
std::string SweepRemovesOnlyTheCachesOwnTemporaryNames() {
  fs::path dir = FreshDir("sweep-names");
  fs::create_directories(dir);
  const std::string own = "4.tmp.hosta.00000000000000aa";
  const std::string negative_key = "-4.tmp.host_b-2.0123456789abcdef";
  // A SHA-256 disk key, as XLAGraphExecutor's entries are named.
  const std::string digest_key =
      "c626c317e2f79d21eae264fe7825cd82efa855d6429d1c6a6de94e84abc34ea9"
      ".tmp.hosta.00000000000000aa";
  const std::vector<std::string> foreign = {
      "report.tmp.txt",
      "notes.tmp.hosta.00000000000000aa",
      "4.tmp.hosta.00000000000000aa.bak",
      "4.tmp.hosta.00000000000000AA",
      "4.tmp.hosta.00000000000000a",
      "4.tmp..00000000000000aa",
      "4.tmp.host.a.00000000000000aa",
      ".tmp.hosta.00000000000000aa",
      "4x.tmp.hosta.00000000000000aa",
      "-4a.tmp.hosta.00000000000000aa",
      "C626.tmp.hosta.00000000000000aa",
  };
  for (const auto& name : foreign) WriteFile(dir / name, "not the cache's");
  WriteFile(dir / own, "partial");
  WriteFile(dir / negative_key, "partial");
  WriteFile(dir / digest_key, "partial");
  for (const auto& entry : fs::directory_iterator(dir)) {
    MakeOld(entry.path(), 2 * 60 * 60);
  }
  MakeCache(dir, /*readonly=*/false);
  std::vector<std::string> names = Names(dir);
  std::sort(names.begin(), names.end());
  fs::remove_all(dir);
  std::vector<std::string> expected = foreign;
  std::sort(expected.begin(), expected.end());
  if (names != expected) {
    return "the directory holds " + Join(names) + " instead of " +
           Join(expected);
  }
  return "";
}

// Cuts the last 100 bytes off a saved entry, as a crash without fsync or a
// full disk can leave it: a read-only cache misses and keeps the file; a
// writer misses, removes it, and saves the entry again.
std::string TruncatedEntryIsAMissRemovedOnlyByAWriter() {
  fs::path dir = FreshDir("truncated");
  const std::string value(4096, 'x');
  MakeCache(dir, /*readonly=*/false)
      ->Add(6, std::make_shared<std::string>(value));
  fs::path entry = dir / "6";
  uintmax_t cut_size = fs::file_size(entry) - 100;
  fs::resize_file(entry, cut_size);
  int64_t corrupt_before = Counter("PersistentCacheCorrupt");
  Value read_only = MakeCache(dir, /*readonly=*/true)->Get(6);
  bool kept = fs::exists(entry) && fs::file_size(entry) == cut_size;
  int64_t corrupt_after = Counter("PersistentCacheCorrupt");
  auto writer = MakeCache(dir, /*readonly=*/false);
  Value written = writer->Get(6);
  bool removed = !fs::exists(entry);
  writer->Add(6, std::make_shared<std::string>(value));
  Value reloaded = MakeCache(dir, /*readonly=*/true)->Get(6);
  fs::remove_all(dir);
  if (read_only != nullptr) {
    return "a read-only cache loaded " + std::to_string(read_only->size()) +
           " bytes of a 4096-byte value";
  }
  if (!kept) return "a read-only cache changed the truncated entry";
  if (corrupt_after != corrupt_before + 1) {
    return "PersistentCacheCorrupt went from " +
           std::to_string(corrupt_before) + " to " +
           std::to_string(corrupt_after);
  }
  if (written != nullptr) return "a writer loaded the truncated entry";
  if (!removed) return "a writer kept the truncated entry";
  if (reloaded == nullptr || *reloaded != value) {
    return "the entry was not saved again";
  }
  return "";
}

// One byte in the middle of a saved entry changes: the entry must not load.
std::string DamagedEntryIsAMiss() {
  fs::path dir = FreshDir("damaged");
  MakeCache(dir, /*readonly=*/false)
      ->Add(8, std::make_shared<std::string>(4096, 'y'));
  {
    std::fstream file(dir / "8",
                      std::ios::binary | std::ios::in | std::ios::out);
    file.seekp(100);
    file.put('z');
  }
  Value loaded = MakeCache(dir, /*readonly=*/true)->Get(8);
  fs::remove_all(dir);
  if (loaded != nullptr) return "an entry with a changed byte loaded";
  return "";
}

// The entry's name is an empty directory: open(2) succeeds and read(2) fails
// (EISDIR), like a read that fails with ESTALE on NFS while another host
// replaces the entry. That proves nothing about the entry: a writer must miss,
// count it, and delete nothing.
std::string FailedReadIsAMissAndDeletesNothing() {
  fs::path dir = FreshDir("unreadable");
  fs::create_directories(dir / "9");
  int64_t before = Counter("PersistentCacheReadFailure");
  auto writer = MakeCache(dir, /*readonly=*/false);
  Value loaded = writer->Get(9);
  int64_t after = Counter("PersistentCacheReadFailure");
  bool kept = fs::is_directory(dir / "9");
  fs::remove_all(dir);
  if (loaded != nullptr) return "an unreadable entry loaded";
  if (!kept) return "the writer deleted an entry it could not read";
  if (after != before + 1) {
    return "PersistentCacheReadFailure went from " + std::to_string(before) +
           " to " + std::to_string(after);
  }
  return "";
}

// A read-only cache in another thread loads entries while a writer saves
// large ones: every value it loads must be whole.
std::string ConcurrentReadersNeverLoadAPartialEntry() {
  fs::path dir = FreshDir("concurrent");
  auto writer = MakeCache(dir, /*readonly=*/false);
  auto reader = MakeCache(dir, /*readonly=*/true);
  const size_t size = 32 << 20;
  const int entries = 6;
  std::atomic<bool> done{false};
  std::string partial;
  std::thread reading([&] {
    std::vector<bool> loaded(entries, false);
    bool last_pass = false;
    while (partial.empty()) {
      last_pass = done.load();
      for (int key = 0; key < entries; ++key) {
        if (loaded[key]) continue;
        Value value = reader->Get(key);
        if (value == nullptr) continue;
        loaded[key] = true;
        if (*value != std::string(size, 'a' + key)) {
          partial = "entry " + std::to_string(key) + " loaded with " +
                    std::to_string(value->size()) + " bytes";
        }
      }
      if (last_pass) {
        if (partial.empty() &&
            std::count(loaded.begin(), loaded.end(), true) != entries) {
          partial = "the reader did not load every saved entry";
        }
        break;
      }
    }
  });
  for (int key = 0; key < entries; ++key) {
    writer->Add(key, std::make_shared<std::string>(size, 'a' + key));
  }
  done = true;
  reading.join();
  fs::remove_all(dir);
  return partial;
}

// An entry whose bytes are intact but which the client cannot load now (out
// of memory, a busy device: any status that does not prove the bytes bad) is
// a miss counted as PersistentCacheLoadRefused, and nothing is deleted. So
// that an entry that fails every time does not block saving forever, the
// writer's fresh compile then replaces it (by rename).
std::string IntactEntryThatFailsToLoadIsKeptThenReplaced() {
  fs::path dir = FreshDir("unloadable");
  // Deserialize returns nullptr for an empty value.
  MakeCache(dir, /*readonly=*/false)
      ->Add(11, std::make_shared<std::string>(""));
  bool saved = fs::exists(dir / "11");
  int64_t refused_before = Counter("PersistentCacheLoadRefused");
  int64_t failures_before = Counter("PersistentCacheDeserializeFailure");
  auto writer = MakeCache(dir, /*readonly=*/false);
  Value loaded = writer->Get(11);
  int64_t refused_after = Counter("PersistentCacheLoadRefused");
  int64_t failures_after = Counter("PersistentCacheDeserializeFailure");
  bool kept = fs::exists(dir / "11");
  writer->Add(11, std::make_shared<std::string>("eleven"));
  Value reloaded = MakeCache(dir, /*readonly=*/true)->Get(11);
  fs::remove_all(dir);
  if (!saved) return "the entry was not saved";
  if (loaded != nullptr) return "an empty value loaded";
  if (refused_after != refused_before + 1) {
    return "PersistentCacheLoadRefused went from " +
           std::to_string(refused_before) + " to " +
           std::to_string(refused_after);
  }
  if (failures_after != failures_before + 1) {
    return "PersistentCacheDeserializeFailure went from " +
           std::to_string(failures_before) + " to " +
           std::to_string(failures_after);
  }
  if (!kept) return "the writer deleted an intact entry it could not load";
  if (reloaded == nullptr || *reloaded != "eleven") {
    return "the fresh compile did not replace the entry";
  }
  return "";
}

// The load of an intact entry throws every time: a miss, the entry is kept,
// and the writer's fresh compile replaces it instead of being blocked by it.
std::string EntryWhoseLoadThrowsDoesNotBlockSaving() {
  fs::path dir = FreshDir("throwing");
  MakeCache(dir, /*readonly=*/false)
      ->Add(14, std::make_shared<std::string>(kThrowsOnLoad));
  auto writer = MakeCache(dir, /*readonly=*/false);
  Value loaded = writer->Get(14);
  bool kept = fs::exists(dir / "14");
  writer->Add(14, std::make_shared<std::string>("fourteen"));
  Value reloaded = MakeCache(dir, /*readonly=*/true)->Get(14);
  fs::remove_all(dir);
  if (loaded != nullptr) return "a throwing load returned a value";
  if (!kept) return "the writer deleted an intact entry whose load threw";
  if (reloaded == nullptr || *reloaded != "fourteen") {
    return "the entry whose load throws blocked the fresh compile's save";
  }
  return "";
}

// Once the writer has started, Add must not list the cache directory: one
// listing is a network round trip on gcsfuse, and it ran under the cache's
// lock. Listings are counted through this program's opendir(3): an open of
// the directory to fsync it (after a rename) is no listing, and inotify's
// IN_OPEN cannot tell the two apart.
std::string AddsDoNotListTheDirectory() {
  fs::path dir = FreshDir("listing");
  auto cache = MakeCache(dir, /*readonly=*/false);
  {
    std::lock_guard<std::mutex> lock(syscalls::mutex);
    syscalls::events.clear();
    syscalls::recording = true;
  }
  const int adds = 20;
  for (int key = 100; key < 100 + adds; ++key) {
    cache->Add(key, std::make_shared<std::string>("v"));
  }
  int listings = 0;
  {
    std::lock_guard<std::mutex> lock(syscalls::mutex);
    syscalls::recording = false;
    for (const std::string& event : syscalls::events) {
      if (event.rfind("opendir ", 0) == 0) ++listings;
    }
    syscalls::events.clear();
  }
  fs::remove_all(dir);
  if (listings != 0) {
    return std::to_string(adds) + " adds listed the directory " +
           std::to_string(listings) + " time(s)";
  }
  return "";
}

// The client cannot serialize the value (SerializeComputation throws): Add
// must count the failed write, keep the value in memory and not throw.
std::string FailedSerializationIsCountedNotThrown() {
  fs::path dir = FreshDir("unserializable");
  auto cache = MakeCache(dir, /*readonly=*/false);
  int64_t before = Counter("PersistentCacheWriteFailure");
  Value added = cache->Add(12, std::make_shared<std::string>(kUnserializable));
  int64_t after = Counter("PersistentCacheWriteFailure");
  Value again = cache->Get(12);
  std::vector<std::string> names = Names(dir);
  fs::remove_all(dir);
  if (added == nullptr || again == nullptr) {
    return "the value is not kept in memory";
  }
  if (after != before + 1) {
    return "PersistentCacheWriteFailure went from " + std::to_string(before) +
           " to " + std::to_string(after);
  }
  if (!names.empty()) return "the failed write left " + Join(names);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // Built with -fsanitize=address (program persistent_cache_asan_check): only
  // the check whose failure is a use of freed memory.
  if (argc > 1 && std::string(argv[1]) == "--memory-size-zero") {
    RunIsolated("memory_size_zero_keeps_no_reference",
                MemorySizeZeroKeepsNoReference);
    return failures;
  }
  Run("no_reader_sees_a_partial_entry", NoReaderSeesAPartialEntry);
  Run("reader_creates_nothing", ReaderCreatesNothing);
  Run("reader_writes_and_deletes_nothing", ReaderWritesAndDeletesNothing);
  Run("reader_loads_what_the_writer_saved", ReaderLoadsWhatTheWriterSaved);
  Run("finished_write_is_durable_before_it_is_visible",
      FinishedWriteIsDurableBeforeItIsVisible);
  RunIsolated("memory_size_zero_keeps_no_reference",
              MemorySizeZeroKeepsNoReference);
  Run("writer_removes_an_entry_that_fails_to_load",
      WriterRemovesAnEntryThatFailsToLoad);
  Run("failed_delete_does_not_throw", FailedDeleteDoesNotThrow);
  Run("failed_write_is_counted_not_thrown", FailedWriteIsCountedNotThrown);
  Run("uncreatable_directory_does_not_throw", UncreatableDirectoryDoesNotThrow);
  Run("entry_is_the_value_and_a_footer", EntryIsTheValueAndAFooter);
  Run("crash_leftover_does_not_block_saving", CrashLeftoverDoesNotBlockSaving);
  Run("temporary_names_carry_host_and_random_part",
      TemporaryNamesCarryHostAndRandomPart);
  Run("stale_temporary_files_are_removed_when_a_writer_starts",
      StaleTemporaryFilesAreRemovedWhenAWriterStarts);
  Run("sweep_removes_only_the_caches_own_temporary_names",
      SweepRemovesOnlyTheCachesOwnTemporaryNames);
  Run("adds_do_not_list_the_directory", AddsDoNotListTheDirectory);
  Run("truncated_entry_is_a_miss_removed_only_by_a_writer",
      TruncatedEntryIsAMissRemovedOnlyByAWriter);
  Run("damaged_entry_is_a_miss", DamagedEntryIsAMiss);
  Run("failed_read_is_a_miss_and_deletes_nothing",
      FailedReadIsAMissAndDeletesNothing);
  Run("concurrent_readers_never_load_a_partial_entry",
      ConcurrentReadersNeverLoadAPartialEntry);
  Run("intact_entry_that_fails_to_load_is_kept_then_replaced",
      IntactEntryThatFailsToLoadIsKeptThenReplaced);
  Run("entry_whose_load_throws_does_not_block_saving",
      EntryWhoseLoadThrowsDoesNotBlockSaving);
  Run("failed_serialization_is_counted_not_thrown",
      FailedSerializationIsCountedNotThrown);
  return failures;
}
