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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/nn.h"

namespace chorus::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTile = 32;  // rows of the other side per pass (one per lane)

// An element of q, k or v as a float.
__device__ float widen(float x, bool) { return x; }
__device__ float widen(uint16_t x, bool bf16) {
  return bf16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}

// Where sequence b's row i of an array starts.
__device__ size_t rowAt(int b, size_t batchRows, int i, int stride) {
  return (static_cast<size_t>(b) * batchRows + i) * static_cast<size_t>(stride);
}

// What every kernel of one block-pair call reads: the block's geometry and its arrays.
template <typename Element>
struct Pair {
  const Element* q;
  const Element* k;
  const Element* v;
  int qStride, kvStride, Tq, Tk, hs;
  bool diagonal, bf16;
  size_t qRows, kvRows, batchStat;  // AttentionBatch
  int statStride;
  float scale;
  // Whether key j is masked for query i.
  __device__ bool masked(int i, int j) const { return j >= Tk || (diagonal && j > i); }
  // The keys queries [firstRow, firstRow + rows) may attend: [0, keyEnd); on the diagonal, keys
  // past the last of them are masked for all.
  __device__ int keyEnd(int firstRow, int rows) const { return diagonal ? min(Tk, min(Tq, firstRow + rows)) : Tk; }
};

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
      const bool off = i >= p.Tq || p.masked(i, j);
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

__global__ void startKernel(float* out, int outStride, float* rowMax, float* rowSum, int statStride, int Tq, int C,
                            int NH, size_t qRows, size_t batchStat) {
  const int b = blockIdx.y, i = blockIdx.x;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[rowAt(b, qRows, i, outStride) + c] = 0.0f;
  for (int h = threadIdx.x; h < NH; h += blockDim.x) {
    const size_t stat = b * batchStat + static_cast<size_t>(h) * statStride + i;
    rowMax[stat] = -INFINITY;
    rowSum[stat] = 0.0f;
  }
}

