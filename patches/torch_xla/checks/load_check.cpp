// Behaviour check of PjRtComputationClient::DeserializeComputation (patch
// 0001), the function that loads a persistent-cache entry:
//   - the function is copied verbatim, at check time, out of the tree's
//     pjrt_computation_client.cpp into deserialize_computation.inc;
//   - the PJRT client is a fake (stand_ins/pjrt_stand_ins.h declares the
//     OpenXLA types) whose LoadSerializedExecutable, DeserializeExecutable and
//     Load answer what each case needs: OK, UNIMPLEMENTED (the PJRT C API and
//     CPU clients' DeserializeExecutable), INVALID_ARGUMENT (the StreamExecutor
//     client's LoadSerializedExecutable without CompileOptions);
//   - torch_xla's TF_LOG and XLA_CHECK are small stand-ins that record the
//     warning text and throw on a failed check.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures. An exception escaping the function is a failure:
// a cache entry that cannot be loaded must cost a recompile, not the run.

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "check_report.h"
#include "stand_ins/pjrt_stand_ins.h"

namespace load_check {

std::ostringstream warnings;

std::ostream& Log(const char* severity) {
  warnings << "\n" << severity << ": ";
  return warnings;
}

// XLA_CHECK(cond) << message: throws when the condition is false.
class CheckStream {
 public:
  explicit CheckStream(bool ok) : ok_(ok) {}
  ~CheckStream() noexcept(false) {
    if (!ok_) throw std::runtime_error("XLA_CHECK failed: " + message_.str());
  }
  template <typename T>
  CheckStream& operator<<(const T& value) {
    message_ << value;
    return *this;
  }

 private:
  bool ok_;
  std::ostringstream message_;
};

}  // namespace load_check

#define TF_LOG(severity) ::load_check::Log(#severity)
#define XLA_CHECK(condition) ::load_check::CheckStream(condition)

namespace torch_xla {

bool UseVirtualDevice(bool force_spmd = false) { return false; }

namespace runtime {

// Only what DeserializeComputation uses, with its types at c04e61c.
class ComputationClient {
 public:
  struct Computation {
    Computation(xla::XlaComputation computation,
                std::vector<std::string> devices)
        : computation(std::move(computation)), devices(std::move(devices)) {}
    virtual ~Computation() = default;
    xla::XlaComputation computation;
    std::vector<std::string> devices;
  };
  using ComputationPtr = std::shared_ptr<Computation>;
  static constexpr auto spmd_device_str = "SPMD:0";
};

class PjRtComputationClient : public ComputationClient {
 public:
  struct PjRtComputation : public Computation {
    PjRtComputation(xla::XlaComputation computation,
                    std::vector<std::string> devices,
                    std::unique_ptr<xla::PjRtLoadedExecutable> executable)
        : Computation(std::move(computation), std::move(devices)),
          executable(std::move(executable)) {}
    std::unique_ptr<xla::PjRtLoadedExecutable> executable;
  };

  ComputationPtr DeserializeComputation(const std::string& serialized);
  std::string GetDefaultDevice() const { return "CPU:0"; }

  std::unique_ptr<xla::PjRtClient> client_;
};

#include "deserialize_computation.inc"

}  // namespace runtime
}  // namespace torch_xla

namespace {

using torch_xla::runtime::PjRtComputationClient;

using check_report::failures;
using check_report::Report;

class FakeDevice : public xla::PjRtDevice {
 public:
  explicit FakeDevice(int id) : id_(id), name_("TPU:" + std::to_string(id)) {}
  int id() const override { return id_; }
  int process_index() const override { return 0; }
  absl::string_view ToString() const override { return name_; }

