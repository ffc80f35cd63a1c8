// attention.cu: fused causal attention on device memory, in the block form of
// kernels::attentionBlockForward / Backward (kernels/cpu/nn.cc), FlashAttention's way: the keys
// go by in tiles through shared memory, each query row keeps its softmax online (running maximum,
// sum of exponentials, unnormalised output), and no matrix of scores is ever written to memory.
// Backward rebuilds the probabilities from the saved log-sum-exp in two kernels that each own
// what they write: one per tile of queries for dq, one per tile of keys for dk and dv, so no two
// threads add into one element and the sums go in a fixed order.
//
// The work split, per (tile of rows, head, sequence) block of kWarps warps: each warp takes
// kRowsPerWarp rows (queries, or keys in the dk/dv kernel); each of its lanes takes one of the 32
// rows of the other side's tile in shared memory for the dot products (lane = key for scores), and
// the head's columns are spread over the lanes (lane, lane + 32, ...: kLanes of them) for the
// weighted sums, the weights passed between lanes by shuffles.
#ifndef CHORUS_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/block.cuh"
#include "kernels/cuda/nn.h"

namespace chorus::kernels::cuda {
namespace {

using namespace attention;  // NOLINT: the shared pieces and the tensor-core kernels

constexpr int kWarps = 4;
constexpr int kTile = 32;  // rows of the other side per pass (one per lane)

// An element of q, k or v as a float.
__device__ float widen(float x, bool) { return x; }
__device__ float widen(uint16_t x, bool bf16) {
  return bf16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}

template <typename Element>
Pair<Element> pairOf(const AttentionBlockOf<Element>& blk, const AttentionBatch& bat, int statStride) {
  const int hs = blk.C / blk.NH;
  return Pair<Element>{blk.q,
                       blk.k,
                       blk.v,
                       blk.qStride,
                       blk.kvStride,
                       blk.Tq,
                       blk.Tk,
                       hs,
                       blk.diagonal,
                       blk.format == Float16::kBf16,
                       bat.qRows,
                       bat.kvRows,
                       bat.batchStatStride,
                       statStride,
                       1.0f / std::sqrt(static_cast<float>(hs))};
}

// Loads rows [first, first + kTile) of one head of a (rows, stride) array into tile[kTile][pitch]
// as floats, zeros past `rows`.
template <typename Element>
__device__ void loadTile(float* tile, int pitch, const Element* base, int b, size_t batchRows, int first, int rows,
                         int stride, int hs, bool bf16) {
  for (int at = threadIdx.x; at < kTile * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs;
    tile[r * pitch + c] = first + r < rows ? widen(base[rowAt(b, batchRows, first + r, stride) + c], bf16) : 0.0f;
  }
}

// acc (this lane's columns of one row) += the sum over the tile's rows j of w_j tile[j], where w_j
// is lane j's `weight`.
template <int kLanes>
__device__ __forceinline__ void addWeightedRows(float (&acc)[kLanes], float weight, const float* tile, int pitch,
                                                int hs, int lane) {
  for (int j = 0; j < kTile; ++j) {
    const float w = __shfl_sync(0xffffffffu, weight, j);
#pragma unroll
    for (int e = 0; e < kLanes; ++e) {
      const int c = lane + e * kWarp;
      if (c < hs) acc[e] += w * tile[j * pitch + c];
    }
  }
}

// ---- forward: a block per (kWarps x kRowsPerWarp queries, head, sequence) ----

constexpr int kForwardRows = 4;  // queries per warp

template <typename Element, int kLanes>
__global__ void forwardKernel(Pair<Element> p, float* out, int outStride, float* rowMax, float* rowSum) {
  constexpr int kMaxHs = kWarp * kLanes;
  __shared__ float keys[kTile * (kMaxHs + 1)];  // padded: lane j reads row j
  __shared__ float values[kTile * kMaxHs];
  __shared__ float queries[kWarps * kForwardRows * kMaxHs];
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, keyPitch = hs + 1;
  const int firstRow = blockIdx.x * kWarps * kForwardRows;
  const int myRow0 = firstRow + warp * kForwardRows;
  // This warp's queries into shared memory; their running statistics and outputs into registers.
  float* myQueries = queries + warp * kForwardRows * kMaxHs;
  float maxSoFar[kForwardRows], sumSoFar[kForwardRows], acc[kForwardRows][kLanes];
#pragma unroll
  for (int r = 0; r < kForwardRows; ++r) {
    const int i = myRow0 + r;
    const bool live = i < p.Tq;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    maxSoFar[r] = live ? rowMax[stat] : -INFINITY;
    sumSoFar[r] = live ? rowSum[stat] : 0.0f;
    for (int c = lane; c < hs; c += kWarp) {
      myQueries[r * kMaxHs + c] = live ? widen(p.q[rowAt(b, p.qRows, i, p.qStride) + h * hs + c], p.bf16) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kLanes; ++e) {
      const int c = lane + e * kWarp;
      acc[r][e] = live && c < hs ? out[rowAt(b, p.qRows, i, outStride) + h * hs + c] : 0.0f;
    }
  }
  const int keyEnd = p.keyEnd(firstRow, kWarps * kForwardRows);
  for (int first = 0; first < keyEnd; first += kTile) {
    __syncthreads();
    loadTile(keys, keyPitch, p.k + h * hs, b, p.kvRows, first, p.Tk, p.kvStride, hs, p.bf16);
    loadTile(values, hs, p.v + h * hs, b, p.kvRows, first, p.Tk, p.kvStride, hs, p.bf16);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kForwardRows; ++r) {
      const int i = myRow0 + r;
      if (i >= p.Tq) continue;
      // Lane j: the score of key first + j.
      const float* qi = myQueries + r * kMaxHs;
      const float* kj = keys + lane * keyPitch;
      float dot = 0.0f;
      for (int c = 0; c < hs; ++c) dot += qi[c] * kj[c];
      const float s = p.masked(i, first + lane) ? -INFINITY : dot * p.scale;
      const float newMax = fmaxf(maxSoFar[r], warpMax(s));
      if (newMax == -INFINITY) continue;  // every key of the tile masked, none seen before
      const float weight = s == -INFINITY ? 0.0f : expf(s - newMax);
      const float carry = maxSoFar[r] == -INFINITY ? 0.0f : expf(maxSoFar[r] - newMax);
      sumSoFar[r] = sumSoFar[r] * carry + warpSum(weight);
      maxSoFar[r] = newMax;
#pragma unroll
      for (int e = 0; e < kLanes; ++e) acc[r][e] *= carry;
      addWeightedRows(acc[r], weight, values, hs, hs, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < kForwardRows; ++r) {
    const int i = myRow0 + r;
    if (i >= p.Tq) continue;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    if (lane == 0) {
      rowMax[stat] = maxSoFar[r];
      rowSum[stat] = sumSoFar[r];
    }
#pragma unroll
    for (int e = 0; e < kLanes; ++e) {
      const int c = lane + e * kWarp;
      if (c < hs) out[rowAt(b, p.qRows, i, outStride) + h * hs + c] = acc[r][e];
    }
  }
}

// ---- backward ----
// With P = exp(s - lse), dP = dO v^T, dS = P (dP - delta) scale: dq += dS k (per query tile),
// dk += dS^T q and dv += P^T dO (per key tile).

constexpr int kBackwardRows = 2;  // rows per warp

template <typename Element, int kLanes>
__global__ void backwardQueryKernel(Pair<Element> p, const float* dout, int doutStride, const float* lse,
                                    const float* delta, float* dq, int dqStride) {
  constexpr int kMaxHs = kWarp * kLanes;
  __shared__ float keys[kTile * (kMaxHs + 1)];
  __shared__ float values[kTile * (kMaxHs + 1)];
  __shared__ float queries[kWarps * kBackwardRows * kMaxHs];
  __shared__ float grads[kWarps * kBackwardRows * kMaxHs];  // dO rows
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, pitch = hs + 1;
  const int firstRow = blockIdx.x * kWarps * kBackwardRows;
  const int myRow0 = firstRow + warp * kBackwardRows;
  float* myQueries = queries + warp * kBackwardRows * kMaxHs;
  float* myGrads = grads + warp * kBackwardRows * kMaxHs;
  float rowLse[kBackwardRows], rowDelta[kBackwardRows], acc[kBackwardRows][kLanes];
#pragma unroll
  for (int r = 0; r < kBackwardRows; ++r) {
    const int i = myRow0 + r;
    const bool live = i < p.Tq;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    rowLse[r] = live ? lse[stat] : 0.0f;
    rowDelta[r] = live ? delta[stat] : 0.0f;
    for (int c = lane; c < hs; c += kWarp) {
      myQueries[r * kMaxHs + c] = live ? widen(p.q[rowAt(b, p.qRows, i, p.qStride) + h * hs + c], p.bf16) : 0.0f;
      myGrads[r * kMaxHs + c] = live ? dout[rowAt(b, p.qRows, i, doutStride) + h * hs + c] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kLanes; ++e) acc[r][e] = 0.0f;
  }
  __syncwarp();
  const int keyEnd = p.keyEnd(firstRow, kWarps * kBackwardRows);
  for (int first = 0; first < keyEnd; first += kTile) {
    __syncthreads();
    loadTile(keys, pitch, p.k + h * hs, b, p.kvRows, first, p.Tk, p.kvStride, hs, p.bf16);
    loadTile(values, pitch, p.v + h * hs, b, p.kvRows, first, p.Tk, p.kvStride, hs, p.bf16);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kBackwardRows; ++r) {
      const int i = myRow0 + r;
      if (i >= p.Tq) continue;
      const float* qi = myQueries + r * kMaxHs;
      const float* gi = myGrads + r * kMaxHs;
      const float* kj = keys + lane * pitch;
      const float* vj = values + lane * pitch;
      float s = 0.0f, dp = 0.0f;
      for (int c = 0; c < hs; ++c) {
        s += qi[c] * kj[c];
        dp += gi[c] * vj[c];
      }
      const float prob = p.masked(i, first + lane) ? 0.0f : expf(s * p.scale - rowLse[r]);
      const float ds = prob * (dp - rowDelta[r]) * p.scale;
      addWeightedRows(acc[r], ds, keys, pitch, hs, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < kBackwardRows; ++r) {
    const int i = myRow0 + r;
    if (i >= p.Tq) continue;
#pragma unroll
    for (int e = 0; e < kLanes; ++e) {
      const int c = lane + e * kWarp;
      if (c < hs) dq[rowAt(b, p.qRows, i, dqStride) + h * hs + c] += acc[r][e];
    }
  }
}

template <typename Element, int kLanes>
__global__ void backwardKeyKernel(Pair<Element> p, const float* dout, int doutStride, const float* lse,
                                  const float* delta, float* dk, float* dv, int dkvStride) {
  constexpr int kMaxHs = kWarp * kLanes;
  __shared__ float queries[kTile * (kMaxHs + 1)];
  __shared__ float grads[kTile * (kMaxHs + 1)];  // dO rows
  __shared__ float tileLse[kTile], tileDelta[kTile];
  __shared__ float keys[kWarps * kBackwardRows * kMaxHs];
  __shared__ float values[kWarps * kBackwardRows * kMaxHs];
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, pitch = hs + 1;
  const int firstKey = blockIdx.x * kWarps * kBackwardRows;
  const int myKey0 = firstKey + warp * kBackwardRows;
  float* myKeys = keys + warp * kBackwardRows * kMaxHs;
  float* myValues = values + warp * kBackwardRows * kMaxHs;
  float dkAcc[kBackwardRows][kLanes], dvAcc[kBackwardRows][kLanes];
#pragma unroll
  for (int r = 0; r < kBackwardRows; ++r) {
    const int j = myKey0 + r;
    const bool live = j < p.Tk;
    for (int c = lane; c < hs; c += kWarp) {
      myKeys[r * kMaxHs + c] = live ? widen(p.k[rowAt(b, p.kvRows, j, p.kvStride) + h * hs + c], p.bf16) : 0.0f;
      myValues[r * kMaxHs + c] = live ? widen(p.v[rowAt(b, p.kvRows, j, p.kvStride) + h * hs + c], p.bf16) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kLanes; ++e) dkAcc[r][e] = dvAcc[r][e] = 0.0f;
  }
  __syncwarp();
  // On the diagonal, queries before the block's first key attend none of its keys.
  const int queryBegin = p.diagonal ? (firstKey / kTile) * kTile : 0;
  const size_t statBase = b * p.batchStat + static_cast<size_t>(h) * p.statStride;
  for (int first = queryBegin; first < p.Tq; first += kTile) {
    __syncthreads();
    loadTile(queries, pitch, p.q + h * hs, b, p.qRows, first, p.Tq, p.qStride, hs, p.bf16);
    loadTile(grads, pitch, dout + h * hs, b, p.qRows, first, p.Tq, doutStride, hs, false);
    if (threadIdx.x < kTile) {
      const int i = first + threadIdx.x;
      tileLse[threadIdx.x] = i < p.Tq ? lse[statBase + i] : 0.0f;
      tileDelta[threadIdx.x] = i < p.Tq ? delta[statBase + i] : 0.0f;
    }
    __syncthreads();
    const int i = first + lane;  // this lane's query
    const float* qi = queries + lane * pitch;
    const float* gi = grads + lane * pitch;
#pragma unroll
    for (int r = 0; r < kBackwardRows; ++r) {
      const int j = myKey0 + r;
      if (j >= p.Tk) continue;
      const float* kj = myKeys + r * kMaxHs;
      const float* vj = myValues + r * kMaxHs;
      float s = 0.0f, dp = 0.0f;
      for (int c = 0; c < hs; ++c) {
        s += qi[c] * kj[c];
        dp += gi[c] * vj[c];
      }
      const bool off = p.off(i, j);
      const float prob = off ? 0.0f : expf(s * p.scale - tileLse[lane]);
      const float ds = off ? 0.0f : prob * (dp - tileDelta[lane]) * p.scale;
      addWeightedRows(dvAcc[r], prob, grads, pitch, hs, lane);
      addWeightedRows(dkAcc[r], ds, queries, pitch, hs, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < kBackwardRows; ++r) {
    const int j = myKey0 + r;
    if (j >= p.Tk) continue;
#pragma unroll
    for (int e = 0; e < kLanes; ++e) {
      const int c = lane + e * kWarp;
      if (c < hs) {
        dk[rowAt(b, p.kvRows, j, dkvStride) + h * hs + c] += dkAcc[r][e];
        dv[rowAt(b, p.kvRows, j, dkvStride) + h * hs + c] += dvAcc[r][e];
      }
    }
  }
}

// ---- the small passes ----

// A block per query row (the grid's x) of each sequence (y).
__global__ void startKernel(float* out, int outStride, float* rowMax, float* rowSum, int statStride, int C, int NH,
                            size_t qRows, size_t batchStat) {
  const int b = blockIdx.y, i = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[rowAt(b, qRows, i, outStride) + c] = 0.0f;
  for (int h = threadIdx.x; h < NH; h += blockDim.x) {
    const size_t stat = b * batchStat + static_cast<size_t>(h) * statStride + i;
    rowMax[stat] = -INFINITY;
    rowSum[stat] = 0.0f;
  }
}

// A block per query row (the grid's x) of each sequence (y).
__global__ void finishKernel(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                             int statStride, int C, int NH, size_t qRows, size_t batchStat) {
  const int b = blockIdx.y, i = blockIdx.x, hs = C / NH;
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const size_t stat = b * batchStat + static_cast<size_t>(c / hs) * statStride + i;
    out[rowAt(b, qRows, i, outStride) + c] *= 1.0f / rowSum[stat];
  }
  __syncthreads();  // every thread has read rowSum before lse (which may be rowMax) is written
  for (int h = threadIdx.x; h < NH; h += blockDim.x) {
    const size_t stat = b * batchStat + static_cast<size_t>(h) * statStride + i;
    lse[stat] = rowMax[stat] + logf(rowSum[stat]);
  }
}

// A warp per (row, head).
__global__ void deltaKernel(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq,
                            int C, int NH, size_t qRows, size_t batchStat) {
  const int lane = threadIdx.x % kWarp;
  const int item = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int b = blockIdx.y, hs = C / NH;
  if (item >= Tq * NH) return;
  const int i = item / NH, h = item % NH;
  const float* d = dout + rowAt(b, qRows, i, stride) + h * hs;
  const float* o = out + rowAt(b, qRows, i, stride) + h * hs;
  float dot = 0.0f;
  for (int c = lane; c < hs; c += kWarp) dot += d[c] * o[c];
  dot = warpSum(dot);
  if (lane == 0) delta[b * batchStat + static_cast<size_t>(h) * statStride + i] = dot;
}

// Launches kernel with `bytes` of dynamic shared memory (above the 48 KiB default: opted in).
template <typename Kernel, typename... Args>
int launchTc(Kernel kernel, dim3 grid, size_t bytes, void* stream, Args... args) {
  if (const cudaError_t error =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))) {
    return static_cast<int>(error);
  }
  CHORUS_LAUNCH(kernel, grid, kTcWarps * kWarp, bytes, asStream(stream), args...);
  return launched();
}

template <typename T>
int forwardTc(const Pair<uint16_t>& p, int batch, int NH, float* out, int outStride, float* rowMax, float* rowSum,
              void* stream) {
  const dim3 grid((p.Tq + kTcRows - 1) / kTcRows, NH, batch);
  return withHeadSize(p.hs, [&](auto size) {
    return launchTc(forwardTcKernel<T, size()>, grid, TcForwardMemory::carve(nullptr, size()).bytes, stream, p, out,
                    outStride, rowMax, rowSum);
  });
}

template <typename T>
int backwardTc(const Pair<uint16_t>& p, int batch, int NH, const float* dout, int doutStride, const float* lse,
               const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride, void* stream) {
  return withHeadSize(p.hs, [&](auto size) {
    if (const int error = launchTc(backwardQueryTcKernel<T, size()>, dim3((p.Tq + kTcRows - 1) / kTcRows, NH, batch),
                                   TcQueryMemory::carve(nullptr, size()).bytes, stream, p, dout, doutStride, lse, delta,
                                   dq, dqStride)) {
      return error;
    }
    return launchTc(backwardKeyTcKernel<T, size()>, dim3((p.Tk + kTcRows - 1) / kTcRows, NH, batch),
                    TcKeyMemory::carve(nullptr, size()).bytes, stream, p, dout, doutStride, lse, delta, dk, dv,
                    dkvStride);
  });
}

// Lanes of the head's columns each lane holds (head size up to 32 lanes), 0 above the largest.
int lanesFor(int hs) { return hs > kMaxAttentionHeadSize ? 0 : (hs + kWarp - 1) / kWarp; }
// Whether the kernels take heads of C / NH columns: every entry point asks before it launches
// anything, so a refused call has touched no memory.
bool headTaken(int C, int NH) { return NH > 0 && lanesFor(C / NH) > 0; }

template <typename Element, int kLanes>
int launchForward(const Pair<Element>& p, int batch, int NH, float* out, int outStride, float* rowMax, float* rowSum,
                  void* stream) {
  constexpr int kRows = kWarps * kForwardRows;
  CHORUS_LAUNCH((forwardKernel<Element, kLanes>), dim3((p.Tq + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0,
                asStream(stream), p, out, outStride, rowMax, rowSum);
  return launched();
}

template <typename Element, int kLanes>
int launchBackward(const Pair<Element>& p, int batch, int NH, const float* dout, int doutStride, const float* lse,
                   const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride, void* stream) {
  constexpr int kRows = kWarps * kBackwardRows;
  CHORUS_LAUNCH((backwardQueryKernel<Element, kLanes>), dim3((p.Tq + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0,
                asStream(stream), p, dout, doutStride, lse, delta, dq, dqStride);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH((backwardKeyKernel<Element, kLanes>), dim3((p.Tk + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0,
                asStream(stream), p, dout, doutStride, lse, delta, dk, dv, dkvStride);
  return launched();
}

template <typename Element>
int blockForward(const AttentionBlockOf<Element>& blk, const AttentionBatch& bat, float* out, int outStride,
                 float* rowMax, float* rowSum, int statStride, void* stream) {
  if (blk.Tq == 0 || bat.batch == 0) return 0;
  const Pair<Element> p = pairOf(blk, bat, statStride);
  if constexpr (std::is_same_v<Element, uint16_t>) {
    if (tensorCoresTake(p.hs)) {
      return p.bf16 ? forwardTc<__nv_bfloat16>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream)
                    : forwardTc<__half>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream);
    }
  }
  switch (lanesFor(p.hs)) {
    case 1:
      return launchForward<Element, 1>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream);
    case 2:
      return launchForward<Element, 2>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream);
    case 3:
      return launchForward<Element, 3>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream);
    case 4:
      return launchForward<Element, 4>(p, bat.batch, blk.NH, out, outStride, rowMax, rowSum, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

template <typename Element>
int blockBackward(const AttentionBlockOf<Element>& blk, const AttentionBatch& bat, const float* dout, int doutStride,
                  const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk, float* dv,
                  int dkvStride, void* stream) {
  if (blk.Tq == 0 || blk.Tk == 0 || bat.batch == 0) return 0;
  const Pair<Element> p = pairOf(blk, bat, statStride);
  if constexpr (std::is_same_v<Element, uint16_t>) {
    if (tensorCoresTake(p.hs)) {
      return p.bf16 ? backwardTc<__nv_bfloat16>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk,
                                                dv, dkvStride, stream)
                    : backwardTc<__half>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv,
                                         dkvStride, stream);
    }
  }
  switch (lanesFor(p.hs)) {
    case 1:
      return launchBackward<Element, 1>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv,
                                        dkvStride, stream);
    case 2:
      return launchBackward<Element, 2>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv,
                                        dkvStride, stream);
    case 3:
      return launchBackward<Element, 3>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv,
                                        dkvStride, stream);
    case 4:
      return launchBackward<Element, 4>(p, bat.batch, blk.NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv,
                                        dkvStride, stream);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// The whole causal attention of qkv(B, T, 3C) as one diagonal block.
template <typename Element>
AttentionBlockOf<Element> wholeBlock(const Element* qkv, int T, int C, int NH, Float16 format) {
  AttentionBlockOf<Element> blk{qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, T, T, C, NH, true};
  blk.format = format;
  return blk;
}
AttentionBatch wholeBatch(int B, int T, int NH) {
  return AttentionBatch{B, static_cast<size_t>(T), static_cast<size_t>(T), static_cast<size_t>(NH) * T};
}

template <typename Element>
int wholeForward(Float16 format, float* out, float* lse, float* rowSum, const Element* qkv, int B, int T, int C, int NH,
                 void* stream) {
  if (!headTaken(C, NH)) return static_cast<int>(cudaErrorInvalidValue);
  const AttentionBatch bat = wholeBatch(B, T, NH);
  if (const int error = attentionBlockStart(out, C, lse, rowSum, T, T, C, NH, bat, stream)) return error;
  if (const int error = blockForward(wholeBlock(qkv, T, C, NH, format), bat, out, C, lse, rowSum, T, stream)) {
    return error;
  }
  return attentionBlockFinish(out, C, lse, lse, rowSum, T, T, C, NH, bat, stream);
}

template <typename Element>
int wholeBackward(Float16 format, float* dqkv, float* delta, const float* dout, const float* out, const Element* qkv,
                  const float* lse, int B, int T, int C, int NH, void* stream) {
  if (!headTaken(C, NH)) return static_cast<int>(cudaErrorInvalidValue);
  const AttentionBatch bat = wholeBatch(B, T, NH);
  if (const int error = attentionBlockDelta(delta, T, dout, out, C, T, C, NH, bat, stream)) return error;
  return blockBackward(wholeBlock(qkv, T, C, NH, format), bat, dout, C, lse, delta, T, dqkv, 3 * C, dqkv + C,
                       dqkv + 2 * C, 3 * C, stream);
}

}  // namespace

int attentionBlockForward(const AttentionBlock& blk, const AttentionBatch& bat, float* out, int outStride,
                          float* rowMax, float* rowSum, int statStride, void* stream) {
  return blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride, stream);
}

int attentionBlockForward(const AttentionBlock16& blk, const AttentionBatch& bat, float* out, int outStride,
                          float* rowMax, float* rowSum, int statStride, void* stream) {
  return blockForward(blk, bat, out, outStride, rowMax, rowSum, statStride, stream);
}

int attentionBlockStart(float* out, int outStride, float* rowMax, float* rowSum, int statStride, int Tq, int C, int NH,
                        const AttentionBatch& bat, void* stream) {
  if (!headTaken(C, NH)) return static_cast<int>(cudaErrorInvalidValue);
  if (Tq == 0 || bat.batch == 0) return 0;
  CHORUS_LAUNCH(startKernel, dim3(Tq, bat.batch), 128, 0, asStream(stream), out, outStride, rowMax, rowSum, statStride,
                C, NH, bat.qRows, bat.batchStatStride);
  return launched();
}

int attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                         int statStride, int Tq, int C, int NH, const AttentionBatch& bat, void* stream) {
  if (!headTaken(C, NH)) return static_cast<int>(cudaErrorInvalidValue);
  if (Tq == 0 || bat.batch == 0) return 0;
  CHORUS_LAUNCH(finishKernel, dim3(Tq, bat.batch), 128, 0, asStream(stream), out, outStride, lse, rowMax, rowSum,
                statStride, C, NH, bat.qRows, bat.batchStatStride);
  return launched();
}

int attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                        int NH, const AttentionBatch& bat, void* stream) {
  if (!headTaken(C, NH)) return static_cast<int>(cudaErrorInvalidValue);
  if (Tq == 0 || bat.batch == 0) return 0;
  constexpr int kPerBlock = 8;  // warps
  CHORUS_LAUNCH(deltaKernel, dim3((Tq * NH + kPerBlock - 1) / kPerBlock, bat.batch), kPerBlock * kWarp, 0,
                asStream(stream), delta, statStride, dout, out, stride, Tq, C, NH, bat.qRows, bat.batchStatStride);
  return launched();
}

