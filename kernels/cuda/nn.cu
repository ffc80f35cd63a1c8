// nn.cu: the transformer's element-wise and row-wise layers on device memory (embeddings,
// layernorm, GELU, residual, softmax cross-entropy, the optimizers, sums), matching
// kernels/cpu/nn.cc formula for formula. Attention is in attention.cu, the products in matmul.cu.
// Sums over rows that the CPU folds in order are folded here in a fixed order too (per block of
// rows, then the blocks in order), so a run repeats bit for bit.
#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/nn.h"

namespace chorus::kernels::cuda {
namespace {

// Blocks whose partial sums sumOfSquares and meanOf add in order.
constexpr int kSumBlocks = 1024;  // 256 threads each: about every thread an H200's SMs hold at once
// Rows per block of columnSums / layernormBackward's partial sums, at least: few enough that GPT-2's
// 8192 rows make 512 blocks (with 64, 128 blocks left most of an H200 idle: 13% of its bandwidth).
constexpr int kFoldRows = 16;
constexpr int kMaxFoldBlocks = 512;

int foldBlocks(int n) { return std::clamp((n + kFoldRows - 1) / kFoldRows, 1, kMaxFoldBlocks); }

// ---- embeddings ----

__global__ void embeddingForwardKernel(float* out, const int* tokens, const float* wte, const float* wpe, int T, int C,
                                       int v0, int vcount, const int* positions, bool byQuads) {
  const size_t row = blockIdx.x;  // b T + t
  const int t = static_cast<int>(row % T);
  const int token = tokens[row] - v0;
  const bool mine = token >= 0 && token < vcount;
  const float* te = wte + static_cast<size_t>(mine ? token : 0) * C;
  const float* pe = wpe ? wpe + static_cast<size_t>(positions ? positions[t] : t) * C : nullptr;
  float* o = out + row * C;
  // 16 bytes at a time where the rows allow (C a multiple of 4 and the tables aligned).
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    float4 x = mine ? quadAt(te, q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (pe) x = lanes(Add{}, x, quadAt(pe, q));
    storeQuad(o, q, x);
  }
  for (int i = quads * 4 + threadIdx.x; i < C; i += blockDim.x) {
    float x = mine ? te[i] : 0.0f;
    if (pe) x += pe[i];
    o[i] = x;
  }
}

// The token embedding's gradient: the rows of a token are one sum, added by one block in row order
// as the CPU's loop adds them (atomic additions would add them in another order each run), so the
// sum repeats bit for bit. The rows are grouped by token first, in time linear in the rows: counted
// (integer atomics: a count does not depend on the order), the counts scanned over the vocabulary
// (which also lists the tokens present, in token order), each row placed in its token's range (in
// no fixed order), and each range sorted by the block that sums it. A token with more rows than a
// block sorts in shared memory (kSortedRows) is summed by a scan of every row instead, a tile at a
// time; there are at most rows / kSortedRows such tokens.
constexpr int kSortedRows = 1024;
constexpr int kScanThreads = 1024;

// embeddingBackward's scratch, carved from one allocation.
struct TokenRows {
  int* count;    // vcount: rows of each token (zeroed, counted, then counted down as rows are placed)
  int* start;    // vcount + 1: where each token's rows begin in `rows` (the counts' exclusive scan)
  int* present;  // 1 + min(rows, vcount): how many tokens have rows, then those tokens in order
  int* rows;     // rows: the rows, grouped by token
  static size_t ints(int rows, int vcount) {
    return static_cast<size_t>(vcount) + (vcount + 1) + (1 + std::min(rows, vcount)) + rows;
  }
  static TokenRows carve(void* scratch, int rows, int vcount) {
    int* p = static_cast<int*>(scratch);
    TokenRows t{};
    t.count = p;
    t.start = t.count + vcount;
    t.present = t.start + vcount + 1;
    t.rows = t.present + 1 + std::min(rows, vcount);
    return t;
  }
};

__global__ void countTokenRowsKernel(int* count, const int* tokens, int rows, int v0, int vcount) {
  for (size_t r = threadIndex(); r < static_cast<size_t>(rows); r += gridThreads()) {
    const int v = tokens[r] - v0;
    if (v >= 0 && v < vcount) atomicAdd(&count[v], 1);
  }
}

// The exclusive prefix sum of x over the block (blockDim.x a multiple of 32), and the block's total.
__device__ int blockExclusiveSum(int x, int* total) {
  __shared__ int warpTotals[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  int inclusive = x;
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const int below = __shfl_sync(0xffffffffu, inclusive, lane >= offset ? lane - offset : lane);
    if (lane >= offset) inclusive += below;
  }
  __syncthreads();  // warpTotals may still be read by an earlier call
  if (lane == kWarp - 1) warpTotals[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    before += w < warp ? warpTotals[w] : 0;
    all += warpTotals[w];
  }
  *total = all;
  return before + inclusive - x;
}

// One block: start = the exclusive scan of count, and the tokens that have rows, in order (each
// thread a run of consecutive tokens).
__global__ void scanTokenRowsKernel(TokenRows t, int vcount) {
  const int per = (vcount + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int lo = min(static_cast<int>(threadIdx.x) * per, vcount), hi = min(lo + per, vcount);
  int rows = 0, tokens = 0;
  for (int v = lo; v < hi; ++v) {
    rows += t.count[v];
    tokens += t.count[v] > 0 ? 1 : 0;
  }
  int allRows = 0, allTokens = 0;
  int at = blockExclusiveSum(rows, &allRows), listed = blockExclusiveSum(tokens, &allTokens);
  for (int v = lo; v < hi; ++v) {
    t.start[v] = at;
    at += t.count[v];
    if (t.count[v] > 0) t.present[1 + listed++] = v;
  }
  if (threadIdx.x == 0) {
    t.start[vcount] = allRows;
    t.present[0] = allTokens;
  }
}

__global__ void placeTokenRowsKernel(TokenRows t, const int* tokens, int rows, int v0, int vcount) {
  for (size_t r = threadIndex(); r < static_cast<size_t>(rows); r += gridThreads()) {
    const int v = tokens[r] - v0;
    if (v >= 0 && v < vcount) t.rows[t.start[v] + atomicSub(&t.count[v], 1) - 1] = static_cast<int>(r);
  }
}

// te += the rows `rows[0 .. k)` of dout, in that order (every thread of the block calls it).
__device__ void addRowsInOrder(float* te, const float* dout, int C, const int* rows, int k, bool byQuads) {
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    float4 acc = quadAt(te, q);
    for (int j = 0; j < k; ++j) acc = lanes(Add{}, acc, quadAt(dout + static_cast<size_t>(rows[j]) * C, q));
    storeQuad(te, q, acc);
  }
  for (int i = quads * 4 + threadIdx.x; i < C; i += blockDim.x) {
    float acc = te[i];
    for (int j = 0; j < k; ++j) acc += dout[static_cast<size_t>(rows[j]) * C + i];
    te[i] = acc;
  }
}

// One block per token present (the grid may hold more blocks than tokens: they return).
__global__ void embeddingTokenBackwardKernel(float* dwte, const float* dout, const int* tokens, TokenRows t, int rows,
                                             int C, bool byQuads) {
  __shared__ int sorted[kSortedRows];
  if (static_cast<int>(blockIdx.x) >= t.present[0]) return;
  const int v = t.present[1 + blockIdx.x];
  const int first = t.start[v], k = t.start[v + 1] - first;
  float* te = dwte + static_cast<size_t>(v) * C;
  if (k <= kSortedRows) {
    // Bitonic sort of the token's rows, padded to a power of two with rows past the end.
    int n = 1;
    while (n < k) n <<= 1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sorted[i] = i < k ? t.rows[first + i] : rows;
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
          const int j = i ^ stride;
          if (j <= i) continue;
          const int a = sorted[i], b = sorted[j];
          if ((a > b) == ((i & size) == 0)) {
            sorted[i] = b;
            sorted[j] = a;
          }
        }
        __syncthreads();
      }
    }
    addRowsInOrder(te, dout, C, sorted, k, byQuads);
    return;
  }
  // Too many rows to sort here: every row looked at, a tile of blockDim.x at a time (a multiple of
  // 32, at most kThreads), this token's rows of the tile listed in order and added.
  __shared__ int matched[kThreads];
  __shared__ int warpMatches[kThreads / kWarp];
  const int token = tokens[t.rows[first]];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  for (int base = 0; base < rows; base += static_cast<int>(blockDim.x)) {
    const int r = base + static_cast<int>(threadIdx.x);
    const bool match = r < rows && tokens[r] == token;
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warpMatches[warp] = __popc(mask);
    __syncthreads();
    int before = 0, count = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warpMatches[w] : 0;
      count += warpMatches[w];
    }
    if (match) matched[before + __popc(mask & ((1u << lane) - 1u))] = r;
    __syncthreads();
    addRowsInOrder(te, dout, C, matched, count, byQuads);
    __syncthreads();  // the tile's rows read before the next tile's overwrite them
  }
}

