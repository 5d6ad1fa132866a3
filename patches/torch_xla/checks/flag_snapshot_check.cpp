// Behaviour check of the flag parts of the persistent cache key (patch 0003),
// built from a pytorch/xla tree:
//   - PjRtComputationClient::PersistentCacheKeyInputs, DebugOptionsKey and
//     ClearDebugOptionsOutsideKey are copied verbatim, at check time, out of
//     the tree's pjrt_computation_client.cpp, and the data members they use
//     out of its pjrt_computation_client.h: a tree without them fails to
//     build, naming them;
//   - env_hash.cpp (FlagSnapshot, ParseFlagsLikeXla, IsDebugOptionOutsideKey)
//     and sys_util.cpp are compiled as they are in the tree;
//   - xla::DebugOptions with its protobuf descriptor and reflection,
//     xla::MakeDebugOptionsFlags, tsl::Flag and tsl::Flags::Parse, and the
//     CompileOptions are stand-ins below, written to the semantics of the real
//     ones (tsl::Flags::Parse on a vector: recognized flags applied and
//     removed, unknown ones left in the vector, false when a recognized flag's
//     value does not parse). xla::GetDebugOptionsFromFlags() aborts, as the
//     real one does on a flag this XLA does not know
//     (ParseFlagsFromEnvAndDieIfUnknown): the key must never call it.
//
// Not covered here: that PjRtComputationClient::Initialize takes the snapshot
// right after the plugin starts (it is read, not run), and the real protobuf
// descriptor of DebugOptions (series-compile compiles the code against the
// real headers).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "check_report.h"
#include "std_includes.inc"
#include "torch_xla/csrc/runtime/cache_key.h"
#include "torch_xla/csrc/runtime/env_hash.h"

namespace xla {
class DebugOptions;
}  // namespace xla

