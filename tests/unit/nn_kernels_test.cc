// nn_kernels_test.cc: the transformer layers of kernels/cpu/nn.h and the linear layer of
// kernels/cpu/matmul.h. Each forward is checked against a plain double-precision loop written
// here from the definition, and each backward against central differences of that double loop
// (the gradient of L = sum(w * out) for random w), so neither side borrows from the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/nn.h"
#include "tests/support/gradient_check.h"

namespace chorus::kernels {
namespace {

using Vec = std::vector<double>;
using chorus::testing::randomFloats;

Vec asDoubles(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// ||a - b|| / ||b||, the relative error of a whole tensor.
double relativeError(const std::vector<float>& a, const Vec& b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// d/dx of sum(w * f(x)) by central differences in double.
Vec numericGradient(const Vec& x, const Vec& w, const std::function<Vec(const Vec&)>& f) {
  return chorus::testing::numericGradient(x, [&](const Vec& v) {
    const Vec y = f(v);
    double s = 0.0;
    for (size_t k = 0; k < w.size(); ++k) s += w[k] * y[k];
    return s;
  });
}

// ---- double-precision definitions ----

Vec linearRef(const Vec& x, const Vec& w, const Vec& b, int n, int c, int oc) {
  Vec out(static_cast<size_t>(n) * oc);
  for (int r = 0; r < n; ++r) {
    for (int o = 0; o < oc; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < c; ++i) s += x[r * c + i] * w[o * c + i];
      out[r * oc + o] = s;
    }
  }
  return out;
}

Vec layernormRef(const Vec& x, const Vec& w, const Vec& b, int n, int c) {
  Vec out(x.size());
  for (int r = 0; r < n; ++r) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < c; ++i) mean += x[r * c + i];
    mean /= c;
    for (int i = 0; i < c; ++i) var += (x[r * c + i] - mean) * (x[r * c + i] - mean);
    var /= c;
    for (int i = 0; i < c; ++i) out[r * c + i] = (x[r * c + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
  }
  return out;
}

// For each (b, t, head): softmax over s <= t of q_t . k_s / sqrt(hs), then the weighted sum of v_s.
Vec attentionRef(const Vec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  Vec out(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        auto at = [&](int pos, int part, int i) { return qkv[((b * T + pos) * 3 + part) * C + h * hs + i]; };
        Vec score(t + 1);
        double maxv = -1e300;
        for (int s = 0; s <= t; ++s) {
          double dot = 0.0;
          for (int i = 0; i < hs; ++i) dot += at(t, 0, i) * at(s, 1, i);
          score[s] = dot / std::sqrt(static_cast<double>(hs));
          maxv = std::max(maxv, score[s]);
        }
        double sum = 0.0;
        for (auto& s : score) sum += (s = std::exp(s - maxv));
        for (int s = 0; s <= t; ++s) {
          for (int i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += score[s] / sum * at(s, 2, i);
        }
      }
    }
  }
  return out;
}

double geluRef(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// Per row: log(sum exp(x)) - x[target].
Vec crossEntropyRef(const Vec& logits, const std::vector<int>& targets, int n, int v) {
  Vec losses(n);
  for (int r = 0; r < n; ++r) {
    double maxv = -1e300;
    for (int j = 0; j < v; ++j) maxv = std::max(maxv, logits[r * v + j]);
    double sum = 0.0;
    for (int j = 0; j < v; ++j) sum += std::exp(logits[r * v + j] - maxv);
    losses[r] = std::log(sum) + maxv - logits[r * v + targets[r]];
  }
  return losses;
}

// ---- tests ----

TEST(NnKernelsTest, LinearForwardAndBackward) {
  const int n = 5, c = 7, oc = 6;
  const auto x = randomFloats(n * c, 1), w = randomFloats(oc * c, 2), b = randomFloats(oc, 3);
  std::vector<float> out(n * oc);
  matmulForward(out.data(), x.data(), w.data(), b.data(), n, c, oc);
  EXPECT_LT(relativeError(out, linearRef(asDoubles(x), asDoubles(w), asDoubles(b), n, c, oc)), 1e-6);
  std::vector<float> noBias(n * oc);
  matmulForward(noBias.data(), x.data(), w.data(), nullptr, n, c, oc);
  EXPECT_LT(relativeError(noBias, linearRef(asDoubles(x), asDoubles(w), {}, n, c, oc)), 1e-6);

  const auto dout = randomFloats(n * oc, 4);
  const Vec wd = asDoubles(dout);
  // Gradients accumulate: start from a known value and subtract it afterwards.
  std::vector<float> dx(n * c, 1.0f), dw(oc * c, 1.0f), db(oc, 1.0f);
  matmulBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), n, c, oc);
  for (auto* g : {&dx, &dw, &db}) {
    for (auto& v : *g) v -= 1.0f;
  }
  const Vec X = asDoubles(x), W = asDoubles(w), Bv = asDoubles(b);
  EXPECT_LT(relativeError(dx, numericGradient(X, wd, [&](const Vec& v) { return linearRef(v, W, Bv, n, c, oc); })),
            1e-5);
  EXPECT_LT(relativeError(dw, numericGradient(W, wd, [&](const Vec& v) { return linearRef(X, v, Bv, n, c, oc); })),
            1e-5);
  EXPECT_LT(relativeError(db, numericGradient(Bv, wd, [&](const Vec& v) { return linearRef(X, W, v, n, c, oc); })),
            1e-5);
}

// ---- 16-bit products ----

// x rounded to the format, as 16-bit bits and as the doubles they hold.
struct Rounded {
  std::vector<uint16_t> bits;
  Vec values;
};
Rounded roundTo(Float16 format, const std::vector<float>& x) {
  Rounded r{std::vector<uint16_t>(x.size()), Vec(x.size())};
  toFloat16(format, x.data(), r.bits.data(), x.size());
  std::vector<float> back(x.size());
  fromFloat16(format, r.bits.data(), back.data(), x.size());
  r.values = asDoubles(back);
  return r;
}

// Every backend this build and CPU have for the format (the widened one always).
std::vector<Gemm16Backend> backendsFor(Float16 format) {
  std::vector<Gemm16Backend> backends{Gemm16Backend::kWidened};
  if (gemm16Supported(format, Gemm16Backend::kOneDnn)) backends.push_back(Gemm16Backend::kOneDnn);
  return backends;
}

// Flushing subnormals: a product below the smallest normal float comes out 0, and a subnormal
// operand counts as 0; switched off, both are IEEE's (a subnormal result, a non-zero product). In
// this thread and in one it starts afterwards; GEMM (on this thread) sees the same.
TEST(NnKernelsTest, FlushDenormalsZeroesSubnormalResultsAndOperands) {
  const float subnormalValue = std::ldexp(1.0f, -130), twice = std::ldexp(1.0f, -129);  // exact subnormals
  volatile float tiny = 1e-30f, small = 1e-10f, subnormal = subnormalValue, two = 2.0f;
  auto results = [&] { return std::pair<float, float>(tiny * small, subnormal * two); };
  setFlushDenormals(false);
  const auto ieee = results();
  EXPECT_GT(ieee.first, 0.0f);
  EXPECT_EQ(ieee.second, twice);
  setFlushDenormals(true);
  EXPECT_EQ(results(), std::make_pair(0.0f, 0.0f));
  std::pair<float, float> inThread;
  std::thread([&] { inThread = results(); }).join();
  EXPECT_EQ(inThread, std::make_pair(0.0f, 0.0f));
  const float a[4] = {subnormal, 0, 0, 0}, b[4] = {two, 0, 0, 0};
  float c[4] = {};
  matmulForward(c, a, b, nullptr, 2, 2, 2);  // c = a b^T: c[0] = 2^-130 x 2
  EXPECT_EQ(c[0], 0.0f);
  setFlushDenormals(false);
  matmulForward(c, a, b, nullptr, 2, 2, 2);
  EXPECT_EQ(c[0], twice);
}

// OpenBLAS's fallback for a CPU it does not know is replaced by the kernels the CPU's instructions
// allow; a choice that already uses AVX2, or a CPU without it, is left alone.
TEST(NnKernelsTest, APreAvx2BlasFallbackIsReplacedByWhatTheCpuCanRun) {
  EXPECT_EQ(betterBlasCoreFor("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(betterBlasCoreFor("Prescott", true, false), "Haswell");
  EXPECT_EQ(betterBlasCoreFor("Nehalem", true, true), "SkylakeX");
  EXPECT_EQ(betterBlasCoreFor("Sandybridge", true, false), "Haswell");
  EXPECT_EQ(betterBlasCoreFor("Prescott", false, false), "");
  for (const char* modern : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "skylakex"}) {
    EXPECT_EQ(betterBlasCoreFor(modern, true, true), "") << modern;
  }
  // And this process: whatever OpenBLAS runs, a better choice is one of the two, or none.
  const std::string here = betterBlasCore();
  EXPECT_TRUE(here.empty() || here == "SkylakeX" || here == "Haswell") << here;
}

TEST(NnKernelsTest, SixteenBitGemmEqualsTheProductOfTheRoundedOperandsInEveryLayout) {
  // C = alpha op(A) op(B) + beta C with A and B rounded to the format: checked against double sums
  // of the rounded values, in all four transpositions with padded leading dimensions. The error
  // bound is fp32 accumulation's; the rounding itself (2^-8 for bf16) would be far above it.
  const int m = 9, n = 11, k = 37;
  for (Float16 format : {Float16::kBf16, Float16::kFp16}) {
    SCOPED_TRACE(gemm16Description(format));
    for (Gemm16Backend backend : backendsFor(format)) {
      SCOPED_TRACE(gemm16BackendName(backend));
      for (int t = 0; t < 4; ++t) {
        const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
        const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
        const auto a = roundTo(format, randomFloats(static_cast<size_t>(ta ? k : m) * lda, 11 + t));
        const auto b = roundTo(format, randomFloats(static_cast<size_t>(tb ? n : k) * ldb, 21 + t));
        const auto c0 = randomFloats(static_cast<size_t>(m) * ldc, 31 + t);
        const float alpha = 0.75f, beta = t % 2 == 0 ? 1.0f : 0.0f;
        std::vector<float> c = c0;
        gemm16With(backend, format, ta, tb, m, n, k, alpha, a.bits.data(), lda, b.bits.data(), ldb, beta, c.data(),
                   ldc);
        double worst = 0.0;
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            double sum = 0.0, scale = 0.0;
            for (int l = 0; l < k; ++l) {
              const double x = ta ? a.values[l * lda + i] : a.values[i * lda + l];
              const double y = tb ? b.values[j * ldb + l] : b.values[l * ldb + j];
              sum += x * y;
              scale += std::abs(x * y);
            }
            const double want = alpha * sum + beta * c0[i * ldc + j];
            worst = std::max(worst, std::abs(c[i * ldc + j] - want) / (scale + std::abs(c0[i * ldc + j])));
          }
          // The padding past each row's n columns is not touched.
          for (int j = n; j < ldc; ++j) EXPECT_EQ(c[i * ldc + j], c0[i * ldc + j]);
        }
        EXPECT_LT(worst, 4e-6) << "transA " << ta << " transB " << tb;
      }
    }
  }
}

