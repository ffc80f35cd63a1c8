// moe.cu: the mixture-of-experts routing kernels of moe.h on device memory. The top-k choice runs
// in three passes: each token's k best experts (a thread per token), then one block per expert
// numbering its choices in GShard's priority order (every token's first choice before any second
// one) by a block-wide prefix count, dropping those past the capacity, then the experts' offsets
// added to the rows. Dispatch and combine go a warp per choice or per token, a token's choices in
// order; products that the reference rounds separately are rounded separately here too.
#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/moe.h"

namespace chorus::kernels::cuda {
namespace {

constexpr int kMaxChoices = 16;  // k, at most (a register per choice in the top-k pass)
constexpr int kPlaceThreads = 1024;

// ---- router ----

// One warp per row: the row's maximum, its exponentials summed in double, probabilities and lse.
__global__ void routerSoftmaxKernel(float* probs, float* lse, const float* logits, int n, int E) {
  const int lane = threadIdx.x % kWarp;
  const int i = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (i >= n) return;
  const float* in = logits + static_cast<size_t>(i) * E;
  float* out = probs + static_cast<size_t>(i) * E;
  float max = -INFINITY;
  for (int e = lane; e < E; e += kWarp) max = fmaxf(max, in[e]);
  max = warpMax(max);
  double sum = 0.0;
  for (int e = lane; e < E; e += kWarp) {
    out[e] = expf(in[e] - max);
    sum += out[e];
  }
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < E; e += kWarp) out[e] *= inv;
  if (lane == 0) lse[i] = max + static_cast<float>(log(sum));
}

// A thread per token: its k best experts by (probability descending, expert ascending), as the
// reference's partial sort orders them, and their gates.
__global__ void topKKernel(int* expert, float* gate, const float* probs, int n, int E, int k, bool normalize) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* p = probs + static_cast<size_t>(i) * E;
  int chosen[kMaxChoices];
  float prev = INFINITY;
  int prevExpert = -1;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    // The best expert after the previous pick in that order.
    int best = -1;
    for (int e = 0; e < E; ++e) {
      const bool after = p[e] < prev || (p[e] == prev && e > prevExpert);
      if (after && (best < 0 || p[e] > p[best])) best = e;
    }
    chosen[j] = best;
    prev = p[best];
    prevExpert = best;
    sum += p[best];
  }
  for (int j = 0; j < k; ++j) {
    expert[i * k + j] = chosen[j];
    gate[i * k + j] = normalize ? p[chosen[j]] / sum : p[chosen[j]];
  }
}

// One block per expert e: its choices numbered in priority order (choice j of token i at position
// j n + i), a 32-way ballot per warp and the warps' totals in order. Writes each kept choice's
// place within the expert to row (-1 past the capacity), and assigned[e], counts[e].
__global__ void placeKernel(int* row, int* assigned, int* counts, const int* expert, int n, int k, int capacity) {
  __shared__ int warpCounts[kPlaceThreads / kWarp];
  const int e = blockIdx.x, lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int total = n * k;
  int before = 0;  // this expert's choices in earlier chunks
  for (int first = 0; first < total; first += blockDim.x) {
    const int at = first + threadIdx.x;  // priority position
    const int choice = at < total ? (at % n) * k + at / n : 0;
    const bool mine = at < total && expert[choice] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    const int inWarp = __popc(ballot & ((1u << lane) - 1));
    __syncthreads();  // the previous chunk's counts are read
    if (lane == 0) warpCounts[warp] = __popc(ballot);
    __syncthreads();
    int place = before + inWarp;
    int chunk = 0;
    for (int w = 0; w < kPlaceThreads / kWarp; ++w) {
      if (w < warp) place += warpCounts[w];
      chunk += warpCounts[w];
    }
    if (mine) row[choice] = capacity < 0 || place < capacity ? place : -1;
    before += chunk;
  }
  if (threadIdx.x == 0) {
    assigned[e] = before;
    counts[e] = capacity < 0 ? before : min(before, capacity);
  }
}

