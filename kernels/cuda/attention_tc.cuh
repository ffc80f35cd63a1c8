// attention_tc.cuh: what attention.cu's kernels share (where a row starts, a block pair's
// geometry) and its tensor-core kernels, for 16-bit q, k and v whose head size is a multiple of 16.
// attention.cu launches them. Written against a small part of CUDA (threads, warps and their
// shuffles, the warp's tensor-core product of mma.cuh, dynamic shared memory) so that a host emulation of that part
// (tests/support/cuda_emulation.h, defining CHORUS_CUDA_EMULATION) compiles the same kernels and
// tests them on a machine without a GPU.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/copy_async.cuh"
#include "kernels/cuda/mma.cuh"
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
  // Whether query i and key j take no part together: a row past the queries, or masked.
  __device__ bool off(int i, int j) const { return i >= Tq || masked(i, j); }
  // Whether some pair of queries [i0, i0 + rows) and keys [j0, j0 + keys) is off (a tile with none
  // needs no checks).
  __device__ bool anyOff(int i0, int rows, int j0, int keys) const {
    return i0 + rows > Tq || j0 + keys > Tk || (diagonal && j0 + keys - 1 > i0);
  }
  // Of `pieces` pieces of 8 keys from j0, how many some query up to iLast may attend (on the
  // diagonal, those past it are masked for all).
  __device__ int keyPiecesSeen(int iLast, int j0, int pieces) const {
    return !diagonal ? pieces : iLast < j0 ? 0 : min(pieces, (iLast - j0) / 8 + 1);
  }
  // Of `pieces` pieces of 8 queries from i0, how many attend no key from j0 on (on the diagonal,
  // those before it).
  __device__ int queryPiecesBlind(int i0, int j0, int pieces) const {
    return diagonal && j0 > i0 ? min(pieces, (j0 - i0) / 8) : 0;
  }
  // The keys queries [firstRow, firstRow + rows) may attend: [0, keyEnd); on the diagonal, keys
  // past the last of them are masked for all.
  __device__ int keyEnd(int firstRow, int rows) const { return diagonal ? min(Tk, min(Tq, firstRow + rows)) : Tk; }
};

// The same blocks and the same work split by owner as attention.cu's scalar kernels, with the
// products on the tensor cores (mma.cuh: the warp's 16 x 8 x 16 product on registers, fp32
// accumulation) and the rounding of the CPU's 16-bit attention (kernels/cpu/nn.h): the
// probabilities are rounded to the format for P V, and backward rounds dO and dS for its products.
// Each warp owns 16 rows (queries; keys in the dk/dv kernel) of a block of kTcRows; the other side
// goes by a tile of rows at a time through shared memory. A warp's scores, probabilities and sums
// stay in its registers: a lane holds rows g and g+8 (g = lane / 4) of each 16 x 8 piece, so the
// online softmax reduces a row over the 4 lanes of its group, and the probabilities' accumulators
// are already the next product's a operand. Every tile is stored once, row by row: a product that
// reads one along its other index (V in P V, K in dS K, Q and dO in the dk/dv kernel's) loads it
// transposed (ldmatrix .trans).

constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;

// True when the tensor-core kernels take a head of hs columns.
inline bool tensorCoresTake(int hs) { return hs % 16 == 0 && hs <= kMaxAttentionHeadSize; }

// Rows of the other side per tile: keys in the forward, keys or queries in backward (fewer for
// wide heads, whose accumulators take more registers).
__host__ __device__ constexpr int forwardTile(int) { return 64; }
__host__ __device__ constexpr int backwardTile(int hs) { return hs <= 64 ? 64 : 16; }

// Calls f(std::integral_constant<int, HS>{}) for the head size hs (tensorCoresTake(hs)) and
// returns what it returns: the kernels are compiled for each such size.
template <typename F>
auto withHeadSize(int hs, F f) {
  static_assert(kMaxAttentionHeadSize == 128, "one case per multiple of 16");
  switch (hs) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 48:
      return f(std::integral_constant<int, 48>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 80:
      return f(std::integral_constant<int, 80>{});
    case 96:
      return f(std::integral_constant<int, 96>{});
    case 112:
      return f(std::integral_constant<int, 112>{});
    default:
      return f(std::integral_constant<int, 128>{});
  }
}

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
template <>
inline __device__ float roundTo<float>(float x) {
  return x;
}
template <typename T>
__device__ T toElement(T x) {
  return x;
}
template <typename T>
__device__ T toElement(float x) {
  return roundTo<T>(x);
}

