// Behaviour check of XLA_PERSISTENT_CACHE_VERIFY (patch 0005) on the
// persistent cache of patch 0004, compiled against the patched tree's
// runtime/cache.h and the real torch headers and libraries:
//   - the entry format functions (EncodePersistentCacheEntry,
//     DecodePersistentCacheEntry, PersistentCacheEntryMagic) are copied
//     verbatim, at check time, out of the tree's xla_graph_executor.cpp into
//     entry_magic.inc, encode_entry.inc and decode_entry.inc, and the value's
//     serialize/deserialize functions use them as CreateComputationCache's do;
//   - an "HLO module" is a string and its fingerprint torch::lazy::Hash of it:
//     HloFingerprint itself (metadata cleared, deterministic serialization)
//     and the lowering need OpenXLA and are compiled only on a builder.
//
// The scenario is the one the switch exists for: an input that changes the
// program but is missing from the cache key (as the matmul precision was), so
// two different modules share one key.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <torch/csrc/lazy/core/hash.h>
#include <torch/csrc/lazy/core/metrics.h>

#include "check_report.h"

#include "torch_xla/csrc/runtime/cache.h"

namespace torch_xla {
// In the tree's order: the magic, then the functions that use it.
#include "entry_magic.inc"
// Writes an entry's payload.
#include "encode_entry.inc"
// Reads it.
#include "decode_entry.inc"
}  // namespace torch_xla

namespace fs = std::filesystem;

