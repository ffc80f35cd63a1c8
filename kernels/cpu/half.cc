// half.cc: bulk fp16 / bf16 conversions.
#include "kernels/cpu/half.h"

namespace chorus::kernels {

void halfToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = halfToFloat(in[i]);
}
void floatToHalf(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = floatToHalf(in[i]);
}
void bfloat16ToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = bfloat16ToFloat(in[i]);
}
void floatToBfloat16(const float* in, uint16_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = floatToBfloat16(in[i]);
}

const char* float16Name(Float16 format) { return format == Float16::kBf16 ? "bf16" : "fp16"; }

void toFloat16(Float16 format, const float* in, uint16_t* out, size_t count) {
  if (format == Float16::kBf16) {
    floatToBfloat16(in, out, count);
  } else {
    floatToHalf(in, out, count);
  }
}

void fromFloat16(Float16 format, const uint16_t* in, float* out, size_t count) {
  if (format == Float16::kBf16) {
    bfloat16ToFloat(in, out, count);
  } else {
    halfToFloat(in, out, count);
  }
}

}  // namespace chorus::kernels