TEST(NnKernelsTest, SixteenBitLinearForwardAndBackward) {
  // The 16-bit linear layer against the double linear layer of the rounded input and weight:
  // forward exactly so; backward's products take dout rounded too, so they are compared with the
  // double gradients within the format's rounding (and dbias, summed from fp32 dout, tightly).
  const int n = 6, c = 40, oc = 24;
  for (Float16 format : {Float16::kBf16, Float16::kFp16}) {
    SCOPED_TRACE(float16Name(format));
    const auto x = roundTo(format, randomFloats(n * c, 41)), w = roundTo(format, randomFloats(oc * c, 42));
    const auto b = randomFloats(oc, 43);
    std::vector<float> out(n * oc);
    matmulForward16(format, out.data(), x.bits.data(), w.bits.data(), b.data(), n, c, oc);
    EXPECT_LT(relativeError(out, linearRef(x.values, w.values, asDoubles(b), n, c, oc)), 1e-6);

    const auto dout = randomFloats(n * oc, 44);
    std::vector<float> dx(n * c, 1.0f), dw(oc * c, 1.0f), db(oc, 1.0f);
    matmulBackward16(format, dx.data(), dw.data(), db.data(), dout.data(), x.bits.data(), w.bits.data(), n, c, oc);
    for (auto* g : {&dx, &dw, &db}) {
      for (auto& v : *g) v -= 1.0f;
    }
    const Vec wd = asDoubles(dout);
    const double rounding = format == Float16::kBf16 ? 1e-2 : 2e-3;
    EXPECT_LT(relativeError(dx, numericGradient(x.values, wd,
                                                [&](const Vec& v) { return linearRef(v, w.values, {}, n, c, oc); })),
              rounding);
    EXPECT_LT(relativeError(dw, numericGradient(w.values, wd,
                                                [&](const Vec& v) { return linearRef(x.values, v, {}, n, c, oc); })),
              rounding);
    // From fp32 operands (cast on the way in): the very same results as from their 16-bit copies.
    const auto xf = randomFloats(n * c, 41), wf = randomFloats(oc * c, 42);
    std::vector<float> outAs(n * oc), dxAs(n * c, 1.0f), dwAs(oc * c, 1.0f), dbAs(oc, 1.0f);
    matmulForwardAs(format, outAs.data(), xf.data(), wf.data(), b.data(), n, c, oc);
    EXPECT_EQ(outAs, out);
    matmulBackwardAs(format, dxAs.data(), dwAs.data(), dbAs.data(), dout.data(), xf.data(), wf.data(), n, c, oc);
    for (auto* g : {&dxAs, &dwAs, &dbAs}) {
      for (auto& v : *g) v -= 1.0f;
    }
    EXPECT_EQ(dxAs, dx);
    EXPECT_EQ(dwAs, dw);
    Vec dbWant(oc, 0.0);
    for (int r = 0; r < n; ++r) {
      for (int o = 0; o < oc; ++o) dbWant[o] += dout[r * oc + o];
    }
    EXPECT_LT(relativeError(db, dbWant), 1e-6);
  }
}

