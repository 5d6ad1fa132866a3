// Stand-in for OpenXLA's xla/types.h: torch_xla's runtime/sys_util.h includes
// it only for the fixed-width integer types.
#ifndef XLA_WHEELS_STAND_IN_XLA_TYPES_H_
#define XLA_WHEELS_STAND_IN_XLA_TYPES_H_

#include <cstdint>

#endif  // XLA_WHEELS_STAND_IN_XLA_TYPES_H_
