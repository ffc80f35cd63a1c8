// nn.cc: the transformer layers on host memory. Loops are written for the compiler to vectorise;
// the attention's products go to BLAS (kernels/cpu/matmul.h).
#include "kernels/cpu/nn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"

// The loops that exponentiate are built for AVX-512, AVX2 and plain x86-64 and chosen at load
// time (GCC / Clang function multiversioning), with an exp the compiler can vectorise.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CHORUS_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CHORUS_VECTOR_CLONES
#endif

namespace chorus::kernels {

namespace {

// e^x in float, written without calls so that loops of it vectorise: x = n ln2 + r with
// |r| <= ln2 / 2 (n rounded by the 1.5 * 2^23 trick, ln2 split in two for exactness), e^r by
// Cephes' degree-7 polynomial, 2^n through the exponent bits. Within 2 ulp of expf on
// [-87, 88]; below that 0 (as e^x underflows there), above it clamped to e^88.
inline float vexp(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// tanh(x) = 1 - 2 / (e^(2x) + 1): exact to a few ulp away from 0, where its absolute error stays
// below 1e-7 (GELU multiplies it by x, so that is all that matters there).
inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

// Sum and maximum of x(n) in 16 independent lanes (so they vectorise without reassociation
// licences), the lanes combined at the end.
constexpr int kLanes = 16;
inline float laneSum(const float* x, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i];
  for (int k = 0; k < kLanes; ++k) sum += acc[k];
  return sum;
}
// laneSum of exp(x - shift), without storing the exponentials: the same sums in the same order.
inline float laneExpSum(const float* x, float shift, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += vexp(x[i + k] - shift);
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += vexp(x[i] - shift);
  for (int k = 0; k < kLanes; ++k) sum += acc[k];
  return sum;
}
inline float laneMax(const float* x, int n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] = std::max(acc[k], x[i + k]);
  }
  float m = x[0];
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (int k = 0; k < kLanes; ++k) m = std::max(m, acc[k]);
  return m;
}

}  // namespace

void embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v0,
                      int vcount, const int* positions) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const int row = tokens[b * T + t] - v0;
      const bool mine = row >= 0 && row < vcount;
      // The token term (or 0), then the position term: one addition per element, as te + pe.
      if (mine) {
        std::memcpy(o, wte + static_cast<size_t>(row) * C, static_cast<size_t>(C) * sizeof(float));
      } else {
        std::fill(o, o + C, 0.0f);
      }
      if (wpe != nullptr) {
        const float* pe = wpe + static_cast<size_t>(positions ? positions[t] : t) * C;
        for (int i = 0; i < C; ++i) o[i] += pe[i];
      }
    }
  }
}

void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                       int vcount, const int* positions) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      const int row = tokens[b * T + t] - v0;
      if (row >= 0 && row < vcount) {
        float* te = dwte + static_cast<size_t>(row) * C;
        for (int i = 0; i < C; ++i) te[i] += d[i];
      }
      float* pe = dwpe + static_cast<size_t>(positions ? positions[t] : t) * C;
      for (int i = 0; i < C; ++i) pe[i] += d[i];
    }
  }
}

CHORUS_VECTOR_CLONES void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                           const float* bias, int n, int c) {
  for (int row = 0; row < n; ++row) {
    const float* x = inp + static_cast<size_t>(row) * c;
    float sum = 0.0f;
    for (int i = 0; i < c; ++i) sum += x[i];
    const float m = sum / c;
    float var = 0.0f;
    for (int i = 0; i < c; ++i) var += (x[i] - m) * (x[i] - m);
    const float r = 1.0f / std::sqrt(var / c + kLayernormEps);
    float* o = out + static_cast<size_t>(row) * c;
    for (int i = 0; i < c; ++i) o[i] = (x[i] - m) * r * weight[i] + bias[i];
    mean[row] = m;
    rstd[row] = r;
  }
}