 private:
  int id_;
  std::string name_;
};

// The devices of the client: four, all local. An executable is compiled for
// all of them (Compile() assigns every device, as replicas or partitions).
std::vector<FakeDevice> kDevices = {FakeDevice(0), FakeDevice(1), FakeDevice(2),
                                    FakeDevice(3)};

std::vector<xla::PjRtDevice*> Devices(int count) {
  std::vector<xla::PjRtDevice*> devices;
  for (int i = 0; i < count; ++i) devices.push_back(&kDevices[i]);
  return devices;
}

// What a loaded executable was compiled for.
struct Assignment {
  int replicas = 4;
  int partitions = 1;
  int addressable = 4;
};

class FakeLoaded : public xla::PjRtLoadedExecutable {
 public:
  FakeLoaded(absl::Status modules_status, Assignment assignment)
      : modules_status_(std::move(modules_status)),
        assignment_(assignment),
        devices_(Devices(assignment.addressable)) {}
  absl::StatusOr<std::vector<std::shared_ptr<xla::HloModule>>> GetHloModules()
      const override {
    if (!modules_status_.ok()) return modules_status_;
    return std::vector<std::shared_ptr<xla::HloModule>>{
        std::make_shared<xla::HloModule>("cached_graph")};
  }
  int num_replicas() const override { return assignment_.replicas; }
  int num_partitions() const override { return assignment_.partitions; }
  absl::Span<xla::PjRtDevice* const> addressable_devices() const override {
    return devices_;
  }

 private:
  absl::Status modules_status_;
  Assignment assignment_;
  std::vector<xla::PjRtDevice*> devices_;
};

// What each of the client's three loading calls answers, and which were made.
struct Answers {
  absl::Status load_serialized;
  absl::Status deserialize;
  absl::Status load;
  absl::Status hlo_modules;
  Assignment assignment = {};
};

class FakeClient : public xla::PjRtClient {
 public:
  explicit FakeClient(Answers answers) : answers_(std::move(answers)) {}
  absl::string_view platform_name() const override { return "fake"; }
  absl::string_view platform_version() const override { return "0"; }
  absl::StatusOr<const xla::PjRtTopologyDescription*> GetTopologyDescription()
      const override {
    return absl::UnimplementedError("no topology");
  }
  int device_count() const override { return 4; }
  absl::Span<xla::PjRtDevice* const> addressable_devices() const override {
    return devices_;
  }
  absl::StatusOr<std::unique_ptr<xla::PjRtLoadedExecutable>>
  LoadSerializedExecutable(absl::string_view serialized,
                           std::optional<xla::CompileOptions> options,
                           const xla::LoadOptions& load_options) override {
    calls.push_back("LoadSerializedExecutable");
    if (!answers_.load_serialized.ok()) return answers_.load_serialized;
    return std::unique_ptr<xla::PjRtLoadedExecutable>(
        new FakeLoaded(answers_.hlo_modules, answers_.assignment));
  }
  absl::StatusOr<std::unique_ptr<xla::PjRtExecutable>> DeserializeExecutable(
      absl::string_view serialized,
      std::optional<xla::CompileOptions> options) override {
    calls.push_back("DeserializeExecutable");
    if (!answers_.deserialize.ok()) return answers_.deserialize;
    return std::make_unique<xla::PjRtExecutable>();
  }
  absl::StatusOr<std::unique_ptr<xla::PjRtLoadedExecutable>> Load(
      std::unique_ptr<xla::PjRtExecutable> executable,
      const xla::LoadOptions& load_options) override {
    calls.push_back("Load");
    if (!answers_.load.ok()) return answers_.load;
    return std::unique_ptr<xla::PjRtLoadedExecutable>(
        new FakeLoaded(answers_.hlo_modules, answers_.assignment));
  }
  std::vector<std::string> calls;

