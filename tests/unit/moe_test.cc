// moe_test.cc: the mixture-of-experts MLP of src/training/moe.h on one rank against a dense
// double-precision computation of the same routing (every expert on every token, the chosen
// ones' outputs summed with their gates), forward and backward (central differences of that
// computation, the choice of experts and the dropped choices held fixed as the gradient of a
// piecewise function is), with and without capacity, top-1 and top-2, GELU and SwiGLU.
#include "src/training/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "tests/support/gradient_check.h"

namespace chorus::training {
namespace {

using Vec = std::vector<double>;
using chorus::testing::numericGradient;
using chorus::testing::randomFloats;

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

struct Sizes {
  int n, C, E, k, H;
  bool swiglu;
};

// The layer in double: params as MoeMlp lays them out (router, then each expert), routing given.
// Returns sum(w * out) + auxCoef aux + zCoef z.
double denseLoss(const Vec& x, const Vec& params, const Sizes& s, const MoeMlp& layer, const std::vector<int>& expert,
                 const std::vector<int>& row, const std::vector<int>& assigned, const Vec& w, double auxCoef,
                 double zCoef, Vec* outOut = nullptr) {
  const int n = s.n, C = s.C, E = s.E, k = s.k, H = s.H, F = s.swiglu ? 2 * H : H;
  const size_t R = layer.routerFloats();  // the experts' block follows the router's
  // Every expert on every token.
  std::vector<Vec> dense(E, Vec(static_cast<size_t>(n) * C));
  for (int e = 0; e < E; ++e) {
    const MoeMlp::ExpertTensors t = layer.expertTensors(e);
    for (int i = 0; i < n; ++i) {
      Vec fc(F), act(H);
      for (int f = 0; f < F; ++f) {
        double v = params[R + t.fcBias + f];
        for (int c = 0; c < C; ++c) v += params[R + t.fcWeight + f * C + c] * x[i * C + c];
        fc[f] = v;
      }
      for (int h = 0; h < H; ++h) {
        act[h] = s.swiglu ? fc[h] / (1.0 + std::exp(-fc[h])) * fc[H + h] : gelu(fc[h]);
      }
      for (int c = 0; c < C; ++c) {
        double v = params[R + t.projBias + c];
        for (int h = 0; h < H; ++h) v += params[R + t.projWeight + c * H + h] * act[h];
        dense[e][i * C + c] = v;
      }
    }
  }
  double loss = 0.0, z = 0.0;
  Vec meanProb(E, 0.0), out(static_cast<size_t>(n) * C, 0.0);
  for (int i = 0; i < n; ++i) {
    Vec logit(E);
    double max = -1e300;
    for (int e = 0; e < E; ++e) {
      double v = 0.0;
      for (int c = 0; c < C; ++c) v += params[e * C + c] * x[i * C + c];
      logit[e] = v;
      max = std::max(max, v);
    }
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(logit[e] - max);
    const double lse = max + std::log(sum);
    z += lse * lse / n;
    Vec p(E);
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(logit[e] - lse);
      meanProb[e] += p[e] / n;
    }
    double chosen = 0.0;
    for (int j = 0; j < k; ++j) chosen += p[expert[i * k + j]];
    for (int j = 0; j < k; ++j) {
      if (row[i * k + j] < 0) continue;
      const int e = expert[i * k + j];
      const double gate = k > 1 ? p[e] / chosen : p[e];
      for (int c = 0; c < C; ++c) out[i * C + c] += gate * dense[e][i * C + c];
    }
  }
  for (size_t c = 0; c < out.size(); ++c) loss += w[c] * out[c];
  double aux = 0.0;
  for (int e = 0; e < E; ++e) aux += static_cast<double>(E) / (static_cast<double>(n) * k) * assigned[e] * meanProb[e];
  if (outOut != nullptr) *outOut = out;
  return loss + auxCoef * aux + zCoef * z;
}

void expectClose(const std::vector<float>& got, const Vec& want, double tolerance, const char* what) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(diff), tolerance * std::max(std::sqrt(norm), 1e-3)) << what;
}

