// block.cuh: what the transformer's CUDA kernels share: sums and maxima over a warp and over a
// block, element-wise maps 16 bytes at a time, dynamic shared memory, and the host side's grid
// size, stream cast and launch check. Host code of tests may compile it under
// tests/support/cuda_emulation.h.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>

// A kernel's dynamic shared memory (the launch's sharedBytes, 128-byte aligned), as `name`.
#define CHORUS_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

#include <algorithm>
#include <cstddef>
#include <initializer_list>

#include "kernels/cuda/grid.cuh"

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

// ---- element-wise kernels, 16 bytes at a time ----
// One float per load leaves too few bytes in flight to fill a large GPU's memory (an H200 ran the
// scalar forms at 51-78% of its peak), so the element-wise kernels go a float4 at a time over the
// first `quads` groups of four, where every pointer is 16-byte aligned (cudaMalloc's are; a view
// into a buffer may not be), then a float at a time over the rest.

// The groups of four a launch may take whole: n / 4 where every pointer is aligned, else 0.
inline size_t quadsFor(size_t n, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (!vectorAligned(p)) return 0;
  }
  return n / 4;
}

// Whether rows of C floats starting in these buffers go a float4 at a time: C a multiple of 4 and
// every buffer aligned.
inline bool rowsByQuads(int C, std::initializer_list<const void*> buffers) {
  return C % 4 == 0 && quadsFor(4, buffers) > 0;
}

__device__ __forceinline__ float4 quadAt(const float* p, size_t q) { return reinterpret_cast<const float4*>(p)[q]; }
__device__ __forceinline__ void storeQuad(float* p, size_t q, float4 x) { reinterpret_cast<float4*>(p)[q] = x; }

// f applied lane by lane to quads of its arguments.
template <typename F, typename... Q>
__device__ __forceinline__ float4 lanes(const F& f, Q... q) {
  return make_float4(f(q.x...), f(q.y...), f(q.z...), f(q.w...));
}

// out[i] = f(in[i]...) for i < n; out may be one of the inputs.
template <typename F, typename... In>
__global__ void mapKernel(float* out, size_t n, size_t quads, F f, In... in) {
  for (size_t q = threadIndex(); q < quads; q += gridThreads()) storeQuad(out, q, lanes(f, quadAt(in, q)...));
  for (size_t i = quads * 4 + threadIndex(); i < n; i += gridThreads()) out[i] = f(in[i]...);
}

// Launches mapKernel over n elements on stream; returns 0 or the launch's error.
template <typename F, typename... In>
int mapElements(float* out, size_t n, void* stream, F f, In... in) {
  if (n == 0) return 0;
  const size_t quads = quadsFor(n, {out, in...});
  CHORUS_LAUNCH(mapKernel, blocksFor(quads > 0 ? quads : n), kThreads, 0, asStream(stream), out, n, quads, f, in...);
  return launched();
}

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
