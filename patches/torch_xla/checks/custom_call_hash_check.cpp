// Behaviour check of the custom call's node hash (the custom-call patch),
// built from a pytorch/xla tree:
//   - CustomCallHashSeed is copied verbatim, at check time, out of the tree's
//     ops/custom_call.cpp (custom_call_hash_seed.inc): a tree without it fails
//     to build, naming it;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu).
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <map>
#include <string>
#include <unordered_map>

#include <torch/csrc/lazy/core/hash.h>

#include "check_report.h"

namespace torch_xla {
namespace {
#include "custom_call_hash_seed.inc"
}  // namespace

torch::lazy::hash_t Seed(
    const std::string& target, bool side_effect, const std::string& config,
    int api, const std::unordered_map<std::string, std::string>& attributes) {
  return CustomCallHashSeed(target, side_effect, config, api, attributes);
}

}  // namespace torch_xla

namespace {

using check_report::failures;
using check_report::Report;
using torch_xla::Seed;

// place_to_host and place_to_device (experimental/stablehlo_custom_call.py)
// differ only in the _xla_buffer_placement frontend attribute.
std::string FrontendAttributesChangeTheHash() {
  if (Seed("annotate_device_placement", true, "", 4,
           {{"_xla_buffer_placement", "pinned_host"}}) ==
      Seed("annotate_device_placement", true, "", 4,
           {{"_xla_buffer_placement", "device"}})) {
    return "place_to_host and place_to_device give one hash";
  }
  if (Seed("k", false, "", 1, {}) == Seed("k", false, "", 1, {{"a", ""}})) {
    return "an attribute with an empty value leaves the hash as is";
  }
  return "";
}

std::string EveryAttributeOfTheCallChangesTheHash() {
  const auto base = Seed("k", false, "cfg", 1, {});
  if (base == Seed("k2", false, "cfg", 1, {})) return "the call target leaves the hash as is";
  if (base == Seed("k", true, "cfg", 1, {})) return "has_side_effect leaves the hash as is";
  if (base == Seed("k", false, "cfg2", 1, {})) return "backend_config leaves the hash as is";
  if (base == Seed("k", false, "cfg", 2, {})) return "api_version leaves the hash as is";
  return "";
}

// The attributes are an unordered map: equal maps give one hash whatever
// their iteration order.
std::string AttributeOrderDoesNotMatter() {
  std::unordered_map<std::string, std::string> forward;
  std::unordered_map<std::string, std::string> backward(1);
  for (int i = 0; i < 12; ++i) {
    forward["attr_" + std::to_string(i)] = std::to_string(i);
  }
  for (int i = 11; i >= 0; --i) {
    backward["attr_" + std::to_string(i)] = std::to_string(i);
  }
  if (Seed("k", false, "", 1, forward) != Seed("k", false, "", 1, backward)) {
    return "the hash depends on the map's iteration order";
  }
  return "";
}

}  // namespace

int main() {
  Report("frontend_attributes_change_the_hash",
         FrontendAttributesChangeTheHash());
  Report("every_attribute_of_the_call_changes_the_hash",
         EveryAttributeOfTheCallChangesTheHash());
  Report("attribute_order_does_not_matter", AttributeOrderDoesNotMatter());
  return failures;
}
