// Behaviour check of torch_xla's runtime/cache.h PersistentCache, compiled by
// tests/test_torch_xla_patches.py against a patched pytorch/xla checkout and
// the real torch headers and libraries (TORCH_LAZY_COUNTER, TORCH_WARN).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures. A check that throws out of the cache is reported as
// FAIL: the cache must never throw into training.

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/lazy/core/metrics.h>

#include "torch_xla/csrc/runtime/cache.h"

namespace fs = std::filesystem;
using torch_xla::runtime::util::PersistentCache;
using Value = std::shared_ptr<std::string>;
using Cache = PersistentCache<int, std::string>;

namespace {

int failures = 0;

void Report(const std::string& name, bool ok, const std::string& why) {
  std::cout << (ok ? "PASS " : "FAIL ") << name << (ok ? "" : ": " + why)
            << std::endl;
  if (!ok) ++failures;
}

// Runs `check`; an exception escaping it is a failure of that check.
void Run(const std::string& name, const std::function<std::string()>& check) {
  try {
    std::string why = check();
    Report(name, why.empty(), why);
  } catch (const std::exception& error) {
    Report(name, false, std::string("threw: ") + error.what());
  }
}

std::string Serialize(const Value& value) { return *value; }

// An empty file is what a reader sees of an entry whose write has just begun;
// it must not load.
Value Deserialize(const std::string& text) {
  if (text.empty()) return nullptr;
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

// A second thread watches the entry's path while large entries are written:
// every time the file exists it must already have its full size. An in-place
// write is seen partially written almost at once.
std::string NoReaderSeesAPartialEntry() {
  fs::path dir = FreshDir("atomic");
  auto cache = MakeCache(dir, /*readonly=*/false);
  const size_t size = 32 << 20;
  const int entries = 6;
  std::atomic<bool> done{false};
  std::atomic<int64_t> partial_size{-1};
  std::thread reader([&] {
    while (!done.load()) {
      for (int key = 0; key < entries; ++key) {
        struct stat info;
        std::string path = (dir / std::to_string(key)).string();
        if (::stat(path.c_str(), &info) == 0 &&
            static_cast<size_t>(info.st_size) != size) {
          partial_size = info.st_size;
        }
      }
    }
  });
  for (int key = 0; key < entries; ++key) {
    cache->Add(key, std::make_shared<std::string>(size, 'a' + key));
  }
  done = true;
  reader.join();
  if (partial_size.load() >= 0) {
    return "a reader saw an entry of " + std::to_string(partial_size.load()) +
           " bytes instead of " + std::to_string(size);
  }
  for (int key = 0; key < entries; ++key) {
    if (ReadFile(dir / std::to_string(key)) != std::string(size, 'a' + key)) {
      return "entry " + std::to_string(key) + " does not hold what was added";
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
  auto cache = MakeCache(dir, /*readonly=*/true);
  cache->Add(1, std::make_shared<std::string>("one"));
  Value loaded = cache->Get(7);
  std::vector<std::string> names = Names(dir);
  fs::remove_all(dir);
  if (loaded != nullptr) return "an empty entry loaded";
  if (names != std::vector<std::string>{"7"}) {
    return "a read-only cache changed the directory to: " + Join(names);
  }
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

}  // namespace

int main() {
  Run("no_reader_sees_a_partial_entry", NoReaderSeesAPartialEntry);
  Run("reader_creates_nothing", ReaderCreatesNothing);
  Run("reader_writes_and_deletes_nothing", ReaderWritesAndDeletesNothing);
  Run("reader_loads_what_the_writer_saved", ReaderLoadsWhatTheWriterSaved);
  Run("writer_removes_an_entry_that_fails_to_load",
      WriterRemovesAnEntryThatFailsToLoad);
  Run("failed_delete_does_not_throw", FailedDeleteDoesNotThrow);
  Run("failed_write_is_counted_not_thrown", FailedWriteIsCountedNotThrown);
  Run("uncreatable_directory_does_not_throw", UncreatableDirectoryDoesNotThrow);
  return failures;
}
