// Behaviour check of the lowering settings in the persistent cache key (patch
// 0003), built from a pytorch/xla tree:
//   - HashLoweringSettings, which CollectSyncTensors merges into every graph's
//     key, is copied verbatim, at check time, out of the tree's
//     xla_graph_executor.cpp (hash_lowering_settings.inc): a tree without it
//     fails to build, naming it;
//   - torch::lazy hashing is the real one (torch headers and libtorch_cpu);
//   - XlaHelpers' process-wide matmul precision (helpers.h: a static member,
//     set by torch_xla.backends.set_mat_mul_precision through
//     _xla_set_mat_mul_precision) and xla::PrecisionConfig are stand-ins
//     below: helpers.h needs OpenXLA's builder headers.
//
// Each check prints "PASS <name>" or "FAIL <name>: <why>"; the exit status is
// the number of failures.

#include <cstdint>
#include <set>
#include <string>

#include <torch/csrc/lazy/core/hash.h>

#include "check_report.h"

namespace xla {
// Stand-in of xla_data.proto's PrecisionConfig::Precision (same values).
struct PrecisionConfig {
  enum Precision { DEFAULT = 0, HIGH = 1, HIGHEST = 2, PACKED_NIBBLE = 3 };
};
}  // namespace xla

namespace torch_xla {

// Stand-in of helpers.h's accessors of XlaHelpers::s_mat_mul_precision.
class XlaHelpers {
 public:
  static xla::PrecisionConfig::Precision mat_mul_precision() {
    return s_mat_mul_precision;
  }
  static void set_mat_mul_precision(xla::PrecisionConfig::Precision precision) {
    s_mat_mul_precision = precision;
  }

 private:
  static inline xla::PrecisionConfig::Precision s_mat_mul_precision =
      xla::PrecisionConfig::DEFAULT;
};

namespace {
#include "hash_lowering_settings.inc"
}  // namespace

torch::lazy::hash_t KeyAt(xla::PrecisionConfig::Precision precision) {
  XlaHelpers::set_mat_mul_precision(precision);
  return HashLoweringSettings();
}

}  // namespace torch_xla

namespace {

using check_report::Report;
using torch_xla::KeyAt;
using xla::PrecisionConfig;

// set_mat_mul_precision('highest') against 'default' (and 'high'): the
// lowering puts the precision into every dot's PrecisionConfig, so each
// precision must have its own key.
std::string PrecisionChangesTheKey() {
  std::set<torch::lazy::hash_t> keys = {KeyAt(PrecisionConfig::DEFAULT),
                                        KeyAt(PrecisionConfig::HIGH),
                                        KeyAt(PrecisionConfig::HIGHEST)};
  if (KeyAt(PrecisionConfig::DEFAULT) == KeyAt(PrecisionConfig::HIGHEST)) {
    return "precision 'highest' and 'default' give one key";
  }
  if (keys.size() != 3) return "'default', 'high' and 'highest' share a key";
  return "";
}

// The precision can be set at any time and the lowering reads it at every
// lowering: the key must follow it at every sync, not keep a first reading.
std::string KeyFollowsThePrecisionAtEverySync() {
  torch::lazy::hash_t before = KeyAt(PrecisionConfig::DEFAULT);
  torch::lazy::hash_t highest = KeyAt(PrecisionConfig::HIGHEST);
  torch::lazy::hash_t after = KeyAt(PrecisionConfig::DEFAULT);
  if (before == highest) return "a precision set after a key is not keyed";
  if (before != after) return "setting the precision back changes the key";
  return "";
}

}  // namespace

int main() {
  Report("matmul_precision_changes_the_key", PrecisionChangesTheKey());
  Report("key_follows_the_precision_at_every_sync",
         KeyFollowsThePrecisionAtEverySync());
  return check_report::failures;
}
