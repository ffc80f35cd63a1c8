// half.h: conversions between fp32 and the 16-bit float formats (IEEE fp16, bfloat16), round to
// nearest even, with infinities and NaN preserved. Pure functions; safe from any thread. The
// element conversions are CHORUS_HD: the CUDA kernels call these same functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/hd.h"

namespace chorus::kernels {

CHORUS_HD inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bitsFloat(sign | floatBits(magnitude));
  }
  // Infinity, or NaN made quiet with its payload kept, as the x86 and CUDA conversions do.
  if (exponent == 31) return bitsFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  return bitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

CHORUS_HD inline uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf, or NaN made quiet with the payload's top bits (as F16C)
    return static_cast<uint16_t>(sign | 0x7c00u |
                                 (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal (2^-14): count units of 2^-24, rounding to nearest even.
    // units < 1024, so its fraction is exact and the tie test below is the rounding.
    const float units = bitsFloat(magnitude) * 16777216.0f;
    uint32_t whole = static_cast<uint32_t>(units);
    const float fraction = units - static_cast<float>(whole);
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u) != 0)) ++whole;
    return static_cast<uint16_t>(sign | whole);
  }
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);  // round to nearest even; carries reach the exponent
  magnitude -= 112u << 23;                         // rebias the exponent from 127 to 15
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

CHORUS_HD inline float bfloat16ToFloat(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

CHORUS_HD inline uint16_t floatToBfloat16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Bulk conversions, for buffers.
void halfToFloat(const uint16_t* in, float* out, size_t count);
void floatToHalf(const float* in, uint16_t* out, size_t count);
void bfloat16ToFloat(const uint16_t* in, float* out, size_t count);
void floatToBfloat16(const float* in, uint16_t* out, size_t count);

// The two 16-bit formats mixed-precision compute uses, and the bulk conversions by format.
enum class Float16 { kBf16, kFp16 };
const char* float16Name(Float16 format);  // "bf16", "fp16"
// One element to and from `format`: floatToBfloat16 / floatToHalf and their inverses.
CHORUS_HD inline uint16_t toFloat16(Float16 format, float f) {
  return format == Float16::kBf16 ? floatToBfloat16(f) : floatToHalf(f);
}
CHORUS_HD inline float fromFloat16(Float16 format, uint16_t h) {
  return format == Float16::kBf16 ? bfloat16ToFloat(h) : halfToFloat(h);
}
void toFloat16(Float16 format, const float* in, uint16_t* out, size_t count);
void fromFloat16(Float16 format, const uint16_t* in, float* out, size_t count);

}  // namespace chorus::kernels
