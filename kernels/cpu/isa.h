// isa.h: which vector instruction set the host reductions use. The best the CPU has is chosen at
// run time (one build runs on any x86-64); CHORUS_CPU_ISA=scalar|avx2|avx512 caps it, for
// comparison and for tests. Elsewhere than x86-64 only the scalar reference exists.
#pragma once

#include <cstddef>
#include <cstdint>

#include "chorus/chorus.h"

namespace chorus::kernels {

enum class Isa { kScalar, kAvx2, kAvx512 };

const char* isaName(Isa isa);
// Whether this CPU (and this build) can run kernels for isa.
bool isaSupported(Isa isa);
// The best supported set, capped by CHORUS_CPU_ISA; decided once per process.
Isa activeIsa();

// reduce(), divide() and reduceMany() with the given set (it must be supported): for tests and benchmarks.
void reduceWith(Isa isa, void* dst, const void* a, const void* b, size_t count, chorusDataType_t type,
                chorusRedOp_t op);
void divideWith(Isa isa, void* buf, size_t count, chorusDataType_t type, int divisor);
void reduceManyWith(Isa isa, void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t count,
                    chorusDataType_t type, chorusRedOp_t op, const bool* stream);

// The vector kernels of one set (reduce_vector.h): each does a prefix of whole vectors and returns
// its length in elements, 0 where it has no kernel; the caller does the rest with the reference.
namespace avx2 {
// fp16 / bf16 (type) <-> fp32, as half.h's element conversions do (NaN kept a NaN).
size_t widenPrefix(const uint16_t* in, float* out, size_t count, chorusDataType_t type);
size_t narrowPrefix(const float* in, uint16_t* out, size_t count, chorusDataType_t type);
size_t reducePrefix(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op);
size_t dividePrefix(void* buf, size_t count, chorusDataType_t type, int divisor);
size_t reduceManyPrefix(void* const* dsts, const uint8_t* stream, int ndst, const void* const* srcs, int nsrc,
                        size_t count, chorusDataType_t type, chorusRedOp_t op);
}  // namespace avx2
namespace avx512 {
// fp16 / bf16 (type) <-> fp32, as half.h's element conversions do (NaN kept a NaN).
size_t widenPrefix(const uint16_t* in, float* out, size_t count, chorusDataType_t type);
size_t narrowPrefix(const float* in, uint16_t* out, size_t count, chorusDataType_t type);
size_t reducePrefix(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op);
size_t dividePrefix(void* buf, size_t count, chorusDataType_t type, int divisor);
size_t reduceManyPrefix(void* const* dsts, const uint8_t* stream, int ndst, const void* const* srcs, int nsrc,
                        size_t count, chorusDataType_t type, chorusRedOp_t op);
}  // namespace avx512

}  // namespace chorus::kernels