// One block per position t: its rows of dout added in batch order, as the CPU's loop adds them.
__global__ void embeddingPositionBackwardKernel(float* dwpe, const float* dout, int B, int T, int C,
                                                const int* positions) {
  const int t = blockIdx.x;
  float* pe = dwpe + static_cast<size_t>(positions ? positions[t] : t) * C;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    float acc = pe[i];
    for (int b = 0; b < B; ++b) acc += dout[(static_cast<size_t>(b) * T + t) * C + i];
    pe[i] = acc;
  }
}

// ---- layernorm ----

// One warp per row, 16 bytes at a time where the rows allow (byQuads: c a multiple of 4 and every
// buffer aligned), else a float at a time.
__global__ void layernormForwardKernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                       const float* bias, int n, int c, bool byQuads) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= n) return;
  const float* x = inp + static_cast<size_t>(row) * c;
  const int quads = byQuads ? c / 4 : 0;
  float sum = 0.0f;
  for (int q = lane; q < quads; q += kWarp) {
    const float4 v = quadAt(x, q);
    sum += v.x + v.y + v.z + v.w;
  }
  for (int i = quads * 4 + lane; i < c; i += kWarp) sum += x[i];
  const float m = warpSum(sum) / c;
  auto square = [m](float v) { return (v - m) * (v - m); };
  float var = 0.0f;
  for (int q = lane; q < quads; q += kWarp) {
    const float4 v = quadAt(x, q);
    var += square(v.x) + square(v.y) + square(v.z) + square(v.w);
  }
  for (int i = quads * 4 + lane; i < c; i += kWarp) var += square(x[i]);
  const float r = 1.0f / sqrtf(warpSum(var) / c + kLayernormEps);
  float* o = out + static_cast<size_t>(row) * c;
  auto normalize = [m, r](float v, float w, float b) { return (v - m) * r * w + b; };
  for (int q = lane; q < quads; q += kWarp) {
    storeQuad(o, q, lanes(normalize, quadAt(x, q), quadAt(weight, q), quadAt(bias, q)));
  }
  for (int i = quads * 4 + lane; i < c; i += kWarp) o[i] = normalize(x[i], weight[i], bias[i]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// ---- layernorm with the row in registers ----
// A row of c floats (c a multiple of 4, every buffer aligned) is c / 4 quads, lane l of its warp
// holding quads l, l + 32, ...: at most kQ each (GPT-2 124M's 768 columns are 6 a lane). The kernels
// around these (layernormForwardKernel above, layernormBackwardKernel below), which take rows of any
// width, read a row once per pass, a pass waiting on the one before (the mean, then the variance,
// then the output), and the backward reads the rows again for the column sums; these load a row
// once, every quad of a lane in flight at once. A row's sums add in the same order as there (the
// backward's column sums have an order of their own, said there).
// GPT-2's layernorms ran at 47% (forward) and 25% (backward) of an H200's memory peak on those.

// The most quads a lane holds: a float4 each, the backward's two rows of them and its two sums.
constexpr int kMostForwardQuads = 16;  // rows of up to 2048 floats
constexpr int kMostBackwardQuads = 8;  // up to 1024

// The sizes the kernels are built for: every register a lane's quads take costs occupancy (the
// backward takes 158 registers a thread with 8 quads, one block of 256 threads an SM, and 128 with
// 6, two blocks), so GPT-2's 768 and 1536 columns get sizes of their own.
constexpr int kLaneQuads[] = {1, 2, 4, 6, 8, 12, 16};

// The quads a lane holds for rows of c floats, rounded up to one of kLaneQuads no larger than
// kMost; 0 where none is.
template <int kMost>
int quadsPerLane(int c) {
  const int perLane = (c / 4 + kWarp - 1) / kWarp;
  for (const int k : kLaneQuads) {
    if (k <= kMost && perLane <= k) return k;
  }
  return 0;
}

// f(std::integral_constant<int, k>{}) for k, one of quadsPerLane<kMost>'s sizes (not 0), the
// sizes from kLaneQuads[kIndex] up tried in turn.
template <int kMost, int kIndex = 0, typename F>
int withQuadsPerLane(int k, F f) {
  constexpr int kQ = kLaneQuads[kIndex];
  if constexpr (kQ < kMost) {
    if (k > kQ) return withQuadsPerLane<kMost, kIndex + 1>(k, f);
  }
  return f(std::integral_constant<int, kQ>{});
}

// Lane `lane`'s quads of row x (zeros past the row's `quads`).
template <int kQ>
__device__ __forceinline__ void loadRowQuads(float4 (&v)[kQ], const float* x, int lane, int quads) {
#pragma unroll
  for (int k = 0; k < kQ; ++k) {
    const int q = lane + k * kWarp;
    v[k] = q < quads ? quadAt(x, q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

template <int kQ>
__global__ void layernormForwardRowsKernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                           const float* bias, int n, int c) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= n) return;
  const int quads = c / 4;
  float4 x[kQ];
  loadRowQuads(x, inp + static_cast<size_t>(row) * c, lane, quads);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kQ; ++k) sum += x[k].x + x[k].y + x[k].z + x[k].w;  // the zeros past the row add nothing
  const float m = warpSum(sum) / c;
  auto square = [m](float v) { return (v - m) * (v - m); };
  float var = 0.0f;
#pragma unroll
  for (int k = 0; k < kQ; ++k) {
    if (lane + k * kWarp < quads) var += square(x[k].x) + square(x[k].y) + square(x[k].z) + square(x[k].w);
  }
  const float r = 1.0f / sqrtf(warpSum(var) / c + kLayernormEps);
  float* o = out + static_cast<size_t>(row) * c;
  auto normalize = [m, r](float v, float w, float b) { return (v - m) * r * w + b; };
#pragma unroll
  for (int k = 0; k < kQ; ++k) {
    const int q = lane + k * kWarp;
    if (q < quads) storeQuad(o, q, lanes(normalize, x[k], quadAt(weight, q), quadAt(bias, q)));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// As layernormBackwardKernel below, with each warp's rows in registers and its lanes' sums of
// dout xhat and dout over them kept there too; the block's warps then add theirs in warp order
// (rows warp, warp + warps, ... of the block: an order of its own, fixed) into partial.
template <int kQ>
__global__ void layernormBackwardRowsKernel(float* dinp, float* partial, const float* dout, const float* inp,
                                            const float* weight, const float* mean, const float* rstd, int n, int c,
                                            int rowsPerBlock) {
  __shared__ float4 blockSums[2][kQ * kWarp];  // the block's dweight, then dbias, by quad
  const int begin = blockIdx.x * rowsPerBlock;
  const int end = min(n, begin + rowsPerBlock);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int quads = c / 4;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 dw[kQ], db[kQ];
#pragma unroll
  for (int k = 0; k < kQ; ++k) dw[k] = db[k] = zero;
  for (int row = begin + warp; row < end; row += warps) {
    float4 x[kQ], d[kQ];
    loadRowQuads(x, inp + static_cast<size_t>(row) * c, lane, quads);
    loadRowQuads(d, dout + static_cast<size_t>(row) * c, lane, quads);
    const float m = mean[row], r = rstd[row];
    float gSum = 0.0f, gxSum = 0.0f;
    auto add = [&](float xi, float di, float wi, float& dwi, float& dbi) {
      const float xhat = (xi - m) * r;
      const float g = di * wi;
      gSum += g;
      gxSum += g * xhat;
      dwi += xhat * di;
      dbi += di;
    };
#pragma unroll
    for (int k = 0; k < kQ; ++k) {
      const int q = lane + k * kWarp;
      if (q >= quads) continue;
      const float4 wq = quadAt(weight, q);
      add(x[k].x, d[k].x, wq.x, dw[k].x, db[k].x);
      add(x[k].y, d[k].y, wq.y, dw[k].y, db[k].y);
      add(x[k].z, d[k].z, wq.z, dw[k].z, db[k].z);
      add(x[k].w, d[k].w, wq.w, dw[k].w, db[k].w);
    }
    const float gMean = warpSum(gSum) / c, gxMean = warpSum(gxSum) / c;
    float* dx = dinp + static_cast<size_t>(row) * c;
    auto grad = [m, r, gMean, gxMean](float dxi, float xi, float di, float wi) {
      const float xhat = (xi - m) * r;
      return dxi + (di * wi - gMean - xhat * gxMean) * r;
    };
#pragma unroll
    for (int k = 0; k < kQ; ++k) {
      const int q = lane + k * kWarp;
      if (q < quads) storeQuad(dx, q, lanes(grad, quadAt(dx, q), x[k], d[k], quadAt(weight, q)));
    }
  }
  for (int w = 0; w < warps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int k = 0; k < kQ; ++k) {
        const int q = lane + k * kWarp;
        if (q >= quads) continue;
        blockSums[0][q] = w == 0 ? dw[k] : lanes(Add{}, blockSums[0][q], dw[k]);
        blockSums[1][q] = w == 0 ? db[k] : lanes(Add{}, blockSums[1][q], db[k]);
      }
    }
    __syncthreads();
  }
  float* weights = partial + static_cast<size_t>(blockIdx.x) * c;
  float* biases = partial + static_cast<size_t>(gridDim.x + blockIdx.x) * c;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    storeQuad(weights, q, blockSums[0][q]);
    storeQuad(biases, q, blockSums[1][q]);
  }
}