namespace google {
namespace protobuf {

class FieldDescriptor {
 public:
  explicit FieldDescriptor(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

class Descriptor {
 public:
  explicit Descriptor(const std::vector<std::string>& names) {
    for (const std::string& name : names) fields_.emplace_back(name);
  }
  int field_count() const { return static_cast<int>(fields_.size()); }
  const FieldDescriptor* field(int i) const { return &fields_[i]; }

 private:
  std::vector<FieldDescriptor> fields_;
};

class Reflection {
 public:
  void ClearField(xla::DebugOptions* message,
                  const FieldDescriptor* field) const;
};

}  // namespace protobuf
}  // namespace google

namespace xla {

// The fields of the stand-in DebugOptions: some that change the executable,
// the dump fields the series' earlier hand list missed, one that XLA has not
// added yet, and JAX's other cleared fields.
const std::vector<std::string> kDebugFields = {
    "xla_backend_optimization_level",
    "xla_cpu_enable_fast_math",
    "xla_dump_to",
    "xla_dump_hlo_as_text",
    "xla_dump_include_timestamp",
    "xla_dump_large_constants",
    "xla_dump_hlo_unoptimized_snapshots",
    "xla_dump_a_field_added_next_year",
    "xla_force_host_platform_device_count",
    "xla_gpu_cuda_data_dir",
    "xla_gpu_per_fusion_autotune_cache_dir",
    "xla_gpu_experimental_autotune_cache_mode",
};

class DebugOptions {
 public:
  std::map<std::string, std::string> values;
  const google::protobuf::Descriptor* GetDescriptor() const {
    static const google::protobuf::Descriptor descriptor(kDebugFields);
    return &descriptor;
  }
  const google::protobuf::Reflection* GetReflection() const {
    static const google::protobuf::Reflection reflection;
    return &reflection;
  }
};

DebugOptions DefaultDebugOptionsIgnoringFlags() {
  DebugOptions options;
  options.values["xla_backend_optimization_level"] = "3";
  return options;
}

[[noreturn]] DebugOptions GetDebugOptionsFromFlags() {
  std::cout << "FAIL key_never_calls_get_debug_options_from_flags: "
               "xla::GetDebugOptionsFromFlags() was called (it stops the "
               "process on an unknown flag)"
            << std::endl;
  std::abort();
}

// What the key serializes of the compile options (one field is enough).
struct CompileOptionsProto {
  std::string text;
};

struct CompileOptions {
  bool fail_to_proto = false;
  absl::StatusOr<CompileOptionsProto> ToProto() const {
    if (fail_to_proto) return absl::InvalidArgumentError("cannot ToProto");
    return CompileOptionsProto{"options"};
  }
};

}  // namespace xla

void google::protobuf::Reflection::ClearField(
    xla::DebugOptions* message, const FieldDescriptor* field) const {
  message->values.erase(field->name());
}

namespace tsl {

struct Flag {
  std::string name;
  std::function<bool(std::string)> setter;
};

struct Flags {
  static bool Parse(std::vector<std::string>& flags,
                    const std::vector<Flag>& flag_list) {
    bool ok = true;
    std::vector<std::string> unknown;
    for (const std::string& arg : flags) {
      std::string body = arg.substr(arg.find_first_not_of('-'));
      std::string name = body.substr(0, body.find('='));
      std::string value =
          body.find('=') == std::string::npos ? "true" : body.substr(
                                                            body.find('=') + 1);
      bool found = false;
      for (const Flag& flag : flag_list) {
        if (flag.name == name) {
          found = true;
          ok = flag.setter(value) && ok;
        }
      }
      if (!found) unknown.push_back(arg);
    }
    flags = unknown;
    return ok;
  }
};

inline bool SerializeToStringDeterministic(const xla::DebugOptions& options,
                                           std::string* out) {
  out->clear();
  for (const auto& [name, value] : options.values) {
    *out += name + "=" + value + ";";
  }
  return true;
}

inline bool SerializeToStringDeterministic(
    const xla::CompileOptionsProto& options, std::string* out) {
  *out = options.text;
  return true;
}

}  // namespace tsl

namespace xla {

// Flags that write to `debug_options`; "bad" is a value no flag parses.
void MakeDebugOptionsFlags(std::vector<tsl::Flag>* flag_list,
                           DebugOptions* debug_options) {
  for (const std::string& name : kDebugFields) {
    flag_list->push_back({name, [debug_options, name](std::string value) {
                            if (value == "bad") return false;
                            debug_options->values[name] = value;
                            return true;
                          }});
  }
}

}  // namespace xla

namespace torch_xla {
namespace runtime {
namespace {
#include "clear_debug_options_outside_key.inc"
#include "debug_options_key.inc"
}  // namespace

class PjRtComputationClient {
 public:
  struct CompileInstance {};
  absl::StatusOr<cache_key::DiskKeyInputs> PersistentCacheKeyInputs(
      const CompileInstance& instance);
  xla::CompileOptions BuildCompileOptions(const CompileInstance&) {
    xla::CompileOptions options;
    options.fail_to_proto = fail_to_proto;
    return options;
  }
  bool fail_to_proto = false;
#include "flag_client_members.inc"
};

#include "persistent_cache_key_inputs.inc"

}  // namespace runtime
}  // namespace torch_xla

namespace {

using check_report::failures;
using check_report::Report;
using torch_xla::runtime::DebugOptionsKey;
using torch_xla::runtime::PjRtComputationClient;
namespace hash = torch_xla::runtime::hash;

const char* const kVariables[] = {"XLA_FLAGS", "LIBTPU_INIT_ARGS",
                                  "TPU_MEGACORE"};

void Set(const char* variable, const std::string& value) {
  ::setenv(variable, value.c_str(), 1);
}

// A client as Initialize() leaves it: the snapshot taken, XLA_FLAGS parsed.
void Create(PjRtComputationClient* client) {
  client->flag_snapshot_ = hash::FlagSnapshot::Take();
  client->debug_options_key_ =
      DebugOptionsKey(client->flag_snapshot_.values.at("XLA_FLAGS"));
  client->runtime_description_ = "platform=tpu\n";
}

std::string KeyPart(const torch_xla::runtime::cache_key::DiskKeyInputs& in) {
  return in.compile_options + "|" + in.debug_options + "|" + in.xla_flags +
         "|" + in.libtpu_init_args + "|" + in.compile_switches + "|" +
         in.runtime;
}

// libtpu reads the three variables once, at plugin start: the key must hold
// what the client saw then, not what the environment says at a later
// compile.
std::string KeyHoldsTheFlagsAtClientCreation() {
  Set("XLA_FLAGS", "--xla_cpu_enable_fast_math=true");
  Set("LIBTPU_INIT_ARGS", "--xla_tpu_a=1");
  Set("TPU_MEGACORE", "megacore_dense");
  PjRtComputationClient client;
  Create(&client);
  absl::StatusOr<torch_xla::runtime::cache_key::DiskKeyInputs> before =
      client.PersistentCacheKeyInputs({});
  Set("XLA_FLAGS", "--xla_cpu_enable_fast_math=false");
  Set("LIBTPU_INIT_ARGS", "--xla_tpu_a=2");
  Set("TPU_MEGACORE", "megacore");
  absl::StatusOr<torch_xla::runtime::cache_key::DiskKeyInputs> after =
      client.PersistentCacheKeyInputs({});
  if (!before.ok() || !after.ok()) return "the key inputs are an error";
  if (!before->unwritable_reason.empty()) {
    return "an unchanged environment writes no entry: " +
           before->unwritable_reason;
  }
  if (KeyPart(*before) != KeyPart(*after)) {
    return "the key follows the environment of the compile, not the flags "
           "the client was created with";
  }
  if (before->libtpu_init_args.find("--xla_tpu_a=1") == std::string::npos ||
      before->compile_switches.find("megacore_dense") == std::string::npos ||
      before->debug_options.find("xla_cpu_enable_fast_math=true") ==
          std::string::npos) {
    return "the key does not hold the flags of the client's creation";
  }
  return "";
}

// Changed since the client was created: no entry is written, and the reason
// names the variable (and only it).
std::string ChangedFlagsWriteNoEntryNamingTheVariable() {
  Set("XLA_FLAGS", "");
  Set("LIBTPU_INIT_ARGS", "--xla_tpu_a=1");
  Set("TPU_MEGACORE", "");
  PjRtComputationClient client;
  Create(&client);
  Set("LIBTPU_INIT_ARGS", "--xla_tpu_a=2");
  absl::StatusOr<torch_xla::runtime::cache_key::DiskKeyInputs> changed =
      client.PersistentCacheKeyInputs({});
  Set("LIBTPU_INIT_ARGS", "--xla_tpu_a=1");
  absl::StatusOr<torch_xla::runtime::cache_key::DiskKeyInputs> restored =
      client.PersistentCacheKeyInputs({});
  if (!changed.ok() || !restored.ok()) return "the key inputs are an error";
  if (changed->unwritable_reason.find("LIBTPU_INIT_ARGS") ==
      std::string::npos) {
    return "a LIBTPU_INIT_ARGS changed after client creation still writes "
           "entries (reason: '" +
           changed->unwritable_reason + "')";
  }
  if (changed->unwritable_reason.find("XLA_FLAGS") != std::string::npos ||
      changed->unwritable_reason.find("TPU_MEGACORE") != std::string::npos) {
    return "the reason names variables that did not change: " +
           changed->unwritable_reason;
  }
  if (!restored->unwritable_reason.empty()) {
    return "the value of the client's creation set again writes no entry";
  }
  return "";
}

// On TPU, XLA_FLAGS may carry flags only libtpu's XLA knows: the key must
// not stop the process (GetDebugOptionsFromFlags would), and the flags this
// XLA knows are still in the debug options.
std::string UnknownXlaFlagDoesNotStopTheProcess() {
  Set("XLA_FLAGS",
      "--xla_cpu_enable_fast_math=true --xla_tpu_flag_this_xla_lacks=1");
  PjRtComputationClient client;
  Create(&client);
  absl::StatusOr<torch_xla::runtime::cache_key::DiskKeyInputs> inputs =
      client.PersistentCacheKeyInputs({});
  if (!inputs.ok()) {
    return "an unknown flag makes the key an error: " +
           std::string(inputs.status().message());
  }
  if (inputs->debug_options.find("xla_cpu_enable_fast_math=true") ==
      std::string::npos) {
    return "the known flag is not in the debug options";
  }
  if (inputs->xla_flags.find("--xla_tpu_flag_this_xla_lacks=1") ==
      std::string::npos) {
    return "the unknown flag is in no part of the key";
  }
  return "";
}

// A flag file that cannot be read or a value XLA's parser rejects: the key
// is an error (the caller compiles without the persistent cache), not an
// abort and not a key without the flag.
std::string UnparsableXlaFlagsTurnTheCacheOff() {
  for (const char* value : {"--xla_backend_optimization_level=bad",
                            "/nonexistent/flag_snapshot_check.flags"}) {
    Set("XLA_FLAGS", value);
    PjRtComputationClient client;
    Create(&client);
    if (client.debug_options_key_.ok()) {
      return std::string("XLA_FLAGS=") + value + " parses";
    }
    if (client.PersistentCacheKeyInputs({}).ok()) {
      return std::string("XLA_FLAGS=") + value + " still gives a key";
    }
  }
  return "";
}

// Every xla_dump_* field of the descriptor is cleared, including the ones a
// hand list missed and one XLA adds later, and so are JAX's other fields; the
// fields that change the executable stay.
std::string EveryDumpFieldIsCleared() {
  xla::DebugOptions options;
  for (const std::string& name : xla::kDebugFields) options.values[name] = "1";
  torch_xla::runtime::ClearDebugOptionsOutsideKey(&options);
  std::map<std::string, std::string> expected = {
      {"xla_backend_optimization_level", "1"},
      {"xla_cpu_enable_fast_math", "1"}};
  if (options.values != expected) {
    std::string kept;
    for (const auto& [name, value] : options.values) kept += name + " ";
    return "kept after clearing: " + kept;
  }
  return "";
}

// A failure to serialize the options is an error the caller can skip, not an
// exception out of the compile.
std::string OptionsFailureIsAnError() {
  Set("XLA_FLAGS", "");
  PjRtComputationClient client;
  Create(&client);
  client.fail_to_proto = true;
  if (client.PersistentCacheKeyInputs({}).ok()) {
    return "a failing CompileOptions::ToProto still gives a key";
  }
  return "";
}

void Run(const std::string& name, const std::function<std::string()>& check) {
  try {
    Report(name, check());
  } catch (const std::exception& error) {
    Report(name, std::string("threw: ") + error.what());
  }
  for (const char* variable : kVariables) ::unsetenv(variable);
}

}  // namespace

int main() {
  for (const char* variable : kVariables) ::unsetenv(variable);
  Run("key_holds_the_flags_at_client_creation",
      KeyHoldsTheFlagsAtClientCreation);
  Run("changed_flags_write_no_entry_naming_the_variable",
      ChangedFlagsWriteNoEntryNamingTheVariable);
  Run("unknown_xla_flag_does_not_stop_the_process",
      UnknownXlaFlagDoesNotStopTheProcess);
  Run("unparsable_xla_flags_turn_the_cache_off",
      UnparsableXlaFlagsTurnTheCacheOff);
  Run("every_dump_field_is_cleared", EveryDumpFieldIsCleared);
  Run("options_failure_is_an_error", OptionsFailureIsAnError);
  return failures;
}