CHORUS_VECTOR_CLONES void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                            const float* inp, const float* weight, const float* mean, const float* rstd,
                                            int n, int c) {
  // With xhat = (x - mean) * rstd and g = dout * weight:
  //   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
  for (int row = 0; row < n; ++row) {
    const float* x = inp + static_cast<size_t>(row) * c;
    const float* d = dout + static_cast<size_t>(row) * c;
    const float m = mean[row];
    const float r = rstd[row];
    float gMean = 0.0f;
    float gxMean = 0.0f;
    for (int i = 0; i < c; ++i) {
      const float xhat = (x[i] - m) * r;
      const float g = d[i] * weight[i];
      gMean += g;
      gxMean += g * xhat;
    }
    gMean /= c;
    gxMean /= c;
    float* dx = dinp + static_cast<size_t>(row) * c;
    for (int i = 0; i < c; ++i) {
      const float xhat = (x[i] - m) * r;
      const float g = d[i] * weight[i];
      dbias[i] += d[i];
      dweight[i] += xhat * d[i];
      dx[i] += (g - gMean - xhat * gxMean) * r;
    }
  }
}

namespace {

// Each row i of p (T x T) becomes the softmax of its columns j <= i, with zeros above the diagonal.
CHORUS_VECTOR_CLONES void causalSoftmaxRows(float* p, int T) {
  for (int i = 0; i < T; ++i) {
    float* row = p + static_cast<size_t>(i) * T;
    float maxv = row[0];
    for (int j = 1; j <= i; ++j) maxv = std::max(maxv, row[j]);
    float sum = 0.0f;
    for (int j = 0; j <= i; ++j) {
      row[j] = vexp(row[j] - maxv);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= i; ++j) row[j] *= inv;
    for (int j = i + 1; j < T; ++j) row[j] = 0.0f;
  }
}

// The softmax's backward, row by row: ds (holding dP on entry) becomes
// dS[i, j] = P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k]) scale, zero above the diagonal.
void causalSoftmaxBackwardRows(float* ds, const float* p, int T, float scale) {
  for (int i = 0; i < T; ++i) {
    const float* prow = p + static_cast<size_t>(i) * T;
    float* drow = ds + static_cast<size_t>(i) * T;
    float dot = 0.0f;
    for (int j = 0; j <= i; ++j) dot += prow[j] * drow[j];
    for (int j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
    for (int j = i + 1; j < T; ++j) drow[j] = 0.0f;
  }
}

}  // namespace

// Per batch row b and head h, with hs = C / NH and q, k, v the head's (T, hs) slices of qkv (row
// stride 3C):
//   S = q k^T / sqrt(hs)            (T, T), computed whole; the part above the diagonal is unused
//   P = softmax of each row i over columns j <= i, zero for j > i  -> att[b, h]
//   out[b, :, h] = P v              (T, hs) into out's row stride C
void attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int row3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<size_t>(b) * T * row3;
    for (int h = 0; h < NH; ++h) {
      const float* q = base + h * hs;
      const float* k = base + C + h * hs;
      const float* v = base + 2 * C + h * hs;
      float* p = att + (static_cast<size_t>(b) * NH + h) * T * T;
      gemm(false, true, T, T, hs, scale, q, row3, k, row3, 0.0f, p, T);
      causalSoftmaxRows(p, T);
      gemm(false, false, T, hs, T, 1.0f, p, T, v, row3, 0.0f, out + static_cast<size_t>(b) * T * C + h * hs, C);
    }
  }
}

// Backward of the above for each (b, h), with dO the head's slice of dout:
//   dP = dO v^T;  dv += P^T dO;  dS[i, j] = P[i, j] (dP[i, j] - sum_k P[i, k] dP[i, k]) / sqrt(hs)
//   dq += dS k;   dk += dS^T q.
void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B, int T,
                       int C, int NH) {
  const int hs = C / NH;
  const int row3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* ds = scratch;
  for (int b = 0; b < B; ++b) {
    const float* base = qkv + static_cast<size_t>(b) * T * row3;
    float* dbase = dqkv + static_cast<size_t>(b) * T * row3;
    const float* dO = dout + static_cast<size_t>(b) * T * C;
    for (int h = 0; h < NH; ++h) {
      const float* q = base + h * hs;
      const float* k = base + C + h * hs;
      const float* v = base + 2 * C + h * hs;
      const float* p = att + (static_cast<size_t>(b) * NH + h) * T * T;
      gemm(false, true, T, T, hs, 1.0f, dO + h * hs, C, v, row3, 0.0f, ds, T);
      gemm(true, false, T, hs, T, 1.0f, p, T, dO + h * hs, C, 1.0f, dbase + 2 * C + h * hs, row3);
      causalSoftmaxBackwardRows(ds, p, T, scale);
      gemm(false, false, T, hs, T, 1.0f, ds, T, k, row3, 1.0f, dbase + h * hs, row3);
      gemm(true, false, T, hs, T, 1.0f, ds, T, q, row3, 1.0f, dbase + C + h * hs, row3);
    }
  }
}