int attentionBlockBackward(const AttentionBlock& blk, const AttentionBatch& bat, const float* dout, int doutStride,
                           const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                           float* dv, int dkvStride, void* stream) {
  return blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride, stream);
}

int attentionBlockBackward(const AttentionBlock16& blk, const AttentionBatch& bat, const float* dout, int doutStride,
                           const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                           float* dv, int dkvStride, void* stream) {
  return blockBackward(blk, bat, dout, doutStride, lse, delta, statStride, dq, dqStride, dk, dv, dkvStride, stream);
}

int attentionForward(float* out, float* lse, float* rowSum, const float* qkv, int B, int T, int C, int NH,
                     void* stream) {
  return wholeForward(Float16::kBf16, out, lse, rowSum, qkv, B, T, C, NH, stream);
}

int attentionForward16(Float16 format, float* out, float* lse, float* rowSum, const uint16_t* qkv, int B, int T, int C,
                       int NH, void* stream) {
  return wholeForward(format, out, lse, rowSum, qkv, B, T, C, NH, stream);
}

int attentionBackward(float* dqkv, float* delta, const float* dout, const float* out, const float* qkv,
                      const float* lse, int B, int T, int C, int NH, void* stream) {
  return wholeBackward(Float16::kBf16, dqkv, delta, dout, out, qkv, lse, B, T, C, NH, stream);
}

int attentionBackward16(Float16 format, float* dqkv, float* delta, const float* dout, const float* out,
                        const uint16_t* qkv, const float* lse, int B, int T, int C, int NH, void* stream) {
  return wholeBackward(format, dqkv, delta, dout, out, qkv, lse, B, T, C, NH, stream);
}

}  // namespace chorus::kernels::cuda