TEST(NnKernelsTest, EmbeddingForwardAndBackward) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int> tokens = {4, 0, 4, 1, 2, 4};  // token 4 three times: its gradient sums three rows
  const auto wte = randomFloats(V * C, 5), wpe = randomFloats(T * C, 6);
  std::vector<float> out(B * T * C);
  embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < C; ++i) {
        EXPECT_EQ(out[(b * T + t) * C + i], wte[tokens[b * T + t] * C + i] + wpe[t * C + i]);
      }
    }
  }
  const auto dout = randomFloats(B * T * C, 7);
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  const Vec WTE = asDoubles(wte), WPE = asDoubles(wpe);
  auto fwd = [&](const Vec& te, const Vec& pe) {
    Vec o(B * T * C);
    for (int r = 0; r < B * T; ++r) {
      for (int i = 0; i < C; ++i) o[r * C + i] = te[tokens[r] * C + i] + pe[(r % T) * C + i];
    }
    return o;
  };
  EXPECT_LT(relativeError(dwte, numericGradient(WTE, asDoubles(dout), [&](const Vec& v) { return fwd(v, WPE); })),
            1e-6);
  EXPECT_LT(relativeError(dwpe, numericGradient(WPE, asDoubles(dout), [&](const Vec& v) { return fwd(WTE, v); })),
            1e-6);
  for (int i = 0; i < C; ++i) EXPECT_EQ(dwte[3 * C + i], 0.0f) << "token 3 does not occur";

  // Positions given (context parallelism's columns of a longer sequence): column t uses row
  // positions[t] of wpe, and its gradient goes there.
  const std::vector<int> positions = {4, 0, 2};
  const auto wpeLong = randomFloats(5 * C, 8);
  embeddingForward(out.data(), tokens.data(), wte.data(), wpeLong.data(), B, T, C, 0, V, positions.data());
  std::vector<float> dwpeLong(5 * C, 0.0f);
  std::fill(dwte.begin(), dwte.end(), 0.0f);
  embeddingBackward(dwte.data(), dwpeLong.data(), dout.data(), tokens.data(), B, T, C, 0, V, positions.data());
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < C; ++i) {
      EXPECT_EQ(out[(1 * T + t) * C + i], wte[tokens[T + t] * C + i] + wpeLong[positions[t] * C + i]);
      EXPECT_FLOAT_EQ(dwpeLong[positions[t] * C + i], dout[t * C + i] + dout[(T + t) * C + i]);
    }
  }
  for (int i = 0; i < C; ++i) EXPECT_EQ(dwpeLong[1 * C + i], 0.0f) << "position 1 is not held";
}