// Carves one block's dynamic shared memory: each piece 128-byte aligned. base: null to size only.
// The pieces are offsets from base (no integer round trip), so the compiler sees they are shared
// memory and loads them as such.
struct Carve {
  size_t used = 0;
  template <typename U>
  __host__ __device__ U* take(unsigned char* base, size_t count) {
    U* at = base != nullptr ? reinterpret_cast<U*>(base + used) : nullptr;
    used += (count * sizeof(U) + 127) / 128 * 128;
    return at;
  }
};

// A tile's pitch: 16-bit rows padded by 8 elements (16 bytes, so rows stay 16-byte aligned for
// ldmatrix; the 8 rows of 16 bytes one of its matrices reads then fall in 32 different banks).
__host__ __device__ constexpr int halfPitch(int cols) { return cols + 8; }

// Rows [first, first + count) x hs columns of one head (sequence b) into tile (tile[r * pitch + c]),
// rounded to T where Source is float (dO), zeros past `rows`. 16 bytes per load where the rows
// start 16-byte aligned, else an element at a time.
template <typename T, typename Source>
__device__ void loadTile(T* tile, int pitch, const Source* base, int b, size_t batchRows, int first, int count,
                         int rows, int stride, int hs) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(Source));  // elements per 16-byte load
  if (reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride % kPer == 0) {
    const int chunks = hs / kPer;
    for (int at = threadIdx.x; at < count * chunks; at += blockDim.x) {
      const int r = at / chunks, c = (at % chunks) * kPer;
      uint4 x{0, 0, 0, 0};  // +0 in every format
      if (first + r < rows) x = *reinterpret_cast<const uint4*>(base + rowAt(b, batchRows, first + r, stride) + c);
      if constexpr (std::is_same_v<Source, T>) {
        *reinterpret_cast<uint4*>(tile + r * pitch + c) = x;
      } else {
        Source e[kPer];
        memcpy(e, &x, sizeof x);
        for (int j = 0; j < kPer; ++j) tile[r * pitch + c + j] = toElement<T>(e[j]);
      }
    }
    return;
  }
  for (int at = threadIdx.x; at < count * hs; at += blockDim.x) {
    const int r = at / hs, c = at % hs;
    tile[r * pitch + c] =
        first + r < rows ? toElement<T>(base[rowAt(b, batchRows, first + r, stride) + c]) : roundTo<T>(0.0f);
  }
}

// As loadTile from a source of the tile's own type (16-bit, or fp32 to stage), by asynchronous
// copies (copy_async.cuh) where the rows start 16-byte aligned: they land by this thread's next
// waitCopies, and the block sees them after a barrier past it. Rows past `rows` are zeroed by
// plain stores, and unaligned rows go as loadTile takes them (both seen after that barrier too).
template <typename T>
__device__ void copyTile(T* tile, int pitch, const T* base, int b, size_t batchRows, int first, int count, int rows,
                         int stride, int hs) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0 || stride % kPer != 0) {
    loadTile(tile, pitch, base, b, batchRows, first, count, rows, stride, hs);
    return;
  }
  const int chunks = hs / kPer;
  for (int at = threadIdx.x; at < count * chunks; at += blockDim.x) {
    const int r = at / chunks, c = (at % chunks) * kPer;
    if (first + r < rows) {
      copyAsync16(tile + r * pitch + c, base + rowAt(b, batchRows, first + r, stride) + c);
    } else {
      *reinterpret_cast<uint4*>(tile + r * pitch + c) = uint4{0, 0, 0, 0};
    }
  }
}

