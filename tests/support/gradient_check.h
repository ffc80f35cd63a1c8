// gradient_check.h: what the layer tests share: seeded normal random floats, and a scalar
// function's gradient by central differences in double.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace chorus::testing {

inline std::vector<float> randomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// d f / d x at x, by central differences of step h.
inline std::vector<double> numericGradient(std::vector<double> x,
                                           const std::function<double(const std::vector<double>&)>& f,
                                           double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

}  // namespace chorus::testing