TEST(NnKernelsTest, LayernormForwardAndBackward) {
  const int n = 4, c = 16;
  auto x = randomFloats(n * c, 8, 2.0f);
  for (int i = 0; i < c; ++i) x[i] += 10.0f;  // a row far from zero mean
  const auto w = randomFloats(c, 9), b = randomFloats(c, 10);
  std::vector<float> out(n * c), mean(n), rstd(n);
  layernormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  const Vec X = asDoubles(x), W = asDoubles(w), Bv = asDoubles(b);
  EXPECT_LT(relativeError(out, layernormRef(X, W, Bv, n, c)), 1e-6);

  const auto dout = randomFloats(n * c, 11);
  std::vector<float> dx(n * c, 0.0f), dw(c, 0.0f), db(c, 0.0f);
  layernormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), n, c);
  const Vec wd = asDoubles(dout);
  EXPECT_LT(relativeError(dx, numericGradient(X, wd, [&](const Vec& v) { return layernormRef(v, W, Bv, n, c); })),
            1e-4);
  EXPECT_LT(relativeError(dw, numericGradient(W, wd, [&](const Vec& v) { return layernormRef(X, v, Bv, n, c); })),
            1e-5);
  EXPECT_LT(relativeError(db, numericGradient(Bv, wd, [&](const Vec& v) { return layernormRef(X, W, v, n, c); })),
            1e-5);
}