// Block g takes rows [g rows, (g + 1) rows): a warp per row for the input gradient
// (dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout weight, xhat = (x - mean) rstd), then a
// thread per column for the block's sums of dout xhat and dout into partial (weights, then biases:
// `blocks` rows of c each).
__global__ void layernormBackwardKernel(float* dinp, float* partial, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd, int n, int c,
                                        int rowsPerBlock, bool byQuads) {
  const int begin = blockIdx.x * rowsPerBlock;
  const int end = min(n, begin + rowsPerBlock);
  const int lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  const int quads = byQuads ? c / 4 : 0;
  for (int row = begin + threadIdx.x / kWarp; row < end; row += warps) {
    const float* x = inp + static_cast<size_t>(row) * c;
    const float* d = dout + static_cast<size_t>(row) * c;
    const float m = mean[row], r = rstd[row];
    float gSum = 0.0f, gxSum = 0.0f;
    auto add = [&](float xi, float di, float wi) {
      const float xhat = (xi - m) * r;
      const float g = di * wi;
      gSum += g;
      gxSum += g * xhat;
    };
    for (int q = lane; q < quads; q += kWarp) {
      const float4 xq = quadAt(x, q), dq = quadAt(d, q), wq = quadAt(weight, q);
      add(xq.x, dq.x, wq.x);
      add(xq.y, dq.y, wq.y);
      add(xq.z, dq.z, wq.z);
      add(xq.w, dq.w, wq.w);
    }
    for (int i = quads * 4 + lane; i < c; i += kWarp) add(x[i], d[i], weight[i]);
    const float gMean = warpSum(gSum) / c, gxMean = warpSum(gxSum) / c;
    float* dx = dinp + static_cast<size_t>(row) * c;
    auto grad = [m, r, gMean, gxMean](float dxi, float xi, float di, float wi) {
      const float xhat = (xi - m) * r;
      return dxi + (di * wi - gMean - xhat * gxMean) * r;
    };
    for (int q = lane; q < quads; q += kWarp) {
      storeQuad(dx, q, lanes(grad, quadAt(dx, q), quadAt(x, q), quadAt(d, q), quadAt(weight, q)));
    }
    for (int i = quads * 4 + lane; i < c; i += kWarp) dx[i] = grad(dx[i], x[i], d[i], weight[i]);
  }
  float* weights = partial + static_cast<size_t>(blockIdx.x) * c;
  float* biases = partial + static_cast<size_t>(gridDim.x + blockIdx.x) * c;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    float dw = 0.0f, db = 0.0f;
    for (int row = begin; row < end; ++row) {
      const size_t at = static_cast<size_t>(row) * c + i;
      dw += (inp[at] - mean[row]) * rstd[row] * dout[at];
      db += dout[at];
    }
    weights[i] = dw;
    biases[i] = db;
  }
}