// count rows of hs fp32 values (staged, rows `stagedPitch` apart) rounded to T into tile, four a
// thread at a time.
template <typename T>
__device__ void roundTile(T* tile, int pitch, const float* staged, int stagedPitch, int count, int hs) {
  const int quads = hs / 4;
  for (int at = threadIdx.x; at < count * quads; at += blockDim.x) {
    const int r = at / quads, c = (at % quads) * 4;
    const float4 x = *reinterpret_cast<const float4*>(staged + r * stagedPitch + c);
    T* to = tile + r * pitch + c;
    to[0] = roundTo<T>(x.x);
    to[1] = roundTo<T>(x.y);
    to[2] = roundTo<T>(x.z);
    to[3] = roundTo<T>(x.w);
  }
}

// Buffer `tile % 2` of a double-buffered pair, chosen without indexing the pair by a variable
// (which would put it in local memory).
template <typename P>
__device__ __forceinline__ P both(P const (&pair)[2], int tile) {
  return tile % 2 == 0 ? pair[0] : pair[1];
}

// The kernels' exponentials are base 2 (exp2f, one instruction of the special-function unit; expf
// takes several): scores are scaled by log2(e) with the softmax scale, and the maxima and
// log-sum-exps the callers keep in base e are converted on the way in and out.
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

// The 4 lanes of a group (g = lane / 4) hold a row's columns: the maximum and the sum over them.
__device__ inline float groupMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float groupSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// s[n] += a b_n for the pieces n in [firstPiece, endPiece) of kPieces, b_n the transpose of the
// tile's rows 8n .. 8n+7, columns k0 .. k0+15 (K for Q K^T): two pieces a load where both are taken.
template <typename T, int kPieces>
__device__ void addRowProducts(float (&s)[kPieces][4], const uint32_t a[4], const T* tile, int pitch, int k0,
                               int firstPiece, int endPiece) {
  static_assert(kPieces % 2 == 0);
  for (int n = 0; n < kPieces; n += 2) {  // from 0 and by constant indices, so that s stays in registers
    if (n + 1 < firstPiece || n >= endPiece) continue;
    if (n >= firstPiece && n + 1 < endPiece) {
      uint32_t b0[2], b1[2];
      mma::loadBPair<false>(b0, b1, tile, pitch, n * 8, k0);
      mma::product<T>(s[n], a, b0);
      mma::product<T>(s[n + 1], a, b1);
    } else if (n >= firstPiece) {
      uint32_t b[2];
      mma::loadB(b, tile, pitch, n * 8, k0);
      mma::product<T>(s[n], a, b);
    } else {
      uint32_t b[2];
      mma::loadB(b, tile, pitch, n * 8 + 8, k0);
      mma::product<T>(s[n + 1], a, b);
    }
  }
}

// acc (16 x HS: kHeadPieces pieces of 8 columns) += s t: s the warp's 16 rows against the other
// side's tile (kPieces pieces of 8), rounded to T as the product's a operand, pieces
// [firstPiece, endPiece) of it taken (the rest are zeros: masked), and t that tile (its rows the
// product's k, its columns the head's; read transposed).
template <typename T, int kHeadPieces, int kPieces>
__device__ void addProduct(float (&acc)[kHeadPieces][4], const float (&s)[kPieces][4], int firstPiece, int endPiece,
                           const T* tile, int pitch) {
  static_assert(kHeadPieces % 2 == 0, "head sizes are multiples of 16");
  for (int kk = 0; kk < kPieces / 2; ++kk) {  // 16 rows of the tile a step; from 0 so that s stays in registers
    if (2 * kk + 1 < firstPiece || 2 * kk >= endPiece) continue;
    uint32_t a[4];
    mma::accumulatorsAsA<T>(a, s[2 * kk], s[2 * kk + 1]);
    for (int n = 0; n < kHeadPieces; n += 2) {
      uint32_t b0[2], b1[2];
      mma::loadBPair<true>(b0, b1, tile, pitch, n * 8, kk * 16);
      mma::product<T>(acc[n], a, b0);
      mma::product<T>(acc[n + 1], a, b1);
    }
  }
}

