// grid.cuh: what every grid-stride CUDA kernel of kernels/cuda/ shares: this thread's index in the
// grid and the grid's size, the 16-byte alignment that lets a kernel load 16 bytes at a time, and
// the launch line, which tests/support/cuda_emulation.h turns into a run on host threads.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>

// CHORUS_LAUNCH(kernel, grid, threads, sharedBytes, stream, arguments...): kernel<<<grid, threads,
// sharedBytes, stream>>>(arguments...), written so that the emulation can run the same line.
#define CHORUS_LAUNCH(kernel, grid, threads, sharedBytes, stream, ...) \
  kernel<<<grid, threads, sharedBytes, stream>>>(__VA_ARGS__)
#endif

#include <cstddef>
#include <cstdint>

namespace chorus::kernels::cuda {

constexpr size_t kVectorBytes = 16;  // one uint4 / float4 load

inline bool vectorAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0; }

__device__ __forceinline__ size_t threadIndex() { return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ size_t gridThreads() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

}  // namespace chorus::kernels::cuda