__global__ void finishKernel(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                             int statStride, int Tq, int C, int NH, size_t qRows, size_t batchStat) {
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

// ---- tensor cores: 16-bit q, k and v whose head size is a multiple of 16 ----
// The same blocks and the same work split by owner as above, with the products on the tensor
// cores (WMMA 16 x 16 x 16, fp32 accumulation) and the rounding of the CPU's 16-bit attention
// (kernels/cpu/nn.h): the probabilities are rounded to the format for P V, and backward rounds dO
// and dS for its products. Each warp owns 16 rows (queries; keys in the dk/dv kernel) of a block
// of kTcRows; the other side goes by kTcOther rows at a time through shared memory. Scores,
// probabilities and the fp32 sums a warp owns live in shared memory (a fragment's layout is the
// hardware's), so the online softmax rescales them by row.

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcOther = 32;
static_assert(kTcOther == kWarp, "the forward's online softmax gives each lane one key of the tile");

// True when the tensor-core kernels take a head of hs columns.
bool tensorCoresTake(int hs) { return hs % 16 == 0 && hs <= kMaxAttentionHeadSize; }

template <typename T>
__device__ T roundTo(float x);
template <>
__device__ __nv_bfloat16 roundTo<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __half roundTo<__half>(float x) {
  return __float2half_rn(x);
}

// Carves one block's dynamic shared memory: each piece 128-byte aligned (WMMA needs 32).
struct Carve {
  size_t used = 0;
  template <typename U>
  __host__ __device__ U* take(unsigned char* base, size_t count) {
    U* at = reinterpret_cast<U*>(reinterpret_cast<uintptr_t>(base) + used);  // base: null to size only
    used += (count * sizeof(U) + 127) / 128 * 128;
    return at;
  }
};

// Leading dimensions: 16-bit rows padded by 8 elements, fp32 rows by 4 (multiples WMMA allows,
// and the padding spreads the rows over the banks).
__host__ __device__ inline int halfPitch(int cols) { return cols + 8; }
__host__ __device__ inline int floatPitch(int cols) { return cols + 4; }

// rows x hs 16-bit elements of one head into tile (pitch halfPitch(hs)), zeros past `rows`.
template <typename T>
__device__ void loadTcTile(T* tile, const T* base, int b, size_t batchRows, int first, int count, int rows, int stride,
                           int hs) {
  const int pitch = halfPitch(hs);
  for (int at = threadIdx.x; at < count * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs;
    tile[r * pitch + c] = first + r < rows ? base[rowAt(b, batchRows, first + r, stride) + c] : roundTo<T>(0.0f);
  }
}
// The same from fp32 rows (dO), rounded to T.
template <typename T>
__device__ void loadTcTileRounded(T* tile, const float* base, int b, size_t batchRows, int first, int count, int rows,
                                  int stride, int hs) {
  const int pitch = halfPitch(hs);
  for (int at = threadIdx.x; at < count * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs;
    tile[r * pitch + c] = roundTo<T>(first + r < rows ? base[rowAt(b, batchRows, first + r, stride) + c] : 0.0f);
  }
}

namespace wm = nvcuda::wmma;
using Accumulator = wm::fragment<wm::accumulator, 16, 16, 16, float>;

// out (16 x 16 * nTiles, fp32, pitch ldOut) = a (16 x depth, row-major) times b^T, b given as
// 16 * nTiles rows of depth (row-major): the scores of a warp's rows against a tile's.
template <typename T>
__device__ void productWithTransposed(float* out, int ldOut, const T* a, int lda, const T* b, int ldb, int nTiles,
                                      int depth) {
  for (int n = 0; n < nTiles; ++n) {
    Accumulator acc;
    wm::fill_fragment(acc, 0.0f);
    for (int k = 0; k < depth; k += 16) {
      wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
      wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major> fb;
      wm::load_matrix_sync(fa, a + k, lda);
      wm::load_matrix_sync(fb, b + n * 16 * ldb + k, ldb);
      wm::mma_sync(acc, fa, fb, acc);
    }
    wm::store_matrix_sync(out + n * 16, acc, ldOut, wm::mem_row_major);
  }
}

// sum (16 x width, fp32, pitch ldSum) += a (16 x depth, row-major) times b (depth x width,
// row-major): a warp's weighted sums of a tile's rows.
template <typename T>
__device__ void addProduct(float* sum, int ldSum, const T* a, int lda, const T* b, int ldb, int width, int depth) {
  for (int n = 0; n < width; n += 16) {
    Accumulator acc;
    wm::load_matrix_sync(acc, sum + n, ldSum, wm::mem_row_major);
    for (int k = 0; k < depth; k += 16) {
      wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> fa;
      wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> fb;
      wm::load_matrix_sync(fa, a + k, lda);
      wm::load_matrix_sync(fb, b + k * ldb + n, ldb);
      wm::mma_sync(acc, fa, fb, acc);
    }
    wm::store_matrix_sync(sum + n, acc, ldSum, wm::mem_row_major);
  }
}

// Shared memory of each kernel, by head size (the host sizes the launch with the same carve).
struct TcForwardMemory {
  __nv_bfloat16 *q, *k, *v, *p;  // any 16-bit T: the pointers are cast
  float *s, *o, *rowMax, *rowSum, *carry;
  size_t bytes;
  __host__ __device__ static TcForwardMemory carve(unsigned char* base, int hs) {
    TcForwardMemory m{};
    Carve c;
    m.q = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.k = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.v = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.p = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(kTcOther));
    m.s = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(kTcOther));
    m.o = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(hs));
    m.rowMax = c.take<float>(base, kTcRows);
    m.rowSum = c.take<float>(base, kTcRows);
    m.carry = c.take<float>(base, kTcRows);
    m.bytes = c.used;
    return m;
  }
};