// The blocks an SM must hold at once, for __launch_bounds__: `blocks` up to head size 64 (GPT-2's),
// where the kernels' registers come to about what that leaves them anyway (forward and dq 4
// blocks: 128 registers; dk/dv, with two accumulators, 3: 168) and the extra block keeps more
// warps to hide the next tile's loads under; none for wider heads, whose accumulators would spill.
__host__ __device__ constexpr int blocksUpTo64(int hs, int blocks) { return hs <= 64 ? blocks : 1; }

// Shared memory of each kernel, by head size (the host sizes the launch with the same carve).
// The 16-bit pointers are of any 16-bit T: the kernels cast them.
// The other side's tiles are double-buffered (k[2], v[2]): tile i + 1's copies are issued as
// tile i's products start, past the barrier that shows tile i and ends every warp's use of tile
// i - 1 (whose buffers they take), so each tile's loads run under the last one's products.
struct TcForwardMemory {
  __nv_bfloat16 *q, *k[2], *v[2];
  size_t bytes;
  __host__ __device__ static TcForwardMemory carve(unsigned char* base, int hs) {
    const int keys = forwardTile(hs);
    TcForwardMemory m{};
    Carve c;
    m.q = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    for (int i = 0; i < 2; ++i) {
      m.k[i] = c.take<__nv_bfloat16>(base, static_cast<size_t>(keys) * halfPitch(hs));
      m.v[i] = c.take<__nv_bfloat16>(base, static_cast<size_t>(keys) * halfPitch(hs));
    }
    m.bytes = c.used;
    return m;
  }
};

// The keys and values [first, first + keys) of one head (k and v: its first column) into buffers
// `tile % 2` of m.k and m.v, as one group of asynchronous copies: the forward's and dq's next tile.
template <typename T, int HS, typename Memory>
__device__ void copyKeyTiles(const Memory& m, int tile, const Pair<uint16_t>& p, const T* k, const T* v, int b,
                             int first, int keys) {
  copyTile(reinterpret_cast<T*>(both(m.k, tile)), halfPitch(HS), k, b, p.kvRows, first, keys, p.Tk, p.kvStride, HS);
  copyTile(reinterpret_cast<T*>(both(m.v, tile)), halfPitch(HS), v, b, p.kvRows, first, keys, p.Tk, p.kvStride, HS);
  commitCopies();
}