// dst[i] += the sum of partial[p][i] over p < parts, in order; a grid of two rows of blocks folds
// two such partials in one launch, the second (parts rows after the first) into dst2.
__global__ void foldColumnsKernel(float* dst, float* dst2, const float* partial, int parts, int c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  if (blockIdx.y == 1) {
    dst = dst2;
    partial += static_cast<size_t>(parts) * c;
  }
  float sum = 0.0f;
  for (int p = 0; p < parts; ++p) sum += partial[static_cast<size_t>(p) * c + i];
  dst[i] += sum;
}

// partial[g][i] = the sum of src's rows [g rows, (g + 1) rows) at column i.
__global__ void columnPartialsKernel(float* partial, const float* src, int n, int c, int rowsPerBlock) {
  const int begin = blockIdx.y * rowsPerBlock;
  const int end = min(n, begin + rowsPerBlock);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  float sum = 0.0f;
  for (int row = begin; row < end; ++row) sum += src[static_cast<size_t>(row) * c + i];
  partial[static_cast<size_t>(blockIdx.y) * c + i] = sum;
}

// ---- element-wise ----

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

struct GeluForward {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(kGeluBeta * (x + kGeluKappa * x * x * x)));
  }
};
// dinp + dout * GELU'(x): the backward adds into dinp.
struct GeluBackward {
  __device__ float operator()(float dinp, float x, float dout) const {
    const float th = tanhf(kGeluBeta * (x + kGeluKappa * x * x * x));
    const float dinner = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
    return dinp + dout * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dinner);
  }
};
struct Scale {
  float factor;
  __device__ float operator()(float x) const { return x * factor; }
};
struct Fill {
  float value;
  __device__ float operator()() const { return value; }
};

// da += dout and db += dout, reading dout once.
__global__ void residualBackwardKernel(float* da, float* db, const float* dout, size_t n, size_t quads) {
  for (size_t q = threadIndex(); q < quads; q += gridThreads()) {
    const float4 d = quadAt(dout, q);
    storeQuad(da, q, lanes(Add{}, quadAt(da, q), d));
    storeQuad(db, q, lanes(Add{}, quadAt(db, q), d));
  }
  for (size_t i = quads * 4 + threadIndex(); i < n; i += gridThreads()) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

__global__ void addRowsKernel(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width,
                              size_t rows) {
  const size_t count = width * rows;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / width, c = i % width;
    dst[r * dstStride + c] += src[r * srcStride + c];
  }
}