size_t attention16ScratchFloats(int T, int C) {
  const size_t tt = static_cast<size_t>(T) * T;
  return 2 * tt + (tt + 1) / 2 + (static_cast<size_t>(T) * C + 1) / 2;
}

// As attentionForward, with q, k, v, P and the products in the format: S = q k^T and out = P v
// multiplied by gemm16 (fp32 sums), the softmax in fp32 (scratch), P rounded once as it is kept.
void attentionForward16(Float16 format, float* out, uint16_t* att, const uint16_t* qkv, float* scratch, int B, int T,
                        int C, int NH) {
  const int hs = C / NH;
  const int row3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t tt = static_cast<size_t>(T) * T;
  for (int b = 0; b < B; ++b) {
    const uint16_t* base = qkv + static_cast<size_t>(b) * T * row3;
    for (int h = 0; h < NH; ++h) {
      uint16_t* p = att + (static_cast<size_t>(b) * NH + h) * tt;
      gemm16(format, false, true, T, T, hs, scale, base + h * hs, row3, base + C + h * hs, row3, 0.0f, scratch, T);
      causalSoftmaxRows(scratch, T);
      toFloat16(format, scratch, p, tt);
      gemm16(format, false, false, T, hs, T, 1.0f, p, T, base + 2 * C + h * hs, row3, 0.0f,
             out + static_cast<size_t>(b) * T * C + h * hs, C);
    }
  }
}

// As attentionBackward, the products in the format: dO and dS rounded to it for theirs, the
// softmax's backward in fp32 from P widened.
void attentionBackward16(Float16 format, float* dqkv, float* scratch, const float* dout, const uint16_t* qkv,
                         const uint16_t* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int row3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t tt = static_cast<size_t>(T) * T;
  float* ds = scratch;
  float* p = scratch + tt;
  uint16_t* ds16 = reinterpret_cast<uint16_t*>(scratch + 2 * tt);
  uint16_t* dO16 = reinterpret_cast<uint16_t*>(scratch + 2 * tt + (tt + 1) / 2);
  for (int b = 0; b < B; ++b) {
    const uint16_t* base = qkv + static_cast<size_t>(b) * T * row3;
    float* dbase = dqkv + static_cast<size_t>(b) * T * row3;
    toFloat16(format, dout + static_cast<size_t>(b) * T * C, dO16, static_cast<size_t>(T) * C);
    for (int h = 0; h < NH; ++h) {
      const uint16_t* q = base + h * hs;
      const uint16_t* k = base + C + h * hs;
      const uint16_t* v = base + 2 * C + h * hs;
      const uint16_t* p16 = att + (static_cast<size_t>(b) * NH + h) * tt;
      gemm16(format, false, true, T, T, hs, 1.0f, dO16 + h * hs, C, v, row3, 0.0f, ds, T);
      gemm16(format, true, false, T, hs, T, 1.0f, p16, T, dO16 + h * hs, C, 1.0f, dbase + 2 * C + h * hs, row3);
      fromFloat16(format, p16, p, tt);
      causalSoftmaxBackwardRows(ds, p, T, scale);
      toFloat16(format, ds, ds16, tt);
      gemm16(format, false, false, T, hs, T, 1.0f, ds16, T, k, row3, 1.0f, dbase + h * hs, row3);
      gemm16(format, true, false, T, hs, T, 1.0f, ds16, T, q, row3, 1.0f, dbase + C + h * hs, row3);
    }
  }
}