template <typename T>
__global__ void __launch_bounds__(kTcWarps* kWarp)
    forwardTcKernel(Pair<uint16_t> p, float* out, int outStride, float* rowMax, float* rowSum) {
  extern __shared__ __align__(128) unsigned char shared[];
  const TcForwardMemory m = TcForwardMemory::carve(shared, p.hs);
  T *qs = reinterpret_cast<T*>(m.q), *ks = reinterpret_cast<T*>(m.k), *vs = reinterpret_cast<T*>(m.v);
  T* ps = reinterpret_cast<T*>(m.p);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, ldh = halfPitch(hs), lds = floatPitch(kTcOther), ldp = halfPitch(kTcOther), ldo = floatPitch(hs);
  const int firstRow = blockIdx.x * kTcRows;
  const T* q = reinterpret_cast<const T*>(p.q) + h * hs;
  const T* k = reinterpret_cast<const T*>(p.k) + h * hs;
  const T* v = reinterpret_cast<const T*>(p.v) + h * hs;
  // The block's queries, and the running state of their rows: output, maximum, sum.
  loadTcTile(qs, q, b, p.qRows, firstRow, kTcRows, p.Tq, p.qStride, hs);
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs, i = firstRow + r;
    m.o[r * ldo + c] = i < p.Tq ? out[rowAt(b, p.qRows, i, outStride) + h * hs + c] : 0.0f;
  }
  for (int r = threadIdx.x; r < kTcRows; r += blockDim.x) {
    const int i = firstRow + r;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    m.rowMax[r] = i < p.Tq ? rowMax[stat] : -INFINITY;
    m.rowSum[r] = i < p.Tq ? rowSum[stat] : 0.0f;
  }
  const int mine = warp * 16;  // this warp's first row in the block
  float* s = m.s + mine * lds;
  T* pw = ps + mine * ldp;
  float* o = m.o + mine * ldo;
  const int keyEnd = p.keyEnd(firstRow, kTcRows);
  for (int first = 0; first < keyEnd; first += kTcOther) {
    __syncthreads();  // the last tile read by every warp (and, the first time, the state loaded)
    loadTcTile(ks, k, b, p.kvRows, first, kTcOther, p.Tk, p.kvStride, hs);
    loadTcTile(vs, v, b, p.kvRows, first, kTcOther, p.Tk, p.kvStride, hs);
    __syncthreads();
    productWithTransposed(s, lds, qs + mine * ldh, ldh, ks, ldh, kTcOther / 16, hs);
    __syncwarp();
    // The online softmax, a row at a time: lane j holds key first + j.
    for (int r = 0; r < 16; ++r) {
      const int row = mine + r, i = firstRow + row;
      const float score = i >= p.Tq || p.masked(i, first + lane) ? -INFINITY : s[r * lds + lane] * p.scale;
      const float before = m.rowMax[row];
      const float newMax = fmaxf(before, warpMax(score));
      float weight = 0.0f, carry = 1.0f;
      if (newMax != -INFINITY) {
        weight = score == -INFINITY ? 0.0f : expf(score - newMax);
        carry = before == -INFINITY ? 0.0f : expf(before - newMax);
      }
      const float total = warpSum(weight);  // every lane has read rowMax before lane 0 writes it
      pw[r * ldp + lane] = roundTo<T>(weight);
      if (lane == 0) {
        m.rowMax[row] = newMax;
        m.rowSum[row] = m.rowSum[row] * carry + total;
        m.carry[row] = carry;
      }
    }
    __syncwarp();
    for (int at = lane; at < 16 * hs; at += kWarp) o[(at / hs) * ldo + at % hs] *= m.carry[mine + at / hs];
    __syncwarp();
    addProduct(o, ldo, pw, ldp, vs, ldh, hs, kTcOther);
  }
  __syncthreads();
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs, i = firstRow + r;
    if (i < p.Tq) out[rowAt(b, p.qRows, i, outStride) + h * hs + c] = m.o[r * ldo + c];
  }
  for (int r = threadIdx.x; r < kTcRows; r += blockDim.x) {
    const int i = firstRow + r;
    if (i >= p.Tq) continue;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    rowMax[stat] = m.rowMax[r];
    rowSum[stat] = m.rowSum[r];
  }
}

// Backward, dq: per block of queries, the keys a tile at a time.
struct TcQueryMemory {
  __nv_bfloat16 *q, *dout, *k, *v, *ds;
  float *s, *dp, *dq, *lse, *delta;
  size_t bytes;
  __host__ __device__ static TcQueryMemory carve(unsigned char* base, int hs) {
    TcQueryMemory m{};
    Carve c;
    m.q = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.dout = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.k = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.v = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.ds = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(kTcOther));
    m.s = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(kTcOther));
    m.dp = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(kTcOther));
    m.dq = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(hs));
    m.lse = c.take<float>(base, kTcRows);
    m.delta = c.take<float>(base, kTcRows);
    m.bytes = c.used;
    return m;
  }
};