// A thread per choice: a kept place becomes a row of the dispatch buffer (the experts' rows in
// expert order); the first thread counts the choices dropped.
__global__ void offsetRowsKernel(int* row, int* dropped, const int* expert, const int* assigned, const int* counts,
                                 int total, int E) {
  CHORUS_DYNAMIC_SHARED(bytes);
  int* offsets = reinterpret_cast<int*>(bytes);  // E + 1
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
    if (blockIdx.x == 0) {
      int lost = 0;
      for (int e = 0; e < E; ++e) lost += assigned[e] - counts[e];
      *dropped = lost;
    }
  }
  __syncthreads();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < total && row[c] >= 0) row[c] += offsets[expert[c]];
}

// A block per expert: the column's sum over the rows, in double.
__global__ void columnSumsKernel(float* sums, const float* probs, int n, int E) {
  const int e = blockIdx.x;
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += probs[static_cast<size_t>(i) * E + e];
  sum = blockReduce(sum, Add{});
  if (threadIdx.x == 0) sums[e] = static_cast<float>(sum);
}

// A block per token; dp(E) in shared memory, the gate terms added by one thread in choice order.
__global__ void routerBackwardKernel(float* dlogits, const float* dgate, const float* probs, const float* lse,
                                     const int* expert, const float* gate, const int* row, const int* assigned,
                                     int total, int E, int k, bool normalize, double auxPerToken, float zScale) {
  CHORUS_DYNAMIC_SHARED(bytes);
  float* dp = reinterpret_cast<float*>(bytes);  // E
  const int i = blockIdx.x;
  const float* p = probs + static_cast<size_t>(i) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) dp[e] = static_cast<float>(auxPerToken * assigned[e]);
  __syncthreads();
  if (threadIdx.x == 0) {
    // Gates: g_j = p_j / S with S the sum of the chosen p (normalize), else g_j = p_j.
    float sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) {
      sum += p[expert[i * k + j]];
      if (row[i * k + j] >= 0) dot += dgate[i * k + j] * gate[i * k + j];
    }
    for (int j = 0; j < k; ++j) {
      const float dg = row[i * k + j] >= 0 ? dgate[i * k + j] : 0.0f;
      dp[expert[i * k + j]] += normalize ? (dg - dot) / sum : dg;
    }
  }
  __syncthreads();
  double pdp = 0.0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) pdp += static_cast<double>(p[e]) * dp[e];
  pdp = blockReduce(pdp, Add{});
  float* out = dlogits + static_cast<size_t>(i) * E;
  const float z = zScale * 2.0f * lse[i] / total;
  for (int e = threadIdx.x; e < E; e += blockDim.x) out[e] = p[e] * (dp[e] - static_cast<float>(pdp)) + z * p[e];
}

// ---- dispatch and combine ----
// A warp per row, kRowWarps rows a block (a block per row, as first written, moved a 3 KB row a
// block, a quarter of its threads idle, and ran at 48% (dispatch) and 58% (combine) of an H200's
// memory peak; the blocks' starts are the likely cost, not measured apart). A lane takes its units
// of a row (quads where the rows allow: byQuads, C a multiple of 4 and every buffer aligned; else
// floats) kBatch at a time, every load of a batch issued before its stores: GPT-2's 768 columns
// are 192 quads, 6 a lane in two batches. Each element's sums keep the reference's order.

constexpr int kRowWarps = kThreads / kWarp;
constexpr int kBatch = 4;

unsigned rowBlocks(int rows) { return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps); }
__device__ __forceinline__ int warpRow() { return blockIdx.x * kRowWarps + threadIdx.x / kWarp; }

// launch(U{}, width): U float4 and width C / 4 where rows of C floats in these buffers go 16 bytes at
// a time (rowsByQuads), else float and C. Returns 0 or the launch's error.
template <typename Launch>
int withRowUnits(int C, std::initializer_list<const void*> buffers, Launch launch) {
  if (rowsByQuads(C, buffers)) {
    launch(float4{}, C / 4);
  } else {
    launch(0.0f, C);
  }
  return launched();
}