__global__ void addIndexedRowsKernel(float* out, const float* table, const int* index, size_t width, size_t rows) {
  const size_t count = width * rows;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / width, c = i % width;
    out[i] += table[static_cast<size_t>(index[r]) * width + c];
  }
}

// ---- softmax cross-entropy: one block per row ----

constexpr int kRowThreads = 512;

// A row of the vocabulary (50257 floats for GPT-2: an odd width, so rows start at every
// alignment) goes 16 bytes at a time from its first aligned element: `head` floats one at a time,
// then `quads` groups of four, then the rest one at a time. Rows of two buffers (logits and
// their gradient) go so together where they share an alignment, else a float at a time. The scalar
// forms ran GPT-2's cross-entropy at 34% (forward) and 52% (backward) of an H200's memory peak.
struct RowSplit {
  int head, quads;
};
__device__ __forceinline__ RowSplit splitRow(const float* x, const float* y, int v) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(x) % kVectorBytes;
  if (offset != reinterpret_cast<uintptr_t>(y) % kVectorBytes || offset % sizeof(float) != 0) return {v, 0};
  const int head = min(v, static_cast<int>((kVectorBytes - offset) % kVectorBytes / sizeof(float)));
  return {head, (v - head) / 4};
}

// scalar(j) for the row's single elements and quad(j) for its groups of four (j the first's
// index: x + j aligned, so quadAt(x + j, 0) loads them), this thread's share of them.
template <typename Scalar, typename Quad>
__device__ __forceinline__ void forRow(RowSplit split, int v, Scalar scalar, Quad quad) {
  for (int j = threadIdx.x; j < split.head; j += blockDim.x) scalar(j);
  for (int q = threadIdx.x; q < split.quads; q += blockDim.x) quad(split.head + 4 * q);
  for (int j = split.head + 4 * split.quads + threadIdx.x; j < v; j += blockDim.x) scalar(j);
}

// The passes over one row x(v), each over the whole block, that the kernels below are made of
// (the vocab-parallel passes, between which the ranks reduce the row's values).
__device__ float rowMaxOf(const float* x, int v) {
  float m = -INFINITY;
  forRow(
      splitRow(x, x, v), v, [&](int j) { m = fmaxf(m, x[j]); },
      [&](int j) {
        const float4 q = quadAt(x + j, 0);
        m = fmaxf(m, fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w)));
      });
  return blockReduce(m, Max{});
}
// The row's sum of exp(x - max).
__device__ float rowExpSum(const float* x, float maxv, int v) {
  float sum = 0.0f;
  auto shifted = [maxv](float xj) { return expf(xj - maxv); };
  forRow(
      splitRow(x, x, v), v, [&](int j) { sum += shifted(x[j]); },
      [&](int j) {
        const float4 e = lanes(shifted, quadAt(x + j, 0));
        sum += e.x + e.y + e.z + e.w;
      });
  return blockReduce(sum, Add{});
}

__global__ void crossEntropyMaxKernel(float* rowMax, const float* logits, int v) {
  const float m = rowMaxOf(logits + static_cast<size_t>(blockIdx.x) * v, v);
  if (threadIdx.x == 0) rowMax[blockIdx.x] = m;
}

__global__ void crossEntropyExpKernel(float* sums, float* targetLogits, const float* logits, const float* rowMax,
                                      const int* targets, int v, int v0) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  const float sum = rowExpSum(x, rowMax[row], v);
  if (threadIdx.x == 0) {
    sums[row] = sum;
    const int column = targets[row] - v0;
    targetLogits[row] = column >= 0 && column < v ? x[column] : 0.0f;
  }
}

// A thread per row: -log softmax[target] = log(sum) + max - logit[target] (exact where the
// probability underflows).
__global__ void crossEntropyLossKernel(float* losses, const float* sums, const float* rowMax, const float* targetLogits,
                                       int n) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < n) losses[row] = logf(sums[row]) + rowMax[row] - targetLogits[row];
}

// A thread's running maximum m of the values it has seen and their sum s of exp(x - m), rescaled
// when m grows: the row's maximum and its sum of exp(x - max) from one read of x.
struct OnlineSum {
  float m = -INFINITY, s = 0.0f;
  // Values of which `most` is the largest.
  template <typename... X>
  __device__ __forceinline__ void add(float most, X... x) {
    if (most > m) {
      s *= expf(m - most);  // exp(-inf) = 0 the first time
      m = most;
    }
    if (m != -INFINITY) s += (expf(x - m) + ...);  // nothing while every value is -inf
  }
};

__device__ float2 rowMaxAndSum(const float* x, int v) {
  OnlineSum t;
  forRow(
      splitRow(x, x, v), v, [&](int j) { t.add(x[j], x[j]); },
      [&](int j) {
        const float4 q = quadAt(x + j, 0);
        t.add(fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w)), q.x, q.y, q.z, q.w);
      });
  const float maxv = blockReduce(t.m, Max{});
  const float sum = blockReduce(t.m == -INFINITY ? 0.0f : t.s * expf(t.m - maxv), Add{});
  return make_float2(maxv, sum);
}

// The forward, one block per row: x read once, the row's statistics and loss written (the
// probabilities are not: backward recomputes them from x and the statistics).
__global__ void crossEntropyForwardKernel(float* rowMax, float* sums, float* losses, const float* logits,
                                          const int* targets, int v) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  const float2 stats = rowMaxAndSum(x, v);
  if (threadIdx.x == 0) {
    rowMax[row] = stats.x;
    sums[row] = stats.y;
    losses[row] = logf(stats.y) + stats.x - x[targets[row]];
  }
}

