// reduce.h: element-wise reductions on host memory for every chorus type x op. The CPU
// reference that kernels/cuda/ must match. Pure functions; safe from any thread.
#pragma once

#include <cstddef>

#include "chorus/chorus.h"

namespace chorus::kernels {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b (exactly, not partially).
// Avg combines as Sum; apply divide() once on the final sum. Integer Sum and Prod wrap modulo
// 2^bits; fp16 and bf16 compute in fp32 and round once per element.
void reduce(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op);

// For every destination j and i < count: dsts[j][i] = srcs[0][i] (op) srcs[1][i] (op) ... (op)
// srcs[nsrc - 1][i], and for Avg that sum divided by nsrc: the same values as folding reduce() over
// the sources in order (then divide()), computed in one pass that reads each source once and
// writes each destination once, with no buffer between. A destination may be one of the sources
// (exactly, not partially); destinations must not overlap one another. Destination j is written
// with non-temporal stores where stream[j] is set, it is not a source and it is aligned to 64 bytes
// (see copyStreaming: for large results not read again soon); the others with plain stores.
// stream may be null: nothing streamed.
void reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t count, chorusDataType_t type,
                chorusRedOp_t op, const bool* stream);
// buf[i] = buf[i] / divisor: the last step of Avg. Integers truncate toward zero; fp16 / bf16
// divide in fp32.
void divide(void* buf, size_t count, chorusDataType_t type, int divisor);

// Bytes of one element, or 0 for an unknown type.
size_t typeSize(chorusDataType_t type);

}  // namespace chorus::kernels