template <typename T, int HS>
__global__ void __launch_bounds__(kTcWarps* kWarp, blocksUpTo64(HS, 4))
    forwardTcKernel(Pair<uint16_t> p, float* out, int outStride, float* rowMax, float* rowSum) {
  constexpr int kKeys = forwardTile(HS), kHeadPieces = HS / 8, kKeyPieces = kKeys / 8;
  constexpr int ldh = halfPitch(HS);
  CHORUS_DYNAMIC_SHARED(shared);
  const TcForwardMemory m = TcForwardMemory::carve(shared, HS);
  T* qs = reinterpret_cast<T*>(m.q);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane >> 2, t = lane & 3;
  // Query blocks last to first: on the diagonal the last take the most key tiles, and a GPU starts
  // blocks about in blockIdx order, so the longest start first rather than last.
  const int firstRow = (gridDim.x - 1 - blockIdx.x) * kTcRows, mine = warp * 16;  // the warp's first row
  const int warpLast = firstRow + mine + 15;
  const float scale2 = p.scale * kLog2e;  // scores in base 2
  const T* k = reinterpret_cast<const T*>(p.k) + h * HS;
  const T* v = reinterpret_cast<const T*>(p.v) + h * HS;
  const int keyEnd = p.keyEnd(firstRow, kTcRows);
  if (keyEnd > 0) copyKeyTiles<T, HS>(m, 0, p, k, v, b, 0, kKeys);
  loadTile(qs, ldh, reinterpret_cast<const T*>(p.q) + h * HS, b, p.qRows, firstRow, kTcRows, p.Tq, p.qStride, HS);
  // The running state of this lane's rows (g and g+8 of the warp's): output, maximum (base 2), sum.
  int row[2];
  float runMax[2], runSum[2], o[kHeadPieces][4];
  for (int s = 0; s < 2; ++s) {
    row[s] = firstRow + mine + g + 8 * s;
    const bool live = row[s] < p.Tq;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + row[s];
    runMax[s] = live ? rowMax[stat] * kLog2e : -INFINITY;
    runSum[s] = live ? rowSum[stat] : 0.0f;
    for (int n = 0; n < kHeadPieces; ++n) {
      for (int e = 0; e < 2; ++e) {
        o[n][2 * s + e] = live ? out[rowAt(b, p.qRows, row[s], outStride) + h * HS + n * 8 + 2 * t + e] : 0.0f;
      }
    }
  }
  // The warp's rows of q, as the a operand of every tile's Q K^T, loaded once.
  __syncthreads();
  uint32_t aq[HS / 16][4];
  for (int d = 0; d < HS; d += 16) mma::loadA(aq[d / 16], qs, ldh, mine, d);
  for (int tile = 0, first = 0; first < keyEnd; ++tile, first += kKeys) {
    waitCopies<0>();
    __syncthreads();  // this tile seen by every warp, and every warp done with the last one
    if (first + kKeys < keyEnd) copyKeyTiles<T, HS>(m, tile + 1, p, k, v, b, first + kKeys, kKeys);
    const T *ks = reinterpret_cast<const T*>(both(m.k, tile)), *vs = reinterpret_cast<const T*>(both(m.v, tile));
    // On the diagonal, keys past the warp's last row are masked for all its rows: not multiplied.
    const int pieces = p.keyPiecesSeen(warpLast, first, kKeyPieces);
    float s[kKeyPieces][4] = {};
    for (int d = 0; d < HS; d += 16) addRowProducts<T>(s, aq[d / 16], ks, ldh, d, 0, pieces);
    // The online softmax of this tile, rows g and g+8 (the group's 4 lanes hold a row's keys):
    // scores in base 2, masked ones -inf (looked for only where the tile may hold some).
    for (int n = 0; n < kKeyPieces; ++n) {
      for (int e = 0; e < 4; ++e) s[n][e] *= scale2;
    }
    if (p.anyOff(firstRow + mine, 16, first, kKeys)) {
      for (int n = 0; n < kKeyPieces; ++n) {
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, j = first + n * 8 + 2 * t + e % 2;
          if (p.off(row[r], j)) s[n][e] = -INFINITY;
        }
      }
    }
    float tileMax[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kKeyPieces; ++n) {
      for (int e = 0; e < 4; ++e) tileMax[e / 2] = fmaxf(tileMax[e / 2], s[n][e]);
    }
    float newMax[2], shift[2], carry[2], total[2] = {0.0f, 0.0f};
    for (int r = 0; r < 2; ++r) {
      newMax[r] = fmaxf(runMax[r], groupMax(tileMax[r]));
      shift[r] = newMax[r] == -INFINITY ? 0.0f : newMax[r];  // a row masked so far: weights exp2(-inf) = 0
      carry[r] = newMax[r] == -INFINITY ? 1.0f : runMax[r] == -INFINITY ? 0.0f : exp2f(runMax[r] - newMax[r]);
    }
    for (int n = 0; n < kKeyPieces; ++n) {
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2f(s[n][e] - shift[e / 2]);
        total[e / 2] += s[n][e];
      }
    }
    for (int r = 0; r < 2; ++r) {
      runMax[r] = newMax[r];
      runSum[r] = runSum[r] * carry[r] + groupSum(total[r]);
    }
    for (int n = 0; n < kHeadPieces; ++n) {
      for (int e = 0; e < 4; ++e) o[n][e] *= carry[e / 2];
    }
    addProduct(o, s, 0, pieces, vs, ldh);  // o += P V
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.Tq) continue;
    float* to = out + rowAt(b, p.qRows, row[r], outStride) + h * HS;
    for (int n = 0; n < kHeadPieces; ++n) {
      for (int e = 0; e < 2; ++e) to[n * 8 + 2 * t + e] = o[n][2 * r + e];
    }
    if (t == 0) {
      const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + row[r];
      rowMax[stat] = runMax[r] * kLn2;
      rowSum[stat] = runSum[r];
    }
  }
}