// dlogits = (probs - one-hot(target)) scale, probs = exp(x - max) / sum rounded as the forward's
// passes rounded it (the exponential, then times the reciprocal), the target's column at
// targets[row] - v0 (none in this vocabulary shard where that is outside [0, v)).
struct LossGradient {
  float maxv, inv;
  int column;
  float scale;
  __device__ float operator()(float xj, int j) const {
    const float value = expf(xj - maxv) * inv * scale;
    return j == column ? value - scale : value;
  }
};
__device__ LossGradient lossGradient(const float* rowMax, const float* sums, const int* targets, size_t row, int v0,
                                     float scale) {
  return {rowMax[row], 1.0f / sums[row], targets[row] - v0, scale};
}

__global__ void crossEntropyBackwardKernel(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                                           const int* targets, int v, float scale, int v0) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  float* d = dlogits + row * v;
  const LossGradient gradient = lossGradient(rowMax, sums, targets, row, v0, scale);
  forRow(
      splitRow(x, d, v), v, [&](int j) { d[j] = gradient(x[j], j); },
      [&](int j) {
        const float4 q = quadAt(x + j, 0);
        storeQuad(d + j, 0,
                  make_float4(gradient(q.x, j), gradient(q.y, j + 1), gradient(q.z, j + 2), gradient(q.w, j + 3)));
      });
}

// The same gradient rounded to 16 bits (bf16, else fp16) as it is stored: the operand the head's
// products take, without the fp32 gradient between. A group of four goes out as 8 bytes where
// the row allows.
__global__ void crossEntropyBackward16Kernel(uint16_t* dlogits, const float* logits, const float* rowMax,
                                             const float* sums, const int* targets, int v, float scale, int v0,
                                             Float16 format) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  uint16_t* d = dlogits + row * v;
  const LossGradient gradient = lossGradient(rowMax, sums, targets, row, v0, scale);
  auto rounded = [format](float value) -> uint32_t { return toFloat16(format, value); };
  const RowSplit split = splitRow(x, x, v);
  const bool wide = reinterpret_cast<uintptr_t>(d + split.head) % sizeof(uint2) == 0;
  forRow(
      split, v, [&](int j) { d[j] = static_cast<uint16_t>(rounded(gradient(x[j], j))); },
      [&](int j) {
        const float4 q = quadAt(x + j, 0);
        const uint32_t e0 = rounded(gradient(q.x, j)), e1 = rounded(gradient(q.y, j + 1));
        const uint32_t e2 = rounded(gradient(q.z, j + 2)), e3 = rounded(gradient(q.w, j + 3));
        if (wide) {
          *reinterpret_cast<uint2*>(d + j) = make_uint2(e0 | e1 << 16, e2 | e3 << 16);
        } else {
          d[j] = static_cast<uint16_t>(e0);
          d[j + 1] = static_cast<uint16_t>(e1);
          d[j + 2] = static_cast<uint16_t>(e2);
          d[j + 3] = static_cast<uint16_t>(e3);
        }
      });
}

// ---- optimizers (the step's scalars computed on the host, in double, as the CPU does) ----

struct AdamW {
  float decay, b1, b2, stepSize, bc2Sqrt, eps;
  // One element: p, m and v updated from g.
  __device__ void operator()(float& p, float g, float& m, float& v) const {
    const float decayed = p * decay;
    m = m * b1 + g * (1.0f - b1);
    v = v * b2 + g * g * (1.0f - b2);
    p = decayed - stepSize * (m / (sqrtf(v) / bc2Sqrt + eps));
  }
};

