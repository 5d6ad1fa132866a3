// Behaviour check of how XLAGraphExecutor::Compile takes the persistent cache
// key (patch 0003), built from a pytorch/xla tree:
//   - PersistentCacheKey, SkipPersistentCache and WarnPersistentCacheOnce are
//     copied verbatim, at check time, out of the tree's xla_graph_executor.cpp;
//     a tree without them fails to build, naming them;
//   - runtime/cache_key.cpp (CanonicalHloText, DiskKey) is compiled as it is
//     in the tree, with LLVM's SHA-256 (libLLVMSupport);
//   - TORCH_LAZY_COUNTER is the real one (torch headers and libtorch_cpu);
//   - the HLO module, its proto round trip (util::CreateModuleFromProto), the
//     client's PersistentCacheKeyInputs and TF_LOG are stand-ins below.
//
// A failure while keying (the module cannot be rebuilt from its proto, the
// client cannot give the key's inputs, or either throws) must cost the
// persistent cache for that graph, counted, never the compile.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include <torch/csrc/lazy/core/metrics.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "check_report.h"
#include "torch_xla/csrc/runtime/cache_key.h"

// Stand-in of tf_logging.h's TF_LOG: the warnings go to stderr.
#define TF_LOG(severity) std::cerr << #severity << ": "

namespace xla {

class HloPrintOptions {
 public:
  HloPrintOptions& set_print_operand_shape(bool) { return *this; }
  HloPrintOptions& set_print_large_constants(bool) { return *this; }
  HloPrintOptions& set_print_metadata(bool) { return *this; }
};

struct HloModuleProto {
  std::string text;
};

class HloModule {
 public:
  explicit HloModule(std::string text) : text_(std::move(text)) {}
  std::string ToString(const HloPrintOptions&) const { return text_; }

 private:
  std::string text_;
};

}  // namespace xla

namespace torch_xla {

const char TORCH_GITREV[] = "torch-rev";
const char XLA_GITREV[] = "torch-xla-rev";
const char OPENXLA_GITREV[] = "openxla-rev";

namespace runtime {
namespace util {

// A proto whose text is "unparsable" does not rebuild into a module.
absl::StatusOr<std::unique_ptr<xla::HloModule>> CreateModuleFromProto(
    const xla::HloModuleProto& proto) {
  if (proto.text == "unparsable") {
    return absl::InvalidArgumentError("the proto does not parse");
  }
  return std::make_unique<xla::HloModule>(proto.text);
}

}  // namespace util

class ComputationClient {
 public:
  struct Computation {
    xla::HloModuleProto module;
    const xla::HloModuleProto& proto() const { return module; }
  };
  struct CompileInstance {
    Computation computation;
  };
  enum class Inputs { kGood, kError, kThrow, kUnwritable };
  Inputs inputs = Inputs::kGood;

  absl::StatusOr<cache_key::DiskKeyInputs> PersistentCacheKeyInputs(
      const CompileInstance&) {
    if (inputs == Inputs::kError) {
      return absl::InternalError("the options cannot be serialized");
    }
    if (inputs == Inputs::kThrow) {
      throw std::runtime_error("XLA_CHECK failed");
    }
    cache_key::DiskKeyInputs key_inputs;
    key_inputs.compile_options = "options";
    if (inputs == Inputs::kUnwritable) {
      key_inputs.unwritable_reason = "LIBTPU_INIT_ARGS changed";
    }
    return key_inputs;
  }
};

}  // namespace runtime

namespace {
#include "persistent_cache_key.inc"
}  // namespace

}  // namespace torch_xla

namespace {

using check_report::failures;
using check_report::Report;
using torch_xla::runtime::ComputationClient;

int64_t Counter(const std::string& name) {
  torch::lazy::CounterData* counter = torch::lazy::GetCounter(name);
  return counter == nullptr ? 0 : counter->Value();
}

struct Keyed {
  std::optional<std::string> key;
  bool writable = false;
  std::string threw;
};

Keyed KeyOf(const std::string& module, ComputationClient::Inputs inputs) {
  ComputationClient client;
  client.inputs = inputs;
  ComputationClient::CompileInstance instance;
  instance.computation.module.text = module;
  Keyed keyed;
  try {
    keyed.key = torch_xla::PersistentCacheKey(&client, instance,
                                              &keyed.writable);
  } catch (const std::exception& error) {
    keyed.threw = error.what();
  }
  return keyed;
}

// Each way keying can fail: no key, counted, nothing thrown.
std::string KeyingFailureSkipsTheCacheCounted() {
  for (const auto& [module, inputs, what] :
       {std::make_tuple("unparsable", ComputationClient::Inputs::kGood,
                        "a module that cannot be rebuilt from its proto"),
        std::make_tuple("HloModule m", ComputationClient::Inputs::kError,
                        "key inputs that are an error"),
        std::make_tuple("HloModule m", ComputationClient::Inputs::kThrow,
                        "key inputs that throw")}) {
    const int64_t before = Counter("PersistentCacheKeyFailure");
    Keyed keyed = KeyOf(module, inputs);
    if (!keyed.threw.empty()) {
      return std::string(what) + " throws out of the compile: " + keyed.threw;
    }
    if (keyed.key.has_value()) return std::string(what) + " still give a key";
    if (Counter("PersistentCacheKeyFailure") != before + 1) {
      return std::string(what) + " is not counted as PersistentCacheKeyFailure";
    }
  }
  return "";
}

// A good graph has a key (the disk key: 64 hex digits), and may be written.
std::string GoodGraphIsKeyedAndWritable() {
  Keyed keyed = KeyOf("HloModule m\nbody", ComputationClient::Inputs::kGood);
  if (!keyed.threw.empty()) return "keying threw: " + keyed.threw;
  if (!keyed.key.has_value()) return "a good graph has no key";
  if (!keyed.writable) return "a good graph's entry may not be written";
  if (keyed.key->size() != 64 ||
      keyed.key->find_first_not_of("0123456789abcdef") != std::string::npos) {
    return "the key is not a SHA-256 in hex: " + *keyed.key;
  }
  if (KeyOf("HloModule m\nother", ComputationClient::Inputs::kGood).key ==
      keyed.key) {
    return "two modules give one key";
  }
  return "";
}

// Flags changed since the client read them: a key (loads stay possible), no
// write, counted.
std::string ChangedFlagsAreKeyedButNotWritten() {
  const int64_t before = Counter("PersistentCacheFlagsChanged");
  Keyed keyed = KeyOf("HloModule m", ComputationClient::Inputs::kUnwritable);
  if (!keyed.threw.empty()) return "keying threw: " + keyed.threw;
  if (!keyed.key.has_value()) return "no key";
  if (keyed.writable) return "an entry may be written";
  if (Counter("PersistentCacheFlagsChanged") != before + 1) {
    return "not counted as PersistentCacheFlagsChanged";
  }
  return "";
}

}  // namespace

int main() {
  Report("keying_failure_skips_the_cache_counted",
         KeyingFailureSkipsTheCacheCounted());
  Report("good_graph_is_keyed_and_writable", GoodGraphIsKeyedAndWritable());
  Report("changed_flags_are_keyed_but_not_written",
         ChangedFlagsAreKeyedButNotWritten());
  return failures;
}
