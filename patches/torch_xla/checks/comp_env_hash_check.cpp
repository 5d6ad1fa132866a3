// Behaviour check of the compilation-environment hash (patch 0003): the
// in-memory cache's share of the key (HashCompilationEnv) and the platform and
// devices part of the persistent cache key (describe_runtime), built from a
// pytorch/xla tree:
//   - describe_runtime, hash_comp_env, PjRtComputationClient::
//     HashCompilationEnv and SetCustomCompileOptions are copied verbatim, at check time, out of the
//     tree's pjrt_computation_client.cpp into .inc files, and that file's
//     standard-library #include lines into std_includes.inc (so a missing
//     include in the patch fails here too);
//   - the data members those functions use are copied verbatim out of the
//     tree's pjrt_computation_client.h (client_members.inc): a member the
//     header lacks is left out and the compile names it;
//   - env_hash.cpp and sys_util.cpp are compiled as they are in the tree;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu);
//   - the PJRT client, devices and topology are stand-ins
//     (stand_ins/pjrt_stand_ins.h).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures. Run with --race-setter-and-key (built with -fsanitize=thread, program
// custom_options_race_check) it only judges whether SetCustomCompileOptions and
// HashCompilationEnv share a lock.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include <torch/csrc/lazy/core/hash.h>

#include "check_report.h"
#include "stand_ins/pjrt_stand_ins.h"
#include "std_includes.inc"

#include "torch_xla/csrc/runtime/env_hash.h"

namespace torch_xla {
namespace runtime {
namespace {
#include "describe_runtime.inc"
#include "hash_comp_env.inc"
}  // namespace

// The declarations come from the tree's headers (the base's virtual
// SetCustomCompileOptions, the override and the data members); the functions
// from its source.
class ComputationClient {
 public:
  virtual ~ComputationClient() = default;
#include "computation_client_members.inc"
};

class PjRtComputationClient : public ComputationClient {
 public:
  torch::lazy::hash_t HashCompilationEnv();
#include "client_members.inc"
};

#include "hash_compilation_env.inc"
#include "set_custom_compile_options.inc"

}  // namespace runtime
}  // namespace torch_xla

namespace {

using torch_xla::runtime::hash_comp_env;
using torch_xla::runtime::PjRtComputationClient;

using check_report::failures;
using check_report::Report;

class FakeTopology : public xla::PjRtTopologyDescription {
 public:
  absl::StatusOr<std::string> Serialize() const override { return "v6e:2x2"; }
};

class FakeDevice : public xla::PjRtDevice {
 public:
  FakeDevice(int id, int process_index, std::string kind = "TPU v6 lite")
      : id_(id),
        process_index_(process_index),
        name_("TPU_" + std::to_string(id)),
        kind_(std::move(kind)) {}
  int id() const override { return id_; }
  int process_index() const override { return process_index_; }
  absl::string_view ToString() const override { return name_; }
  absl::string_view device_kind() const override { return kind_; }

 private:
  int id_;
  int process_index_;
  std::string name_;
  std::string kind_;
};

class FakeClient : public xla::PjRtClient {
 public:
  FakeClient(std::string version, bool has_topology)
      : version_(std::move(version)), has_topology_(has_topology) {}
  absl::string_view platform_name() const override { return "tpu"; }
  absl::string_view platform_version() const override { return version_; }
  absl::StatusOr<const xla::PjRtTopologyDescription*> GetTopologyDescription()
      const override {
    if (!has_topology_) return absl::UnimplementedError("no topology");
    return &topology_;
  }