template <typename T>
__global__ void __launch_bounds__(kTcWarps* kWarp)
    backwardQueryTcKernel(Pair<uint16_t> p, const float* dout, int doutStride, const float* lse, const float* delta,
                          float* dq, int dqStride) {
  extern __shared__ __align__(128) unsigned char shared[];
  const TcQueryMemory m = TcQueryMemory::carve(shared, p.hs);
  T *qs = reinterpret_cast<T*>(m.q), *gs = reinterpret_cast<T*>(m.dout), *ks = reinterpret_cast<T*>(m.k),
    *vs = reinterpret_cast<T*>(m.v), *dss = reinterpret_cast<T*>(m.ds);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, ldh = halfPitch(hs), lds = floatPitch(kTcOther), ldp = halfPitch(kTcOther), ldo = floatPitch(hs);
  const int firstRow = blockIdx.x * kTcRows;
  const T* k = reinterpret_cast<const T*>(p.k) + h * hs;
  const T* v = reinterpret_cast<const T*>(p.v) + h * hs;
  loadTcTile(qs, reinterpret_cast<const T*>(p.q) + h * hs, b, p.qRows, firstRow, kTcRows, p.Tq, p.qStride, hs);
  loadTcTileRounded(gs, dout + h * hs, b, p.qRows, firstRow, kTcRows, p.Tq, doutStride, hs);
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) m.dq[(at / hs) * ldo + at % hs] = 0.0f;
  for (int r = threadIdx.x; r < kTcRows; r += blockDim.x) {
    const int i = firstRow + r;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + i;
    m.lse[r] = i < p.Tq ? lse[stat] : 0.0f;
    m.delta[r] = i < p.Tq ? delta[stat] : 0.0f;
  }
  const int mine = warp * 16;
  float *s = m.s + mine * lds, *dp = m.dp + mine * lds, *dqw = m.dq + mine * ldo;
  T* ds = dss + mine * ldp;
  const int keyEnd = p.keyEnd(firstRow, kTcRows);
  for (int first = 0; first < keyEnd; first += kTcOther) {
    __syncthreads();
    loadTcTile(ks, k, b, p.kvRows, first, kTcOther, p.Tk, p.kvStride, hs);
    loadTcTile(vs, v, b, p.kvRows, first, kTcOther, p.Tk, p.kvStride, hs);
    __syncthreads();
    productWithTransposed(s, lds, qs + mine * ldh, ldh, ks, ldh, kTcOther / 16, hs);
    productWithTransposed(dp, lds, gs + mine * ldh, ldh, vs, ldh, kTcOther / 16, hs);
    __syncwarp();
    for (int at = lane; at < 16 * kTcOther; at += kWarp) {
      const int r = at / kTcOther, j = at % kTcOther, row = mine + r, i = firstRow + row;
      const bool off = i >= p.Tq || p.masked(i, first + j);
      const float prob = off ? 0.0f : expf(s[r * lds + j] * p.scale - m.lse[row]);
      ds[r * ldp + j] = roundTo<T>(off ? 0.0f : prob * (dp[r * lds + j] - m.delta[row]) * p.scale);
    }
    __syncwarp();
    addProduct(dqw, ldo, ds, ldp, ks, ldh, hs, kTcOther);
  }
  __syncthreads();
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs, i = firstRow + r;
    if (i < p.Tq) dq[rowAt(b, p.qRows, i, dqStride) + h * hs + c] += m.dq[r * ldo + c];
  }
}

// Backward, dk and dv: per block of keys, the queries a tile at a time (transposed: a warp's key
// rows against the tile's queries).
struct TcKeyMemory {
  __nv_bfloat16 *k, *v, *q, *dout, *p, *ds;
  float *s, *dp, *dk, *dv, *lse, *delta;
  size_t bytes;
  __host__ __device__ static TcKeyMemory carve(unsigned char* base, int hs) {
    TcKeyMemory m{};
    Carve c;
    m.k = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.v = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.q = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.dout = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcOther) * halfPitch(hs));
    m.p = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(kTcOther));
    m.ds = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(kTcOther));
    m.s = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(kTcOther));
    m.dp = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(kTcOther));
    m.dk = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(hs));
    m.dv = c.take<float>(base, static_cast<size_t>(kTcRows) * floatPitch(hs));
    m.lse = c.take<float>(base, kTcOther);
    m.delta = c.take<float>(base, kTcOther);
    m.bytes = c.used;
    return m;
  }
};