TEST(MoeMlpTest, ForwardAndBackwardMatchTheDenseComputationOfTheSameRouting) {
  for (const bool swiglu : {false, true}) {
    for (const int k : {1, 2}) {
      for (const double capacity : {0.0, 1.0}) {
        SCOPED_TRACE(::testing::Message() << "swiglu " << swiglu << " k " << k << " capacity " << capacity);
        const Sizes s{7, 4, 4, k, 5, swiglu};
        MoeConfig config;
        config.experts = s.E;
        config.topK = k;
        config.hidden = s.H;
        config.capacityFactor = capacity;
        config.auxCoef = 0.05f;
        config.zCoef = 0.01f;
        config.swiglu = swiglu;
        MoeMlp layer(config, s.C);
        const std::vector<float> x = randomFloats(static_cast<size_t>(s.n) * s.C, 1, 1.0f);
        const std::vector<float> params = randomFloats(layer.paramFloats(), 2, 0.5f);
        const std::vector<float> w = randomFloats(x.size(), 3, 1.0f);
        MoeActivations a;
        std::vector<float> out(x.size());
        layer.forward(out.data(), x.data(), s.n, params.data(), params.data() + layer.routerFloats(), a);
        if (capacity > 0) {
          EXPECT_GT(a.dropped, 0) << "capacity 1.0 on 7 tokens should drop some";
        } else {
          EXPECT_EQ(a.dropped, 0);
        }

        const Vec xd(x.begin(), x.end()), pd(params.begin(), params.end()), wd(w.begin(), w.end());
        Vec outRef;
        const double lossRef =
            denseLoss(xd, pd, s, layer, a.expert, a.row, a.assigned, wd, config.auxCoef, config.zCoef, &outRef);
        expectClose(out, outRef, 1e-5, "output");
        double loss = layer.weightedLoss(a);
        for (size_t c = 0; c < out.size(); ++c) loss += static_cast<double>(w[c]) * out[c];
        EXPECT_NEAR(loss, lossRef, 1e-4 * std::max(1.0, std::abs(lossRef)));

        std::vector<float> dx(x.size(), 0.0f), dparams(params.size(), 0.0f);
        const size_t R = layer.routerFloats();
        layer.backward(dx.data(), dparams.data(), dparams.data() + R, w.data(), x.data(), params.data(),
                       params.data() + R, a, 1.0f);
        const Vec dxRef = numericGradient(
            xd,
            [&](const Vec& v) {
              return denseLoss(v, pd, s, layer, a.expert, a.row, a.assigned, wd, config.auxCoef, config.zCoef);
            },
            1e-4);
        const Vec dpRef = numericGradient(
            pd,
            [&](const Vec& v) {
              return denseLoss(xd, v, s, layer, a.expert, a.row, a.assigned, wd, config.auxCoef, config.zCoef);
            },
            1e-4);
        expectClose(dx, dxRef, 1e-4, "input gradient");
        expectClose(dparams, dpRef, 1e-4, "parameter gradient");
        // The router's part alone (the dense part dwarfs it in the whole).
        std::vector<float> routerGot(dparams.begin(), dparams.begin() + layer.routerFloats());
        expectClose(routerGot, Vec(dpRef.begin(), dpRef.begin() + layer.routerFloats()), 1e-4, "router gradient");
      }
    }
  }
}

TEST(MoeMlpTest, BadSettingsAreRefusedByName) {
  auto error = [](MoeConfig c, int width, int ep) {
    try {
      c.validate(width, ep);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  MoeConfig c;
  c.experts = 6;
  c.topK = 3;
  EXPECT_NE(error(c, 8, 1).find("top_k = 3 is not 1 or 2"), std::string::npos);
  c.topK = 2;
  EXPECT_NE(error(c, 8, 4).find("experts = 6 is not a multiple of ep = 4"), std::string::npos);
  c.capacityFactor = -1;
  EXPECT_NE(error(c, 8, 2).find("capacity_factor = -1 is negative"), std::string::npos);
  c.capacityFactor = 1.25;
  EXPECT_EQ(error(c, 8, 2), "");
}

}  // namespace
}  // namespace chorus::training