 private:
  std::string version_;
  bool has_topology_;
  FakeTopology topology_;
};

// (device id, process index) in the client's order.
using Layout = std::vector<std::pair<int, int>>;

torch::lazy::hash_t EnvHash(const std::string& version, bool has_topology,
                            const Layout& layout = {{0, 0}},
                            const std::string& kind = "TPU v6 lite") {
  FakeClient client(version, has_topology);
  std::vector<FakeDevice> devices;
  for (const auto& [id, process] : layout) {
    devices.emplace_back(id, process, kind);
  }
  std::vector<xla::PjRtDevice*> ordered;
  for (auto& device : devices) ordered.push_back(&device);
  return hash_comp_env(&client, ordered);
}

torch::lazy::hash_t KeyWith(
    const std::unordered_map<std::string, std::string>& options) {
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  client.SetCustomCompileOptions(options);
  return client.HashCompilationEnv();
}

std::string PlatformVersionInBothBranches() {
  for (bool has_topology : {true, false}) {
    if (EnvHash("libtpu 0.0.36", has_topology) ==
        EnvHash("libtpu 0.0.37", has_topology)) {
      return std::string("two libtpu versions give one key when the client ") +
             (has_topology ? "has" : "has no") + " topology description";
    }
  }
  return "";
}

std::string DevicesInBothBranches() {
  for (bool has_topology : {true, false}) {
    std::string branch =
        has_topology ? " with a topology description" : " without topology";
    if (EnvHash("v", has_topology, {{0, 0}}) ==
        EnvHash("v", has_topology, {{0, 0}, {1, 0}})) {
      return "one device and two devices give one key" + branch;
    }
    if (EnvHash("v", has_topology, {{0, 0}, {1, 0}}) ==
        EnvHash("v", has_topology, {{1, 0}, {0, 0}})) {
      return "the order of the device ids is not in the key" + branch;
    }
    if (EnvHash("v", has_topology, {{0, 0}, {1, 0}}) ==
        EnvHash("v", has_topology, {{0, 0}, {1, 1}})) {
      return "one process and two processes give one key" + branch;
    }
    if (EnvHash("v", has_topology, {{0, 0}}, "TPU v6 lite") ==
        EnvHash("v", has_topology, {{0, 0}}, "TPU v5 lite")) {
      return "two device kinds give one key" + branch;
    }
  }
  return "";
}

std::string CustomOptionsChangeTheKey() {
  if (KeyWith({}) == KeyWith({{"xla_tpu_enable_foo", "true"}})) {
    return "setting a custom option leaves the key unchanged";
  }
  if (KeyWith({{"xla_tpu_enable_foo", "true"}}) ==
      KeyWith({{"xla_tpu_enable_foo", "false"}})) {
    return "changing a custom option's value leaves the key unchanged";
  }
  if (KeyWith({{"a", "bc"}}) == KeyWith({{"ab", "c"}})) {
    return "name/value boundaries are not part of the key";
  }
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  client.SetCustomCompileOptions({{"xla_tpu_enable_foo", "true"}});
  client.SetCustomCompileOptions({});
  if (client.HashCompilationEnv() != KeyWith({})) {
    return "clearing the options does not bring back the key without them";
  }
  return "";
}

// The same options, held in maps whose iteration orders differ, give one key.
std::string CustomOptionsAreHashedInSortedOrder() {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int i = 0; i < 12; ++i) {
    pairs.push_back({"xla_option_" + std::to_string(i), std::to_string(i)});
  }
  std::unordered_map<std::string, std::string> forward(pairs.begin(),
                                                       pairs.end());
  for (size_t buckets : {1, 7, 64, 1024}) {
    std::unordered_map<std::string, std::string> other(buckets);
    for (auto it = pairs.rbegin(); it != pairs.rend(); ++it) other.insert(*it);
    if (std::equal(forward.begin(), forward.end(), other.begin())) continue;
    if (KeyWith(forward) != KeyWith(other)) {
      return "the key depends on the map's iteration order";
    }
    return "";
  }
  return "could not build two maps with different iteration orders";
}

// LIBTPU_INIT_ARGS carries libtpu's own flags next to XLA's.
std::string LibtpuFlagsChangeTheKey() {
  for (const char* flag :
       {"--megascale_grpc_premap_memory_bytes=17179869184",
        "--tpu_use_continuations=true", "-xla_tpu_enable_foo=true"}) {
    ::unsetenv("LIBTPU_INIT_ARGS");
    torch::lazy::hash_t without = EnvHash("v", true);
    ::setenv("LIBTPU_INIT_ARGS", flag, 1);
    torch::lazy::hash_t with = EnvHash("v", true);
    ::unsetenv("LIBTPU_INIT_ARGS");
    if (with == without) {
      return std::string("LIBTPU_INIT_ARGS=") + flag + " leaves the key as is";
    }
  }
  // The dump flags stay out of the key, in either spelling.
  ::setenv("LIBTPU_INIT_ARGS", "--tpu_use_continuations=true", 1);
  torch::lazy::hash_t plain = EnvHash("v", true);
  ::setenv("LIBTPU_INIT_ARGS",
           "-xla_dump_to=/tmp/a --tpu_use_continuations=true  --xla_dump_to=b",
           1);
  torch::lazy::hash_t dumping = EnvHash("v", true);
  ::unsetenv("LIBTPU_INIT_ARGS");
  if (plain != dumping) return "a dump flag changes the key";
  return "";
}