// f over the units of one float or one quad.
template <typename F, typename... S>
__device__ __forceinline__ float each(const F& f, float a, S... s) {
  return f(a, s...);
}
template <typename F, typename... Q>
__device__ __forceinline__ float4 each(const F& f, float4 a, Q... q) {
  return lanes(f, a, q...);
}
__device__ __forceinline__ double dotOf(float a, float b) { return static_cast<double>(a) * b; }
__device__ __forceinline__ double dotOf(float4 a, float4 b) {
  return dotOf(a.x, b.x) + dotOf(a.y, b.y) + dotOf(a.z, b.z) + dotOf(a.w, b.w);
}

// Row r of units U (float or float4), `width` of them a row.
template <typename U>
__device__ __forceinline__ const U* rowOf(const float* base, size_t r, int width) {
  return reinterpret_cast<const U*>(base) + r * width;
}
template <typename U>
__device__ __forceinline__ U* rowOf(float* base, size_t r, int width) {
  return reinterpret_cast<U*>(base) + r * width;
}

// acc + gate * y, the product rounded before the sum, as the reference rounds it.
struct GatedAdd {
  float gate;
  __device__ float operator()(float acc, float y) const { return __fadd_rn(acc, __fmul_rn(gate, y)); }
};
struct Scaled {
  float scale;
  __device__ float operator()(float g) const { return scale * g; }
};

// A warp per choice: x's row copied to the choice's row of the buffer (none for a dropped choice).
template <typename U>
__global__ void dispatchKernel(float* buffer, const float* x, const int* row, int total, int k, int width) {
  const int c = warpRow();
  if (c >= total || row[c] < 0) return;
  const U* src = rowOf<U>(x, c / k, width);
  U* dst = rowOf<U>(buffer, row[c], width);
  for (int base = threadIdx.x % kWarp; base < width; base += kBatch * kWarp) {
    U v[kBatch]{};
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) v[b] = src[base + b * kWarp];
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) dst[base + b * kWarp] = v[b];
    }
  }
}

// A warp per token: dx's row, then its kept choices' rows of dbuffer added in choice order.
template <typename U>
__global__ void dispatchBackwardKernel(float* dx, const float* dbuffer, const int* row, int n, int k, int width) {
  const int i = warpRow();
  if (i >= n) return;
  U* dst = rowOf<U>(dx, i, width);
  for (int base = threadIdx.x % kWarp; base < width; base += kBatch * kWarp) {
    U acc[kBatch]{};
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) acc[b] = dst[base + b * kWarp];
    }
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r < 0) continue;
      const U* src = rowOf<U>(dbuffer, r, width);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (base + b * kWarp < width) acc[b] = each(Add{}, acc[b], src[base + b * kWarp]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) dst[base + b * kWarp] = acc[b];
    }
  }
}

// A warp per token: out's row = its kept choices' rows of y, gated, added in choice order.
template <typename U>
__global__ void combineKernel(float* out, const float* y, const int* row, const float* gate, int n, int k, int width) {
  const int i = warpRow();
  if (i >= n) return;
  U* dst = rowOf<U>(out, i, width);
  for (int base = threadIdx.x % kWarp; base < width; base += kBatch * kWarp) {
    U acc[kBatch]{};
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r < 0) continue;
      const U* src = rowOf<U>(y, r, width);
      const GatedAdd add{gate[i * k + j]};
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (base + b * kWarp < width) acc[b] = each(add, acc[b], src[base + b * kWarp]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) dst[base + b * kWarp] = acc[b];
    }
  }
}

// A warp per choice: dy's row (dout's, gated), and the gate's gradient (a dot product in double,
// the lanes' sums added over the warp in a fixed order).
template <typename U>
__global__ void combineBackwardKernel(float* dy, float* dgate, const float* dout, const float* y, const int* row,
                                      const float* gate, int total, int k, int width) {
  const int c = warpRow();
  if (c >= total) return;
  const int r = row[c];
  if (r < 0) {
    if (threadIdx.x % kWarp == 0) dgate[c] = 0.0f;
    return;
  }
  const U* g = rowOf<U>(dout, c / k, width);
  const U* src = rowOf<U>(y, r, width);
  U* dst = rowOf<U>(dy, r, width);
  const Scaled scaled{gate[c]};
  double dot = 0.0;
  for (int base = threadIdx.x % kWarp; base < width; base += kBatch * kWarp) {
    U gv[kBatch]{}, sv[kBatch]{};
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) {
        gv[b] = g[base + b * kWarp];
        sv[b] = src[base + b * kWarp];
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kWarp < width) {
        dst[base + b * kWarp] = each(scaled, gv[b]);
        dot += dotOf(gv[b], sv[b]);
      }
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (threadIdx.x % kWarp == 0) dgate[c] = static_cast<float>(dot);
}

