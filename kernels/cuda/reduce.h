// reduce.h (CUDA): element-wise reductions on device memory, matching kernels/cpu/reduce.h
// element for element. Host code includes this header; it holds no CUDA runtime types.
#pragma once

#include <cstddef>

#include "chorus/chorus.h"

namespace chorus::kernels::cuda {

// dst[i] = a[i] (op) b[i] on the device, enqueued on `stream` (a cudaStream_t; NULL for the
// default stream). Same semantics as kernels::reduce. Returns 0 or the cudaError_t of the launch.
int reduce(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op,
           void* stream);

// dst[i] = src[i] converted between float types (fp32, fp64, fp16, bf16), rounding to nearest
// even as kernels/cpu/half.h does. Returns cudaErrorInvalidValue for other types.
int cast(void* dst, chorusDataType_t dstType, const void* src, chorusDataType_t srcType, size_t count, void* stream);

// buf[i] = buf[i] / divisor on the device, as kernels::divide.
int divide(void* buf, size_t count, chorusDataType_t type, int divisor, void* stream);

}  // namespace chorus::kernels::cuda
