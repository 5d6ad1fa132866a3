// Stand-in declarations of the OpenXLA PJRT types that patch 0003's functions
// call, with the signatures of xla/pjrt/pjrt_client.h and
// xla/pjrt/pjrt_compiler.h (PjRtClient::platform_name, platform_version and
// GetTopologyDescription; PjRtTopologyDescription::Serialize;
// PjRtDevice::ToString). Written for this check, not copied: only the members
// the functions use, so that a call with another signature fails to compile.
#ifndef XLA_WHEELS_STAND_IN_PJRT_H_
#define XLA_WHEELS_STAND_IN_PJRT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace xla {

class PjRtTopologyDescription {
 public:
  virtual ~PjRtTopologyDescription() = default;
  virtual absl::StatusOr<std::string> Serialize() const = 0;
};

class PjRtDevice {
 public:
  virtual ~PjRtDevice() = default;
  virtual absl::string_view ToString() const = 0;
};

class PjRtClient {
 public:
  virtual ~PjRtClient() = default;
  virtual absl::string_view platform_name() const = 0;
  virtual absl::string_view platform_version() const = 0;
  virtual absl::StatusOr<const PjRtTopologyDescription*>
  GetTopologyDescription() const = 0;
};

}  // namespace xla

#endif  // XLA_WHEELS_STAND_IN_PJRT_H_
