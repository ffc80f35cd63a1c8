// half.cc: bulk fp16 / bf16 conversions, vectorised where the CPU can (F16C, AVX-512).
#include "kernels/cpu/half.h"

#include "kernels/cpu/isa.h"

namespace chorus::kernels {

namespace {

// The whole vectors by the best instruction set the CPU has (isa.h), the rest element by element.
size_t widenVectors(const uint16_t* in, float* out, size_t count, chorusDataType_t type) {
#ifdef CHORUS_X86_VECTOR_KERNELS
  switch (activeIsa()) {
    case Isa::kAvx512:
      return avx512::widenPrefix(in, out, count, type);
    case Isa::kAvx2:
      return avx2::widenPrefix(in, out, count, type);
    case Isa::kScalar:
      break;
  }
#endif
  (void)in, (void)out, (void)count, (void)type;
  return 0;
}

size_t narrowVectors(const float* in, uint16_t* out, size_t count, chorusDataType_t type) {
#ifdef CHORUS_X86_VECTOR_KERNELS
  switch (activeIsa()) {
    case Isa::kAvx512:
      return avx512::narrowPrefix(in, out, count, type);
    case Isa::kAvx2:
      return avx2::narrowPrefix(in, out, count, type);
    case Isa::kScalar:
      break;
  }
#endif
  (void)in, (void)out, (void)count, (void)type;
  return 0;
}

}  // namespace

void halfToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = widenVectors(in, out, count, chorusFloat16); i < count; ++i) out[i] = halfToFloat(in[i]);
}
void floatToHalf(const float* in, uint16_t* out, size_t count) {
  for (size_t i = narrowVectors(in, out, count, chorusFloat16); i < count; ++i) out[i] = floatToHalf(in[i]);
}
void bfloat16ToFloat(const uint16_t* in, float* out, size_t count) {
  for (size_t i = widenVectors(in, out, count, chorusBfloat16); i < count; ++i) out[i] = bfloat16ToFloat(in[i]);
}
void floatToBfloat16(const float* in, uint16_t* out, size_t count) {
  for (size_t i = narrowVectors(in, out, count, chorusBfloat16); i < count; ++i) out[i] = floatToBfloat16(in[i]);
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
