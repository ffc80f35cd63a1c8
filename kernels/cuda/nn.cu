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

// One block per row; only the block of a token's first row goes on (the rows of a token are one
// sum, not one atomic addition each): it adds every row of its token into that token's gradient
// row in row order, as the CPU's loop does, so the sum repeats bit for bit. The rows are found a
// tile of blockDim.x tokens at a time (blockDim.x a multiple of 32, at most kThreads).
__global__ void embeddingTokenBackwardKernel(float* dwte, const float* dout, const int* tokens, int rows, int C, int v0,
                                             int vcount) {
  __shared__ int matched[kThreads];  // this tile's rows of the token, in order
  __shared__ int warpMatches[kThreads / 32];
  const int token = tokens[blockIdx.x];
  if (token - v0 < 0 || token - v0 >= vcount) return;
  float* te = dwte + static_cast<size_t>(token - v0) * C;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
  bool first = true;  // no tile with a row of the token seen yet
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
    if (count > 0 && first) {
      if (matched[0] != static_cast<int>(blockIdx.x)) return;  // an earlier row's block sums the token
      first = false;
    }
    for (int i = static_cast<int>(threadIdx.x); i < C; i += static_cast<int>(blockDim.x)) {
      float acc = te[i];
      for (int k = 0; k < count; ++k) acc += dout[static_cast<size_t>(matched[k]) * C + i];
      te[i] = acc;
    }
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

// dst[i] += the sum of partial[p][i] over p < parts, in order.
__global__ void foldColumnsKernel(float* dst, const float* partial, int parts, int c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
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

// The three passes over one row x(v), each over the whole block; every kernel below is made of them
// (the fused forward of all three, or one each for the vocab-parallel passes, between which the
// ranks reduce the row's values).
__device__ float rowMaxOf(const float* x, int v) {
  float m = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, x[j]);
  return blockReduce(m, Max{});
}
// p = exp(x - max); returns the row's sum of p.
__device__ float rowExp(float* p, const float* x, float maxv, int v) {
  float sum = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    p[j] = expf(x[j] - maxv);
    sum += p[j];
  }
  return blockReduce(sum, Add{});
}
// p /= sum; returns -log softmax[target] = log(sum) + max - logit[target] (exact where the
// probability underflows).
__device__ float rowLoss(float* p, float sum, float maxv, float targetLogit, int v) {
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < v; j += blockDim.x) p[j] *= inv;
  return logf(sum) + maxv - targetLogit;
}

__global__ void crossEntropyMaxKernel(float* rowMax, const float* logits, int v) {
  const float m = rowMaxOf(logits + static_cast<size_t>(blockIdx.x) * v, v);
  if (threadIdx.x == 0) rowMax[blockIdx.x] = m;
}

__global__ void crossEntropyExpKernel(float* probs, float* sums, float* targetLogits, const float* logits,
                                      const float* rowMax, const int* targets, int v, int v0) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  const float sum = rowExp(probs + row * v, x, rowMax[row], v);
  if (threadIdx.x == 0) {
    sums[row] = sum;
    const int column = targets[row] - v0;
    targetLogits[row] = column >= 0 && column < v ? x[column] : 0.0f;
  }
}

__global__ void crossEntropyLossKernel(float* probs, float* losses, const float* sums, const float* rowMax,
                                       const float* targetLogits, int v) {
  const size_t row = blockIdx.x;
  const float loss = rowLoss(probs + row * v, sums[row], rowMax[row], targetLogits[row], v);
  if (threadIdx.x == 0) losses[row] = loss;
}

// The row's maximum and its sum of exp(x - max) from one read of x: each thread keeps a running
// maximum and a sum rescaled when its maximum grows; the block then combines them.
__device__ float2 rowMaxAndSum(const float* x, int v) {
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float xj = x[j];
    if (xj > m) {
      s = s * expf(m - xj) + 1.0f;  // exp(-inf) = 0 the first time
      m = xj;
    } else if (m != -INFINITY) {
      s += expf(xj - m);
    }
  }
  const float maxv = blockReduce(m, Max{});
  const float sum = blockReduce(m == -INFINITY ? 0.0f : s * expf(m - maxv), Add{});
  return make_float2(maxv, sum);
}