namespace {

// The online softmax of one block's scores s (Tq x Tk, scaled) for one head: each row's
// exponentials relative to its new running maximum, in place (zero where masked), the running
// maximum and sum updated, and the head's output so far (hs columns of out's rows) rescaled to
// the new maximum.
CHORUS_VECTOR_CLONES void onlineSoftmaxRows(float* s, int Tq, int Tk, bool diagonal, float* maxes, float* sums,
                                            float* out, int outStride, int hs) {
  for (int i = 0; i < Tq; ++i) {
    float* row = s + static_cast<size_t>(i) * Tk;
    const int keys = diagonal ? i + 1 : Tk;
    float blockMax = row[0];
    for (int j = 1; j < keys; ++j) blockMax = std::max(blockMax, row[j]);
    const float newMax = std::max(maxes[i], blockMax);
    // What the earlier blocks' exponentials were relative to, rescaled to the new maximum.
    const float carry = maxes[i] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(maxes[i] - newMax);
    float sum = 0.0f;
    for (int j = 0; j < keys; ++j) {
      row[j] = vexp(row[j] - newMax);
      sum += row[j];
    }
    for (int j = keys; j < Tk; ++j) row[j] = 0.0f;
    maxes[i] = newMax;
    sums[i] = sums[i] * carry + sum;
    float* o = out + static_cast<size_t>(i) * outStride;
    for (int c = 0; c < hs; ++c) o[c] *= carry;
  }
}

// Backward's rows for one head: p (holding the scaled scores) becomes P = exp(s - lse), ds
// (holding dP) becomes dS = P (dP - delta) scale; zero where masked.
CHORUS_VECTOR_CLONES void blockSoftmaxBackwardRows(float* p, float* ds, int Tq, int Tk, bool diagonal, const float* lse,
                                                   const float* delta, float scale) {
  for (int i = 0; i < Tq; ++i) {
    float* prow = p + static_cast<size_t>(i) * Tk;
    float* drow = ds + static_cast<size_t>(i) * Tk;
    const int keys = diagonal ? i + 1 : Tk;
    for (int j = 0; j < keys; ++j) {
      prow[j] = vexp(prow[j] - lse[i]);
      drow[j] = prow[j] * (drow[j] - delta[i]) * scale;
    }
    for (int j = keys; j < Tk; ++j) prow[j] = drow[j] = 0.0f;
  }
}

}  // namespace

void attentionBlockForward(const AttentionBlock& blk, float* out, int outStride, float* rowMax, float* rowSum,
                           int statStride, float* scratch) {
  const int Tq = blk.Tq, Tk = blk.Tk, hs = blk.C / blk.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int h = 0; h < blk.NH; ++h) {
    float* s = scratch;
    gemm(false, true, Tq, Tk, hs, scale, blk.q + h * hs, blk.qStride, blk.k + h * hs, blk.kvStride, 0.0f, s, Tk);
    onlineSoftmaxRows(s, Tq, Tk, blk.diagonal, rowMax + static_cast<size_t>(h) * statStride,
                      rowSum + static_cast<size_t>(h) * statStride, out + h * hs, outStride, hs);
    gemm(false, false, Tq, hs, Tk, 1.0f, s, Tk, blk.v + h * hs, blk.kvStride, 1.0f, out + h * hs, outStride);
  }
}

size_t attentionBlock16ScratchFloats(int Tq, int Tk, int C) {
  const size_t tt = static_cast<size_t>(Tq) * Tk;
  return 3 * tt + (static_cast<size_t>(Tq) * C + 1) / 2;
}

void attentionBlockForward(const AttentionBlock16& blk, float* out, int outStride, float* rowMax, float* rowSum,
                           int statStride, float* scratch) {
  const int Tq = blk.Tq, Tk = blk.Tk, hs = blk.C / blk.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t tt = static_cast<size_t>(Tq) * Tk;
  float* s = scratch;
  uint16_t* p16 = reinterpret_cast<uint16_t*>(scratch + tt);
  for (int h = 0; h < blk.NH; ++h) {
    gemm16(blk.format, false, true, Tq, Tk, hs, scale, blk.q + h * hs, blk.qStride, blk.k + h * hs, blk.kvStride, 0.0f,
           s, Tk);
    onlineSoftmaxRows(s, Tq, Tk, blk.diagonal, rowMax + static_cast<size_t>(h) * statStride,
                      rowSum + static_cast<size_t>(h) * statStride, out + h * hs, outStride, hs);
    toFloat16(blk.format, s, p16, tt);
    gemm16(blk.format, false, false, Tq, hs, Tk, 1.0f, p16, Tk, blk.v + h * hs, blk.kvStride, 1.0f, out + h * hs,
           outStride);
  }
}

void attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                          int statStride, int Tq, int C, int NH) {
  const int hs = C / NH;
  for (int h = 0; h < NH; ++h) {
    const size_t at = static_cast<size_t>(h) * statStride;
    for (int i = 0; i < Tq; ++i) {
      const float inv = 1.0f / rowSum[at + i];
      float* o = out + static_cast<size_t>(i) * outStride + h * hs;
      for (int c = 0; c < hs; ++c) o[c] *= inv;
      lse[at + i] = rowMax[at + i] + std::log(rowSum[at + i]);
    }
  }
}

void attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                         int NH) {
  const int hs = C / NH;
  for (int h = 0; h < NH; ++h) {
    for (int i = 0; i < Tq; ++i) {
      const float* d = dout + static_cast<size_t>(i) * stride + h * hs;
      const float* o = out + static_cast<size_t>(i) * stride + h * hs;
      float dot = 0.0f;
      for (int c = 0; c < hs; ++c) dot += d[c] * o[c];
      delta[static_cast<size_t>(h) * statStride + i] = dot;
    }
  }
}

// Per head, with P = exp(q k^T / sqrt(hs) - lse) (masked as in forward) and dO the head's dout:
//   dv += P^T dO;  dP = dO v^T;  dS = P (dP - delta) / sqrt(hs);  dq += dS k;  dk += dS^T q.
void attentionBlockBackward(const AttentionBlock& blk, const float* dout, int doutStride, const float* lse,
                            const float* delta, int statStride, float* dq, int dqStride, float* dk, float* dv,
                            int dkvStride, float* scratch) {
  const int Tq = blk.Tq, Tk = blk.Tk, hs = blk.C / blk.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* p = scratch;
  float* ds = scratch + static_cast<size_t>(Tq) * Tk;
  for (int h = 0; h < blk.NH; ++h) {
    const float* q = blk.q + h * hs;
    const float* k = blk.k + h * hs;
    const float* v = blk.v + h * hs;
    const float* dO = dout + h * hs;
    gemm(false, true, Tq, Tk, hs, scale, q, blk.qStride, k, blk.kvStride, 0.0f, p, Tk);
    gemm(false, true, Tq, Tk, hs, 1.0f, dO, doutStride, v, blk.kvStride, 0.0f, ds, Tk);
    blockSoftmaxBackwardRows(p, ds, Tq, Tk, blk.diagonal, lse + static_cast<size_t>(h) * statStride,
                             delta + static_cast<size_t>(h) * statStride, scale);
    gemm(true, false, Tk, hs, Tq, 1.0f, p, Tk, dO, doutStride, 1.0f, dv + h * hs, dkvStride);
    gemm(false, false, Tq, hs, Tk, 1.0f, ds, Tk, k, blk.kvStride, 1.0f, dq + h * hs, dqStride);
    gemm(true, false, Tk, hs, Tq, 1.0f, ds, Tk, q, blk.qStride, 1.0f, dk + h * hs, dkvStride);
  }
}

void attentionBlockBackward(const AttentionBlock16& blk, const float* dout, int doutStride, const float* lse,
                            const float* delta, int statStride, float* dq, int dqStride, float* dk, float* dv,
                            int dkvStride, float* scratch) {
  const int Tq = blk.Tq, Tk = blk.Tk, C = blk.C, hs = C / blk.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t tt = static_cast<size_t>(Tq) * Tk;
  float* p = scratch;
  float* ds = scratch + tt;
  uint16_t* p16 = reinterpret_cast<uint16_t*>(scratch + 2 * tt);
  uint16_t* ds16 = p16 + tt;
  uint16_t* dO16 = ds16 + tt;  // (Tq, C), rows C apart
  for (int i = 0; i < Tq; ++i) {
    toFloat16(blk.format, dout + static_cast<size_t>(i) * doutStride, dO16 + static_cast<size_t>(i) * C, C);
  }
  for (int h = 0; h < blk.NH; ++h) {
    const uint16_t* q = blk.q + h * hs;
    const uint16_t* k = blk.k + h * hs;
    const uint16_t* v = blk.v + h * hs;
    const uint16_t* dO = dO16 + h * hs;
    gemm16(blk.format, false, true, Tq, Tk, hs, scale, q, blk.qStride, k, blk.kvStride, 0.0f, p, Tk);
    gemm16(blk.format, false, true, Tq, Tk, hs, 1.0f, dO, C, v, blk.kvStride, 0.0f, ds, Tk);
    blockSoftmaxBackwardRows(p, ds, Tq, Tk, blk.diagonal, lse + static_cast<size_t>(h) * statStride,
                             delta + static_cast<size_t>(h) * statStride, scale);
    toFloat16(blk.format, p, p16, tt);
    toFloat16(blk.format, ds, ds16, tt);
    gemm16(blk.format, true, false, Tk, hs, Tq, 1.0f, p16, Tk, dO, C, 1.0f, dv + h * hs, dkvStride);
    gemm16(blk.format, false, false, Tq, hs, Tk, 1.0f, ds16, Tk, k, blk.kvStride, 1.0f, dq + h * hs, dqStride);
    gemm16(blk.format, true, false, Tk, hs, Tq, 1.0f, ds16, Tk, q, blk.qStride, 1.0f, dk + h * hs, dkvStride);
  }
}