template <typename T>
__global__ void __launch_bounds__(kTcWarps* kWarp)
    backwardKeyTcKernel(Pair<uint16_t> p, const float* dout, int doutStride, const float* lse, const float* delta,
                        float* dk, float* dv, int dkvStride) {
  extern __shared__ __align__(128) unsigned char shared[];
  const TcKeyMemory m = TcKeyMemory::carve(shared, p.hs);
  T *ks = reinterpret_cast<T*>(m.k), *vs = reinterpret_cast<T*>(m.v), *qs = reinterpret_cast<T*>(m.q),
    *gs = reinterpret_cast<T*>(m.dout), *pss = reinterpret_cast<T*>(m.p), *dss = reinterpret_cast<T*>(m.ds);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int hs = p.hs, ldh = halfPitch(hs), lds = floatPitch(kTcOther), ldp = halfPitch(kTcOther), ldo = floatPitch(hs);
  const int firstKey = blockIdx.x * kTcRows;
  const T* q = reinterpret_cast<const T*>(p.q) + h * hs;
  loadTcTile(ks, reinterpret_cast<const T*>(p.k) + h * hs, b, p.kvRows, firstKey, kTcRows, p.Tk, p.kvStride, hs);
  loadTcTile(vs, reinterpret_cast<const T*>(p.v) + h * hs, b, p.kvRows, firstKey, kTcRows, p.Tk, p.kvStride, hs);
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) {
    m.dk[(at / hs) * ldo + at % hs] = 0.0f;
    m.dv[(at / hs) * ldo + at % hs] = 0.0f;
  }
  const int mine = warp * 16;
  float *s = m.s + mine * lds, *dp = m.dp + mine * lds, *dkw = m.dk + mine * ldo, *dvw = m.dv + mine * ldo;
  T *pw = pss + mine * ldp, *ds = dss + mine * ldp;
  // On the diagonal, queries before the block's first key attend none of its keys.
  const int queryBegin = p.diagonal ? (firstKey / kTcOther) * kTcOther : 0;
  const size_t statBase = b * p.batchStat + static_cast<size_t>(h) * p.statStride;
  for (int first = queryBegin; first < p.Tq; first += kTcOther) {
    __syncthreads();
    loadTcTile(qs, q, b, p.qRows, first, kTcOther, p.Tq, p.qStride, hs);
    loadTcTileRounded(gs, dout + h * hs, b, p.qRows, first, kTcOther, p.Tq, doutStride, hs);
    for (int j = threadIdx.x; j < kTcOther; j += blockDim.x) {
      m.lse[j] = first + j < p.Tq ? lse[statBase + first + j] : 0.0f;
      m.delta[j] = first + j < p.Tq ? delta[statBase + first + j] : 0.0f;
    }
    __syncthreads();
    productWithTransposed(s, lds, ks + mine * ldh, ldh, qs, ldh, kTcOther / 16, hs);   // S^T
    productWithTransposed(dp, lds, vs + mine * ldh, ldh, gs, ldh, kTcOther / 16, hs);  // dP^T
    __syncwarp();
    for (int at = lane; at < 16 * kTcOther; at += kWarp) {
      const int r = at / kTcOther, c = at % kTcOther, key = firstKey + mine + r, i = first + c;
      const bool off = i >= p.Tq || key >= p.Tk || p.masked(i, key);
      const float prob = off ? 0.0f : expf(s[r * lds + c] * p.scale - m.lse[c]);
      pw[r * ldp + c] = roundTo<T>(prob);
      ds[r * ldp + c] = roundTo<T>(off ? 0.0f : prob * (dp[r * lds + c] - m.delta[c]) * p.scale);
    }
    __syncwarp();
    addProduct(dvw, ldo, pw, ldp, gs, ldh, hs, kTcOther);  // dV += P^T dO
    addProduct(dkw, ldo, ds, ldp, qs, ldh, hs, kTcOther);  // dK += dS^T Q
  }
  __syncthreads();
  for (int at = threadIdx.x; at < kTcRows * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs, j = firstKey + r;
    if (j >= p.Tk) continue;
    dk[rowAt(b, p.kvRows, j, dkvStride) + h * hs + c] += m.dk[r * ldo + c];
    dv[rowAt(b, p.kvRows, j, dkvStride) + h * hs + c] += m.dv[r * ldo + c];
  }
}

