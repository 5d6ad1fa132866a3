// Stand-in declarations of the OpenXLA PJRT types that the series' checked
// functions call, with the signatures of xla/pjrt/pjrt_client.h,
// xla/pjrt/pjrt_executable.h and xla/pjrt/pjrt_compiler.h. Written for these
// checks, not copied: only the members the functions use, so that a call with
// another signature fails to compile. PjRtClient's loading methods have bodies
// returning UNIMPLEMENTED, as the real base class's defaults do.
#ifndef XLA_WHEELS_STAND_IN_PJRT_H_
#define XLA_WHEELS_STAND_IN_PJRT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace xla {

class PjRtTopologyDescription {
 public:
  virtual ~PjRtTopologyDescription() = default;
  virtual absl::StatusOr<std::string> Serialize() const = 0;
};

class PjRtDevice {
 public:
  virtual ~PjRtDevice() = default;
  virtual int id() const = 0;
  virtual int process_index() const = 0;
  virtual absl::string_view ToString() const = 0;
  // Not pure in the real class either (description().device_kind()).
  virtual absl::string_view device_kind() const { return "stand-in kind"; }
};

// What a loaded executable's GetHloModules() yields: only the proto round trip
// DeserializeComputation uses.
struct HloModuleProto {
  std::string name;
};

class HloModule {
 public:
  explicit HloModule(std::string name) : name_(std::move(name)) {}
  HloModuleProto ToProto() const { return {name_}; }

 private:
  std::string name_;
};

class XlaComputation {
 public:
  explicit XlaComputation(HloModuleProto proto) : proto_(std::move(proto)) {}
  const HloModuleProto& proto() const { return proto_; }

 private:
  HloModuleProto proto_;
};

struct CompileOptions {};
struct LoadOptions {};

class PjRtExecutable {
 public:
  virtual ~PjRtExecutable() = default;
};

class PjRtLoadedExecutable {
 public:
  virtual ~PjRtLoadedExecutable() = default;
  virtual absl::StatusOr<std::vector<std::shared_ptr<HloModule>>>
  GetHloModules() const = 0;
  // PjRtExecutable's, which PjRtLoadedExecutable derives from.
  virtual int num_replicas() const = 0;
  virtual int num_partitions() const = 0;
  virtual absl::Span<PjRtDevice* const> addressable_devices() const = 0;
};

class PjRtClient {
 public:
  virtual ~PjRtClient() = default;
  virtual absl::string_view platform_name() const = 0;
  virtual absl::string_view platform_version() const = 0;
  virtual absl::StatusOr<const PjRtTopologyDescription*>
  GetTopologyDescription() const = 0;
  // Pure in the real class; a body here so that checks that never call them
  // need not implement them.
  virtual int device_count() const { return 0; }
  virtual absl::Span<PjRtDevice* const> addressable_devices() const {
    return {};
  }
  virtual absl::StatusOr<std::unique_ptr<PjRtExecutable>> DeserializeExecutable(
      absl::string_view serialized, std::optional<CompileOptions> options) {
    return absl::UnimplementedError(
        "Deserializing serialized executable not supported.");
  }
  virtual absl::StatusOr<std::unique_ptr<PjRtLoadedExecutable>>
  LoadSerializedExecutable(absl::string_view serialized,
                           std::optional<CompileOptions> options,
                           const LoadOptions& load_options) {
    return absl::UnimplementedError(
        "Loading serialized executable not supported.");
  }
  virtual absl::StatusOr<std::unique_ptr<PjRtLoadedExecutable>> Load(
      std::unique_ptr<PjRtExecutable> executable,
      const LoadOptions& load_options) {
    return absl::UnimplementedError("Loading executable not supported.");
  }
};

}  // namespace xla

#endif  // XLA_WHEELS_STAND_IN_PJRT_H_