 private:
  Answers answers_;
  std::vector<xla::PjRtDevice*> devices_ = Devices(4);
};

struct Outcome {
  bool loaded = false;
  std::string thrown;
  std::vector<std::string> calls;
  std::string warnings;
};

Outcome Deserialize(const Answers& answers) {
  PjRtComputationClient client;
  auto fake = std::make_unique<FakeClient>(answers);
  FakeClient* calls = fake.get();
  client.client_ = std::move(fake);
  load_check::warnings.str("");
  Outcome outcome;
  try {
    outcome.loaded = client.DeserializeComputation("entry") != nullptr;
  } catch (const std::exception& error) {
    outcome.thrown = error.what();
  }
  outcome.calls = calls->calls;
  outcome.warnings = load_check::warnings.str();
  return outcome;
}

std::string Calls(const Outcome& outcome) {
  std::string text;
  for (const auto& call : outcome.calls)
    text += (text.empty() ? "" : ",") + call;
  return "[" + text + "]";
}

const absl::Status kOk = absl::OkStatus();
const absl::Status kUnimplemented = absl::UnimplementedError(
    "Deserializing serialized executable not supported.");
const absl::Status kInvalidArgument = absl::InvalidArgumentError(
    "CompileOptions must be provided for LoadSerializedExecutable");

std::string OneStepLoad() {
  Outcome outcome = Deserialize({kOk, kUnimplemented, kUnimplemented, kOk});
  if (!outcome.thrown.empty()) return "threw: " + outcome.thrown;
  if (!outcome.loaded) return "an entry the client loads was not loaded";
  if (Calls(outcome) != "[LoadSerializedExecutable]") {
    return "calls " + Calls(outcome) + ", not LoadSerializedExecutable alone";
  }
  return "";
}

// The fallback for every non-OK answer of the one-step path.
std::string FallsBackOn(const absl::Status& refusal) {
  Outcome outcome = Deserialize({refusal, kOk, kOk, kOk});
  if (!outcome.thrown.empty()) return "threw: " + outcome.thrown;
  if (!outcome.loaded) {
    return "LoadSerializedExecutable answered " + refusal.ToString() +
           " and the entry was not loaded through DeserializeExecutable + "
           "Load (calls " +
           Calls(outcome) + ")";
  }
  if (Calls(outcome) !=
      "[LoadSerializedExecutable,DeserializeExecutable,Load]") {
    return "calls " + Calls(outcome);
  }
  return "";
}

std::string BothPathsFailIsAMiss() {
  for (const Answers& answers :
       {Answers{kInvalidArgument, kUnimplemented, kOk, kOk},
        Answers{kInvalidArgument, kOk, kInvalidArgument, kOk},
        Answers{kUnimplemented, kUnimplemented, kOk, kOk}}) {
    Outcome outcome = Deserialize(answers);
    if (!outcome.thrown.empty()) return "threw: " + outcome.thrown;
    if (outcome.loaded) return "a failed load returned an executable";
    if (outcome.warnings.find("WARNING") == std::string::npos) {
      return "a failed load logged no warning";
    }
    // The warning carries the first path's status, so a log reader can tell
    // a stale entry from a client that cannot load at all.
    if (outcome.warnings.find(answers.load_serialized.ToString()) ==
        std::string::npos) {
      return "the warning does not carry LoadSerializedExecutable's status: " +
             outcome.warnings;
    }
  }
  return "";
}

std::string UnreadableModulesAreAMiss() {
  Outcome outcome = Deserialize(
      {kOk, kUnimplemented, kUnimplemented, absl::InternalError("no modules")});
  if (!outcome.thrown.empty()) return "threw: " + outcome.thrown;
  if (outcome.loaded) return "an executable without HLO modules was returned";
  return "";
}

}  // namespace

int main() {
  Report("one_step_load_is_used_when_it_works", OneStepLoad());
  Report("unimplemented_falls_back_to_two_steps", FallsBackOn(kUnimplemented));
  Report("invalid_argument_falls_back_to_two_steps",
         FallsBackOn(kInvalidArgument));
  Report("both_paths_failing_is_a_miss_not_a_crash", BothPathsFailIsAMiss());
  Report("unreadable_modules_are_a_miss", UnreadableModulesAreAMiss());
  return failures;
}