// Backward, dq: per block of queries, the keys a tile at a time, double-buffered as the forward's.
struct TcQueryMemory {
  __nv_bfloat16 *q, *dout, *k[2], *v[2];
  size_t bytes;
  __host__ __device__ static TcQueryMemory carve(unsigned char* base, int hs) {
    const int keys = backwardTile(hs);
    TcQueryMemory m{};
    Carve c;
    m.q = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.dout = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    for (int i = 0; i < 2; ++i) {
      m.k[i] = c.take<__nv_bfloat16>(base, static_cast<size_t>(keys) * halfPitch(hs));
      m.v[i] = c.take<__nv_bfloat16>(base, static_cast<size_t>(keys) * halfPitch(hs));
    }
    m.bytes = c.used;
    return m;
  }
};

template <typename T, int HS>
__global__ void __launch_bounds__(kTcWarps* kWarp, blocksUpTo64(HS, 4))
    backwardQueryTcKernel(Pair<uint16_t> p, const float* dout, int doutStride, const float* lse, const float* delta,
                          float* dq, int dqStride) {
  constexpr int kKeys = backwardTile(HS), kHeadPieces = HS / 8, kKeyPieces = kKeys / 8;
  constexpr int ldh = halfPitch(HS);
  CHORUS_DYNAMIC_SHARED(shared);
  const TcQueryMemory m = TcQueryMemory::carve(shared, HS);
  T *qs = reinterpret_cast<T*>(m.q), *gs = reinterpret_cast<T*>(m.dout);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int firstRow = (gridDim.x - 1 - blockIdx.x) * kTcRows;  // last to first, as the forward's
  const int mine = warp * 16, warpLast = firstRow + mine + 15;
  const float scale2 = p.scale * kLog2e;
  const T* k = reinterpret_cast<const T*>(p.k) + h * HS;
  const T* v = reinterpret_cast<const T*>(p.v) + h * HS;
  const int keyEnd = p.keyEnd(firstRow, kTcRows);
  if (keyEnd > 0) copyKeyTiles<T, HS>(m, 0, p, k, v, b, 0, kKeys);
  loadTile(qs, ldh, reinterpret_cast<const T*>(p.q) + h * HS, b, p.qRows, firstRow, kTcRows, p.Tq, p.qStride, HS);
  loadTile(gs, ldh, dout + h * HS, b, p.qRows, firstRow, kTcRows, p.Tq, doutStride, HS);
  int row[2];
  float rowLse[2], rowDelta[2], acc[kHeadPieces][4] = {};
  for (int r = 0; r < 2; ++r) {
    row[r] = firstRow + mine + g + 8 * r;
    const size_t stat = b * p.batchStat + static_cast<size_t>(h) * p.statStride + row[r];
    rowLse[r] = row[r] < p.Tq ? lse[stat] * kLog2e : 0.0f;  // base 2
    rowDelta[r] = row[r] < p.Tq ? delta[stat] : 0.0f;
  }
  for (int tile = 0, first = 0; first < keyEnd; ++tile, first += kKeys) {
    waitCopies<0>();
    __syncthreads();  // this tile (and q and dO) seen by every warp, and every warp done with the last
    if (first + kKeys < keyEnd) copyKeyTiles<T, HS>(m, tile + 1, p, k, v, b, first + kKeys, kKeys);
    const T *ks = reinterpret_cast<const T*>(both(m.k, tile)), *vs = reinterpret_cast<const T*>(both(m.v, tile));
    const int pieces = p.keyPiecesSeen(warpLast, first, kKeyPieces);
    float s[kKeyPieces][4] = {}, dp[kKeyPieces][4] = {};
    for (int d = 0; d < HS; d += 16) {
      uint32_t aq[4], ag[4];
      mma::loadA(aq, qs, ldh, mine, d);
      mma::loadA(ag, gs, ldh, mine, d);
      addRowProducts<T>(s, aq, ks, ldh, d, 0, pieces);   // S = Q K^T
      addRowProducts<T>(dp, ag, vs, ldh, d, 0, pieces);  // dP = dO V^T
    }
    // dS = P (dP - delta) scale, in s.
    for (int n = 0; n < kKeyPieces; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        s[n][e] = exp2f(s[n][e] * scale2 - rowLse[r]) * (dp[n][e] - rowDelta[r]) * p.scale;
      }
    }
    if (p.anyOff(firstRow + mine, 16, first, kKeys)) {
      for (int n = 0; n < kKeyPieces; ++n) {  // masked: 0 (what was computed there may be inf or NaN)
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, j = first + n * 8 + 2 * t + e % 2;
          if (p.off(row[r], j)) s[n][e] = 0.0f;
        }
      }
    }
    addProduct(acc, s, 0, pieces, ks, ldh);  // dq += dS K
  }
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.Tq) continue;
    float* to = dq + rowAt(b, p.qRows, row[r], dqStride) + h * HS;
    for (int n = 0; n < kHeadPieces; ++n) {
      for (int e = 0; e < 2; ++e) to[n * 8 + 2 * t + e] += acc[n][2 * r + e];
    }
  }
}

