// gpt.cc: the GPT-2 model's layout, initialisation, forward and backward (shapes after llm.c's
// train_gpt2.c: N = B * T rows of C channels).
#include "src/training/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "chorus/error.hpp"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/nn.h"

namespace chorus::training {

namespace kn = chorus::kernels;

void GptConfig::validate() const {
  auto bad = [](const std::string& what) { throw Error(chorusInvalidArgument, "GPT config: " + what); };
  if (layers < 1) bad(fmt::format("layers = {} (at least 1)", layers));
  if (heads < 1) bad(fmt::format("heads = {} (at least 1)", heads));
  if (width < 1 || width % heads != 0)
    bad(fmt::format("width = {} is not a positive multiple of heads = {}", width, heads));
  if (context < 1) bad(fmt::format("context = {} (at least 1)", context));
  if (vocab < 1) bad(fmt::format("vocab = {} (at least 1)", vocab));
}

std::string GptConfig::describe() const {
  return fmt::format("GPT-2 layers={} heads={} width={} context={} vocab={}", layers, heads, width, context, vocab);
}

// ---- layout ----

ParamLayout::ParamLayout(const GptConfig& c, int tp, int tpRank) : tp_(tp), tpRank_(tpRank) {
  c.validate();
  if (tp < 1 || tpRank < 0 || tpRank >= tp) {
    throw Error(chorusInvalidArgument, fmt::format("GPT layout: tp rank {} of {}", tpRank, tp));
  }
  if (c.heads % tp != 0) {
    throw Error(chorusInvalidArgument,
                fmt::format("GPT layout: heads = {} cannot be split over tp = {} ranks (not a multiple)", c.heads, tp));
  }
  if (c.vocab < tp) {
    throw Error(chorusInvalidArgument, fmt::format("GPT layout: vocab = {} is below tp = {}", c.vocab, tp));
  }
  // Rows or columns [lo, hi) of `extent` that this rank holds.
  auto cut = [&](size_t extent) { return std::pair<size_t, size_t>(extent * tpRank / tp, extent * (tpRank + 1) / tp); };
  int unit = 0;
  auto add = [&](std::string name, std::vector<int> shape, Init init, Split split = Split::kReplicated, int parts = 1) {
    ParamTensor t;
    t.name = std::move(name);
    t.globalShape = shape;
    t.shape = shape;
    t.offset = total_;
    t.globalOffset = globalTotal_;
    t.unit = unit;
    t.init = init;
    t.decay = shape.size() >= 2;
    t.split = tp == 1 ? Split::kReplicated : split;
    t.counted = t.split != Split::kReplicated || tpRank == 0;
    const size_t rows = static_cast<size_t>(shape[0]);
    const size_t cols = shape.size() > 1 ? static_cast<size_t>(shape[1]) : 1;
    const int index = static_cast<int>(tensors_.size());
    if (t.split == Split::kRows) {
      const size_t partRows = rows / parts;
      const auto [lo, hi] = cut(partRows);
      t.shape[0] = static_cast<int>(parts * (hi - lo));
      for (int p = 0; p < parts; ++p) {
        runs_.push_back(
            {t.offset + p * (hi - lo) * cols, t.globalOffset + (p * partRows + lo) * cols, (hi - lo) * cols, index});
      }
    } else if (t.split == Split::kColumns) {
      const auto [lo, hi] = cut(cols);
      t.shape[1] = static_cast<int>(hi - lo);
      for (size_t r = 0; r < rows; ++r) {
        runs_.push_back({t.offset + r * (hi - lo), t.globalOffset + r * cols + lo, hi - lo, index});
      }
    } else {
      runs_.push_back({t.offset, t.globalOffset, rows * cols, index});
    }
    t.count = 1;
    for (int d : t.shape) t.count *= static_cast<size_t>(d);
    total_ += t.count;
    globalTotal_ += rows * cols;
    unitCount_[unit] += t.count;
    tensors_.push_back(std::move(t));
  };
  auto beginUnit = [&](int u) {
    unit = u;
    unitOffset_.push_back(total_);
    unitCount_.push_back(0);
  };
  const int C = c.width;
  const auto [vocabLo, vocabHi] = cut(static_cast<size_t>(c.vocab));
  vocabBegin_ = static_cast<int>(vocabLo);
  vocabCount_ = static_cast<int>(vocabHi - vocabLo);
  beginUnit(0);
  add("wte.weight", {c.vocab, C}, Init::kNormal, Split::kRows);
  add("wpe.weight", {c.context, C}, Init::kNormal);
  for (int l = 0; l < c.layers; ++l) {
    beginUnit(1 + l);
    const std::string p = fmt::format("h.{}.", l);
    add(p + "ln_1.weight", {C}, Init::kOnes);
    add(p + "ln_1.bias", {C}, Init::kZeros);
    add(p + "attn.c_attn.weight", {3 * C, C}, Init::kNormal, Split::kRows, 3);
    add(p + "attn.c_attn.bias", {3 * C}, Init::kZeros, Split::kRows, 3);
    add(p + "attn.c_proj.weight", {C, C}, Init::kResidualNormal, Split::kColumns);
    add(p + "attn.c_proj.bias", {C}, Init::kZeros);
    add(p + "ln_2.weight", {C}, Init::kOnes);
    add(p + "ln_2.bias", {C}, Init::kZeros);
    add(p + "mlp.c_fc.weight", {4 * C, C}, Init::kNormal, Split::kRows);
    add(p + "mlp.c_fc.bias", {4 * C}, Init::kZeros, Split::kRows);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, Init::kResidualNormal, Split::kColumns);
    add(p + "mlp.c_proj.bias", {C}, Init::kZeros);
  }
  beginUnit(c.layers + 1);
  add("ln_f.weight", {C}, Init::kOnes);
  add("ln_f.bias", {C}, Init::kZeros);
  layers_ = c.layers;
}