// Compile() reads these at every compile, so the in-memory index must follow
// them after the client exists (comp_env_hash_ is taken once, at creation).
std::string PerCompileSwitchesChangeTheKey() {
  for (const auto& [name, value] :
       std::vector<std::pair<const char*, const char*>>{
           {"XLA_STABLEHLO_COMPILE", "1"},
           {"CONVERT_SHLO_TO_SHARDY", "1"}}) {
    ::unsetenv(name);
    PjRtComputationClient client;
    client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
    client.SetCustomCompileOptions({});
    torch::lazy::hash_t off = client.HashCompilationEnv();
    ::setenv(name, value, 1);
    torch::lazy::hash_t on = client.HashCompilationEnv();
    ::unsetenv(name);
    if (off == on) {
      return std::string(name) + "=" + value +
             " set after client creation leaves the key as is";
    }
  }
  return "";
}

// Hashed as torch_xla reads them: "1" and "true" are one setting.
std::string SwitchesAreHashedAsRead() {
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  client.SetCustomCompileOptions({});
  ::setenv("XLA_STABLEHLO_COMPILE", "1", 1);
  torch::lazy::hash_t one = client.HashCompilationEnv();
  ::setenv("XLA_STABLEHLO_COMPILE", "true", 1);
  torch::lazy::hash_t word = client.HashCompilationEnv();
  ::unsetenv("XLA_STABLEHLO_COMPILE");
  if (one != word) return "XLA_STABLEHLO_COMPILE=1 and =true give two keys";
  return "";
}

// Logging flags change what is logged, not the executable: a debugging run
// must not start cold.
std::string LoggingFlagsStayOutOfTheKey() {
  for (const char* variable : {"XLA_FLAGS", "LIBTPU_INIT_ARGS"}) {
    ::setenv(variable, "--xla_foo=1", 1);
    torch::lazy::hash_t plain = EnvHash("v", true);
    ::setenv(variable,
             "--v=3 --vmodule=pjrt_computation_client=5 --xla_foo=1 "
             "--log_dir=/tmp/logs --logtostderr --alsologtostderr "
             "--stderrthreshold=0 --minloglevel=1 -v=2",
             1);
    torch::lazy::hash_t logging = EnvHash("v", true);
    ::unsetenv(variable);
    if (plain != logging) {
      return std::string("a logging flag in ") + variable +
             " changes the key";
    }
  }
  return "";
}

#if defined(__SANITIZE_THREAD__)
int tsan_reports = 0;
// ThreadSanitizer calls this for every report: the race check counts them, and
// its verdict and exit status stay this program's own (exitcode=0 below).
extern "C" void __tsan_on_report(void*) { ++tsan_reports; }
extern "C" const char* __tsan_default_options() { return "exitcode=0"; }
#endif

// SetCustomCompileOptions on one thread while another takes the key, as a
// training step's graph sync may while user code changes the options. Only a
// -fsanitize=thread build can judge it: it reports unguarded access.
std::string SetterAndKeyShareALock() {
#if defined(__SANITIZE_THREAD__)
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  client.SetCustomCompileOptions({});
  std::thread setter([&client] {
    for (int i = 0; i < 2000; ++i) {
      client.SetCustomCompileOptions(
          {{"xla_option_a", std::to_string(i)}, {"xla_option_b", "x"}});
    }
  });
  for (int i = 0; i < 2000; ++i) client.HashCompilationEnv();
  setter.join();
  if (tsan_reports > 0) {
    return "ThreadSanitizer reported " + std::to_string(tsan_reports) +
           " data race(s) between SetCustomCompileOptions and "
           "HashCompilationEnv";
  }
  return "";
#else
  return "not built with -fsanitize=thread: the race cannot be judged";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--race-setter-and-key") {
    Report("setter_and_key_share_a_lock", SetterAndKeyShareALock());
    return failures;
  }
  Report("platform_version_in_both_branches", PlatformVersionInBothBranches());
  Report("devices_in_both_branches", DevicesInBothBranches());
  Report("custom_options_change_the_key", CustomOptionsChangeTheKey());
  Report("custom_options_are_hashed_in_sorted_order",
         CustomOptionsAreHashedInSortedOrder());
  Report("libtpu_flags_change_the_key", LibtpuFlagsChangeTheKey());
  Report("per_compile_switches_change_the_key",
         PerCompileSwitchesChangeTheKey());
  Report("switches_are_hashed_as_read", SwitchesAreHashedAsRead());
  Report("logging_flags_stay_out_of_the_key", LoggingFlagsStayOutOfTheKey());
  return failures;
}