// Backward, dk and dv: per block of keys, the queries a tile at a time (transposed: a warp's key
// rows against the tile's queries). Tile i + 1's q (double-buffered) and fp32 dO (staged as it
// is, hs floats a row) are copied asynchronously as tile i's products start; at the top of tile
// i + 1, past the barrier that shows its copies and ends every warp's products of tile i, the
// block rounds the staged dO into its 16-bit tile and stores lse and delta, and a second barrier
// shows those before the products (and frees the staging for the next copies).
struct TcKeyMemory {
  __nv_bfloat16 *k, *v, *q[2], *dout;
  float *staged, *lse, *delta;
  size_t bytes;
  __host__ __device__ static TcKeyMemory carve(unsigned char* base, int hs) {
    const int queries = backwardTile(hs);
    TcKeyMemory m{};
    Carve c;
    m.k = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    m.v = c.take<__nv_bfloat16>(base, static_cast<size_t>(kTcRows) * halfPitch(hs));
    for (int i = 0; i < 2; ++i) m.q[i] = c.take<__nv_bfloat16>(base, static_cast<size_t>(queries) * halfPitch(hs));
    m.dout = c.take<__nv_bfloat16>(base, static_cast<size_t>(queries) * halfPitch(hs));
    m.staged = c.take<float>(base, static_cast<size_t>(queries) * hs);
    m.lse = c.take<float>(base, queries);
    m.delta = c.take<float>(base, queries);
    m.bytes = c.used;
    return m;
  }
};