void ParamLayout::toGlobal(const float* local, float* whole, bool countedOnly) const {
  for (const auto& run : runs_) {
    if (countedOnly && !tensors_[run.tensor].counted) continue;
    std::memcpy(whole + run.global, local + run.local, run.count * sizeof(float));
  }
}

void ParamLayout::fromGlobal(const float* whole, float* local) const {
  for (const auto& run : runs_) std::memcpy(local + run.local, whole + run.global, run.count * sizeof(float));
}

const ParamTensor& ParamLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw Error(chorusInvalidArgument, "GPT layout: no parameter named '" + name + "'");
}

namespace {

// A normal sample that depends only on (seed, index): splitmix64 of both, then Box-Muller on two
// 24-bit uniforms from its halves.
float normalAt(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u1 = (static_cast<double>(z >> 40) + 0.5) / 16777216.0;
  const double u2 = (static_cast<double>(z & 0xFFFFFFull) + 0.5) / 16777216.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

void ParamLayout::initialize(uint64_t seed, float* dst, size_t begin, size_t end) const {
  const float residualStd = 0.02f / std::sqrt(2.0f * static_cast<float>(layers_));
  for (const auto& run : runs_) {
    const size_t lo = std::max(begin, run.local);
    const size_t hi = std::min(end, run.local + run.count);
    const Init init = tensors_[run.tensor].init;
    for (size_t i = lo; i < hi; ++i) {
      const uint64_t global = run.global + (i - run.local);
      float value = 0.0f;
      switch (init) {
        case Init::kNormal:
          value = 0.02f * normalAt(seed, global);
          break;
        case Init::kResidualNormal:
          value = residualStd * normalAt(seed, global);
          break;
        case Init::kZeros:
          value = 0.0f;
          break;
        case Init::kOnes:
          value = 1.0f;
          break;
      }
      dst[i - begin] = value;
    }
  }
}

// ---- the model ----

namespace {

// A block's tensors within its unit, in the order ParamLayout adds them.
template <typename P>
struct BlockPtrs {
  P ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
// C: the model's width; Ct = C / tp (this rank's attention channels), Ft = 4C / tp (its MLP units).
template <typename P>
BlockPtrs<P> blockPtrs(P base, int C, int Ct, int Ft) {
  BlockPtrs<P> b;
  const size_t c = static_cast<size_t>(C), ct = static_cast<size_t>(Ct), ft = static_cast<size_t>(Ft);
  P p = base;
  auto take = [&](size_t n) {
    P at = p;
    p += n;
    return at;
  };
  b.ln1w = take(c);
  b.ln1b = take(c);
  b.qkvw = take(3 * ct * c);
  b.qkvb = take(3 * ct);
  b.projw = take(c * ct);
  b.projb = take(c);
  b.ln2w = take(c);
  b.ln2b = take(c);
  b.fcw = take(ft * c);
  b.fcb = take(ft);
  b.fcprojw = take(c * ft);
  b.fcprojb = take(c);
  return b;
}

// out(n rows, c) += bias(c), the bias of a row-parallel layer added once its partial sums are summed.
void addBias(float* out, const float* bias, int n, int c) {
  for (int row = 0; row < n; ++row)
    kn::residualForward(out + static_cast<size_t>(row) * c, out + static_cast<size_t>(row) * c, bias, c);
}

}  // namespace

Gpt::Gpt(const GptConfig& config, int batch, int seq, TensorParallel tp)
    : config_(config),
      tp_(tp),
      layout_(config, tp.size(), tp.rank()),
      B_(batch),
      T_(seq),
      Ct_(config.width / tp.size()),
      Ft_(4 * config.width / tp.size()),
      heads_(config.heads / tp.size()),
      sequenceParallel_(tp.sequenceParallel && tp.size() > 1) {
  if (batch < 1) throw Error(chorusInvalidArgument, fmt::format("GPT: batch = {} (at least 1)", batch));
  if (seq < 1 || seq > config.context) {
    throw Error(chorusInvalidArgument,
                fmt::format("GPT: sequence length {} is not in [1, context = {}]", seq, config.context));
  }
  const size_t N = static_cast<size_t>(B_) * T_;
  const size_t C = config.width, Ct = Ct_, Ft = Ft_;
  if (sequenceParallel_ && N % tp.size() != 0) {
    throw Error(chorusInvalidArgument,
                fmt::format("GPT: sequence parallelism splits the {} x {} = {} rows of a micro-batch over tp = {} "
                            "ranks, which does not divide them",
                            B_, T_, N, tp.size()));
  }
  rows_ = static_cast<int>(sequenceParallel_ ? N / tp.size() : N);
  firstRow_ = sequenceParallel_ ? tp.rank() * rows_ : 0;
  const size_t Nl = rows_;
  const size_t V = layout_.vocabCount();
  const size_t NH = heads_;
  tokens_.resize(N);
  targets_.resize(N);
  residual_.assign(config.layers + 1, std::vector<float>(Nl * C));
  layers_.resize(config.layers);
  for (auto& L : layers_) {
    L.ln1.resize(Nl * C);
    L.ln1Mean.resize(Nl);
    L.ln1Rstd.resize(Nl);
    L.qkv.resize(N * 3 * Ct);
    L.atty.resize(N * Ct);
    L.att.resize(static_cast<size_t>(B_) * NH * T_ * T_);
    L.res2.resize(Nl * C);
    L.ln2.resize(Nl * C);
    L.ln2Mean.resize(Nl);
    L.ln2Rstd.resize(Nl);
    L.fch.resize(N * Ft);
    L.fchGelu.resize(N * Ft);
  }
  lnf_.resize(Nl * C);
  lnfMean_.resize(Nl);
  lnfRstd_.resize(Nl);
  logits_.resize(N * V);
  probs_.resize(N * V);
  losses_.resize(N);
  if (tp_.size() > 1) ceStats_.resize(3 * N);
  dres_.resize(Nl * C);
  dln_.resize(N * C);
  datty_.resize(N * Ct);
  dqkv_.resize(N * 3 * Ct);
  dfch_.resize(N * Ft);
  dfchGelu_.resize(N * Ft);
  if (sequenceParallel_) {
    wholeRows_.resize(N * C);
    lnfWhole_.resize(N * C);
    dlnRows_.resize(Nl * C);
    lnGrad_.resize(2 * C);
  }
  dattScratch_.resize(static_cast<size_t>(T_) * T_);
}

size_t Gpt::activationBytes() const {
  size_t floats = 0;
  for (const auto& r : residual_) floats += r.size();
  for (const auto& L : layers_) {
    floats += L.ln1.size() + L.ln1Mean.size() + L.ln1Rstd.size() + L.qkv.size() + L.atty.size() + L.att.size() +
              L.res2.size() + L.ln2.size() + L.ln2Mean.size() + L.ln2Rstd.size() + L.fch.size() + L.fchGelu.size();
  }
  floats += lnf_.size() + lnfMean_.size() + lnfRstd_.size() + logits_.size() + probs_.size() + losses_.size() +
            ceStats_.size();
  floats +=
      dres_.size() + dln_.size() + datty_.size() + dqkv_.size() + dfch_.size() + dfchGelu_.size() + dattScratch_.size();
  floats += wholeRows_.size() + dlnRows_.size() + lnfWhole_.size() + lnGrad_.size();
  return floats * sizeof(float) + (tokens_.size() + targets_.size()) * sizeof(int);
}

double Gpt::flopsPerStep() const {
  // Matmuls: 2 flops per multiply-add, 3x for forward + backward (the input and weight gradients).
  // Parameters used in matmuls: the blocks' weights and the tied head (not wpe, biases, norms).
  const double N = static_cast<double>(B_) * T_;
  const double C = config_.width;
  const double matmulParams = config_.layers * 12.0 * C * C + static_cast<double>(config_.vocab) * C;
  // Attention: q k^T and P v, each 2 T C per token per layer, also 3x.
  const double attention = config_.layers * 2.0 * 2.0 * T_ * C;
  return 6.0 * N * matmulParams + 3.0 * N * attention;
}

float Gpt::forward(const int* tokens, const int* targets, UnitAccess& access) {
  const int B = B_, T = T_, C = config_.width, V = config_.vocab;
  const int N = B * T;
  for (int i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw Error(chorusInvalidArgument,
                  fmt::format("GPT forward: token {} at batch row {}, position {} is not in [0, vocab = {})", tokens[i],
                              i / T, i % T, V));
    }
    if (targets != nullptr && (targets[i] < 0 || targets[i] >= V)) {
      throw Error(chorusInvalidArgument,
                  fmt::format("GPT forward: target {} at batch row {}, position {} is not in [0, vocab = {})",
                              targets[i], i / T, i % T, V));
    }
  }
  std::memcpy(tokens_.data(), tokens, tokens_.size() * sizeof(int));
  haveTargets_ = targets != nullptr;
  if (haveTargets_) std::memcpy(targets_.data(), targets, targets_.size() * sizeof(int));

  const bool split = tp_.size() > 1;
  const int v0 = layout_.vocabBegin(), Vt = layout_.vocabCount();
  const int Ct = Ct_, Ft = Ft_, NHt = heads_, Nl = rows_;
  const size_t NlC = static_cast<size_t>(Nl) * C;
  // A row-parallel layer's partial output goes where sumRows wants it: the whole rows' scratch
  // with sequence parallelism (reduce-scattered from there), else the destination itself.
  auto partialFor = [&](float* rowsOut) { return sequenceParallel_ ? wholeRows_.data() : rowsOut; };

  const float* embed = access.acquire(0, Pass::kForward);
  const float* wpe = embed + static_cast<size_t>(Vt) * C;
  if (!split) {
    kn::embeddingForward(residual_[0].data(), tokens_.data(), embed, wpe, B, T, C);
  } else {
    // Each rank looks up the tokens of its vocabulary rows (zeros for the others); the sum is the
    // embedding, and the position term is added once, to this rank's rows.
    float* lookup = partialFor(residual_[0].data());
    kn::embeddingForward(lookup, tokens_.data(), embed, nullptr, B, T, C, v0, Vt);
    sumRows(lookup, residual_[0].data());
    for (int r = 0; r < Nl; ++r) {
      float* row = residual_[0].data() + static_cast<size_t>(r) * C;
      kn::residualForward(row, row, wpe + static_cast<size_t>((firstRow_ + r) % T) * C, C);
    }
  }
  access.release(0, Pass::kForward);

  for (int l = 0; l < config_.layers; ++l) {
    const auto w = blockPtrs<const float*>(access.acquire(1 + l, Pass::kForward), C, Ct, Ft);
    Layer& L = layers_[l];
    const float* in = residual_[l].data();
    float* out = residual_[l + 1].data();
    kn::layernormForward(L.ln1.data(), L.ln1Mean.data(), L.ln1Rstd.data(), in, w.ln1w, w.ln1b, Nl, C);
    kn::matmulForward(L.qkv.data(), gatherRows(L.ln1.data()), w.qkvw, w.qkvb, N, C, 3 * Ct);
    kn::attentionForward(L.atty.data(), L.att.data(), L.qkv.data(), B, T, Ct, NHt);
    // The projection's output goes to `out` for a moment, then the residual sum into res2. Row
    // parallel: each rank's heads give a partial sum; the bias is added to the total.
    if (!split) {
      kn::matmulForward(out, L.atty.data(), w.projw, w.projb, N, C, C);
    } else {
      kn::matmulForward(partialFor(out), L.atty.data(), w.projw, nullptr, N, Ct, C);
      sumRows(partialFor(out), out);
      addBias(out, w.projb, Nl, C);
    }
    kn::residualForward(L.res2.data(), in, out, NlC);
    kn::layernormForward(L.ln2.data(), L.ln2Mean.data(), L.ln2Rstd.data(), L.res2.data(), w.ln2w, w.ln2b, Nl, C);
    kn::matmulForward(L.fch.data(), gatherRows(L.ln2.data()), w.fcw, w.fcb, N, C, Ft);
    kn::geluForward(L.fchGelu.data(), L.fch.data(), static_cast<size_t>(N) * Ft);
    if (!split) {
      kn::matmulForward(out, L.fchGelu.data(), w.fcprojw, w.fcprojb, N, 4 * C, C);
    } else {
      kn::matmulForward(partialFor(out), L.fchGelu.data(), w.fcprojw, nullptr, N, Ft, C);
      sumRows(partialFor(out), out);
      addBias(out, w.fcprojb, Nl, C);
    }
    kn::residualForward(out, L.res2.data(), out, NlC);
    access.release(1 + l, Pass::kForward);
  }

  const float* lnf = access.acquire(config_.layers + 1, Pass::kForward);
  kn::layernormForward(lnf_.data(), lnfMean_.data(), lnfRstd_.data(), residual_[config_.layers].data(), lnf, lnf + C,
                       Nl, C);
  access.release(config_.layers + 1, Pass::kForward);
  // The head sees every row: with sequence parallelism the final layernorm's rows are gathered
  // (and kept for backward's weight gradient).
  const float* lnfRows = lnf_.data();
  if (sequenceParallel_) {
    tp_.comm->allGather(std::span<const float>(lnf_), std::span<float>(lnfWhole_));
    lnfRows = lnfWhole_.data();
  }

  const float* wte = access.acquire(0, Pass::kForward);
  kn::matmulForward(logits_.data(), lnfRows, wte, nullptr, N, C, Vt);
  access.release(0, Pass::kForward);
  if (!haveTargets_) return 0.0f;
  if (!split) return kn::crossEntropyForward(probs_.data(), losses_.data(), logits_.data(), targets_.data(), N, V);
  // Vocab-parallel cross-entropy: the row maxima, then the exponential sums and target logits,
  // reduced over the ranks between the passes.
  std::span<float> rowMax(ceStats_.data(), N), sumsAndTargets(ceStats_.data() + N, 2 * static_cast<size_t>(N));
  kn::crossEntropyShardMax(rowMax.data(), logits_.data(), N, Vt);
  tpSum(rowMax, ReduceOp::kMax);
  kn::crossEntropyShardExp(probs_.data(), sumsAndTargets.data(), sumsAndTargets.data() + N, logits_.data(),
                           rowMax.data(), targets_.data(), N, Vt, v0);
  tpSum(sumsAndTargets);
  return kn::crossEntropyShardLoss(probs_.data(), losses_.data(), sumsAndTargets.data(), rowMax.data(),
                                   sumsAndTargets.data() + N, N, Vt);
}

void Gpt::tpSum(std::span<float> x, ReduceOp op) {
  if (tp_.comm != nullptr) tp_.comm->allReduce(x, op);
}

const float* Gpt::gatherRows(const float* rows) {
  if (!sequenceParallel_) return rows;
  const size_t C = config_.width;
  tp_.comm->allGather(std::span<const float>(rows, rows_ * C), std::span<float>(wholeRows_));
  return wholeRows_.data();
}

void Gpt::sumRows(float* partial, float* rows) {
  const size_t C = config_.width;
  if (sequenceParallel_) {
    tp_.comm->reduceScatter(std::span<const float>(partial, static_cast<size_t>(B_) * T_ * C),
                            std::span<float>(rows, rows_ * C));
  } else {
    tpSum(std::span<float>(rows, rows_ * C));  // partial == rows
  }
}

void Gpt::layernormBackwardRows(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                const float* weight, const float* mean, const float* rstd) {
  const int C = config_.width;
  if (!sequenceParallel_) {
    kn::layernormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows_, C);
    return;
  }
  // This rank's rows give a part of the weight and bias gradients: summed over the tp group, then
  // added to the accumulated gradients.
  std::fill(lnGrad_.begin(), lnGrad_.end(), 0.0f);
  kn::layernormBackward(dinp, lnGrad_.data(), lnGrad_.data() + C, dout, inp, weight, mean, rstd, rows_, C);
  tpSum(lnGrad_);
  kn::residualForward(dweight, dweight, lnGrad_.data(), C);
  kn::residualForward(dbias, dbias, lnGrad_.data() + C, C);
}

void Gpt::backward(UnitAccess& access, float lossScale) {
  if (!haveTargets_) throw Error(chorusInvalidUsage, "GPT backward: the last forward had no targets");
  const int B = B_, T = T_, C = config_.width;
  const int N = B * T;
  const int v0 = layout_.vocabBegin(), Vt = layout_.vocabCount();
  const int Ct = Ct_, Ft = Ft_, NHt = heads_;
  auto zero = [](std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); };
  // Input gradients of the column-parallel layers are partial sums over whole rows (dln_); this
  // rank's rows of their total go to dlnRows (the same buffer without sequence parallelism).
  float* dlnRows = sequenceParallel_ ? dlnRows_.data() : dln_.data();
  // The row-parallel layers and the embedding take every row of dres.
  auto dresWhole = [&]() -> const float* {
    if (!sequenceParallel_) return dres_.data();
    tp_.comm->allGather(std::span<const float>(dres_), std::span<float>(wholeRows_));
    return wholeRows_.data();
  };

