// moe.cu: the mixture-of-experts routing kernels of moe.h on device memory. The top-k choice runs
// in three passes: each token's k best experts (a thread per token), then one block per expert
// numbering its choices in GShard's priority order (every token's first choice before any second
// one) by a block-wide prefix count, dropping those past the capacity, then the experts' offsets
// added to the rows. Dispatch and combine go a block per choice or per token, a token's choices in
// order; products that the reference rounds separately are rounded separately here too.
#ifndef CHORUS_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>

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
// Rows go 16 bytes at a time where they allow (byQuads: C a multiple of 4 and every buffer
// aligned), then a float at a time; each element's sums keep the reference's order.

// acc + gate * y, the product rounded before the sum, as the reference rounds it.
struct GatedAdd {
  float gate;
  __device__ float operator()(float acc, float y) const { return __fadd_rn(acc, __fmul_rn(gate, y)); }
};

__global__ void dispatchKernel(float* buffer, const float* x, const int* row, int k, int C, bool byQuads) {
  const int c = blockIdx.x;
  if (row[c] < 0) return;
  const float* src = x + static_cast<size_t>(c / k) * C;
  float* dst = buffer + static_cast<size_t>(row[c]) * C;
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) storeQuad(dst, q, quadAt(src, q));
  for (int ch = quads * 4 + threadIdx.x; ch < C; ch += blockDim.x) dst[ch] = src[ch];
}

// A block per token: its choices' rows added in choice order.
__global__ void dispatchBackwardKernel(float* dx, const float* dbuffer, const int* row, int k, int C, bool byQuads) {
  const int i = blockIdx.x;
  float* dst = dx + static_cast<size_t>(i) * C;
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    float4 acc = quadAt(dst, q);
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r >= 0) acc = lanes(Add{}, acc, quadAt(dbuffer + static_cast<size_t>(r) * C, q));
    }
    storeQuad(dst, q, acc);
  }
  for (int ch = quads * 4 + threadIdx.x; ch < C; ch += blockDim.x) {
    float acc = dst[ch];
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r >= 0) acc += dbuffer[static_cast<size_t>(r) * C + ch];
    }
    dst[ch] = acc;
  }
}

// A block per token: out = the gated rows in choice order, each product rounded before its sum.
__global__ void combineKernel(float* out, const float* y, const int* row, const float* gate, int k, int C,
                              bool byQuads) {
  const int i = blockIdx.x;
  float* dst = out + static_cast<size_t>(i) * C;
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r >= 0) acc = lanes(GatedAdd{gate[i * k + j]}, acc, quadAt(y + static_cast<size_t>(r) * C, q));
    }
    storeQuad(dst, q, acc);
  }
  for (int ch = quads * 4 + threadIdx.x; ch < C; ch += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int r = row[i * k + j];
      if (r >= 0) acc = GatedAdd{gate[i * k + j]}(acc, y[static_cast<size_t>(r) * C + ch]);
    }
    dst[ch] = acc;
  }
}

// A block per choice: dy's row, and the gate's gradient (a dot product in double).
__global__ void combineBackwardKernel(float* dy, float* dgate, const float* dout, const float* y, const int* row,
                                      const float* gate, int k, int C, bool byQuads) {
  const int c = blockIdx.x;
  const int r = row[c];
  if (r < 0) {
    if (threadIdx.x == 0) dgate[c] = 0.0f;
    return;
  }
  const float* g = dout + static_cast<size_t>(c / k) * C;
  const float* src = y + static_cast<size_t>(r) * C;
  float* dst = dy + static_cast<size_t>(r) * C;
  const float scale = gate[c];
  auto product = [](float a, float b) { return static_cast<double>(a) * b; };
  double dot = 0.0;
  const int quads = byQuads ? C / 4 : 0;
  for (int q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 gq = quadAt(g, q), sq = quadAt(src, q);
    storeQuad(dst, q, make_float4(scale * gq.x, scale * gq.y, scale * gq.z, scale * gq.w));
    dot += product(gq.x, sq.x) + product(gq.y, sq.y) + product(gq.z, sq.z) + product(gq.w, sq.w);
  }
  for (int ch = quads * 4 + threadIdx.x; ch < C; ch += blockDim.x) {
    dst[ch] = scale * g[ch];
    dot += product(g[ch], src[ch]);
  }
  dot = blockReduce(dot, Add{});
  if (threadIdx.x == 0) dgate[c] = static_cast<float>(dot);
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
  CHORUS_LAUNCH(dispatchKernel, n * k, kThreads, 0, asStream(stream), buffer, x, row, k, C,
                rowsByQuads(C, {buffer, x}));
  return launched();
}

int moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(dispatchBackwardKernel, n, kThreads, 0, asStream(stream), dx, dbuffer, row, k, C,
                rowsByQuads(C, {dx, dbuffer}));
  return launched();
}

int moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(combineKernel, n, kThreads, 0, asStream(stream), out, y, row, gate, k, C, rowsByQuads(C, {out, y}));
  return launched();
}

int moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                       int n, int k, int C, void* stream) {
  if (n * k == 0) return 0;
  CHORUS_LAUNCH(combineBackwardKernel, n * k, kThreads, 0, asStream(stream), dy, dgate, dout, y, row, gate, k, C,
                rowsByQuads(C, {dy, dout, y}));
  return launched();
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