namespace {

using check_report::failures;
using check_report::Report;
using torch::lazy::hash_t;

// What the cache keeps: an "executable" and the fingerprint of the module it
// was compiled from (XLAGraphExecutor::CachedComputation's hlo_fingerprint).
struct Compiled {
  std::string executable;
  hash_t hlo_fingerprint;
};
using Value = std::shared_ptr<Compiled>;
using Cache =
    torch_xla::runtime::util::PersistentCache<hash_t, Compiled,
                                              torch::lazy::HashReducer>;

hash_t Fingerprint(const std::string& module) {
  return torch::lazy::Hash(module);
}

// As CreateComputationCache's serialize_fn and deserialize_fn.
std::string Serialize(const Value& value) {
  return torch_xla::EncodePersistentCacheEntry(value->hlo_fingerprint,
                                               value->executable);
}

Value Deserialize(const std::string& payload) {
  auto value = std::make_shared<Compiled>();
  if (!torch_xla::DecodePersistentCacheEntry(payload, &value->hlo_fingerprint,
                                             &value->executable)) {
    throw torch_xla::runtime::util::PersistentCacheCorruptEntry(
        "does not start with an HLO fingerprint");
  }
  return value;
}

// A build without patch 0005 wrote the executable alone.
std::string SerializeWithoutFingerprint(const Value& value) {
  return value->executable;
}

std::unique_ptr<Cache> MakeCache(const fs::path& dir, bool readonly) {
  return std::make_unique<Cache>(16, dir.string(), readonly, Serialize,
                                 Deserialize);
}

// One process running `module`: what it compiles for it.
Value CompileModule(const std::string& module) {
  return std::make_shared<Compiled>(
      Compiled{"executable of " + module, Fingerprint(module)});
}

// The verify switch's decision: the loaded executable was compiled from the
// module this process lowers to.
std::function<bool(const Value&)> Verifier(const std::string& module,
                                           int* calls) {
  return [module, calls](const Value& loaded) {
    ++*calls;
    return loaded->hlo_fingerprint == Fingerprint(module);
  };
}

int64_t Counter(const std::string& name) {
  torch::lazy::CounterData* counter = torch::lazy::GetCounter(name);
  return counter == nullptr ? 0 : counter->Value();
}

std::string Changed(const std::string& name, int64_t before, int64_t after,
                    int64_t by) {
  if (after == before + by) return "";
  return name + " went from " + std::to_string(before) + " to " +
         std::to_string(after) + ", not by " + std::to_string(by);
}

fs::path FreshDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() /
                 ("pcverify-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

std::string KeyName(const hash_t& key) {
  std::ostringstream out;
  out << key;
  return out.str();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char kDefaultPrecision[] = "dot(a, b), precision=DEFAULT";
const char kHighestPrecision[] = "dot(a, b), precision=HIGHEST";

// Two modules under one key (the precision is not in the key). Without the
// switch the second process loads the first one's executable; with it, the
// load is a miss counted as PersistentCacheVerifyMismatch, the hit is not
// counted, and the writer's fresh compile replaces the entry.
std::string VerifyRefusesAnotherModuleUnderOneKey() {
  fs::path dir = FreshDir("mismatch");
  const hash_t key = torch::lazy::Hash(std::string("graph hash"));
  MakeCache(dir, /*readonly=*/false)
      ->Add(key, CompileModule(kDefaultPrecision));

  Value unverified = MakeCache(dir, /*readonly=*/true)->Get(key);
  if (unverified == nullptr ||
      unverified->executable !=
          "executable of " + std::string(kDefaultPrecision)) {
    return "setup: the unverified lookup did not load the other module's "
           "executable";
  }

  int calls = 0;
  int64_t mismatches = Counter("PersistentCacheVerifyMismatch");
  int64_t hits = Counter("PersistentCacheHit");
  auto writer = MakeCache(dir, /*readonly=*/false);
  Value verified = writer->Get(key, Verifier(kHighestPrecision, &calls));
  std::string why =
      Changed("PersistentCacheVerifyMismatch", mismatches,
              Counter("PersistentCacheVerifyMismatch"), 1) +
      Changed("PersistentCacheHit", hits, Counter("PersistentCacheHit"), 0);
  if (verified != nullptr)
    return "the verified lookup loaded " + verified->executable;
  if (calls != 1) return "the verifier ran " + std::to_string(calls) + " times";
  if (!why.empty()) return why;
  if (!fs::exists(dir / KeyName(key)))
    return "the mismatching entry was deleted";

  writer->Add(key, CompileModule(kHighestPrecision));
  int after_calls = 0;
  Value reloaded = MakeCache(dir, /*readonly=*/true)
                       ->Get(key, Verifier(kHighestPrecision, &after_calls));
  fs::remove_all(dir);
  if (reloaded == nullptr ||
      reloaded->executable !=
          "executable of " + std::string(kHighestPrecision)) {
    return "the fresh compile did not replace the mismatching entry";
  }
  return "";
}

// A read-only process refuses the other module's executable too, and leaves
// the entry as it is.
std::string ReadOnlyVerifierMissesAndKeepsTheEntry() {
  fs::path dir = FreshDir("readonly");
  const hash_t key = torch::lazy::Hash(std::string("graph hash"));
  MakeCache(dir, /*readonly=*/false)
      ->Add(key, CompileModule(kDefaultPrecision));
  std::string before = ReadFile(dir / KeyName(key));
  int calls = 0;
  auto reader = MakeCache(dir, /*readonly=*/true);
  Value loaded = reader->Get(key, Verifier(kHighestPrecision, &calls));
  reader->Add(key, CompileModule(kHighestPrecision));
  std::string after = ReadFile(dir / KeyName(key));
  fs::remove_all(dir);
  if (loaded != nullptr)
    return "a read-only verifier loaded another module's executable";
  if (before != after) return "a read-only process changed the entry";
  return "";
}

// The same module verifies and hits; a later lookup of the same key is served
// from memory without lowering again.
std::string SameModuleHitsAndIsVerifiedOnce() {
  fs::path dir = FreshDir("same");
  const hash_t key = torch::lazy::Hash(std::string("graph hash"));
  MakeCache(dir, /*readonly=*/false)
      ->Add(key, CompileModule(kDefaultPrecision));
  int calls = 0;
  int64_t hits = Counter("PersistentCacheHit");
  auto cache = MakeCache(dir, /*readonly=*/true);
  Value first = cache->Get(key, Verifier(kDefaultPrecision, &calls));
  Value second = cache->Get(key, Verifier(kDefaultPrecision, &calls));
  std::string why =
      Changed("PersistentCacheHit", hits, Counter("PersistentCacheHit"), 1);
  fs::remove_all(dir);
  if (first == nullptr || second == nullptr)
    return "the same module did not hit";
  if (calls != 1)
    return "verified " + std::to_string(calls) + " times, not once";
  return why;
}

// The payload is PersistentCacheEntryMagic(), the 16-byte fingerprint (high
// then low 64 bits, little-endian), then the executable; the cache's footer
// follows it on disk.
std::string EntryRecordsTheModuleFingerprint() {
  fs::path dir = FreshDir("format");
  const hash_t key = torch::lazy::Hash(std::string("graph hash"));
  Value value = CompileModule(kDefaultPrecision);
  MakeCache(dir, /*readonly=*/false)->Add(key, value);
  std::string contents = ReadFile(dir / KeyName(key));
  fs::remove_all(dir);
  std::string expected = "XLAHFP01";
  for (uint64_t half : {c10::Uint128High64(value->hlo_fingerprint),
                        c10::Uint128Low64(value->hlo_fingerprint)}) {
    for (int byte = 0; byte < 8; ++byte) {
      expected.push_back(static_cast<char>((half >> (8 * byte)) & 0xff));
    }
  }
  expected += value->executable;
  if (contents.compare(0, expected.size(), expected) != 0) {
    return "the entry does not start with the magic, the fingerprint and the "
           "executable";
  }
  hash_t decoded;
  std::string executable;
  if (!torch_xla::DecodePersistentCacheEntry(expected, &decoded, &executable) ||
      !(decoded == value->hlo_fingerprint) || executable != value->executable) {
    return "DecodePersistentCacheEntry does not invert "
           "EncodePersistentCacheEntry";
  }
  return "";
}

// An intact entry whose payload does not parse (written by a build without
// the fingerprint) is proven corrupt: a read-only process keeps it, a writer
// removes it; both count PersistentCacheCorrupt and miss.
std::string UnparsablePayloadIsCorruptAndRemovedByAWriter() {
  fs::path dir = FreshDir("unparsable");
  const hash_t key = torch::lazy::Hash(std::string("graph hash"));
  Cache(16, dir.string(), /*readonly=*/false, SerializeWithoutFingerprint,
        Deserialize)
      .Add(key, CompileModule(kDefaultPrecision));
  fs::path entry = dir / KeyName(key);
  int64_t corrupt = Counter("PersistentCacheCorrupt");
  int64_t refused = Counter("PersistentCacheLoadRefused");
  Value read_only = MakeCache(dir, /*readonly=*/true)->Get(key);
  bool kept = fs::exists(entry);
  Value written = MakeCache(dir, /*readonly=*/false)->Get(key);
  bool removed = !fs::exists(entry);
  std::string why = Changed("PersistentCacheCorrupt", corrupt,
                            Counter("PersistentCacheCorrupt"), 2) +
                    Changed("PersistentCacheLoadRefused", refused,
                            Counter("PersistentCacheLoadRefused"), 0);
  fs::remove_all(dir);
  if (read_only != nullptr || written != nullptr)
    return "an unparsable entry loaded";
  if (!kept) return "a read-only process removed the entry";
  if (!removed) return "a writer kept an entry proven corrupt";
  return why;
}

void Run(const std::string& name, const std::function<std::string()>& check) {
  try {
    Report(name, check());
  } catch (const std::exception& error) {
    Report(name, std::string("threw: ") + error.what());
  }
}

}  // namespace

int main() {
  Run("verify_refuses_another_module_under_one_key",
      VerifyRefusesAnotherModuleUnderOneKey);
  Run("read_only_verifier_misses_and_keeps_the_entry",
      ReadOnlyVerifierMissesAndKeepsTheEntry);
  Run("same_module_hits_and_is_verified_once", SameModuleHitsAndIsVerifiedOnce);
  Run("entry_records_the_module_fingerprint", EntryRecordsTheModuleFingerprint);
  Run("unparsable_payload_is_corrupt_and_removed_by_a_writer",
      UnparsablePayloadIsCorruptAndRemovedByAWriter);
  return failures;
}
