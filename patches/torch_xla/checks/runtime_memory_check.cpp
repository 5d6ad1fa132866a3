// Behaviour check of GetRuntimeMemoryInfo (patch 0002), the function behind
// torch_xla._XLAC._xla_runtime_memory_info(device):
//   - the function is copied verbatim, at check time, out of the tree's
//     init_python_bindings.cpp into get_runtime_memory_info.inc;
//   - Python is real: an embedded CPython (pybind11's scoped_interpreter), so
//     py::dict and py::value_error are the ones the binding returns and
//     raises, and NoGilSection really releases the GIL;
//   - the computation client is a stand-in with the three calls the function
//     makes (GetLocalDevices, GetAllDevices, GetMemoryInfo) and the devices of
//     one host of a two-host run: TPU:0 and TPU:1 are this process's, TPU:2
//     and TPU:3 another host's;
//   - torch_xla's XLA_ASSIGN_OR_THROW is a small stand-in that throws.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <pybind11/embed.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "check_report.h"

namespace py = pybind11;

#ifndef absl_nonnull
#define absl_nonnull
#endif

#define XLA_ASSIGN_OR_THROW(lhs, rexpr)                                       \
  auto xla_status_or_ = (rexpr);                                              \
  if (!xla_status_or_.ok()) {                                                 \
    throw std::runtime_error(std::string(xla_status_or_.status().message())); \
  }                                                                           \
  lhs = *xla_status_or_;

namespace torch_xla {

// As init_python_bindings.cpp's: the GIL is released while it lives.
struct NoGilSection {
  NoGilSection() : state(PyEval_SaveThread()) {}
  ~NoGilSection() { PyEval_RestoreThread(state); }
  PyThreadState* state = nullptr;
};

namespace runtime {

// Only what GetRuntimeMemoryInfo uses, with its types at c04e61c.
class ComputationClient {
 public:
  struct MemoryInfo {
    int64_t bytes_used = 0;
    int64_t peak_bytes_used = 0;
    int64_t bytes_limit = 0;
  };
  std::vector<std::string> GetLocalDevices() const {
    return {"TPU:0", "TPU:1"};
  }
  std::vector<std::string> GetAllDevices() const {
    return {"TPU:0", "TPU:1", "TPU:2", "TPU:3"};
  }
  MemoryInfo GetMemoryInfo(const std::string& device) {
    queried.push_back(device);
    // The GIL must be released around the query, as around client creation.
    gil_held_during_query = PyGILState_Check() != 0;
    int64_t index = device.back() - '0';
    return {index * 1000 + 1, index * 1000 + 2, 32LL << 30};
  }
  std::vector<std::string> queried;
  bool gil_held_during_query = false;
};

ComputationClient& Client() {
  static ComputationClient client;
  return client;
}

const absl::StatusOr<ComputationClient * absl_nonnull>& GetComputationClient() {
  static const absl::StatusOr<ComputationClient* absl_nonnull> client =
      &Client();
  return client;
}

}  // namespace runtime

#include "get_runtime_memory_info.inc"

}  // namespace torch_xla

namespace {

using check_report::failures;
using check_report::Report;

// The ValueError's text, or "" when the call answered.
std::string Refusal(const std::string& device) {
  try {
    torch_xla::GetRuntimeMemoryInfo(device);
  } catch (const py::value_error& error) {
    return error.what();
  }
  return "";
}

std::string Lacks(const std::string& text,
                  const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    if (text.find(part) == std::string::npos) {
      return "the error lacks \"" + part + "\": " + text;
    }
  }
  return "";
}

std::string LocalDeviceAnswers() {
  torch_xla::runtime::Client().queried.clear();
  py::dict info = torch_xla::GetRuntimeMemoryInfo("TPU:1");
  auto& client = torch_xla::runtime::Client();
  if (client.queried != std::vector<std::string>{"TPU:1"}) {
    return "GetMemoryInfo was not asked about TPU:1 alone";
  }
  if (client.gil_held_during_query) return "the GIL was held during the query";
  if (info["bytes_used"].cast<int64_t>() != 1001 ||
      info["peak_bytes_used"].cast<int64_t>() != 1002 ||
      info["bytes_limit"].cast<int64_t>() != (32LL << 30)) {
    return "the dict does not hold TPU:1's bytes_used, peak_bytes_used, "
           "bytes_limit";
  }
  if (py::len(info) != 3) return "the dict has other keys";
  return "";
}

// Another host's device is listed by the client but has no allocator
// statistics here: a ValueError that says so and points at the list of this
// process's devices.
std::string AnotherHostsDeviceIsRefusedPointingAtTheLocalList() {
  torch_xla::runtime::Client().queried.clear();
  std::string error = Refusal("TPU:2");
  if (error.empty()) return "TPU:2 (another host's) answered";
  if (!torch_xla::runtime::Client().queried.empty()) {
    return "GetMemoryInfo was called for another host's device";
  }
  return Lacks(error, {"not addressable from this process", "'TPU:2'",
                       "[TPU:0, TPU:1]", "_xla_get_runtime_devices()"});
}

// Under SPMD the only Python-visible device is the virtual SPMD:0, which has
// no memory of its own.
std::string SpmdVirtualDeviceIsRefused() {
  torch_xla::runtime::Client().queried.clear();
  std::string error = Refusal("SPMD:0");
  if (error.empty()) return "SPMD:0 answered";
  if (!torch_xla::runtime::Client().queried.empty()) {
    return "GetMemoryInfo was called for SPMD:0";
  }
  return Lacks(error, {"'SPMD:0'", "SPMD:0 virtual device has no memory",
                       "_xla_get_runtime_devices()"});
}

std::string UnknownDeviceIsRefusedListingTheValidOnes() {
  std::string error = Refusal("CPU:7");
  if (error.empty()) return "CPU:7 answered";
  return Lacks(error, {"Unknown runtime device", "'CPU:7'", "[TPU:0, TPU:1]"});
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
  py::scoped_interpreter python;
  Run("local_device_answers", LocalDeviceAnswers);
  Run("another_hosts_device_is_refused_pointing_at_the_local_list",
      AnotherHostsDeviceIsRefusedPointingAtTheLocalList);
  Run("spmd_virtual_device_is_refused", SpmdVirtualDeviceIsRefused);
  Run("unknown_device_is_refused_listing_the_valid_ones",
      UnknownDeviceIsRefusedListingTheValidOnes);
  return failures;
}