__global__ void adamwKernel(float* param, const float* grad, float* m, float* v, size_t n, size_t quads, AdamW step) {
  for (size_t q = threadIndex(); q < quads; q += gridThreads()) {
    float4 p = quadAt(param, q), mq = quadAt(m, q), vq = quadAt(v, q);
    const float4 g = quadAt(grad, q);
    step(p.x, g.x, mq.x, vq.x);
    step(p.y, g.y, mq.y, vq.y);
    step(p.z, g.z, mq.z, vq.z);
    step(p.w, g.w, mq.w, vq.w);
    storeQuad(param, q, p);
    storeQuad(m, q, mq);
    storeQuad(v, q, vq);
  }
  for (size_t i = quads * 4 + threadIndex(); i < n; i += gridThreads()) {
    float p = param[i], mi = m[i], vi = v[i];
    step(p, grad[i], mi, vi);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

struct Sgd {
  bool first, nesterov;
  float momentum, decay, lr;
  __device__ void operator()(float& p, float grad, float& m) const {
    const float g = grad + decay * p;
    m = first ? g : m * momentum + g;
    p -= lr * (nesterov ? g + momentum * m : m);
  }
};

__global__ void sgdKernel(float* param, const float* grad, float* m, size_t n, size_t quads, Sgd step) {
  for (size_t q = threadIndex(); q < quads; q += gridThreads()) {
    float4 p = quadAt(param, q), mq = quadAt(m, q);
    const float4 g = quadAt(grad, q);
    step(p.x, g.x, mq.x);
    step(p.y, g.y, mq.y);
    step(p.z, g.z, mq.z);
    step(p.w, g.w, mq.w);
    storeQuad(param, q, p);
    storeQuad(m, q, mq);
  }
  for (size_t i = quads * 4 + threadIndex(); i < n; i += gridThreads()) {
    float p = param[i], mi = m[i];
    step(p, grad[i], mi);
    param[i] = p;
    m[i] = mi;
  }
}

// ---- sums in double, folded in block order ----

template <bool kSquares>
__global__ void partialSumsKernel(double* partial, const float* x, size_t n, size_t quads) {
  auto term = [](float f) {
    const double value = f;
    return kSquares ? value * value : value;
  };
  double sum = 0.0;
  for (size_t q = threadIndex(); q < quads; q += gridThreads()) {
    const float4 v = quadAt(x, q);
    sum += term(v.x) + term(v.y) + term(v.z) + term(v.w);
  }
  for (size_t i = quads * 4 + threadIndex(); i < n; i += gridThreads()) sum += term(x[i]);
  sum = blockReduce(sum, Add{});
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One thread: the partial sums in order; *dst = the total (sumOfSquares) or total / n as float.
__global__ void foldSumsKernel(double* total, float* mean, const double* partial, int parts, int n) {
  double sum = 0.0;
  for (int p = 0; p < parts; ++p) sum += partial[p];
  if (total) *total = sum;
  if (mean) *mean = n > 0 ? static_cast<float>(sum / n) : 0.0f;
}

}  // namespace

int embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v0,
                     int vcount, const int* positions, void* stream) {
  if (B * T == 0) return 0;
  const bool byQuads = rowsByQuads(C, {out, wte, wpe});
  CHORUS_LAUNCH(embeddingForwardKernel, B * T, kThreads, 0, asStream(stream), out, tokens, wte, wpe, T, C, v0, vcount,
                positions, byQuads);
  return launched();
}

size_t embeddingBackwardScratchBytes(int rows, int vcount) {
  return TokenRows::ints(rows, std::max(vcount, 0)) * sizeof(int);
}

int embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                      int vcount, const int* positions, void* scratch, void* stream) {
  const int rows = B * T;
  if (rows == 0) return 0;
  if (vcount > 0) {
    const TokenRows t = TokenRows::carve(scratch, rows, vcount);
    if (const cudaError_t error = cudaMemsetAsync(t.count, 0, vcount * sizeof(int), asStream(stream))) {
      return static_cast<int>(error);
    }
    CHORUS_LAUNCH(countTokenRowsKernel, blocksFor(rows), kThreads, 0, asStream(stream), t.count, tokens, rows, v0,
                  vcount);
    if (const int error = launched()) return error;
    CHORUS_LAUNCH(scanTokenRowsKernel, 1, kScanThreads, 0, asStream(stream), t, vcount);
    if (const int error = launched()) return error;
    CHORUS_LAUNCH(placeTokenRowsKernel, blocksFor(rows), kThreads, 0, asStream(stream), t, tokens, rows, v0, vcount);
    if (const int error = launched()) return error;
    CHORUS_LAUNCH(embeddingTokenBackwardKernel, std::min(rows, vcount), kThreads, 0, asStream(stream), dwte, dout,
                  tokens, t, rows, C, rowsByQuads(C, {dwte, dout}));
    if (const int error = launched()) return error;
  }
  CHORUS_LAUNCH(embeddingPositionBackwardKernel, T, kThreads, 0, asStream(stream), dwpe, dout, B, T, C, positions);
  return launched();
}

int layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                     int n, int c, void* stream) {
  if (n == 0) return 0;
  const int rowsPerBlock = kThreads / kWarp;
  const unsigned blocks = (n + rowsPerBlock - 1) / rowsPerBlock;
  const bool byQuads = rowsByQuads(c, {out, inp, weight, bias});
  if (const int k = byQuads ? quadsPerLane<kMostForwardQuads>(c) : 0) {
    return withQuadsPerLane<kMostForwardQuads>(k, [&](auto quads) {
      CHORUS_LAUNCH(layernormForwardRowsKernel<decltype(quads)::value>, blocks, kThreads, 0, asStream(stream), out,
                    mean, rstd, inp, weight, bias, n, c);
      return launched();
    });
  }
  CHORUS_LAUNCH(layernormForwardKernel, blocks, kThreads, 0, asStream(stream), out, mean, rstd, inp, weight, bias, n, c,
                byQuads);
  return launched();
}

size_t columnSumsScratchFloats(int n, int c) { return static_cast<size_t>(foldBlocks(n)) * c; }
size_t layernormBackwardScratchFloats(int n, int c) { return 2 * columnSumsScratchFloats(n, c); }

int layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, const float* mean, const float* rstd, int n, int c, float* scratch,
                      void* stream) {
  if (n == 0) return 0;
  const int blocks = foldBlocks(n);
  const int rowsPerBlock = (n + blocks - 1) / blocks;
  const bool byQuads = rowsByQuads(c, {dinp, dout, inp, weight});
  const int k = byQuads && vectorAligned(scratch) ? quadsPerLane<kMostBackwardQuads>(c) : 0;
  auto rowsInRegisters = [&](auto quads) {
    CHORUS_LAUNCH(layernormBackwardRowsKernel<decltype(quads)::value>, blocks, kThreads, 0, asStream(stream), dinp,
                  scratch, dout, inp, weight, mean, rstd, n, c, rowsPerBlock);
    return launched();
  };
  int error = 0;
  if (k > 0) {
    error = withQuadsPerLane<kMostBackwardQuads>(k, rowsInRegisters);
  } else {
    CHORUS_LAUNCH(layernormBackwardKernel, blocks, kThreads, 0, asStream(stream), dinp, scratch, dout, inp, weight,
                  mean, rstd, n, c, rowsPerBlock, byQuads);
    error = launched();
  }
  if (error != 0) return error;
  const dim3 columnBlocks((c + kThreads - 1) / kThreads, 2);  // the weights' sums, then the biases'
  CHORUS_LAUNCH(foldColumnsKernel, columnBlocks, kThreads, 0, asStream(stream), dweight, dbias, scratch, blocks, c);
  return launched();
}

int columnSums(float* dst, const float* src, int n, int c, float* scratch, void* stream) {
  if (n == 0 || c == 0) return 0;
  const int blocks = foldBlocks(n);
  const int rowsPerBlock = (n + blocks - 1) / blocks;
  const unsigned columnBlocks = (c + kThreads - 1) / kThreads;
  CHORUS_LAUNCH(columnPartialsKernel, dim3(columnBlocks, blocks), kThreads, 0, asStream(stream), scratch, src, n, c,
                rowsPerBlock);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH(foldColumnsKernel, columnBlocks, kThreads, 0, asStream(stream), dst, nullptr, scratch, blocks, c);
  return launched();
}

