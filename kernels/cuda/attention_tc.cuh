// attention_tc.cuh: what attention.cu's kernels share (where a row starts, a block pair's
// geometry) and its tensor-core kernels, for 16-bit q, k and v whose head size is a multiple of 16.
// attention.cu launches them. Written against a small part of CUDA (threads, warps and their
// shuffles, WMMA fragments, dynamic shared memory) so that a host emulation of that part
// (tests/support/cuda_emulation.h, defining CHORUS_CUDA_EMULATION) compiles the same kernels and
// tests them on a machine without a GPU.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/nn.h"

namespace chorus::kernels::cuda::attention {

// Where sequence b's row i of an array starts.
__device__ inline size_t rowAt(int b, size_t batchRows, int i, int stride) {
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

// The same blocks and the same work split by owner as attention.cu's scalar kernels, with the
// products on the tensor cores (WMMA 16 x 16 x 16, fp32 accumulation) and the rounding of the CPU's 16-bit attention
// (kernels/cpu/nn.h): the probabilities are rounded to the format for P V, and backward rounds dO
// and dS for its products. Each warp owns 16 rows (queries; keys in the dk/dv kernel) of a block
// of kTcRows; the other side goes by kTcOther rows at a time through shared memory. Scores,
// probabilities and the fp32 sums a warp owns live in shared memory (a fragment's layout is the
// hardware's), so the online softmax rescales them by row.

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcOther = 32;
static_assert(kTcOther % 2 == 0, "the forward's online softmax gives each of a row's two lanes half the tile");

// True when the tensor-core kernels take a head of hs columns.
inline bool tensorCoresTake(int hs) { return hs % 16 == 0 && hs <= kMaxAttentionHeadSize; }

template <typename T>
__device__ T roundTo(float x);
template <>
inline __device__ __nv_bfloat16 roundTo<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
inline __device__ __half roundTo<__half>(float x) {
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

// rows x hs 16-bit elements of one head into tile (pitch halfPitch(hs)), zeros past `rows`: 16
// bytes (8 elements) per load where the rows start 16-byte aligned (hs is a multiple of 16, so a
// tile's rows do), else an element at a time.
template <typename T>
__device__ void loadTcTile(T* tile, const T* base, int b, size_t batchRows, int first, int count, int rows, int stride,
                           int hs) {
  const int pitch = halfPitch(hs);
  if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % 8 == 0) {
    const int chunks = hs / 8;
    for (int at = threadIdx.x; at < count * chunks; at += blockDim.x) {
      const int r = at / chunks, c = (at - r * chunks) * 8;
      uint4 x{};  // +0 in both 16-bit formats
      if (first + r < rows) x = *reinterpret_cast<const uint4*>(base + rowAt(b, batchRows, first + r, stride) + c);
      *reinterpret_cast<uint4*>(tile + r * pitch + c) = x;
    }
    return;
  }
  for (int at = threadIdx.x; at < count * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs;
    tile[r * pitch + c] = first + r < rows ? base[rowAt(b, batchRows, first + r, stride) + c] : roundTo<T>(0.0f);
  }
}
// The same from fp32 rows (dO), rounded to T: 4 floats per load where aligned.
template <typename T>
__device__ void loadTcTileRounded(T* tile, const float* base, int b, size_t batchRows, int first, int count, int rows,
                                  int stride, int hs) {
  const int pitch = halfPitch(hs);
  if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % 4 == 0) {
    const int chunks = hs / 4;
    for (int at = threadIdx.x; at < count * chunks; at += blockDim.x) {
      const int r = at / chunks, c = (at - r * chunks) * 4;
      float4 x{0.0f, 0.0f, 0.0f, 0.0f};
      if (first + r < rows) x = *reinterpret_cast<const float4*>(base + rowAt(b, batchRows, first + r, stride) + c);
      T* to = tile + r * pitch + c;
      to[0] = roundTo<T>(x.x);
      to[1] = roundTo<T>(x.y);
      to[2] = roundTo<T>(x.z);
      to[3] = roundTo<T>(x.w);
    }
    return;
  }
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
  float *s, *o, *rowMax, *rowSum;
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
    m.bytes = c.used;
    return m;
  }
};

template <typename T>
__global__ void __launch_bounds__(kTcWarps* kWarp)
    forwardTcKernel(Pair<uint16_t> p, float* out, int outStride, float* rowMax, float* rowSum) {
  CHORUS_DYNAMIC_SHARED(shared);
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
    // The online softmax: a pair of lanes per row (r = lane / 2), each lane every other key of the
    // tile (half, half + 2, ...), so a row's maximum and sum are a loop and one shuffle.
    {
      const int r = lane >> 1, half = lane & 1, row = mine + r, i = firstRow + row;
      float score[kTcOther / 2];
      float tileMax = -INFINITY;
      for (int j = 0; j < kTcOther / 2; ++j) {
        const int c = 2 * j + half;
        score[j] = i >= p.Tq || p.masked(i, first + c) ? -INFINITY : s[r * lds + c] * p.scale;
        tileMax = fmaxf(tileMax, score[j]);
      }
      tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
      const float before = m.rowMax[row];
      const float newMax = fmaxf(before, tileMax);
      const float carry = newMax == -INFINITY ? 1.0f : before == -INFINITY ? 0.0f : expf(before - newMax);
      float total = 0.0f;
      for (int j = 0; j < kTcOther / 2; ++j) {
        const float weight = newMax == -INFINITY || score[j] == -INFINITY ? 0.0f : expf(score[j] - newMax);
        pw[r * ldp + 2 * j + half] = roundTo<T>(weight);
        total += weight;
      }
      total += __shfl_xor_sync(0xffffffffu, total, 1);  // both lanes of the row have read rowMax by now
      if (half == 0) {
        m.rowMax[row] = newMax;
        m.rowSum[row] = m.rowSum[row] * carry + total;
      }
      // The row's output so far, rescaled to the new maximum (the pair's columns interleaved).
      for (int col = half; col < hs; col += 2) o[r * ldo + col] *= carry;
    }
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
  CHORUS_DYNAMIC_SHARED(shared);
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
  CHORUS_DYNAMIC_SHARED(shared);
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

}  // namespace chorus::kernels::cuda::attention
