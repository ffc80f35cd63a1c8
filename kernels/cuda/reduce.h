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

// The most sources, and the most destinations, one reduceMany takes.
constexpr int kMaxReduceSources = 8;

// For every destination j and i < count: dsts[j][i] = srcs[0][i] (op) srcs[1][i] (op) ... (op)
// srcs[sources - 1][i], folded left to right in the compute type (fp16 and bf16: fp32) and stored
// once per destination; with divisor > 1 (Avg) the stored sum is then divided by it, as
// kernels::reduce then kernels::divide do. 1 <= sources, destinations <= kMaxReduceSources. A
// destination may be one of the sources (exactly: element i of every source is read before element
// i of any destination is written); destinations must not overlap one another. Sources and
// destinations may be any device memory the current device can reach (peers' buffers mapped with
// CUDA IPC among them): one pass that reads each source once and writes each destination once, as
// kernels::reduceMany on the CPU. Enqueued on stream; returns 0 or the launch's cudaError_t.
int reduceMany(void* const* dsts, int destinations, const void* const* srcs, int sources, size_t count,
               chorusDataType_t type, chorusRedOp_t op, int divisor, void* stream);

// Loads every reduceMany kernel now (CUDA loads kernels lazily, at their first launch, which may
// wait for the whole device: a call enqueued behind a blocked stream would wait with it). 0 or the
// cudaError_t.
int preloadReduceMany();

}  // namespace chorus::kernels::cuda