namespace {
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;
}  // namespace

CHORUS_VECTOR_CLONES void geluForward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + vtanh(kGeluBeta * (x + kGeluKappa * x * x * x)));
  }
}

CHORUS_VECTOR_CLONES void geluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float th = vtanh(kGeluBeta * (x + kGeluKappa * x * x * x));
    const float dinner = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dinner);
  }
}

void residualForward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residualBackward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

CHORUS_VECTOR_CLONES void crossEntropyShardMax(float* rowMax, const float* logits, int n, int v) {
  for (int row = 0; row < n; ++row) rowMax[row] = laneMax(logits + static_cast<size_t>(row) * v, v);
}

CHORUS_VECTOR_CLONES void crossEntropyShardExp(float* sums, float* targetLogits, const float* logits,
                                               const float* rowMax, const int* targets, int n, int v, int v0) {
  for (int row = 0; row < n; ++row) {
    const float* x = logits + static_cast<size_t>(row) * v;
    sums[row] = laneExpSum(x, rowMax[row], v);
    const int column = targets[row] - v0;
    targetLogits[row] = column >= 0 && column < v ? x[column] : 0.0f;
  }
}

float crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits, int n) {
  double total = 0.0;
  for (int row = 0; row < n; ++row) {
    // -log softmax[target] = log(sum) + max - logit[target]: exact where the probability underflows.
    losses[row] = std::log(sums[row]) + rowMax[row] - targetLogits[row];
    total += losses[row];
  }
  return n > 0 ? static_cast<float>(total / n) : 0.0f;
}

float crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                          int v) {
  std::vector<float> targetLogits(n);
  crossEntropyShardMax(rowMax, logits, n, v);
  crossEntropyShardExp(sums, targetLogits.data(), logits, rowMax, targets, n, v, 0);
  return crossEntropyShardLoss(losses, sums, rowMax, targetLogits.data(), n);
}

CHORUS_VECTOR_CLONES void crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax,
                                               const float* sums, const int* targets, int n, int v, float scale,
                                               int v0) {
  for (int row = 0; row < n; ++row) {
    const float* x = logits + static_cast<size_t>(row) * v;
    float* d = dlogits + static_cast<size_t>(row) * v;
    const float maxv = rowMax[row], inv = 1.0f / sums[row];
    for (int j = 0; j < v; ++j) d[j] = vexp(x[j] - maxv) * inv * scale;
    const int column = targets[row] - v0;
    if (column >= 0 && column < v) d[column] -= scale;
  }
}

CHORUS_VECTOR_CLONES void adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step,
                                    const OptimizerSettings& s) {
  // The scalars in double, as PyTorch computes them in Python, then used in float.
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(step));
  const float stepSize = static_cast<float>(s.lr / bc1);
  const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weightDecay);
  const float b1 = s.beta1;
  const float b2 = s.beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    param[i] *= decay;
    m[i] = m[i] * b1 + g * (1.0f - b1);
    v[i] = v[i] * b2 + g * g * (1.0f - b2);
    const float denom = std::sqrt(v[i]) / bc2Sqrt + s.eps;
    param[i] -= stepSize * (m[i] / denom);
  }
}

CHORUS_VECTOR_CLONES void sgdStep(float* param, const float* grad, float* m, size_t n, long step,
                                  const OptimizerSettings& s) {
  const float momentum = s.momentum;
  const float decay = s.weightDecay;
  const float lr = s.lr;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] + decay * param[i];
    m[i] = step <= 1 ? g : m[i] * momentum + g;
    param[i] -= lr * (s.nesterov ? g + momentum * m[i] : m[i]);
  }
}

double sumOfSquares(const float* x, size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

void scale(float* x, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

}  // namespace chorus::kernels