TEST(NnKernelsTest, CausalAttentionForwardAndBackward) {
  for (const auto& [B, T, C, NH] : std::vector<std::array<int, 4>>{{2, 5, 8, 2}, {1, 7, 12, 3}, {1, 1, 4, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
    const auto qkv = randomFloats(static_cast<size_t>(B) * T * 3 * C, 12 + T);
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    attentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    const Vec QKV = asDoubles(qkv);
    EXPECT_LT(relativeError(out, attentionRef(QKV, B, T, C, NH)), 1e-6);
    for (int r = 0; r < B * NH * T; ++r) {  // each row of probabilities sums to 1, nothing above the diagonal
      const int i = r % T;
      double sum = 0.0;
      for (int j = 0; j < T; ++j) {
        if (j > i) {
          EXPECT_EQ(att[r * T + j], 0.0f);
        }
        sum += att[r * T + j];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
    const auto dout = randomFloats(B * T * C, 13);
    std::vector<float> dqkv(qkv.size(), 0.0f), scratch(T * T);
    attentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    const Vec expect =
        numericGradient(QKV, asDoubles(dout), [&](const Vec& v) { return attentionRef(v, B, T, C, NH); });
    EXPECT_LT(relativeError(dqkv, expect), 1e-5);
  }
}

// 16-bit attention against the exact (double) attention of the rounded q, k, v: the one rounding of
// P (kept in the format) bounds the forward error at the format's unit roundoff u relative to the
// output, so the test allows 2u; backward rounds dO and dS too and sums T of them: 8u. A formula
// slip (a missing scale, P unrounded where backward expects it rounded, a transposed product)
// errs by O(1).
TEST(NnKernelsTest, SixteenBitAttentionFollowsTheExactAttentionOfTheRoundedInputs) {
  for (Float16 format : {Float16::kBf16, Float16::kFp16}) {
    const double u = format == Float16::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (const auto& [B, T, C, NH] : std::vector<std::array<int, 4>>{{2, 5, 8, 2}, {1, 7, 12, 3}, {2, 16, 32, 2}}) {
      SCOPED_TRACE(::testing::Message() << float16Name(format) << " B=" << B << " T=" << T << " C=" << C
                                        << " NH=" << NH);
      const auto qkv = roundTo(format, randomFloats(static_cast<size_t>(B) * T * 3 * C, 52 + T, 2.0f));
      std::vector<float> out(B * T * C), scratch(attention16ScratchFloats(T, C));
      std::vector<uint16_t> att(static_cast<size_t>(B) * NH * T * T);
      attentionForward16(format, out.data(), att.data(), qkv.bits.data(), scratch.data(), B, T, C, NH);
      const double forward = relativeError(out, attentionRef(qkv.values, B, T, C, NH));
      EXPECT_LT(forward, 2 * u);
      std::vector<float> p(att.size());
      fromFloat16(format, att.data(), p.data(), att.size());
      for (int r = 0; r < B * NH * T; ++r) {  // nothing above the diagonal; rows sum to 1 within the rounding
        double sum = 0.0;
        for (int j = 0; j < T; ++j) {
          if (j > r % T) {
            EXPECT_EQ(p[r * T + j], 0.0f);
          }
          sum += p[r * T + j];
        }
        EXPECT_NEAR(sum, 1.0, u);
      }
      const auto dout = randomFloats(B * T * C, 53);
      std::vector<float> dqkv(qkv.bits.size(), 0.0f);
      attentionBackward16(format, dqkv.data(), scratch.data(), dout.data(), qkv.bits.data(), att.data(), B, T, C, NH);
      const Vec expect =
          numericGradient(qkv.values, asDoubles(dout), [&](const Vec& v) { return attentionRef(v, B, T, C, NH); });
      const double backward = relativeError(dqkv, expect);
      EXPECT_LT(backward, 8 * u);
      std::printf("%s B=%d T=%d C=%d NH=%d: forward %.2e, backward %.2e relative (u = %.2e)\n", float16Name(format), B,
                  T, C, NH, forward, backward, u);
    }
  }
}

// Ring attention's pieces over one sequence of T positions cut into blocks of `block`: each query
// block attends the key blocks at or before it one at a time, in an order that is not the
// positions' (the latest first, its own last), as blocks arrive around a ring. qkv (T, 3C) holds
// q, k, v in Element (float, or uint16_t in `format`). Returns the output; dqkv (T, 3C) gets the
// gradient from dout.
template <typename Element>
std::vector<float> blockwiseAttention(const Element* qkv, int T, int C, int NH, int block, Float16 format,
                                      size_t scratchFloats, const std::vector<float>& dout, std::vector<float>& dqkv) {
  const int blocks = T / block, row3 = 3 * C;
  auto part = [&](auto* base, int blockIndex, int column) {
    return base + static_cast<size_t>(blockIndex) * block * row3 + column;
  };
  auto blockOf = [&](int i, int j) {  // queries of block i, keys and values of block j
    return AttentionBlockOf<Element>{.q = part(qkv, i, 0),
                                     .qStride = row3,
                                     .k = part(qkv, j, C),
                                     .v = part(qkv, j, 2 * C),
                                     .kvStride = row3,
                                     .Tq = block,
                                     .Tk = block,
                                     .C = C,
                                     .NH = NH,
                                     .diagonal = i == j,
                                     .format = format};
  };
  auto keyOrder = [&](int i) {
    std::vector<int> order;
    for (int j = i - 1; j >= 0; --j) order.push_back(j);
    order.push_back(i);
    return order;
  };
  std::vector<float> out(T * C, 0.0f), rowMax(NH * T, -std::numeric_limits<float>::infinity()), rowSum(NH * T, 0.0f);
  std::vector<float> lse(NH * T), scratch(scratchFloats);
  for (int i = 0; i < blocks; ++i) {
    for (int j : keyOrder(i)) {
      attentionBlockForward(blockOf(i, j), out.data() + i * block * C, C, rowMax.data() + i * block,
                            rowSum.data() + i * block, T, scratch.data());
    }
    attentionBlockFinish(out.data() + i * block * C, C, lse.data() + i * block, rowMax.data() + i * block,
                         rowSum.data() + i * block, T, block, C, NH);
  }
  std::vector<float> delta(NH * T);
  attentionBlockDelta(delta.data(), T, dout.data(), out.data(), C, T, C, NH);
  for (int i = 0; i < blocks; ++i) {
    for (int j : keyOrder(i)) {
      attentionBlockBackward(blockOf(i, j), dout.data() + i * block * C, C, lse.data() + i * block,
                             delta.data() + i * block, T, part(dqkv.data(), i, 0), row3, part(dqkv.data(), j, C),
                             part(dqkv.data(), j, 2 * C), row3, scratch.data());
    }
  }
  return out;
}

// The output and the gradient of q, k and v equal the whole causal attention's.
TEST(NnKernelsTest, BlockwiseAttentionInAnyOrderEqualsTheWhole) {
  const int T = 12, C = 8, NH = 2, block = 3;
  const auto qkv = randomFloats(static_cast<size_t>(T) * 3 * C, 31);
  const auto dout = randomFloats(T * C, 32);
  std::vector<float> dqkv(qkv.size(), 0.0f);
  const auto out = blockwiseAttention(qkv.data(), T, C, NH, block, Float16::kBf16, 2 * block * block, dout, dqkv);
  const Vec QKV = asDoubles(qkv);
  EXPECT_LT(relativeError(out, attentionRef(QKV, 1, T, C, NH)), 1e-6);
  const Vec expect = numericGradient(QKV, asDoubles(dout), [&](const Vec& v) { return attentionRef(v, 1, T, C, NH); });
  EXPECT_LT(relativeError(dqkv, expect), 1e-5);
}

// The 16-bit blocks, in the same order, against the exact attention of the rounded q, k, v: each
// block's unnormalised P is rounded once for P v (forward 2u, as the whole 16-bit attention's);
// backward rounds P, dS and dO (8u). u: the format's unit roundoff.
TEST(NnKernelsTest, SixteenBitBlockwiseAttentionFollowsTheExactAttentionOfTheRoundedInputs) {
  const int T = 16, C = 16, NH = 2, block = 4;
  for (Float16 format : {Float16::kBf16, Float16::kFp16}) {
    SCOPED_TRACE(float16Name(format));
    const double u = format == Float16::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const auto qkv = roundTo(format, randomFloats(static_cast<size_t>(T) * 3 * C, 61, 2.0f));
    const auto dout = randomFloats(T * C, 62);
    std::vector<float> dqkv(qkv.bits.size(), 0.0f);
    const auto out = blockwiseAttention(qkv.bits.data(), T, C, NH, block, format,
                                        attentionBlock16ScratchFloats(block, block, C), dout, dqkv);
    const double forward = relativeError(out, attentionRef(qkv.values, 1, T, C, NH));
    EXPECT_LT(forward, 2 * u);
    const Vec expect =
        numericGradient(qkv.values, asDoubles(dout), [&](const Vec& v) { return attentionRef(v, 1, T, C, NH); });
    const double backward = relativeError(dqkv, expect);
    EXPECT_LT(backward, 8 * u);
    std::printf("%s blockwise: forward %.2e, backward %.2e relative (u = %.2e)\n", float16Name(format), forward,
                backward, u);
  }
}

TEST(NnKernelsTest, GeluForwardAndBackward) {
  auto x = randomFloats(64, 14, 3.0f);
  x[0] = 0.0f;
  std::vector<float> out(x.size()), dx(x.size(), 0.0f);
  geluForward(out.data(), x.data(), x.size());
  Vec expect(x.size()), slope(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    expect[i] = geluRef(x[i]);
    slope[i] = (geluRef(x[i] + 1e-6) - geluRef(x[i] - 1e-6)) / 2e-6;
  }
  EXPECT_LT(relativeError(out, expect), 1e-6);
  EXPECT_EQ(out[0], 0.0f);
  const std::vector<float> ones(x.size(), 1.0f);
  geluBackward(dx.data(), x.data(), ones.data(), x.size());
  EXPECT_LT(relativeError(dx, slope), 1e-5);
  EXPECT_FLOAT_EQ(dx[0], 0.5f);  // GELU'(0) = 1/2
}

TEST(NnKernelsTest, ResidualForwardAndBackward) {
  const std::vector<float> a = {1, 2, 3}, b = {10, 20, 30}, dout = {0.5f, -1, 2};
  std::vector<float> out(3), da(3, 1.0f), db(3, 0.0f);
  residualForward(out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));
  residualBackward(da.data(), db.data(), dout.data(), 3);
  EXPECT_EQ(da, (std::vector<float>{1.5f, 0, 3}));
  EXPECT_EQ(db, dout);
}

TEST(NnKernelsTest, CrossEntropyForwardAndBackward) {
  const int n = 3, v = 11;
  auto logits = randomFloats(n * v, 15, 3.0f);
  logits[2 * v + 4] = 80.0f;  // one row where every other probability underflows
  const std::vector<int> targets = {3, 10, 0};
  std::vector<float> rowMax(n), sums(n), losses(n);
  const float mean =
      crossEntropyForward(rowMax.data(), sums.data(), losses.data(), logits.data(), targets.data(), n, v);
  const Vec L = asDoubles(logits);
  const Vec expect = crossEntropyRef(L, targets, n, v);
  EXPECT_LT(relativeError(losses, expect), 1e-6);
  EXPECT_NEAR(mean, (expect[0] + expect[1] + expect[2]) / 3, 1e-5);
  EXPECT_GT(losses[2], 70.0f) << "the loss of an underflowed target stays finite and large";
  for (int row = 0; row < n; ++row) {  // the statistics backward recomputes the probabilities from
    double most = L[row * v], sum = 0.0;
    for (int j = 0; j < v; ++j) most = std::max(most, L[row * v + j]);
    for (int j = 0; j < v; ++j) sum += std::exp(L[row * v + j] - most);
    EXPECT_EQ(rowMax[row], static_cast<float>(most)) << row;
    EXPECT_NEAR(sums[row], sum, 1e-6 * sum) << row;
  }

  std::vector<float> dlogits = logits;  // in place, as the model does
  crossEntropyBackward(dlogits.data(), dlogits.data(), rowMax.data(), sums.data(), targets.data(), n, v, 1.0f / n);
  const Vec w(n, 1.0 / n);
  EXPECT_LT(
      relativeError(dlogits, numericGradient(L, w, [&](const Vec& x) { return crossEntropyRef(x, targets, n, v); })),
      1e-5);
}

TEST(NnKernelsTest, VocabParallelEmbeddingShardsSumToTheWhole) {
  // Rows [0, 2) and [2, 5) of the table: each shard looks up its own tokens (zeros elsewhere, no
  // position term); the sum plus wpe is the whole lookup, and each shard's row gradients are the
  // whole's rows.
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int> tokens = {4, 0, 4, 1, 2, 4};
  const auto wte = randomFloats(V * C, 5), wpe = randomFloats(T * C, 6);
  std::vector<float> whole(B * T * C), sum(B * T * C, 0.0f);
  embeddingForward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  const auto dout = randomFloats(B * T * C, 7);
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  const int begins[2] = {0, 2}, counts[2] = {2, 3};
  for (int s = 0; s < 2; ++s) {
    std::vector<float> part(B * T * C);
    embeddingForward(part.data(), tokens.data(), wte.data() + begins[s] * C, nullptr, B, T, C, begins[s], counts[s]);
    for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
    std::vector<float> dpart(counts[s] * C, 0.0f), dpe(T * C, 0.0f);
    embeddingBackward(dpart.data(), dpe.data(), dout.data(), tokens.data(), B, T, C, begins[s], counts[s]);
    for (int i = 0; i < counts[s] * C; ++i) EXPECT_EQ(dpart[i], dwte[begins[s] * C + i]) << "shard " << s;
    EXPECT_EQ(dpe, dwpe);
  }
  for (int r = 0; r < B * T; ++r) {
    for (int i = 0; i < C; ++i) EXPECT_EQ(sum[r * C + i] + wpe[(r % T) * C + i], whole[r * C + i]);
  }
}

TEST(NnKernelsTest, VocabParallelCrossEntropyFromColumnShardsEqualsTheWhole) {
  // The 11 columns cut in two shards (5 and 6), reduced between the passes as ranks would: the
  // losses and gradients equal those of the whole rows.
  const int n = 3, v = 11, cut = 5;
  auto logits = randomFloats(n * v, 17, 3.0f);
  const std::vector<int> targets = {3, 10, 5};
  std::vector<float> wholeMax(n), wholeSums(n), losses(n), dlogits(n * v);
  const float mean =
      crossEntropyForward(wholeMax.data(), wholeSums.data(), losses.data(), logits.data(), targets.data(), n, v);
  crossEntropyBackward(dlogits.data(), logits.data(), wholeMax.data(), wholeSums.data(), targets.data(), n, v,
                       1.0f / n);
  const int begins[2] = {0, cut}, widths[2] = {cut, v - cut};
  std::vector<float> shard[2], shardGrads[2], maxes[2], sums[2], targetLogits[2];
  for (int s = 0; s < 2; ++s) {
    for (int row = 0; row < n; ++row) {
      shard[s].insert(shard[s].end(), logits.begin() + row * v + begins[s],
                      logits.begin() + row * v + begins[s] + widths[s]);
    }
    shardGrads[s].resize(shard[s].size());
    maxes[s].resize(n);
    sums[s].resize(n);
    targetLogits[s].resize(n);
    crossEntropyShardMax(maxes[s].data(), shard[s].data(), n, widths[s]);
  }
  std::vector<float> rowMax(n), rowSum(n, 0.0f), rowTarget(n, 0.0f);
  for (int row = 0; row < n; ++row) rowMax[row] = std::max(maxes[0][row], maxes[1][row]);
  for (int s = 0; s < 2; ++s) {
    crossEntropyShardExp(sums[s].data(), targetLogits[s].data(), shard[s].data(), rowMax.data(), targets.data(), n,
                         widths[s], begins[s]);
  }
  for (int row = 0; row < n; ++row) {
    rowSum[row] = sums[0][row] + sums[1][row];
    rowTarget[row] = targetLogits[0][row] + targetLogits[1][row];
    EXPECT_EQ(targetLogits[targets[row] < cut ? 1 : 0][row], 0.0f) << "the shard without the target adds 0";
  }
  for (int s = 0; s < 2; ++s) {
    std::vector<float> shardLosses(n);
    const float shardMean =
        crossEntropyShardLoss(shardLosses.data(), rowSum.data(), rowMax.data(), rowTarget.data(), n);
    EXPECT_NEAR(shardMean, mean, 1e-6f);
    for (int row = 0; row < n; ++row) EXPECT_NEAR(shardLosses[row], losses[row], 1e-5f);
    crossEntropyBackward(shardGrads[s].data(), shard[s].data(), rowMax.data(), rowSum.data(), targets.data(), n,
                         widths[s], 1.0f / n, begins[s]);
    for (int row = 0; row < n; ++row) {
      for (int j = 0; j < widths[s]; ++j) {
        EXPECT_NEAR(shardGrads[s][row * widths[s] + j], dlogits[row * v + begins[s] + j], 1e-6f)
            << "row " << row << " column " << begins[s] + j;
      }
    }
  }
}

TEST(NnKernelsTest, AdamWMatchesItsDefinition) {
  OptimizerSettings s;
  s.lr = 0.01f;
  s.weightDecay = 0.1f;
  const size_t n = 33;
  auto p = randomFloats(n, 16);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  Vec P = asDoubles(p), M(n, 0.0), V(n, 0.0);
  for (long step = 1; step <= 5; ++step) {
    const auto g = randomFloats(n, 100 + step);
    adamwStep(p.data(), g.data(), m.data(), v.data(), n, step, s);
    for (size_t i = 0; i < n; ++i) {
      P[i] -= s.lr * s.weightDecay * P[i];
      M[i] = s.beta1 * M[i] + (1 - s.beta1) * g[i];
      V[i] = s.beta2 * V[i] + (1 - s.beta2) * g[i] * g[i];
      const double mhat = M[i] / (1 - std::pow(s.beta1, step));
      const double vhat = V[i] / (1 - std::pow(s.beta2, step));
      P[i] -= s.lr * mhat / (std::sqrt(vhat) + s.eps);
    }
  }
  EXPECT_LT(relativeError(p, P), 1e-6);

  // Closed form: the first step without decay moves every parameter by lr against its gradient's sign.
  s.weightDecay = 0.0f;
  std::vector<float> q = {1.0f, 1.0f, 1.0f}, mq(3, 0.0f), vq(3, 0.0f);
  const std::vector<float> g = {0.5f, -3.0f, 1e-3f};
  adamwStep(q.data(), g.data(), mq.data(), vq.data(), 3, 1, s);
  EXPECT_NEAR(q[0], 1.0f - s.lr, 1e-6);
  EXPECT_NEAR(q[1], 1.0f + s.lr, 1e-6);
  EXPECT_NEAR(q[2], 1.0f - s.lr, 1e-4);  // eps = 1e-8 against |g| = 1e-3
}

// SGD with momentum, plain and Nesterov, against its recurrence in double; and in closed form: a
// constant gradient g from zero momentum moves a parameter by lr g (1 + mu + ... + mu^(k-1)) at step k.
TEST(NnKernelsTest, SgdMatchesItsDefinition) {
  for (bool nesterov : {false, true}) {
    OptimizerSettings s;
    s.kind = Optimizer::kSgd;
    s.lr = 0.05f;
    s.weightDecay = 0.01f;
    s.momentum = 0.9f;
    s.nesterov = nesterov;
    const size_t n = 33;
    auto p = randomFloats(n, 16);
    std::vector<float> m(n, 7.0f);  // ignored at step 1
    Vec P = asDoubles(p), M(n, 0.0);
    for (long step = 1; step <= 5; ++step) {
      const auto g = randomFloats(n, 100 + step);
      sgdStep(p.data(), g.data(), m.data(), n, step, s);
      for (size_t i = 0; i < n; ++i) {
        const double d = g[i] + s.weightDecay * P[i];
        M[i] = step == 1 ? d : s.momentum * M[i] + d;
        P[i] -= s.lr * (nesterov ? d + s.momentum * M[i] : M[i]);
      }
    }
    EXPECT_LT(relativeError(p, P), 1e-6) << (nesterov ? "nesterov" : "plain");
  }
  OptimizerSettings s;
  s.lr = 0.1f;
  s.weightDecay = 0.0f;
  s.momentum = 0.5f;
  std::vector<float> q = {0.0f}, mq = {0.0f};
  const float g = 2.0f;
  for (long step = 1; step <= 3; ++step) sgdStep(q.data(), &g, mq.data(), 1, step, s);
  EXPECT_FLOAT_EQ(q[0], -0.1f * 2.0f * (1.0f + 1.5f + 1.75f));
}

TEST(NnKernelsTest, SumOfSquaresAndScale) {
  std::vector<float> x = {3.0f, -4.0f, 12.0f};
  EXPECT_EQ(sumOfSquares(x.data(), x.size()), 169.0);
  scale(x.data(), x.size(), 0.5f);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 6.0f}));
}

}  // namespace
}  // namespace chorus::kernels