  // The loss and the head: probs becomes dlogits in place, then dlnf (into dln_) and dwte. With tp,
  // each rank's vocabulary columns give a part of dlnf: summed over the ranks.
  kn::crossEntropyBackward(probs_.data(), probs_.data(), targets_.data(), N, Vt, lossScale / static_cast<float>(N), v0);
  haveTargets_ = false;  // probs_ now holds the gradient: a second backward needs a new forward
  {
    const float* wte = access.acquire(0, Pass::kBackward);
    zero(dln_);
    kn::matmulBackward(dln_.data(), access.gradients(0), nullptr, probs_.data(),
                       sequenceParallel_ ? lnfWhole_.data() : lnf_.data(), wte, N, C, Vt);
    access.release(0, Pass::kBackward);
    sumRows(dln_.data(), dlnRows);
  }
  {
    const int u = config_.layers + 1;
    const float* lnf = access.acquire(u, Pass::kBackward);
    float* g = access.gradients(u);
    zero(dres_);
    layernormBackwardRows(dres_.data(), g, g + C, dlnRows, residual_[config_.layers].data(), lnf, lnfMean_.data(),
                          lnfRstd_.data());
    access.release(u, Pass::kBackward);
    access.gradientsDone(u);
  }

  // dres_ holds d(residual[l + 1]) (this rank's rows); each block turns it into d(residual[l]).
  // The row-parallel layers take the whole dres (their input gradients are this rank's columns);
  // the column-parallel layers' input gradients are partial sums, summed over the ranks (the
  // conjugate of the forward all-reduce, or reduce-scatter with sequence parallelism).
  for (int l = config_.layers - 1; l >= 0; --l) {
    const int u = 1 + l;
    const auto w = blockPtrs<const float*>(access.acquire(u, Pass::kBackward), C, Ct, Ft);
    const auto g = blockPtrs<float*>(access.gradients(u), C, Ct, Ft);
    Layer& L = layers_[l];
    // out = res2 + fcproj(gelu(fc(ln2(res2)))): d(fcproj output) = dres.
    zero(dfchGelu_);
    kn::matmulBackward(dfchGelu_.data(), g.fcprojw, g.fcprojb, dresWhole(), L.fchGelu.data(), w.fcprojw, N, Ft, C);
    zero(dfch_);
    kn::geluBackward(dfch_.data(), L.fch.data(), dfchGelu_.data(), static_cast<size_t>(N) * Ft);
    zero(dln_);
    kn::matmulBackward(dln_.data(), g.fcw, g.fcb, dfch_.data(), gatherRows(L.ln2.data()), w.fcw, N, C, Ft);
    sumRows(dln_.data(), dlnRows);
    // dres becomes d(res2): the residual path plus the path through ln2.
    layernormBackwardRows(dres_.data(), g.ln2w, g.ln2b, dlnRows, L.res2.data(), w.ln2w, L.ln2Mean.data(),
                          L.ln2Rstd.data());
    // res2 = in + proj(attention(qkv(ln1(in)))): d(proj output) = d(res2).
    zero(datty_);
    kn::matmulBackward(datty_.data(), g.projw, g.projb, dresWhole(), L.atty.data(), w.projw, N, Ct, C);
    zero(dqkv_);
    kn::attentionBackward(dqkv_.data(), dattScratch_.data(), datty_.data(), L.qkv.data(), L.att.data(), B, T, Ct, NHt);
    zero(dln_);
    kn::matmulBackward(dln_.data(), g.qkvw, g.qkvb, dqkv_.data(), gatherRows(L.ln1.data()), w.qkvw, N, C, 3 * Ct);
    sumRows(dln_.data(), dlnRows);
    layernormBackwardRows(dres_.data(), g.ln1w, g.ln1b, dlnRows, residual_[l].data(), w.ln1w, L.ln1Mean.data(),
                          L.ln1Rstd.data());
    access.release(u, Pass::kBackward);
    access.gradientsDone(u);
  }

  float* gEmbed = access.gradients(0);
  kn::embeddingBackward(gEmbed, gEmbed + static_cast<size_t>(Vt) * C, dresWhole(), tokens_.data(), B, T, C, v0, Vt);
  access.gradientsDone(0);
}

}  // namespace chorus::training
