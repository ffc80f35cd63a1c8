// moe_kernels_test.cc: the mixture-of-experts kernels of kernels/cpu/moe.h. The top-k choice,
// capacity and rows on hand-made probabilities; the router's losses and backward against a
// double-precision definition and its central differences (the choice held fixed, as the
// gradient of a piecewise function is); dispatch and combine against plain loops; SwiGLU against
// its definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/moe.h"
#include "tests/support/gradient_check.h"

namespace chorus::kernels {
namespace {

using Vec = std::vector<double>;
using chorus::testing::numericGradient;
using chorus::testing::randomFloats;

TEST(MoeKernelsTest, TopKChoosesTheMostProbableAndFillsExpertsInPriorityOrder) {
  // 4 tokens, 3 experts, top-2, capacity 2.
  const std::vector<float> probs = {0.5f,  0.3f, 0.2f,    // token 0: experts 0, 1
                                    0.6f,  0.1f, 0.3f,    // token 1: 0, 2
                                    0.7f,  0.2f, 0.1f,    // token 2: 0 (over capacity: dropped), 1
                                    0.25f, 0.5f, 0.25f};  // token 3: 1, then 0 before 2 (a tie: the lower)
  const int n = 4, E = 3, k = 2;
  std::vector<int> expert(n * k), row(n * k), assigned(E), counts(E);
  std::vector<float> gate(n * k);
  const int dropped =
      routeTopK(expert.data(), gate.data(), row.data(), assigned.data(), counts.data(), probs.data(), n, E, k, true, 2);
  EXPECT_EQ(expert, (std::vector<int>{0, 1, 0, 2, 0, 1, 1, 0}));
  EXPECT_EQ(assigned, (std::vector<int>{4, 3, 1}));
  // First choices in token order: 0->e0, 1->e0, 2->e0 (dropped), 3->e1; then 0->e1, 1->e2,
  // 2->e1 (dropped: e1 has token 3 and token 0), 3->e0 (dropped).
  EXPECT_EQ(counts, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(dropped, 3);
  // Rows: expert 0 at 0-1 (tokens 0, 1), expert 1 at 2-3 (token 3, then token 0), expert 2 at 4.
  EXPECT_EQ(row, (std::vector<int>{0, 3, 1, 4, -1, -1, 2, -1}));
  EXPECT_FLOAT_EQ(gate[0], 0.5f / 0.8f);
  EXPECT_FLOAT_EQ(gate[1], 0.3f / 0.8f);
  EXPECT_FLOAT_EQ(gate[6], 0.5f / 0.75f);
  // No limit, no renormalisation (Switch, k = 1).
  std::vector<int> e1(n), r1(n);
  std::vector<float> g1(n);
  EXPECT_EQ(
      routeTopK(e1.data(), g1.data(), r1.data(), assigned.data(), counts.data(), probs.data(), n, E, 1, false, -1), 0);
  EXPECT_EQ(r1, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_FLOAT_EQ(g1[2], 0.7f);
  EXPECT_EQ(expertCapacity(1.25, 4, 3, 2), 4);  // ceil(1.25 * 8 / 3)
  EXPECT_EQ(expertCapacity(0, 4, 3, 2), -1);
}

// The router's part of a layer's loss, in double from the logits, the choice (expert, kept)
// given: L = sum over kept choices of dgate(i, j) gate(i, j) + auxScale aux + zScale z.
double routerLossRef(const Vec& logits, const std::vector<int>& expert, const std::vector<int>& row,
                     const std::vector<int>& assigned, const Vec& dgate, int n, int E, int k, bool normalize,
                     double auxScale, double zScale) {
  double loss = 0.0, aux = 0.0, z = 0.0;
  std::vector<double> meanProb(E, 0.0);
  for (int i = 0; i < n; ++i) {
    double max = logits[i * E];
    for (int e = 1; e < E; ++e) max = std::max(max, logits[i * E + e]);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(logits[i * E + e] - max);
    const double lse = max + std::log(sum);
    z += lse * lse / n;
    std::vector<double> p(E);
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(logits[i * E + e] - lse);
      meanProb[e] += p[e] / n;
    }
    double chosen = 0.0;
    for (int j = 0; j < k; ++j) chosen += p[expert[i * k + j]];
    for (int j = 0; j < k; ++j) {
      if (row[i * k + j] < 0) continue;
      const double g = normalize ? p[expert[i * k + j]] / chosen : p[expert[i * k + j]];
      loss += dgate[i * k + j] * g;
    }
  }
  for (int e = 0; e < E; ++e) aux += static_cast<double>(E) / (static_cast<double>(n) * k) * assigned[e] * meanProb[e];
  return loss + auxScale * aux + zScale * z;
}

TEST(MoeKernelsTest, RouterLossesAndBackwardMatchTheDefinition) {
  const int n = 6, E = 5;
  for (const int k : {1, 2}) {
    for (const bool normalize : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " normalize " << normalize);
      const std::vector<float> logits = randomFloats(n * E, 7 + k);
      std::vector<float> probs(n * E), lse(n), gate(n * k), dlogits(n * E);
      std::vector<int> expert(n * k), row(n * k), assigned(E), counts(E);
      routerSoftmax(probs.data(), lse.data(), logits.data(), n, E);
      routeTopK(expert.data(), gate.data(), row.data(), assigned.data(), counts.data(), probs.data(), n, E, k,
                normalize, expertCapacity(1.0, n, E, k));
      const std::vector<float> dgate = randomFloats(n * k, 11);
      const float auxScale = 0.3f, zScale = 0.05f;
      // Forward values.
      double auxRef = 0.0, zRef = 0.0;
      for (int i = 0; i < n; ++i) zRef += static_cast<double>(lse[i]) * lse[i] / n;
      for (int e = 0; e < E; ++e) {
        double mean = 0.0;
        for (int i = 0; i < n; ++i) mean += probs[i * E + e] / n;
        auxRef += static_cast<double>(E) / (n * k) * assigned[e] * mean;
      }
      std::vector<float> sums(E);
      routerColumnSums(sums.data(), probs.data(), n, E);
      EXPECT_NEAR(routerAuxLoss(sums.data(), assigned.data(), n, E, k), auxRef, 1e-6);
      EXPECT_NEAR(routerSquares(lse.data(), n) / n, zRef, 1e-5);
      // Backward against central differences of the definition.
      routerBackward(dlogits.data(), dgate.data(), probs.data(), lse.data(), expert.data(), gate.data(), row.data(),
                     assigned.data(), n, n, E, k, normalize, auxScale, zScale);
      const Vec dgateD(dgate.begin(), dgate.end());
      const Vec want = numericGradient(Vec(logits.begin(), logits.end()), [&](const Vec& x) {
        return routerLossRef(x, expert, row, assigned, dgateD, n, E, k, normalize, auxScale, zScale);
      });
      for (int c = 0; c < n * E; ++c) EXPECT_NEAR(dlogits[c], want[c], 2e-5) << c;
    }
  }
}

TEST(MoeKernelsTest, DispatchAndCombineMoveEachKeptChoice) {
  const int n = 5, k = 2, C = 3, rows = 7;
  // Token i's choices at rows: -1 for dropped; rows 0..6 each once.
  const std::vector<int> row = {3, -1, 0, 6, 5, 1, -1, -1, 2, 4};
  const std::vector<float> x = randomFloats(n * C, 1), y = randomFloats(rows * C, 2), gate = randomFloats(n * k, 3);
  std::vector<float> buffer(rows * C, -7.0f);
  moeDispatch(buffer.data(), x.data(), row.data(), n, k, C);
  for (int c = 0; c < n * k; ++c) {
    if (row[c] < 0) continue;
    for (int ch = 0; ch < C; ++ch) EXPECT_EQ(buffer[row[c] * C + ch], x[(c / k) * C + ch]);
  }
  std::vector<float> dx(n * C, 1.0f);
  moeDispatchBackward(dx.data(), y.data(), row.data(), n, k, C);
  std::vector<float> out(n * C, 9.0f);
  moeCombine(out.data(), y.data(), row.data(), gate.data(), n, k, C);
  for (int i = 0; i < n; ++i) {
    for (int ch = 0; ch < C; ++ch) {
      double sum = 0.0, back = 1.0;
      for (int j = 0; j < k; ++j) {
        const int r = row[i * k + j];
        if (r < 0) continue;
        sum += static_cast<double>(gate[i * k + j]) * y[r * C + ch];
        back += y[r * C + ch];
      }
      EXPECT_NEAR(out[i * C + ch], sum, 1e-6);
      EXPECT_NEAR(dx[i * C + ch], back, 1e-6);
    }
  }
  // Combine's backward: d(sum(dout * out)) by the rows and the gates.
  const std::vector<float> dout = randomFloats(n * C, 4);
  std::vector<float> dy(rows * C, 0.0f), dgate(n * k, 5.0f);
  moeCombineBackward(dy.data(), dgate.data(), dout.data(), y.data(), row.data(), gate.data(), n, k, C);
  for (int c = 0; c < n * k; ++c) {
    const int r = row[c];
    double dot = 0.0;
    for (int ch = 0; ch < C && r >= 0; ++ch) {
      EXPECT_NEAR(dy[r * C + ch], gate[c] * dout[(c / k) * C + ch], 1e-6);
      dot += static_cast<double>(dout[(c / k) * C + ch]) * y[r * C + ch];
    }
    EXPECT_NEAR(dgate[c], dot, 1e-5) << c;
  }
}

TEST(MoeKernelsTest, SwigluForwardAndBackward) {
  const int n = 3, h = 4;
  const std::vector<float> inp = randomFloats(n * 2 * h, 5, 2.0f), w = randomFloats(n * h, 6);
  std::vector<float> out(n * h), dinp(n * 2 * h, 0.5f);
  swigluForward(out.data(), inp.data(), n, h);
  auto ref = [&](const Vec& x) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < h; ++c) {
        const double a = x[i * 2 * h + c], b = x[i * 2 * h + h + c];
        s += w[i * h + c] * a / (1.0 + std::exp(-a)) * b;
      }
    }
    return s;
  };
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < h; ++c) {
      const double a = inp[i * 2 * h + c], b = inp[i * 2 * h + h + c];
      EXPECT_NEAR(out[i * h + c], a / (1.0 + std::exp(-a)) * b, 1e-5);
    }
  }
  swigluBackward(dinp.data(), inp.data(), w.data(), n, h);
  const Vec want = numericGradient(Vec(inp.begin(), inp.end()), ref);
  for (size_t c = 0; c < want.size(); ++c) EXPECT_NEAR(dinp[c], 0.5 + want[c], 1e-4) << c;
}

}  // namespace
}  // namespace chorus::kernels
