// reduce_ops.h: the reduction ops as CHORUS_HD functors, for the device code (kernels/cuda and the
// cuda_ipc protocol) and its host-side tests: integer Sum and Prod wrap (computed unsigned), as
// kernels/cpu/reduce.cc does; Max and Min compare with <.
#pragma once

#include <cstdint>

#include "kernels/hd.h"

namespace chorus::kernels {

// The unsigned type an integer op of type C wraps in (at least 32 bits: no promotion to int).
template <typename C>
struct Unsigned {
  using Type = C;
};
template <>
struct Unsigned<int8_t> {
  using Type = uint32_t;
};
template <>
struct Unsigned<uint8_t> {
  using Type = uint32_t;
};
template <>
struct Unsigned<int32_t> {
  using Type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using Type = uint64_t;
};

struct OpSum {
  template <typename C>
  CHORUS_HD static C apply(C a, C b) {
    if constexpr (C(-1) < C(0) && C(1) / C(2) == C(0)) {  // signed integer
      using U = typename Unsigned<C>::Type;
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return static_cast<C>(a + b);
    }
  }
};
struct OpProd {
  template <typename C>
  CHORUS_HD static C apply(C a, C b) {
    if constexpr (C(1) / C(2) == C(0)) {  // integer
      using U = typename Unsigned<C>::Type;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};
struct OpMax {
  template <typename C>
  CHORUS_HD static C apply(C a, C b) {
    return a < b ? b : a;
  }
};
struct OpMin {
  template <typename C>
  CHORUS_HD static C apply(C a, C b) {
    return b < a ? b : a;
  }
};

}  // namespace chorus::kernels
