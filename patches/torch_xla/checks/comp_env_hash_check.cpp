// Behaviour check of the compilation-environment hash that keys torch_xla's
// persistent cache (patch 0003), built by tests/test_torch_xla_patches.py from
// a patched pytorch/xla checkout:
//   - hash_comp_env and PjRtComputationClient::HashCompilationEnv are copied
//     verbatim, at test time, out of the patched pjrt_computation_client.cpp
//     into hash_comp_env.inc and hash_compilation_env.inc, and that file's
//     standard-library #include lines into std_includes.inc (so a missing
//     include in the patch fails here too);
//   - env_hash.cpp and sys_util.cpp are compiled as they are in the checkout;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu);
//   - the PJRT client is a stand-in (stand_ins/pjrt_stand_ins.h).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/csrc/lazy/core/hash.h>

#include "stand_ins/pjrt_stand_ins.h"
#include "std_includes.inc"

#include "torch_xla/csrc/runtime/env_hash.h"

namespace torch_xla {
namespace runtime {
namespace {
#include "hash_comp_env.inc"
}  // namespace

// Only the members HashCompilationEnv reads, with their types at c04e61c.
class PjRtComputationClient {
 public:
  torch::lazy::hash_t HashCompilationEnv();
  torch::lazy::hash_t comp_env_hash_;
  std::unordered_map<std::string, std::string> custom_compile_options_;
};

#include "hash_compilation_env.inc"

}  // namespace runtime
}  // namespace torch_xla

namespace {

using torch_xla::runtime::hash_comp_env;
using torch_xla::runtime::PjRtComputationClient;

int failures = 0;

void Report(const std::string& name, const std::string& why) {
  std::cout << (why.empty() ? "PASS " : "FAIL ") << name
            << (why.empty() ? "" : ": " + why) << std::endl;
  if (!why.empty()) ++failures;
}

class FakeTopology : public xla::PjRtTopologyDescription {
 public:
  absl::StatusOr<std::string> Serialize() const override { return "v6e:2x2"; }
};

class FakeDevice : public xla::PjRtDevice {
 public:
  absl::string_view ToString() const override { return "TPU_0"; }
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

torch::lazy::hash_t EnvHash(const std::string& version, bool has_topology) {
  FakeClient client(version, has_topology);
  FakeDevice device;
  std::vector<xla::PjRtDevice*> devices = {&device};
  return hash_comp_env(&client, devices);
}

torch::lazy::hash_t KeyWith(
    const std::unordered_map<std::string, std::string>& options) {
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  client.custom_compile_options_ = options;
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

std::string NoCustomOptionsKeepsTheEnvironmentHash() {
  PjRtComputationClient client;
  client.comp_env_hash_ = EnvHash("libtpu 0.0.36", true);
  if (client.HashCompilationEnv() != client.comp_env_hash_) {
    return "without custom options the key differs from comp_env_hash_";
  }
  return "";
}

std::string CollectiveMatmulSwitchChangesTheKey() {
  ::unsetenv("ENABLE_COLLECTIVE_MATMUL_IN_MP");
  torch::lazy::hash_t off = EnvHash("libtpu 0.0.36", true);
  ::setenv("ENABLE_COLLECTIVE_MATMUL_IN_MP", "1", 1);
  torch::lazy::hash_t on = EnvHash("libtpu 0.0.36", true);
  ::unsetenv("ENABLE_COLLECTIVE_MATMUL_IN_MP");
  if (off == on) return "ENABLE_COLLECTIVE_MATMUL_IN_MP=1 leaves the key as is";
  return "";
}

}  // namespace

int main() {
  Report("platform_version_in_both_branches", PlatformVersionInBothBranches());
  Report("custom_options_change_the_key", CustomOptionsChangeTheKey());
  Report("custom_options_are_hashed_in_sorted_order",
         CustomOptionsAreHashedInSortedOrder());
  Report("no_custom_options_keeps_the_environment_hash",
         NoCustomOptionsKeepsTheEnvironmentHash());
  Report("collective_matmul_switch_changes_the_key",
         CollectiveMatmulSwitchChangesTheKey());
  return failures;
}
