// reduce_ops.h: the reduction ops as CHORUS_HD functors, for the device code (kernels/cuda and the
// device ring) and its host-side tests: integer Sum and Prod wrap (computed unsigned), as
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

// A float sum or product r = a (op) b with NaN as the CPU reference has it (x86's SSE rules): a
// NaN operand comes out quieted with its sign and payload (the first, when both are NaN), and an
// invalid operation (inf - inf, 0 * inf) gives the default NaN, whose sign bit is set. The host
// computes exactly that; a GPU writes one canonical NaN instead, so device code sets it here.
template <typename C>
CHORUS_HD inline C x86Nan(C a, C b, C r) {
#if defined(__CUDA_ARCH__)
  if (r == r) return r;
  if constexpr (sizeof(C) == 4) {
    if (a != a) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
    if (b != b) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
    return __uint_as_float(0xffc00000u);
  } else {
    if (a != a) return __longlong_as_double(__double_as_longlong(a) | 0x0008000000000000ll);
    if (b != b) return __longlong_as_double(__double_as_longlong(b) | 0x0008000000000000ll);
    return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
  }
#else
  (void)a;
  (void)b;
  return r;
#endif
}

struct OpSum {
  template <typename C>
  CHORUS_HD static C apply(C a, C b) {
    if constexpr (C(-1) < C(0) && C(1) / C(2) == C(0)) {  // signed integer
      using U = typename Unsigned<C>::Type;
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (C(1) / C(2) == C(0)) {  // unsigned integer
      return static_cast<C>(a + b);
    } else {
      return x86Nan(a, b, static_cast<C>(a + b));
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
      return x86Nan(a, b, a * b);
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