// ---- SwiGLU ----
// Row i of inp holds a (its first h) then b (the next h). Block (x, y) takes columns [x threads,
// (x + 1) threads) of rows y, y + gridDim.y, ..., 16 bytes at a time where the rows allow (byQuads:
// h a multiple of 4 and every buffer aligned), else a float at a time: no division per element
// (the grid-stride form divided a 64-bit index by h for each, at 41% of an H200's memory peak).

constexpr int kSwigluThreads = 128;  // a GPT-2 expert's 1536 columns: 3 blocks of quads a row
constexpr int kMaxGridRows = 65535;  // gridDim.y's limit

struct SwigluForward {
  __device__ float operator()(float a, float b) const { return a / (1.0f + expf(-a)) * b; }
};
// The gradients added into da and db.
struct SwigluGradA {
  __device__ float operator()(float da, float a, float b, float dout) const {
    const float s = 1.0f / (1.0f + expf(-a));
    return da + dout * b * s * (1.0f + a * (1.0f - s));
  }
};
struct SwigluGradB {
  __device__ float operator()(float db, float a, float dout) const {
    const float s = 1.0f / (1.0f + expf(-a));
    return db + dout * (a * s);
  }
};

__global__ void swigluForwardKernel(float* out, const float* inp, int n, int h, bool byQuads) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= (byQuads ? h / 4 : h)) return;
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const float* a = inp + 2 * static_cast<size_t>(i) * h;
    const float* b = a + h;
    float* o = out + static_cast<size_t>(i) * h;
    if (byQuads) {
      storeQuad(o, c, lanes(SwigluForward{}, quadAt(a, c), quadAt(b, c)));
    } else {
      o[c] = SwigluForward{}(a[c], b[c]);
    }
  }
}

__global__ void swigluBackwardKernel(float* dinp, const float* inp, const float* dout, int n, int h, bool byQuads) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= (byQuads ? h / 4 : h)) return;
  for (int i = blockIdx.y; i < n; i += gridDim.y) {
    const size_t row = 2 * static_cast<size_t>(i) * h;
    const float *a = inp + row, *b = a + h, *d = dout + static_cast<size_t>(i) * h;
    float *da = dinp + row, *db = da + h;
    if (byQuads) {
      const float4 aq = quadAt(a, c), bq = quadAt(b, c), dq = quadAt(d, c);
      storeQuad(da, c, lanes(SwigluGradA{}, quadAt(da, c), aq, bq, dq));
      storeQuad(db, c, lanes(SwigluGradB{}, quadAt(db, c), aq, dq));
    } else {
      da[c] = SwigluGradA{}(da[c], a[c], b[c], d[c]);
      db[c] = SwigluGradB{}(db[c], a[c], d[c]);
    }
  }
}

// The grid of either kernel: blocks across a row's columns (quads where byQuads), and down the rows.
dim3 swigluGrid(int n, int h, bool byQuads) {
  const int width = byQuads ? h / 4 : h;
  return dim3((width + kSwigluThreads - 1) / kSwigluThreads, std::min(n, kMaxGridRows));
}

}  // namespace