// Launches kernel with `bytes` of dynamic shared memory (above the 48 KiB default: opted in).
template <typename Kernel, typename... Args>
int launchTc(Kernel kernel, dim3 grid, size_t bytes, void* stream, Args... args) {
  if (const cudaError_t error =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes))) {
    return static_cast<int>(error);
  }
  kernel<<<grid, kTcWarps * kWarp, bytes, asStream(stream)>>>(args...);
  return launched();
}

template <typename T>
int forwardTc(const Pair<uint16_t>& p, int batch, int NH, float* out, int outStride, float* rowMax, float* rowSum,
              void* stream) {
  const size_t bytes = TcForwardMemory::carve(nullptr, p.hs).bytes;
  return launchTc(forwardTcKernel<T>, dim3((p.Tq + kTcRows - 1) / kTcRows, NH, batch), bytes, stream, p, out, outStride,
                  rowMax, rowSum);
}

template <typename T>
int backwardTc(const Pair<uint16_t>& p, int batch, int NH, const float* dout, int doutStride, const float* lse,
               const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride, void* stream) {
  if (const int error =
          launchTc(backwardQueryTcKernel<T>, dim3((p.Tq + kTcRows - 1) / kTcRows, NH, batch),
                   TcQueryMemory::carve(nullptr, p.hs).bytes, stream, p, dout, doutStride, lse, delta, dq, dqStride)) {
    return error;
  }
  return launchTc(backwardKeyTcKernel<T>, dim3((p.Tk + kTcRows - 1) / kTcRows, NH, batch),
                  TcKeyMemory::carve(nullptr, p.hs).bytes, stream, p, dout, doutStride, lse, delta, dk, dv, dkvStride);
}

// Lanes of the head's columns each lane holds (head size up to 32 lanes), 0 above the largest.
int lanesFor(int hs) { return hs > kMaxAttentionHeadSize ? 0 : (hs + kWarp - 1) / kWarp; }

template <typename Element, int kLanes>
int launchForward(const Pair<Element>& p, int batch, int NH, float* out, int outStride, float* rowMax, float* rowSum,
                  void* stream) {
  constexpr int kRows = kWarps * kForwardRows;
  forwardKernel<Element, kLanes><<<dim3((p.Tq + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0, asStream(stream)>>>(
      p, out, outStride, rowMax, rowSum);
  return launched();
}

template <typename Element, int kLanes>
int launchBackward(const Pair<Element>& p, int batch, int NH, const float* dout, int doutStride, const float* lse,
                   const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride, void* stream) {
  constexpr int kRows = kWarps * kBackwardRows;
  backwardQueryKernel<Element, kLanes>
      <<<dim3((p.Tq + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0, asStream(stream)>>>(p, dout, doutStride, lse,
                                                                                             delta, dq, dqStride);
  if (const int error = launched()) return error;
  backwardKeyKernel<Element, kLanes>
      <<<dim3((p.Tk + kRows - 1) / kRows, NH, batch), kWarps * kWarp, 0, asStream(stream)>>>(p, dout, doutStride, lse,
                                                                                             delta, dk, dv, dkvStride);
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
  if (Tq == 0 || bat.batch == 0) return 0;
  startKernel<<<dim3(Tq, bat.batch), 128, 0, asStream(stream)>>>(out, outStride, rowMax, rowSum, statStride, Tq, C, NH,
                                                                 bat.qRows, bat.batchStatStride);
  return launched();
}

int attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                         int statStride, int Tq, int C, int NH, const AttentionBatch& bat, void* stream) {
  if (Tq == 0 || bat.batch == 0) return 0;
  finishKernel<<<dim3(Tq, bat.batch), 128, 0, asStream(stream)>>>(out, outStride, lse, rowMax, rowSum, statStride, Tq,
                                                                  C, NH, bat.qRows, bat.batchStatStride);
  return launched();
}

int attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                        int NH, const AttentionBatch& bat, void* stream) {
  if (Tq == 0 || bat.batch == 0) return 0;
  constexpr int kPerBlock = 8;  // warps
  deltaKernel<<<dim3((Tq * NH + kPerBlock - 1) / kPerBlock, bat.batch), kPerBlock * kWarp, 0, asStream(stream)>>>(
      delta, statStride, dout, out, stride, Tq, C, NH, bat.qRows, bat.batchStatStride);
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
