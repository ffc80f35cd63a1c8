// hd.h: what lets one inline function serve both the CPU reference (kernels/cpu/) and the CUDA
// kernels (kernels/cuda/): CHORUS_HD marks it callable on host and device, and the bit casts
// below compile on either side. Element math written once here is the same math on both.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CHORUS_HD __host__ __device__
#else
#define CHORUS_HD
#endif

namespace chorus::kernels {

CHORUS_HD inline uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

CHORUS_HD inline float bitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

CHORUS_HD inline float absf(float x) { return bitsFloat(floatBits(x) & 0x7fffffffu); }

}  // namespace chorus::kernels