int routerSoftmax(float* probs, float* lse, const float* logits, int n, int E, void* stream) {
  if (n == 0) return 0;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  CHORUS_LAUNCH(routerSoftmaxKernel, (n + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, asStream(stream), probs, lse,
                logits, n, E);
  return launched();
}

int routeTopK(int* expert, float* gate, int* row, int* assigned, int* counts, int* dropped, const float* probs, int n,
              int E, int k, bool normalize, int capacity, void* stream) {
  if (k < 1 || k > kMaxChoices || k > E || E > kMaxExperts) return static_cast<int>(cudaErrorInvalidValue);
  const cudaStream_t s = asStream(stream);
  if (n > 0) {
    CHORUS_LAUNCH(topKKernel, (n + kThreads - 1) / kThreads, kThreads, 0, s, expert, gate, probs, n, E, k, normalize);
    if (const int error = launched()) return error;
  }
  CHORUS_LAUNCH(placeKernel, E, kPlaceThreads, 0, s, row, assigned, counts, expert, n, k, capacity);
  if (const int error = launched()) return error;
  const int total = n * k;
  CHORUS_LAUNCH(offsetRowsKernel, std::max(1, (total + kThreads - 1) / kThreads), kThreads, (E + 1) * sizeof(int), s,
                row, dropped, expert, assigned, counts, total, E);
  return launched();
}

int routerColumnSums(float* sums, const float* probs, int n, int E, void* stream) {
  CHORUS_LAUNCH(columnSumsKernel, E, kThreads, 0, asStream(stream), sums, probs, n, E);
  return launched();
}

int routerBackward(float* dlogits, const float* dgate, const float* probs, const float* lse, const int* expert,
                   const float* gate, const int* row, const int* assigned, int n, int total, int E, int k,
                   bool normalize, float auxScale, float zScale, void* stream) {
  if (n == 0) return 0;
  if (E > kMaxExperts) return static_cast<int>(cudaErrorInvalidValue);
  const double auxPerToken = static_cast<double>(auxScale) * E / (static_cast<double>(total) * total * k);
  CHORUS_LAUNCH(routerBackwardKernel, n, 128, E * sizeof(float), asStream(stream), dlogits, dgate, probs, lse, expert,
                gate, row, assigned, total, E, k, normalize, auxPerToken, zScale);
  return launched();
}

int moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C, void* stream) {
  if (n * k == 0) return 0;
  return withRowUnits(C, {buffer, x}, [&](auto unit, int width) {
    CHORUS_LAUNCH(dispatchKernel<decltype(unit)>, rowBlocks(n * k), kThreads, 0, asStream(stream), buffer, x, row,
                  n * k, k, width);
  });
}

int moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C, void* stream) {
  if (n == 0) return 0;
  return withRowUnits(C, {dx, dbuffer}, [&](auto unit, int width) {
    CHORUS_LAUNCH(dispatchBackwardKernel<decltype(unit)>, rowBlocks(n), kThreads, 0, asStream(stream), dx, dbuffer, row,
                  n, k, width);
  });
}

int moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C, void* stream) {
  if (n == 0) return 0;
  return withRowUnits(C, {out, y}, [&](auto unit, int width) {
    CHORUS_LAUNCH(combineKernel<decltype(unit)>, rowBlocks(n), kThreads, 0, asStream(stream), out, y, row, gate, n, k,
                  width);
  });
}

int moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                       int n, int k, int C, void* stream) {
  if (n * k == 0) return 0;
  return withRowUnits(C, {dy, dout, y}, [&](auto unit, int width) {
    CHORUS_LAUNCH(combineBackwardKernel<decltype(unit)>, rowBlocks(n * k), kThreads, 0, asStream(stream), dy, dgate,
                  dout, y, row, gate, n * k, k, width);
  });
}

int swigluForward(float* out, const float* inp, int n, int h, void* stream) {
  if (n == 0 || h == 0) return 0;
  const bool byQuads = rowsByQuads(h, {out, inp});
  CHORUS_LAUNCH(swigluForwardKernel, swigluGrid(n, h, byQuads), kSwigluThreads, 0, asStream(stream), out, inp, n, h,
                byQuads);
  return launched();
}

int swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h, void* stream) {
  if (n == 0 || h == 0) return 0;
  const bool byQuads = rowsByQuads(h, {dinp, inp, dout});
  CHORUS_LAUNCH(swigluBackwardKernel, swigluGrid(n, h, byQuads), kSwigluThreads, 0, asStream(stream), dinp, inp, dout,
                n, h, byQuads);
  return launched();
}

}  // namespace chorus::kernels::cuda
