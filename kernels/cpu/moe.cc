// moe.cc: the mixture-of-experts routing kernels of moe.h, plain loops (the experts' products,
// where the time goes, are GEMMs).
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace chorus::kernels {

void routerSoftmax(float* probs, float* lse, const float* logits, int n, int E) {
  for (int i = 0; i < n; ++i) {
    const float* in = logits + static_cast<size_t>(i) * E;
    float* out = probs + static_cast<size_t>(i) * E;
    const float max = *std::max_element(in, in + E);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) {
      out[e] = std::exp(in[e] - max);
      sum += out[e];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int e = 0; e < E; ++e) out[e] *= inv;
    lse[i] = max + static_cast<float>(std::log(sum));
  }
}

int expertCapacity(double factor, int n, int E, int k) {
  if (factor <= 0) return -1;
  return static_cast<int>(std::ceil(factor * n * k / E));
}

int routeTopK(int* expert, float* gate, int* row, int* assigned, int* counts, const float* probs, int n, int E, int k,
              bool normalize, int capacity) {
  std::fill(assigned, assigned + E, 0);
  std::fill(counts, counts + E, 0);
  std::vector<int> order(E);
  for (int i = 0; i < n; ++i) {
    const float* p = probs + static_cast<size_t>(i) * E;
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += p[order[j]];
    for (int j = 0; j < k; ++j) {
      expert[i * k + j] = order[j];
      gate[i * k + j] = normalize ? p[order[j]] / sum : p[order[j]];
      ++assigned[order[j]];
    }
  }
  // Places in priority order: choice j of every token before choice j + 1 of any.
  int dropped = 0;
  for (int j = 0; j < k; ++j) {
    for (int i = 0; i < n; ++i) {
      const int e = expert[i * k + j];
      if (capacity >= 0 && counts[e] >= capacity) {
        row[i * k + j] = -1;
        ++dropped;
      } else {
        row[i * k + j] = counts[e]++;  // the place within the expert, made a row below
      }
    }
  }
  std::vector<int> offsets(E, 0);
  for (int e = 1; e < E; ++e) offsets[e] = offsets[e - 1] + counts[e - 1];
  for (int c = 0; c < n * k; ++c) {
    if (row[c] >= 0) row[c] += offsets[expert[c]];
  }
  return dropped;
}

void routerColumnSums(float* sums, const float* probs, int n, int E) {
  for (int e = 0; e < E; ++e) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += probs[static_cast<size_t>(i) * E + e];
    sums[e] = static_cast<float>(sum);
  }
}

float routerAuxLoss(const float* sums, const int* assigned, int total, int E, int k) {
  double loss = 0.0;
  for (int e = 0; e < E; ++e) loss += static_cast<double>(assigned[e]) * sums[e] / total;
  return static_cast<float>(loss * E / (static_cast<double>(total) * k));
}

double routerSquares(const float* lse, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(lse[i]) * lse[i];
  return sum;
}

void routerBackward(float* dlogits, const float* dgate, const float* probs, const float* lse, const int* expert,
                    const float* gate, const int* row, const int* assigned, int n, int total, int E, int k,
                    bool normalize, float auxScale, float zScale) {
  std::vector<float> dp(E);
  const double auxPerToken = static_cast<double>(auxScale) * E / (static_cast<double>(total) * total * k);
  for (int i = 0; i < n; ++i) {
    const float* p = probs + static_cast<size_t>(i) * E;
    for (int e = 0; e < E; ++e) dp[e] = static_cast<float>(auxPerToken * assigned[e]);
    // Gates: g_j = p_j / S with S the sum of the chosen p (normalize), else g_j = p_j.
    float sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) {
      sum += p[expert[i * k + j]];
      if (row[i * k + j] >= 0) dot += dgate[i * k + j] * gate[i * k + j];
    }
    for (int j = 0; j < k; ++j) {
      const int e = expert[i * k + j];
      const float dg = row[i * k + j] >= 0 ? dgate[i * k + j] : 0.0f;
      dp[e] += normalize ? (dg - dot) / sum : dg;
    }
    double pdp = 0.0;
    for (int e = 0; e < E; ++e) pdp += static_cast<double>(p[e]) * dp[e];
    float* out = dlogits + static_cast<size_t>(i) * E;
    const float z = zScale * 2.0f * lse[i] / total;
    for (int e = 0; e < E; ++e) out[e] = p[e] * (dp[e] - static_cast<float>(pdp)) + z * p[e];
  }
}

void moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C) {
  for (int c = 0; c < n * k; ++c) {
    if (row[c] < 0) continue;
    std::memcpy(buffer + static_cast<size_t>(row[c]) * C, x + static_cast<size_t>(c / k) * C, sizeof(float) * C);
  }
}

void moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C) {
  for (int c = 0; c < n * k; ++c) {
    if (row[c] < 0) continue;
    const float* src = dbuffer + static_cast<size_t>(row[c]) * C;
    float* dst = dx + static_cast<size_t>(c / k) * C;
    for (int ch = 0; ch < C; ++ch) dst[ch] += src[ch];
  }
}

void moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C) {
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(n) * C);
  for (int c = 0; c < n * k; ++c) {
    if (row[c] < 0) continue;
    const float* src = y + static_cast<size_t>(row[c]) * C;
    float* dst = out + static_cast<size_t>(c / k) * C;
    for (int ch = 0; ch < C; ++ch) dst[ch] += gate[c] * src[ch];
  }
}

void moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                        int n, int k, int C) {
  for (int c = 0; c < n * k; ++c) {
    if (row[c] < 0) {
      dgate[c] = 0;
      continue;
    }
    const float* g = dout + static_cast<size_t>(c / k) * C;
    const float* src = y + static_cast<size_t>(row[c]) * C;
    float* dst = dy + static_cast<size_t>(row[c]) * C;
    double dot = 0.0;
    for (int ch = 0; ch < C; ++ch) {
      dst[ch] = gate[c] * g[ch];
      dot += static_cast<double>(g[ch]) * src[ch];
    }
    dgate[c] = static_cast<float>(dot);
  }
}

void swigluForward(float* out, const float* inp, int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float* a = inp + static_cast<size_t>(i) * 2 * h;
    const float* b = a + h;
    float* o = out + static_cast<size_t>(i) * h;
    for (int c = 0; c < h; ++c) o[c] = a[c] / (1.0f + std::exp(-a[c])) * b[c];
  }
}

void swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float* a = inp + static_cast<size_t>(i) * 2 * h;
    const float* b = a + h;
    float* da = dinp + static_cast<size_t>(i) * 2 * h;
    float* db = da + h;
    const float* d = dout + static_cast<size_t>(i) * h;
    for (int c = 0; c < h; ++c) {
      const float s = 1.0f / (1.0f + std::exp(-a[c]));
      const float silu = a[c] * s;
      da[c] += d[c] * b[c] * s * (1.0f + a[c] * (1.0f - s));
      db[c] += d[c] * silu;
    }
  }
}

}  // namespace chorus::kernels
