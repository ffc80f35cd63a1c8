// moe.cc: the mixture-of-experts MLP of moe.h: routing and the gated sum through kernels/cpu/moe.h,
// the experts' products through matmul.h, the rows between ranks by the public API's
// all-to-all(v).
#include "src/training/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/nn.h"

namespace chorus::training {

namespace kn = chorus::kernels;

void MoeConfig::validate(int width, int ep) const {
  auto fail = [](const std::string& what) { throw Error(chorusInvalidArgument, "MoE: " + what); };
  if (experts < 0) fail(fmt::format("experts = {} is negative", experts));
  if (experts == 0) return;
  if (topK != 1 && topK != 2) fail(fmt::format("top_k = {} is not 1 or 2", topK));
  if (topK > experts) fail(fmt::format("top_k = {} exceeds experts = {}", topK, experts));
  if (ep < 1 || experts % ep != 0) fail(fmt::format("experts = {} is not a multiple of ep = {}", experts, ep));
  if (hidden < 0) fail(fmt::format("expert hidden width {} is negative", hidden));
  if (width <= 0) fail(fmt::format("model width {} is not positive", width));
  if (capacityFactor < 0) fail(fmt::format("capacity_factor = {} is negative", capacityFactor));
  if (auxCoef < 0 || zCoef < 0) fail(fmt::format("aux_loss = {} and z_loss = {} must not be negative", auxCoef, zCoef));
}

std::string MoeConfig::describe() const {
  if (!enabled()) return "dense";
  return fmt::format("{} experts, top-{}, {}, capacity {}, aux {} z {}", experts, topK, swiglu ? "SwiGLU" : "GELU",
                     capacityFactor > 0 ? fmt::format("x{}", capacityFactor) : std::string("unlimited"), auxCoef,
                     zCoef);
}

size_t MoeActivations::floats() const {
  // ints and size_ts counted as floats' worth of memory by their bytes.
  const size_t ints = expert.size() + row.size() + assigned.size() + counts.size() + recvCounts.size();
  const size_t sizes = sendRows.size() + recvRows.size();
  return probs.size() + lse.size() + gate.size() + expertIn.size() + fc.size() + act.size() + combined.size() + ints +
         sizes * sizeof(size_t) / sizeof(float);
}

MoeMlp::MoeMlp(const MoeConfig& config, int width, ExpertParallel ep, Communicator* tokenGroup)
    : config_(config), C_(width), hidden_(config.hiddenFor(width)), ep_(ep), tokenGroup_(tokenGroup) {
  config_.validate(width, ep.size());
  if (!config_.enabled()) throw Error(chorusInvalidArgument, "MoE: a layer needs experts > 0");
  localExperts_ = config_.experts / ep_.size();
}

size_t MoeMlp::expertFloats() const {
  const size_t F = static_cast<size_t>(fcRows());
  return F * C_ + F + static_cast<size_t>(C_) * hidden_ + C_;
}

MoeMlp::ExpertTensors MoeMlp::expertTensors(int localExpert) const {
  const size_t F = static_cast<size_t>(fcRows());
  ExpertTensors t;
  t.fcWeight = static_cast<size_t>(localExpert) * expertFloats();
  t.fcBias = t.fcWeight + F * C_;
  t.projWeight = t.fcBias + F;
  t.projBias = t.projWeight + static_cast<size_t>(C_) * hidden_;
  return t;
}

size_t MoeMlp::scratchFloats() const {
  return logits_.size() + dlogits_.size() + dgate_.size() + sent_.size() + received_.size() + dExpertIn_.size() +
         dfc_.size() + dact_.size() + dy_.size() + grouped_.size();
}

void MoeMlp::exchange(const std::vector<float>& in, std::vector<float>& out, const MoeActivations& a, bool toExperts) {
  const std::vector<size_t>& sendRows = toExperts ? a.sendRows : a.recvRows;
  const std::vector<size_t>& recvRows = toExperts ? a.recvRows : a.sendRows;
  out.resize(std::accumulate(recvRows.begin(), recvRows.end(), size_t{0}) * C_);
  if (ep_.size() == 1) {
    std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
    return;
  }
  countsOut_.resize(sendRows.size());
  countsIn_.resize(recvRows.size());
  for (size_t r = 0; r < sendRows.size(); ++r) {
    countsOut_[r] = sendRows[r] * C_;
    countsIn_[r] = recvRows[r] * C_;
  }
  const size_t sending = std::accumulate(countsOut_.begin(), countsOut_.end(), size_t{0});
  ep_.comm->allToAllv<float>(std::span<const float>(in.data(), sending), countsOut_, out, countsIn_);
}

void MoeMlp::regroup(const float* in, float* out, const MoeActivations& a, bool toExpertMajor) const {
  const int P = ep_.size(), El = localExperts_;
  // Where each (source, expert) run starts in either order.
  std::vector<size_t> sourceMajor(static_cast<size_t>(P) * El), expertMajor(static_cast<size_t>(P) * El);
  size_t at = 0;
  for (int s = 0; s < P; ++s) {
    for (int e = 0; e < El; ++e) {
      sourceMajor[s * El + e] = at;
      at += a.recvCounts[s * El + e];
    }
  }
  at = 0;
  for (int e = 0; e < El; ++e) {
    for (int s = 0; s < P; ++s) {
      expertMajor[s * El + e] = at;
      at += a.recvCounts[s * El + e];
    }
  }
  for (int i = 0; i < P * El; ++i) {
    const size_t from = toExpertMajor ? sourceMajor[i] : expertMajor[i];
    const size_t to = toExpertMajor ? expertMajor[i] : sourceMajor[i];
    if (a.recvCounts[i] == 0) continue;  // (the buffers may be empty: no pointer to copy through)
    std::memcpy(out + to * C_, in + from * C_, sizeof(float) * C_ * a.recvCounts[i]);
  }
}

int MoeMlp::rowsOf(const MoeActivations& a, int localExpert) const {
  int rows = 0;
  for (int s = 0; s < ep_.size(); ++s) rows += a.recvCounts[s * localExperts_ + localExpert];
  return rows;
}

void MoeMlp::forward(float* out, const float* x, int n, const float* router, const float* experts, MoeActivations& a) {
  const int E = config_.experts, k = config_.topK, C = C_, P = ep_.size(), El = localExperts_;
  const int F = fcRows(), H = hidden_;
  a.tokens = n;
  logits_.resize(static_cast<size_t>(n) * E);
  kn::matmulForward(logits_.data(), x, router, nullptr, n, C, E);
  a.probs.resize(static_cast<size_t>(n) * E);
  a.lse.resize(n);
  kn::routerSoftmax(a.probs.data(), a.lse.data(), logits_.data(), n, E);
  a.expert.resize(static_cast<size_t>(n) * k);
  a.gate.resize(a.expert.size());
  a.row.resize(a.expert.size());
  a.assigned.resize(E);
  a.counts.resize(E);
  a.dropped =
      kn::routeTopK(a.expert.data(), a.gate.data(), a.row.data(), a.assigned.data(), a.counts.data(), a.probs.data(), n,
                    E, k, config_.normalizeGates(), kn::expertCapacity(config_.capacityFactor, n, E, k));
  // The losses are means over the token group's tokens: its ranks add up their sums first.
  std::vector<float> sums(E + 2);
  kn::routerColumnSums(sums.data(), a.probs.data(), n, E);
  sums[E] = static_cast<float>(kn::routerSquares(a.lse.data(), n));
  sums[E + 1] = static_cast<float>(n);
  if (tokenGroup_ != nullptr) {
    tokenGroup_->allReduce(std::span<float>(sums));
    tokenGroup_->allReduce(std::span<int>(a.assigned));
  }
  a.total = static_cast<int>(sums[E + 1]);
  a.aux = kn::routerAuxLoss(sums.data(), a.assigned.data(), a.total, E, k);
  a.z = sums[E] / static_cast<float>(a.total);

  // Dispatch: the rows in expert order, so each rank's experts' rows are one block.
  const size_t rows = std::accumulate(a.counts.begin(), a.counts.end(), size_t{0});
  sent_.resize(rows * C);
  kn::moeDispatch(sent_.data(), x, a.row.data(), n, k, C);
  a.sendRows.assign(P, 0);
  for (int e = 0; e < E; ++e) a.sendRows[e / El] += a.counts[e];
  a.recvCounts = a.counts;
  if (P > 1) ep_.comm->allToAll<int>(a.counts, a.recvCounts);
  a.recvRows.assign(P, 0);
  for (int i = 0; i < P * El; ++i) a.recvRows[i / El] += a.recvCounts[i];
  exchange(sent_, received_, a, true);
  a.expertIn.resize(received_.size());
  regroup(received_.data(), a.expertIn.data(), a, true);

  // The experts, each on its rows from every rank.
  const size_t localRows = a.expertIn.size() / C;
  a.fc.resize(localRows * F);
  a.act.resize(localRows * H);
  grouped_.resize(localRows * C);
  size_t first = 0;
  for (int e = 0; e < El; ++e) {
    const int count = rowsOf(a, e);
    if (count > 0) {
      const ExpertTensors t = expertTensors(e);
      float* fc = a.fc.data() + first * F;
      float* act = a.act.data() + first * H;
      kn::matmulForward(fc, a.expertIn.data() + first * C, experts + t.fcWeight, experts + t.fcBias, count, C, F);
      if (config_.swiglu) {
        kn::swigluForward(act, fc, count, H);
      } else {
        kn::geluForward(act, fc, static_cast<size_t>(count) * H);
      }
      kn::matmulForward(grouped_.data() + first * C, act, experts + t.projWeight, experts + t.projBias, count, H, C);
    }
    first += count;
  }

  // Combine: the outputs back to their tokens' ranks, and the gated sum.
  regroup(grouped_.data(), received_.data(), a, false);
  exchange(received_, a.combined, a, false);
  kn::moeCombine(out, a.combined.data(), a.row.data(), a.gate.data(), n, k, C);
}

void MoeMlp::backward(float* dx, float* dRouter, float* dExperts, const float* dout, const float* x,
                      const float* router, const float* experts, const MoeActivations& a, float lossScale) {
  const int E = config_.experts, k = config_.topK, C = C_, El = localExperts_, n = a.tokens;
  const int F = fcRows(), H = hidden_;
  dgate_.resize(static_cast<size_t>(n) * k);
  dy_.resize(a.combined.size());
  kn::moeCombineBackward(dy_.data(), dgate_.data(), dout, a.combined.data(), a.row.data(), a.gate.data(), n, k, C);
  exchange(dy_, received_, a, true);
  grouped_.resize(received_.size());
  regroup(received_.data(), grouped_.data(), a, true);

  const size_t localRows = a.expertIn.size() / C;
  dExpertIn_.assign(localRows * C, 0.0f);
  size_t first = 0;
  for (int e = 0; e < El; ++e) {
    const int count = rowsOf(a, e);
    if (count > 0) {
      const ExpertTensors t = expertTensors(e);
      dact_.assign(static_cast<size_t>(count) * H, 0.0f);
      dfc_.assign(static_cast<size_t>(count) * F, 0.0f);
      const float* fc = a.fc.data() + first * F;
      kn::matmulBackward(dact_.data(), dExperts + t.projWeight, dExperts + t.projBias, grouped_.data() + first * C,
                         a.act.data() + first * H, experts + t.projWeight, count, H, C);
      if (config_.swiglu) {
        kn::swigluBackward(dfc_.data(), fc, dact_.data(), count, H);
      } else {
        kn::geluBackward(dfc_.data(), fc, dact_.data(), static_cast<size_t>(count) * H);
      }
      kn::matmulBackward(dExpertIn_.data() + first * C, dExperts + t.fcWeight, dExperts + t.fcBias, dfc_.data(),
                         a.expertIn.data() + first * C, experts + t.fcWeight, count, C, F);
    }
    first += count;
  }
  regroup(dExpertIn_.data(), received_.data(), a, false);
  exchange(received_, sent_, a, false);
  kn::moeDispatchBackward(dx, sent_.data(), a.row.data(), n, k, C);

  dlogits_.resize(static_cast<size_t>(n) * E);
  kn::routerBackward(dlogits_.data(), dgate_.data(), a.probs.data(), a.lse.data(), a.expert.data(), a.gate.data(),
                     a.row.data(), a.assigned.data(), n, a.total, E, k, config_.normalizeGates(),
                     config_.auxCoef * lossScale, config_.zCoef * lossScale);
  kn::matmulBackward(dx, dRouter, nullptr, dlogits_.data(), x, router, n, C, E);
}

}  // namespace chorus::training