int geluForward(float* out, const float* inp, size_t n, void* stream) {
  return mapElements(out, n, stream, GeluForward{}, inp);
}

int geluBackward(float* dinp, const float* inp, const float* dout, size_t n, void* stream) {
  return mapElements(dinp, n, stream, GeluBackward{}, static_cast<const float*>(dinp), inp, dout);
}

int residualForward(float* out, const float* a, const float* b, size_t n, void* stream) {
  return mapElements(out, n, stream, Add{}, a, b);
}

int residualBackward(float* da, float* db, const float* dout, size_t n, void* stream) {
  if (n == 0) return 0;
  const size_t quads = quadsFor(n, {da, db, dout});
  CHORUS_LAUNCH(residualBackwardKernel, blocksFor(quads > 0 ? quads : n), kThreads, 0, asStream(stream), da, db, dout,
                n, quads);
  return launched();
}

int addRows(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width, size_t rows, void* stream) {
  if (width * rows == 0) return 0;
  CHORUS_LAUNCH(addRowsKernel, blocksFor(width * rows), kThreads, 0, asStream(stream), dst, dstStride, src, srcStride,
                width, rows);
  return launched();
}

int addIndexedRows(float* out, const float* table, const int* index, size_t width, size_t rows, void* stream) {
  if (width * rows == 0) return 0;
  CHORUS_LAUNCH(addIndexedRowsKernel, blocksFor(width * rows), kThreads, 0, asStream(stream), out, table, index, width,
                rows);
  return launched();
}

int crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                        int v, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyForwardKernel, n, kRowThreads, 0, asStream(stream), rowMax, sums, losses, logits, targets,
                v);
  return launched();
}

int crossEntropyShardMax(float* rowMax, const float* logits, int n, int v, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyMaxKernel, n, kRowThreads, 0, asStream(stream), rowMax, logits, v);
  return launched();
}

int crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax, const int* targets,
                         int n, int v, int v0, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyExpKernel, n, kRowThreads, 0, asStream(stream), sums, targetLogits, logits, rowMax, targets,
                v, v0);
  return launched();
}

int crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits, int n,
                          void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyLossKernel, blocksFor(n), kThreads, 0, asStream(stream), losses, sums, rowMax, targetLogits,
                n);
  return launched();
}

int crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                         const int* targets, int n, int v, float scale, int v0, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyBackwardKernel, n, kRowThreads, 0, asStream(stream), dlogits, logits, rowMax, sums, targets,
                v, scale, v0);
  return launched();
}

int crossEntropyBackward16(Float16 format, uint16_t* dlogits, const float* logits, const float* rowMax,
                           const float* sums, const int* targets, int n, int v, float scale, int v0, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyBackward16Kernel, n, kRowThreads, 0, asStream(stream), dlogits, logits, rowMax, sums,
                targets, v, scale, v0, format);
  return launched();
}

int adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step, const OptimizerSettings& s,
              void* stream) {
  if (n == 0) return 0;
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weightDecay);
  const AdamW update{decay, s.beta1, s.beta2, static_cast<float>(s.lr / bc1), static_cast<float>(std::sqrt(bc2)),
                     s.eps};
  const size_t quads = quadsFor(n, {param, grad, m, v});
  CHORUS_LAUNCH(adamwKernel, blocksFor(quads > 0 ? quads : n), kThreads, 0, asStream(stream), param, grad, m, v, n,
                quads, update);
  return launched();
}

int sgdStep(float* param, const float* grad, float* m, size_t n, long step, const OptimizerSettings& s, void* stream) {
  if (n == 0) return 0;
  const Sgd update{step <= 1, s.nesterov, s.momentum, s.weightDecay, s.lr};
  const size_t quads = quadsFor(n, {param, grad, m});
  CHORUS_LAUNCH(sgdKernel, blocksFor(quads > 0 ? quads : n), kThreads, 0, asStream(stream), param, grad, m, n, quads,
                update);
  return launched();
}

size_t sumScratchDoubles() { return kSumBlocks; }

// The blocks a sum over n floats takes: one per thread's worth of quads (or floats), at most
// kSumBlocks, so that a small tensor's sum does not launch (and fold) a thousand blocks of zeros.
unsigned sumBlocks(size_t n, size_t quads) {
  return static_cast<unsigned>(std::min<size_t>(kSumBlocks, blocksFor(quads > 0 ? quads : n)));
}

int sumOfSquares(double* result, const float* x, size_t n, double* scratch, void* stream) {
  const size_t quads = quadsFor(n, {x});
  const unsigned blocks = sumBlocks(n, quads);
  CHORUS_LAUNCH(partialSumsKernel<true>, blocks, kThreads, 0, asStream(stream), scratch, x, n, quads);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH(foldSumsKernel, 1, 1, 0, asStream(stream), result, nullptr, scratch, static_cast<int>(blocks), 0);
  return launched();
}

int meanOf(float* result, const float* x, int n, double* scratch, void* stream) {
  const size_t count = static_cast<size_t>(n);
  const size_t quads = quadsFor(count, {x});
  const unsigned blocks = sumBlocks(count, quads);
  CHORUS_LAUNCH(partialSumsKernel<false>, blocks, kThreads, 0, asStream(stream), scratch, x, count, quads);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH(foldSumsKernel, 1, 1, 0, asStream(stream), nullptr, result, scratch, static_cast<int>(blocks), n);
  return launched();
}

int scale(float* x, size_t n, float factor, void* stream) {
  return mapElements(x, n, stream, Scale{factor}, static_cast<const float*>(x));
}

int fill(float* x, size_t n, float value, void* stream) { return mapElements(x, n, stream, Fill{value}); }

}  // namespace chorus::kernels::cuda
