// block.cuh: what the transformer's CUDA kernels share: sums and maxima over a warp and over a
// block, and the host side's grid size, stream cast and launch check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace chorus::kernels::cuda {

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // per block, for the element-wise kernels
// Blocks of a grid-stride loop: enough to fill any current GPU, no more.
constexpr size_t kMaxBlocks = 8192;

inline unsigned blocksFor(size_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<size_t>((n + threads - 1) / threads, 1, kMaxBlocks));
}

inline cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }
// 0, or the error of the last launch (cudaGetLastError, which also clears it).
inline int launched() { return static_cast<int>(cudaGetLastError()); }

__device__ __forceinline__ float warpSum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ __forceinline__ float warpMax(float x) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// The sum (or maximum) of one value per thread over the block, returned to every thread, combined
// in a fixed order (so a launch of the same shape repeats bit for bit). blockDim.x is a multiple of
// 32, at most 1024; every thread of the block must call it.
template <typename T, typename Combine>
__device__ T blockReduce(T x, Combine combine) {
  __shared__ T lanes[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) x = combine(x, __shfl_xor_sync(0xffffffffu, x, offset));
  __syncthreads();  // lanes may still be read by an earlier call
  if (lane == 0) lanes[warp] = x;
  __syncthreads();
  x = lanes[0];
  for (int w = 1; w < warps; ++w) x = combine(x, lanes[w]);
  return x;
}

}  // namespace chorus::kernels::cuda