template <typename T, int HS>
__global__ void __launch_bounds__(kTcWarps* kWarp, blocksUpTo64(HS, 3))
    backwardKeyTcKernel(Pair<uint16_t> p, const float* dout, int doutStride, const float* lse, const float* delta,
                        float* dk, float* dv, int dkvStride) {
  constexpr int kQueries = backwardTile(HS), kHeadPieces = HS / 8, kQueryPieces = kQueries / 8;
  constexpr int ldh = halfPitch(HS);
  CHORUS_DYNAMIC_SHARED(shared);
  const TcKeyMemory m = TcKeyMemory::carve(shared, HS);
  T *ks = reinterpret_cast<T*>(m.k), *vs = reinterpret_cast<T*>(m.v), *gs = reinterpret_cast<T*>(m.dout);
  const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int firstKey = blockIdx.x * kTcRows, mine = warp * 16, warpFirst = firstKey + mine;
  const float scale2 = p.scale * kLog2e;
  const T* q = reinterpret_cast<const T*>(p.q) + h * HS;
  loadTile(ks, ldh, reinterpret_cast<const T*>(p.k) + h * HS, b, p.kvRows, firstKey, kTcRows, p.Tk, p.kvStride, HS);
  loadTile(vs, ldh, reinterpret_cast<const T*>(p.v) + h * HS, b, p.kvRows, firstKey, kTcRows, p.Tk, p.kvStride, HS);
  const int key[2] = {warpFirst + g, warpFirst + g + 8};
  float accK[kHeadPieces][4] = {}, accV[kHeadPieces][4] = {};
  // On the diagonal, queries before the block's first key attend none of its keys.
  const int queryBegin = p.diagonal ? (firstKey / kQueries) * kQueries : 0;
  const size_t statBase = b * p.batchStat + static_cast<size_t>(h) * p.statStride;
  auto copyQueries = [&](int tile, int first) {
    copyTile(reinterpret_cast<T*>(both(m.q, tile)), ldh, q, b, p.qRows, first, kQueries, p.Tq, p.qStride, HS);
    copyTile(m.staged, HS, dout + h * HS, b, p.qRows, first, kQueries, p.Tq, doutStride, HS);
    commitCopies();
  };
  if (queryBegin < p.Tq) copyQueries(0, queryBegin);
  for (int tile = 0, first = queryBegin; first < p.Tq; ++tile, first += kQueries) {
    const T* qs = reinterpret_cast<const T*>(both(m.q, tile));
    waitCopies<0>();
    __syncthreads();  // this tile's copies seen by every warp, and every warp done with the last tile
    roundTile(gs, ldh, m.staged, HS, kQueries, HS);
    for (int j = threadIdx.x; j < kQueries; j += blockDim.x) {
      m.lse[j] = first + j < p.Tq ? lse[statBase + first + j] * kLog2e : 0.0f;  // base 2
      m.delta[j] = first + j < p.Tq ? delta[statBase + first + j] : 0.0f;
    }
    __syncthreads();  // dO, lse and delta seen; the staging free
    if (first + kQueries < p.Tq) copyQueries(tile + 1, first + kQueries);
    // On the diagonal, queries before the warp's first key attend none of its keys: pieces of
    // them are skipped (their probabilities stay 0).
    const int skipped = p.queryPiecesBlind(first, warpFirst, kQueryPieces);
    float s[kQueryPieces][4] = {}, dp[kQueryPieces][4] = {};
    for (int d = 0; d < HS; d += 16) {
      uint32_t ak[4], av[4];
      mma::loadA(ak, ks, ldh, mine, d);
      mma::loadA(av, vs, ldh, mine, d);
      addRowProducts<T>(s, ak, qs, ldh, d, skipped, kQueryPieces);   // S^T = K Q^T
      addRowProducts<T>(dp, av, gs, ldh, d, skipped, kQueryPieces);  // dP^T = V dO^T
    }
    // P^T in s, dS^T in dp.
    for (int n = 0; n < kQueryPieces; ++n) {
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * t + e % 2;
        s[n][e] = exp2f(s[n][e] * scale2 - m.lse[c]);
        dp[n][e] = s[n][e] * (dp[n][e] - m.delta[c]) * p.scale;
      }
    }
    if (p.anyOff(first, kQueries, warpFirst, 16)) {
      for (int n = 0; n < kQueryPieces; ++n) {  // masked: 0 (what was computed there may be inf or NaN)
        for (int e = 0; e < 4; ++e) {
          const int i = first + n * 8 + 2 * t + e % 2, j = key[e / 2];
          if (p.off(i, j)) s[n][e] = dp[n][e] = 0.0f;
        }
      }
    }
    addProduct(accV, s, skipped, kQueryPieces, gs, ldh);   // dV += P^T dO
    addProduct(accK, dp, skipped, kQueryPieces, qs, ldh);  // dK += dS^T Q
  }
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= p.Tk) continue;
    float* toK = dk + rowAt(b, p.kvRows, key[r], dkvStride) + h * HS;
    float* toV = dv + rowAt(b, p.kvRows, key[r], dkvStride) + h * HS;
    for (int n = 0; n < kHeadPieces; ++n) {
      for (int e = 0; e < 2; ++e) {
        toK[n * 8 + 2 * t + e] += accK[n][2 * r + e];
        toV[n * 8 + 2 * t + e] += accV[n][2 * r + e];
      }
    }
  }
}

}  // namespace chorus::kernels::cuda::attention