// The fused forward, one block per row: x read twice (the statistics, then the probabilities)
// and the probabilities written once; each probability is exp(x - max) / sum, rounded as the
// separate passes round it.
__global__ void crossEntropyForwardKernel(float* probs, float* losses, const float* logits, const int* targets, int v) {
  const size_t row = blockIdx.x;
  const float* x = logits + row * v;
  float* p = probs + row * v;
  const float2 stats = rowMaxAndSum(x, v);
  const float inv = 1.0f / stats.y;
  for (int j = threadIdx.x; j < v; j += blockDim.x) p[j] = expf(x[j] - stats.x) * inv;
  if (threadIdx.x == 0) losses[row] = logf(stats.y) + stats.x - x[targets[row]];
}

__global__ void crossEntropyBackwardKernel(float* dlogits, const float* probs, const int* targets, int v, float scale,
                                           int v0) {
  const size_t row = blockIdx.x;
  const float* p = probs + row * v;
  float* d = dlogits + row * v;
  const int column = targets[row] - v0;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float value = p[j] * scale;
    d[j] = j == column ? value - scale : value;
  }
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

int embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                      int vcount, const int* positions, void* stream) {
  if (B * T == 0) return 0;
  CHORUS_LAUNCH(embeddingTokenBackwardKernel, B * T, kThreads, 0, asStream(stream), dwte, dout, tokens, B * T, C, v0,
                vcount);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH(embeddingPositionBackwardKernel, T, kThreads, 0, asStream(stream), dwpe, dout, B, T, C, positions);
  return launched();
}

int layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                     int n, int c, void* stream) {
  if (n == 0) return 0;
  const int rowsPerBlock = kThreads / kWarp;
  CHORUS_LAUNCH(layernormForwardKernel, (n + rowsPerBlock - 1) / rowsPerBlock, kThreads, 0, asStream(stream), out, mean,
                rstd, inp, weight, bias, n, c, rowsByQuads(c, {out, inp, weight, bias}));
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
  CHORUS_LAUNCH(layernormBackwardKernel, blocks, kThreads, 0, asStream(stream), dinp, scratch, dout, inp, weight, mean,
                rstd, n, c, rowsPerBlock, rowsByQuads(c, {dinp, dout, inp, weight}));
  if (const int error = launched()) return error;
  const unsigned columnBlocks = (c + kThreads - 1) / kThreads;
  CHORUS_LAUNCH(foldColumnsKernel, columnBlocks, kThreads, 0, asStream(stream), dweight, scratch, blocks, c);
  if (const int error = launched()) return error;
  CHORUS_LAUNCH(foldColumnsKernel, columnBlocks, kThreads, 0, asStream(stream), dbias,
                scratch + static_cast<size_t>(blocks) * c, blocks, c);
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
  CHORUS_LAUNCH(foldColumnsKernel, columnBlocks, kThreads, 0, asStream(stream), dst, scratch, blocks, c);
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

int crossEntropyForward(float* probs, float* losses, const float* logits, const int* targets, int n, int v,
                        void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyForwardKernel, n, kRowThreads, 0, asStream(stream), probs, losses, logits, targets, v);
  return launched();
}

int crossEntropyShardMax(float* rowMax, const float* logits, int n, int v, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyMaxKernel, n, kRowThreads, 0, asStream(stream), rowMax, logits, v);
  return launched();
}

int crossEntropyShardExp(float* probs, float* sums, float* targetLogits, const float* logits, const float* rowMax,
                         const int* targets, int n, int v, int v0, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyExpKernel, n, kRowThreads, 0, asStream(stream), probs, sums, targetLogits, logits, rowMax,
                targets, v, v0);
  return launched();
}

int crossEntropyShardLoss(float* probs, float* losses, const float* sums, const float* rowMax,
                          const float* targetLogits, int n, int v, void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyLossKernel, n, kRowThreads, 0, asStream(stream), probs, losses, sums, rowMax, targetLogits,
                v);
  return launched();
}

int crossEntropyBackward(float* dlogits, const float* probs, const int* targets, int n, int v, float scale, int v0,
                         void* stream) {
  if (n == 0) return 0;
  CHORUS_LAUNCH(crossEntropyBackwardKernel, n, kRowThreads, 0, asStream(stream), dlogits, probs, targets, v, scale, v0);
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
