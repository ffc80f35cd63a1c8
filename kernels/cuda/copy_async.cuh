// copy_async.cuh: copies from global to shared memory that run while the thread goes on (PTX
// cp.async, sm_80 on): 16 bytes a copy, straight into shared memory without a register, so that a
// kernel can load its next tile while it computes on this one. A thread's copies go in groups
// (commitCopies closes one); waitCopies<n> returns once all but this thread's n most recent groups
// have landed, and only for this thread's own copies: a __syncthreads after it makes every
// thread's visible to the block. Under tests/support/cuda_emulation.h (CHORUS_CUDA_EMULATION) the
// emulation's copies stand in (CHORUS_COPY_ASYNC_16 and the others): a copy fills its destination
// with NaNs when issued and writes the bytes only when its thread waits for it, so a kernel that
// reads a tile before its wait and barrier, or overwrites one that another warp still reads,
// computes with NaNs.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

namespace chorus::kernels::cuda {

// 16 bytes from src (global memory) to dst (shared memory), both 16-byte aligned.
__device__ inline void copyAsync16(void* dst, const void* src) {
#ifdef CHORUS_CUDA_EMULATION
  CHORUS_COPY_ASYNC_16(dst, src);
#else
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
#endif
}

// Closes the group of this thread's copies issued since the last commit.
__device__ inline void commitCopies() {
#ifdef CHORUS_CUDA_EMULATION
  CHORUS_COMMIT_COPIES();
#else
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed groups (the most recent) are in flight.
template <int kPending>
__device__ inline void waitCopies() {
#ifdef CHORUS_CUDA_EMULATION
  CHORUS_WAIT_COPIES(kPending);
#else
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

}  // namespace chorus::kernels::cuda
