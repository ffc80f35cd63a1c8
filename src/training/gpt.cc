// gpt.cc: the GPT-2 model's layout, initialisation, forward and backward (shapes after llm.c's
// train_gpt2.c: N = B * T rows of C channels).
#include "src/training/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "chorus/error.hpp"
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
  if (moeEvery < 1) bad(fmt::format("moe_every = {} (at least 1)", moeEvery));
  moe.validate(width);
}

std::string GptConfig::describe() const {
  std::string text =
      fmt::format("GPT-2 layers={} heads={} width={} context={} vocab={}", layers, heads, width, context, vocab);
  if (moe.enabled()) text += fmt::format(", MoE every {} block(s): {}", moeEvery, moe.describe());
  return text;
}

// ---- layout ----

ParamLayout::ParamLayout(const GptConfig& c, int tp, int tpRank, std::vector<LayerSpan> spans, int ep, int epRank)
    : spans_(std::move(spans)) {
  c.validate();
  if (ep < 1 || epRank < 0 || epRank >= ep) {
    throw Error(chorusInvalidArgument, fmt::format("GPT layout: ep rank {} of {}", epRank, ep));
  }
  c.moe.validate(c.width, ep);
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
  if (spans_.empty()) spans_.push_back({0, c.layers});
  for (size_t i = 0; i < spans_.size(); ++i) {
    const LayerSpan& s = spans_[i];
    const int from = i == 0 ? 0 : spans_[i - 1].end;
    if (s.begin < from || s.end <= s.begin || s.end > c.layers) {
      throw Error(chorusInvalidArgument,
                  fmt::format("GPT layout: layer span {} is [{}, {}); spans must hold at least one of the {} blocks, "
                              "in order, without overlap",
                              i, s.begin, s.end, c.layers));
    }
  }
  tp_ = tp;
  tpRank_ = tpRank;
  ep_ = ep;
  epRank_ = epRank;
  layers_ = c.layers;
  blockUnit_.assign(c.layers, -1);
  expertUnit_.assign(c.layers, -1);
  const bool first = spans_.front().begin == 0, last = spans_.back().end == c.layers;
  // Rows or columns [lo, hi) of `extent` that this rank holds.
  auto cut = [&](size_t extent) { return std::pair<size_t, size_t>(extent * tpRank / tp, extent * (tpRank + 1) / tp); };
  // The whole model is walked in order, so that every tensor gets its offset in the whole layout;
  // only the held units get storage here.
  int unit = -1;
  bool held = false;
  auto add = [&](std::string name, std::vector<int> shape, Init init, Split split = Split::kReplicated, int parts = 1) {
    const size_t rows = static_cast<size_t>(shape[0]);
    const size_t cols = shape.size() > 1 ? static_cast<size_t>(shape[1]) : 1;
    const size_t globalOffset = globalTotal_;
    globalTotal_ += rows * cols;
    if (!held) return;
    ParamTensor t;
    t.name = std::move(name);
    t.globalShape = shape;
    t.shape = shape;
    t.offset = total_;
    t.globalOffset = globalOffset;
    t.unit = unit;
    t.init = init;
    t.decay = shape.size() >= 2;
    t.split = tp == 1 ? Split::kReplicated : split;
    t.counted = t.split != Split::kReplicated || tpRank == 0;
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
    unitCount_[unit] += t.count;
    tensors_.push_back(std::move(t));
  };
  // A held unit gets the next local number.
  auto beginUnit = [&](bool holds) {
    held = holds;
    if (!held) return -1;
    unit = static_cast<int>(unitOffset_.size());
    unitOffset_.push_back(total_);
    unitCount_.push_back(0);
    return unit;
  };
  const int C = c.width;
  const auto [vocabLo, vocabHi] = cut(static_cast<size_t>(c.vocab));
  vocabBegin_ = static_cast<int>(vocabLo);
  vocabCount_ = static_cast<int>(vocabHi - vocabLo);
  embeddingUnit_ = beginUnit(first);
  add("wte.weight", {c.vocab, C}, Init::kNormal, Split::kRows);
  add("wpe.weight", {c.context, C}, Init::kNormal);
  for (int l = 0; l < c.layers; ++l) {
    blockUnit_[l] = beginUnit(
        std::any_of(spans_.begin(), spans_.end(), [&](const LayerSpan& s) { return s.begin <= l && l < s.end; }));
    const std::string p = fmt::format("h.{}.", l);
    add(p + "ln_1.weight", {C}, Init::kOnes);
    add(p + "ln_1.bias", {C}, Init::kZeros);
    add(p + "attn.c_attn.weight", {3 * C, C}, Init::kNormal, Split::kRows, 3);
    add(p + "attn.c_attn.bias", {3 * C}, Init::kZeros, Split::kRows, 3);
    add(p + "attn.c_proj.weight", {C, C}, Init::kResidualNormal, Split::kColumns);
    add(p + "attn.c_proj.bias", {C}, Init::kZeros);
    add(p + "ln_2.weight", {C}, Init::kOnes);
    add(p + "ln_2.bias", {C}, Init::kZeros);
    if (!c.moeLayer(l)) {
      add(p + "mlp.c_fc.weight", {4 * C, C}, Init::kNormal, Split::kRows);
      add(p + "mlp.c_fc.bias", {4 * C}, Init::kZeros, Split::kRows);
      add(p + "mlp.c_proj.weight", {C, 4 * C}, Init::kResidualNormal, Split::kColumns);
      add(p + "mlp.c_proj.bias", {C}, Init::kZeros);
      continue;
    }
    add(p + "mlp.router.weight", {c.moe.experts, C}, Init::kNormal);
    const int H = c.moe.hiddenFor(C), F = c.moe.swiglu ? 2 * H : H, perRank = c.moe.experts / ep;
    // The experts are a unit of their own, right after their block's: data parallelism reduces
    // their gradients over other ranks than the block's (the expert-data-parallel group).
    const bool block = held;
    expertUnit_[l] = beginUnit(block);
    for (int e = 0; e < c.moe.experts; ++e) {
      held = block && e / perRank == epRank;  // the other experts are walked for their whole offsets
      const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
      const size_t before = tensors_.size();
      add(x + "c_fc.weight", {F, C}, Init::kNormal);
      add(x + "c_fc.bias", {F}, Init::kZeros);
      add(x + "c_proj.weight", {C, H}, Init::kResidualNormal);
      add(x + "c_proj.bias", {C}, Init::kZeros);
      for (size_t t = before; t < tensors_.size(); ++t) tensors_[t].expert = e;
    }
    held = block;
  }
  finalNormUnit_ = beginUnit(last);
  add("ln_f.weight", {C}, Init::kOnes);
  add("ln_f.bias", {C}, Init::kZeros);
  headUnit_ = last ? embeddingUnit_ : -1;
  if (last && !first) {
    // The output head is tied to the token embedding, which another pipeline stage holds: this
    // rank keeps a copy of its rows (the same whole-model elements, not counted again); the two
    // copies' gradients are summed before each update.
    const size_t wholeSize = globalTotal_;
    globalTotal_ = 0;
    headUnit_ = beginUnit(true);
    add("lm_head.weight", {c.vocab, C}, Init::kNormal, Split::kRows);
    tensors_.back().counted = false;
    globalTotal_ = wholeSize;
  }
}

double GptConfig::matmulParameters(int layer) const {
  const double C = width;
  if (!moeLayer(layer)) return 12.0 * C * C;
  const double H = moe.hiddenFor(width), F = moe.swiglu ? 2 * H : H;
  return 4.0 * C * C + moe.experts * C + moe.topK * (F * C + C * H);
}

bool ParamLayout::holdsExperts(int unit) const {
  return unit >= 0 && std::find(expertUnit_.begin(), expertUnit_.end(), unit) != expertUnit_.end();
}

ParamLayout::AccessOrder ParamLayout::accessOrder() const {
  if (spans_.size() != 1) {
    throw Error(chorusInvalidUsage, "GPT layout: the access order is defined for one span of layers");
  }
  AccessOrder order;
  auto push = [&](int unit) {
    if (unit >= 0) order.units.push_back(unit);
  };
  push(embeddingUnit_);
  for (int l = spans_[0].begin; l < spans_[0].end; ++l) {
    push(blockUnit_[l]);
    push(expertUnit_[l]);
  }
  push(finalNormUnit_);
  push(headUnit_);
  order.forwardLength = order.units.size();
  push(headUnit_);
  push(finalNormUnit_);
  for (int l = spans_[0].end - 1; l >= spans_[0].begin; --l) {
    push(blockUnit_[l]);
    push(expertUnit_[l]);
  }
  return order;
}

void ParamLayout::toGlobal(const float* local, float* whole, bool countedOnly) const {
  for (const auto& run : runs_) {
    const ParamTensor& t = tensors_[run.tensor];
    if (countedOnly && (!t.counted || (epRank_ != 0 && t.expert < 0))) continue;
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

}  // namespace

Recompute parseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw Error(chorusInvalidArgument,
              fmt::format("activation recompute '{}' is not one of none, selective, full", name));
}

Compute parseCompute(const std::string& name) {
  if (name == "fp32") return Compute::kFp32;
  if (name == "bf16") return Compute::kBf16;
  if (name == "fp16") return Compute::kFp16;
  throw Error(chorusInvalidArgument, fmt::format("compute precision '{}' is not one of fp32, bf16, fp16", name));
}

const char* computeName(Compute compute) {
  switch (compute) {
    case Compute::kFp32:
      return "fp32";
    case Compute::kBf16:
      return "bf16";
    case Compute::kFp16:
      return "fp16";
  }
  return "?";
}

std::vector<int> contextPositions(int seq, int size, int rank) {
  if (size < 1 || rank < 0 || rank >= size || seq < 1 || (size > 1 && seq % (2 * size) != 0)) {
    throw Error(chorusInvalidArgument,
                fmt::format("context parallelism: a sequence of {} positions cannot be cut into 2 x {} equal chunks "
                            "(cp rank {})",
                            seq, size, rank));
  }
  std::vector<int> positions(seq / size);
  const int chunk = seq / (2 * size);
  for (int t = 0; t < static_cast<int>(positions.size()); ++t) {
    positions[t] = size == 1 ? t : (t < chunk ? rank * chunk + t : (2 * size - 1 - rank) * chunk + t - chunk);
  }
  return positions;
}

Gpt::Gpt(const GptConfig& config, int batch, int seq, TensorParallel tp, std::vector<LayerSpan> spans,
         Recompute recompute, ContextParallel cp, ExpertParallel ep, Compute compute, Device device)
    : backend_(makeBackend(device)),
      config_(config),
      tp_(tp),
      layout_(config, tp.size(), tp.rank(), std::move(spans), ep.size(), ep.rank()),
      B_(batch),
      T_(seq / cp.size()),
      Ct_(config.width / tp.size()),
      Ft_(4 * config.width / tp.size()),
      heads_(config.heads / tp.size()),
      sequenceParallel_(tp.sequenceParallel && tp.size() > 1),
      recompute_(recompute),
      compute_(compute),
      format_(compute == Compute::kFp16 ? kn::Float16::kFp16 : kn::Float16::kBf16),
      cp_(cp),
      ep_(ep) {
  if (batch < 1) throw Error(chorusInvalidArgument, fmt::format("GPT: batch = {} (at least 1)", batch));
  if (seq < 1 || seq > config.context) {
    throw Error(chorusInvalidArgument,
                fmt::format("GPT: sequence length {} is not in [1, context = {}]", seq, config.context));
  }
  positions_ = contextPositions(seq, cp.size(), cp.rank());
  make(positionsOn_, positions_.size());
  backend_->fromHost(positionsOn_.data(), positions_.data(), positions_.size() * sizeof(int));
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
  if (tp.size() > 1) {
    // The embedding's position term is added to this rank's rows after the ranks' lookups are summed.
    std::vector<int> rowPositions(Nl);
    for (size_t r = 0; r < Nl; ++r) rowPositions[r] = positions_[(firstRow_ + r) % T_];
    make(rowPositions_, Nl);
    backend_->fromHost(rowPositions_.data(), rowPositions.data(), Nl * sizeof(int));
  }
  for (const auto& span : layout_.spans()) chunks_.push_back(Chunk{span, {}});
  make(dres_, Nl * C);
  make(dln_, N * C);
  make(datty_, N * Ct);
  make(dqkv_, N * 3 * Ct);
  make(dfch_, N * Ft);
  make(dfchGelu_, N * Ft);
  if (sixteen()) {
    make(work_, std::max({Nl * C, N * Ct, N * Ft}));
    make(outWork_, N * std::max(3 * Ct, Ft));
  }
  if (sequenceParallel_) {
    make(wholeRows_, N * C);
    make(dlnRows_, Nl * C);
    make(lnGrad_, 2 * C);
  }
  const bool ring = cp_.size() > 1;
  if (ring) {
    // Nothing of size T x T is kept with ring attention, so selective recompute has nothing to drop.
    // Keys and values travel in the compute type (16 bits: half the bytes); their gradients in fp32.
    for (int i = 0; i < 2; ++i) {
      (sixteen() ? make(ringKv16_[i], N * 2 * Ct) : make(ringKv_[i], N * 2 * Ct));
      make(ringDkv_[i], N * 2 * Ct);
    }
    make(ringMax_, static_cast<size_t>(B_) * heads_ * T_);
    make(ringSum_, ringMax_.size());
  } else if (recompute_ == Recompute::kSelective) {
    make(attScratch_, backend_->attentionKeptBytes(sixteen(), B_, T_, Ct_, heads_));
  }
  if (config_.moe.enabled()) {
    moe_ = std::make_unique<MoeMlp>(config_.moe, config_.width, ep_, sequenceParallel_ ? tp_.comm : nullptr,
                                    sixteen() ? std::optional(format_) : std::nullopt, backend_.get());
    if (sequenceParallel_) make(moeGrad_, moe_->paramFloats());
  }
  if (recompute_ == Recompute::kFull) {
    allocateLayer(recomputed_, !ring, true);
    make(recomputeOut_, Nl * C);
  }
  slotOf(0, 0);  // the first micro-batch's activations, made up front
}

Gpt::~Gpt() = default;

Gpt::Activations& Gpt::slotOf(int c, int slot) {
  Chunk& chunk = chunks_[c];
  if (slot < 0 || slot > static_cast<int>(chunk.slots.size())) {
    throw Error(chorusInvalidUsage,
                fmt::format("GPT: micro-batch slot {} of chunk {} (slots 0..{} exist)", slot, c, chunk.slots.size()));
  }
  if (slot < static_cast<int>(chunk.slots.size())) return *chunk.slots[slot];
  const size_t N = static_cast<size_t>(B_) * T_, Nl = rows_;
  const size_t C = config_.width;
  auto a = std::make_unique<Activations>();
  if (firstChunk(c)) make(a->tokens, N);
  a->residual.resize(chunk.span.layers() + 1);
  for (Buffer<float>& r : a->residual) make(r, Nl * C);
  if (recompute_ != Recompute::kFull) {
    a->layers.resize(chunk.span.layers());
    for (int i = 0; i < chunk.span.layers(); ++i) {
      allocateLayer(a->layers[i], recompute_ == Recompute::kNone && cp_.size() == 1,
                    !config_.moeLayer(chunk.span.begin + i));
    }
  }
  if (lastChunk(c)) {
    const size_t V = layout_.vocabCount();
    make(a->targets, N);
    (sixteen() ? make(a->lnfh, Nl * C) : make(a->lnf, Nl * C));
    make(a->lnfMean, Nl);
    make(a->lnfRstd, Nl);
    if (sequenceParallel_) (sixteen() ? make(a->lnfWholeh, N * C) : make(a->lnfWhole, N * C));
    make(a->logits, N * V);
    make(a->rowMax, N);
    make(a->expSums, (tp_.size() > 1 ? 2 : 1) * N);  // vocab-parallel: the target logits after
    make(a->losses, N);
  }
  chunk.slots.push_back(std::move(a));
  return *chunk.slots.back();
}

void Gpt::allocateLayer(Layer& L, bool withAttention, bool dense) const {
  const size_t N = static_cast<size_t>(B_) * T_, Nl = rows_;
  const size_t C = config_.width, Ct = Ct_, Ft = Ft_;
  // 16-bit compute keeps the linear layers' inputs in 16 bits (see Layer).
  const bool half = sixteen();
  (half ? make(L.ln1h, Nl * C) : make(L.ln1, Nl * C));
  make(L.ln1Mean, Nl);
  make(L.ln1Rstd, Nl);
  (half ? make(L.qkvh, N * 3 * Ct) : make(L.qkv, N * 3 * Ct));
  (half && cp_.size() == 1 ? make(L.attyh, N * Ct) : make(L.atty, N * Ct));
  if (withAttention) make(L.att, backend_->attentionKeptBytes(half, B_, T_, Ct_, heads_));
  if (cp_.size() > 1) make(L.lse, static_cast<size_t>(B_) * heads_ * T_);
  make(L.res2, Nl * C);
  (half && dense ? make(L.ln2h, Nl * C) : make(L.ln2, Nl * C));
  make(L.ln2Mean, Nl);
  make(L.ln2Rstd, Nl);
  if (!dense) return;
  (half ? make(L.fchh, N * Ft) : make(L.fch, N * Ft));
  (half ? make(L.fchGeluh, N * Ft) : make(L.fchGelu, N * Ft));
}

size_t Gpt::Layer::bytes() const {
  const size_t floats = ln1.size() + ln1Mean.size() + ln1Rstd.size() + qkv.size() + atty.size() + lse.size() +
                        res2.size() + ln2.size() + ln2Mean.size() + ln2Rstd.size() + fch.size() + fchGelu.size() +
                        moe.floats();
  const size_t halves = ln1h.size() + qkvh.size() + attyh.size() + ln2h.size() + fchh.size() + fchGeluh.size();
  return floats * sizeof(float) + halves * sizeof(uint16_t) + att.size();
}

size_t Gpt::Activations::bytes() const {
  size_t n = 0;
  for (const auto& r : residual) n += r.size();
  n += lnf.size() + lnfMean.size() + lnfRstd.size() + lnfWhole.size() + logits.size() + rowMax.size() + expSums.size() +
       losses.size();
  n += tokens.size() + targets.size();  // ints are as wide as floats
  size_t bytes = n * sizeof(float) + (lnfh.size() + lnfWholeh.size()) * sizeof(uint16_t);
  for (const auto& L : layers) bytes += L.bytes();
  return bytes;
}

size_t Gpt::activationBytes() const {
  size_t bytes = 0;
  for (const auto& chunk : chunks_) {
    for (const auto& a : chunk.slots) bytes += a->bytes();
  }
  size_t floats = 0;
  floats += dres_.size() + dln_.size() + datty_.size() + dqkv_.size() + dfch_.size() + dfchGelu_.size();
  floats += wholeRows_.size() + dlnRows_.size() + lnGrad_.size();
  floats += recomputeOut_.size() + work_.size() + outWork_.size();
  bytes += recomputed_.bytes() + attScratch_.size() + backend_->scratchBytes() +
           (scratch16_.size() + castWeights_.size() + wholeRows16_.size() + ringKv16_[0].size() + ringKv16_[1].size()) *
               sizeof(uint16_t);
  for (int i = 0; i < 2; ++i) floats += ringKv_[i].size() + ringDkv_[i].size();
  floats += ringMax_.size() + ringSum_.size();
  floats += moeGrad_.size() + (moe_ ? moe_->scratchFloats() : 0);
  return bytes + floats * sizeof(float);
}

std::span<const float> Gpt::logits() const {
  const Chunk& chunk = chunks_.back();
  if (!lastChunk(chunks() - 1) || chunk.slots.empty()) return {};
  return chunk.slots[0]->logits;
}

std::span<const float> Gpt::chunkOutput(int c, int slot) const { return chunks_.at(c).slots.at(slot)->residual.back(); }

double Gpt::flopsPerStep() const {
  // Matmuls: 2 flops per multiply-add, 3x for forward + backward (the input and weight gradients).
  // Parameters used in matmuls: the blocks' weights and the tied head (not wpe, biases, norms).
  const double T = static_cast<double>(T_) * cp_.size();  // the whole sequence
  const double N = B_ * T;
  const double C = config_.width;
  double matmulParams = static_cast<double>(config_.vocab) * C;
  for (int l = 0; l < config_.layers; ++l) matmulParams += config_.matmulParameters(l);
  // Attention: q k^T and P v, each 2 T C per token per layer, also 3x.
  const double attention = config_.layers * 2.0 * 2.0 * T * C;
  return 6.0 * N * matmulParams + 3.0 * N * attention;
}

void Gpt::attention(Layer& L, float* out) {
  const void* qkv = sixteen() ? static_cast<const void*>(L.qkvh.data()) : L.qkv.data();
  backend_->attentionForward(sixteen(), format_, out, attOf(L), qkv, B_, T_, Ct_, heads_);
}

void Gpt::attentionBackward(Layer& L, const float* out) {
  const void* qkv = sixteen() ? static_cast<const void*>(L.qkvh.data()) : L.qkv.data();
  backend_->attentionBackward(sixteen(), format_, dqkv_.data(), datty_.data(), out, qkv, attOf(L), B_, T_, Ct_, heads_);
}

void Gpt::blockForward(const float* weights, const float* experts, Layer& L, const float* in, float* out, int layer) {
  const int B = B_, T = T_, C = config_.width, N = B * T;
  const int Ct = Ct_, Ft = Ft_, Nl = rows_;
  const size_t NlC = static_cast<size_t>(Nl) * C;
  const bool split = tp_.size() > 1;
  const auto w = blockPtrs<const float*>(weights, C, Ct, Ft);
  const auto wh = sixteen() ? blockPtrs(castWeights(weights, layout_.unitCount(layout_.blockUnit(layer))), C, Ct, Ft)
                            : BlockPtrs<const uint16_t*>{};
  float* ln1 = madeIn(L.ln1, work_);
  backend_->layernormForward(ln1, L.ln1Mean.data(), L.ln1Rstd.data(), in, w.ln1w, w.ln1b, Nl, C);
  float* qkv = madeIn(L.qkv, outWork_);
  linearForward(qkv, gathered(operand(ln1, L.ln1h, NlC)), w.qkvw, wh.qkvw, w.qkvb, N, C, 3 * Ct);
  keep(qkv, L.qkvh, static_cast<size_t>(N) * 3 * Ct);
  float* atty = madeIn(L.atty, work_);
  if (cp_.size() > 1) {
    ringAttention(L, Pass::kForward);  // from L.qkv (or L.qkvh) into L.atty, kept in fp32 with context parallelism
  } else {
    attention(L, atty);
  }
  const Operand attyIn = operand(atty, L.attyh, static_cast<size_t>(N) * Ct);
  // The projection's output goes to `out` for a moment, then the residual sum into res2. Row
  // parallel: each rank's heads give a partial sum; the bias is added to the total.
  if (!split) {
    linearForward(out, attyIn, w.projw, wh.projw, w.projb, N, C, C);
  } else {
    linearForward(partialFor(out), attyIn, w.projw, wh.projw, nullptr, N, Ct, C);
    sumRows(partialFor(out), out);
    backend_->addRows(out, C, w.projb, 0, C, Nl);  // the bias, once the partial sums are summed
  }
  backend_->residualForward(L.res2.data(), in, out, NlC);
  float* ln2 = madeIn(L.ln2, work_);
  backend_->layernormForward(ln2, L.ln2Mean.data(), L.ln2Rstd.data(), L.res2.data(), w.ln2w, w.ln2b, Nl, C);
  if (config_.moeLayer(layer)) {
    moeForward(w.fcw, experts, L, out);  // the router's weight is where the dense MLP's would start
    backend_->residualForward(out, L.res2.data(), out, NlC);
    return;
  }
  float* fch = madeIn(L.fch, outWork_);
  linearForward(fch, gathered(operand(ln2, L.ln2h, NlC)), w.fcw, wh.fcw, w.fcb, N, C, Ft);
  keep(fch, L.fchh, static_cast<size_t>(N) * Ft);
  float* fchGelu = madeIn(L.fchGelu, work_);
  backend_->geluForward(fchGelu, fch, static_cast<size_t>(N) * Ft);
  const Operand geluIn = operand(fchGelu, L.fchGeluh, static_cast<size_t>(N) * Ft);
  if (!split) {
    linearForward(out, geluIn, w.fcprojw, wh.fcprojw, w.fcprojb, N, 4 * C, C);
  } else {
    linearForward(partialFor(out), geluIn, w.fcprojw, wh.fcprojw, nullptr, N, Ft, C);
    sumRows(partialFor(out), out);
    backend_->addRows(out, C, w.fcprojb, 0, C, Nl);
  }
  backend_->residualForward(out, L.res2.data(), out, NlC);
}

void Gpt::checkTokens(const int* values, const char* what) const {
  const int N = B_ * T_, V = config_.vocab;
  for (int i = 0; i < N; ++i) {
    if (values[i] < 0 || values[i] >= V) {
      throw Error(chorusInvalidArgument,
                  fmt::format("GPT forward: {} {} at batch row {}, position {} is not in [0, vocab = {})", what,
                              values[i], i / T_, i % T_, V));
    }
  }
}

float Gpt::forward(const int* tokens, const int* targets, UnitAccess& access) {
  if (chunks() != 1 || !firstChunk(0) || !lastChunk(0)) {
    throw Error(chorusInvalidUsage, "GPT forward: this rank holds part of the model; use forwardChunk");
  }
  return forwardChunk(0, 0, tokens, nullptr, targets, access);
}

void Gpt::backward(UnitAccess& access, float lossScale) { backwardChunk(0, 0, nullptr, access, lossScale); }

float Gpt::forwardChunk(int c, int slot, const int* tokens, const float* input, const int* targets,
                        UnitAccess& access) {
  const bool first = firstChunk(c), last = lastChunk(c);
  if (first) checkTokens(tokens, "token");
  if (last && targets != nullptr) checkTokens(targets, "target");
  if (!first && input == nullptr) {
    throw Error(chorusInvalidUsage, fmt::format("GPT forward: chunk {} (blocks {}..{}) needs the previous chunk's "
                                                "output",
                                                c, chunks_[c].span.begin, chunks_[c].span.end - 1));
  }
  Activations& a = slotOf(c, slot);
  const LayerSpan span = chunks_[c].span;
  const int B = B_, T = T_, C = config_.width;
  const int N = B * T;
  const bool split = tp_.size() > 1;
  a.moe = MoeSummary{};
  const int v0 = layout_.vocabBegin(), Vt = layout_.vocabCount();
  const int Nl = rows_;
  const size_t NlC = static_cast<size_t>(Nl) * C;

  if (first) {
    backend_->fromHost(a.tokens.data(), tokens, a.tokens.size() * sizeof(int));
    const float* embed = access.acquire(layout_.embeddingUnit(), Pass::kForward);
    const float* wpe = embed + static_cast<size_t>(Vt) * C;
    if (!split) {
      backend_->embeddingForward(a.residual[0].data(), a.tokens.data(), embed, wpe, B, T, C, 0, Vt,
                                 positionsOn_.data());
    } else {
      // Each rank looks up the tokens of its vocabulary rows (zeros for the others); the sum is the
      // embedding, and the position term is added once, to this rank's rows.
      float* lookup = partialFor(a.residual[0].data());
      backend_->embeddingForward(lookup, a.tokens.data(), embed, nullptr, B, T, C, v0, Vt, nullptr);
      sumRows(lookup, a.residual[0].data());
      backend_->addIndexedRows(a.residual[0].data(), wpe, rowPositions_.data(), C, Nl);
    }
    access.release(layout_.embeddingUnit(), Pass::kForward);
  } else {
    backend_->copy(a.residual[0].data(), input, NlC * sizeof(float));
  }

  for (int i = 0; i < span.layers(); ++i) {
    const int unit = layout_.blockUnit(span.begin + i);
    Layer& L = layerOf(a, i);
    const int expertUnit = layout_.expertUnit(span.begin + i);
    const float* weights = access.acquire(unit, Pass::kForward);
    const float* experts = expertUnit >= 0 ? access.acquire(expertUnit, Pass::kForward) : nullptr;
    blockForward(weights, experts, L, a.residual[i].data(), a.residual[i + 1].data(), span.begin + i);
    if (expertUnit >= 0) access.release(expertUnit, Pass::kForward);
    access.release(unit, Pass::kForward);
    if (config_.moeLayer(span.begin + i)) {
      a.moe.add(L.moe, moe_->weightedLoss(L.moe));
      moeTotals_.add(L.moe, moe_->weightedLoss(L.moe));
    }
  }
  if (!last) return 0.0f;

  const int lnfUnit = layout_.finalNormUnit();
  const float* lnf = access.acquire(lnfUnit, Pass::kForward);
  float* lnfMade = madeIn(a.lnf, work_);
  backend_->layernormForward(lnfMade, a.lnfMean.data(), a.lnfRstd.data(), a.residual.back().data(), lnf, lnf + C, Nl,
                             C);
  access.release(lnfUnit, Pass::kForward);
  // The head sees every row: with sequence parallelism the final layernorm's rows are gathered
  // (and kept for backward's weight gradient).
  Operand lnfRows = operand(lnfMade, a.lnfh, NlC);
  if (sequenceParallel_) {
    if (sixteen()) {
      tp_.comm->allGather(std::span<const BFloat16>(reinterpret_cast<const BFloat16*>(a.lnfh.data()), a.lnfh.size()),
                          std::span<BFloat16>(reinterpret_cast<BFloat16*>(a.lnfWholeh.data()), a.lnfWholeh.size()));
      lnfRows = Operand{nullptr, a.lnfWholeh.data()};
    } else {
      tp_.comm->allGather(std::span<const float>(a.lnf), std::span<float>(a.lnfWhole));
      lnfRows = Operand{a.lnfWhole.data(), nullptr};
    }
  }

  const float* wte = access.acquire(layout_.headUnit(), Pass::kForward);
  const size_t headCount = static_cast<size_t>(Vt) * C;
  linearForward(a.logits.data(), lnfRows, wte, sixteen() ? castWeights(wte, headCount) : nullptr, nullptr, N, C, Vt);
  access.release(layout_.headUnit(), Pass::kForward);
  a.haveTargets = targets != nullptr;
  if (!a.haveTargets) return 0.0f;
  backend_->fromHost(a.targets.data(), targets, a.targets.size() * sizeof(int));
  if (!split) {
    return backend_->crossEntropyForward(a.rowMax.data(), a.expSums.data(), a.losses.data(), a.logits.data(),
                                         a.targets.data(), N, Vt);
  }
  // Vocab-parallel cross-entropy: the row maxima, then the exponential sums and target logits,
  // reduced over the ranks between the passes.
  backend_->crossEntropyShardMax(a.rowMax.data(), a.logits.data(), N, Vt);
  tpSum(a.rowMax, ReduceOp::kMax);
  float* targetLogits = a.expSums.data() + N;
  backend_->crossEntropyShardExp(a.expSums.data(), targetLogits, a.logits.data(), a.rowMax.data(), a.targets.data(), N,
                                 Vt, v0);
  tpSum(a.expSums);
  return backend_->crossEntropyShardLoss(a.losses.data(), a.expSums.data(), a.rowMax.data(), targetLogits, N);
}

void Gpt::MoeSummary::add(const MoeActivations& block, double weightedLoss) {
  expertChoices.resize(block.assigned.size(), 0);
  for (size_t e = 0; e < block.assigned.size(); ++e) expertChoices[e] += block.assigned[e];
  ++layers;
  aux += block.aux;
  z += block.z;
  weighted += weightedLoss;
  dropped += block.dropped;
}

Gpt::MoeSummary Gpt::takeMoeTotals() { return std::exchange(moeTotals_, MoeSummary{}); }

void Gpt::moeForward(const float* router, const float* experts, Layer& L, float* out) {
  // Each rank's rows go through the layer: all of them on every tp rank (the same work), or this
  // rank's block with sequence parallelism.
  moe_->forward(out, L.ln2.data(), rows_, router, experts, L.moe);
}

void Gpt::moeBackward(const float* router, const float* experts, float* dRouter, float* dExperts, Layer& L,
                      float* dlnRows, float lossScale) {
  backend_->zero(dlnRows, static_cast<size_t>(rows_) * config_.width * sizeof(float));
  if (!sequenceParallel_) {
    moe_->backward(dlnRows, dRouter, dExperts, dres_.data(), L.ln2.data(), router, experts, L.moe, lossScale);
    return;
  }
  // This rank's rows give part of the gradients (the router's, then the experts'): summed over
  // the tp group, then added.
  backend_->zero(moeGrad_.data(), moeGrad_.size() * sizeof(float));
  const size_t routerFloats = moe_->routerFloats();
  moe_->backward(dlnRows, moeGrad_.data(), moeGrad_.data() + routerFloats, dres_.data(), L.ln2.data(), router, experts,
                 L.moe, lossScale);
  tpSum(moeGrad_);
  backend_->residualForward(dRouter, dRouter, moeGrad_.data(), routerFloats);
  backend_->residualForward(dExperts, dExperts, moeGrad_.data() + routerFloats, moeGrad_.size() - routerFloats);
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

Gpt::Operand Gpt::operand(const float* made, Buffer<uint16_t>& half, size_t count) {
  if (!sixteen()) return Operand{made, nullptr};
  uint16_t* to = half.data();
  if (half.empty()) {
    if (scratch16_.size() < count) make(scratch16_, count);  // grows only: its size is what it holds
    to = scratch16_.data();
  }
  backend_->toFloat16(format_, made, to, count);
  return Operand{nullptr, to};
}

void Gpt::keep(float* made, Buffer<uint16_t>& half, size_t count) {
  if (!sixteen()) return;
  uint16_t* to = half.data();
  if (half.empty()) {  // kept in fp32 (context parallelism): rounded all the same, as every layout rounds it
    if (scratch16_.size() < count) make(scratch16_, count);  // grows only: its size is what it holds
    to = scratch16_.data();
  }
  backend_->toFloat16(format_, made, to, count);
  backend_->fromFloat16(format_, to, made, count);  // forward goes on with what backward will see
}

const float* Gpt::widened(Buffer<float>& full, Buffer<uint16_t>& half) {
  if (!full.empty()) return full.data();
  backend_->fromFloat16(format_, half.data(), work_.data(), half.size());
  return work_.data();
}

Gpt::Operand Gpt::keptOperand(Buffer<float>& full, Buffer<uint16_t>& half) {
  if (!sixteen()) return Operand{full.data(), nullptr};
  if (!half.empty()) return Operand{nullptr, half.data()};
  return operand(full.data(), half, full.size());  // kept in fp32: cast for the product
}

Gpt::Operand Gpt::gathered(Operand rows) {
  if (!sequenceParallel_) return rows;
  if (rows.f32 != nullptr) return Operand{gatherRows(rows.f32), nullptr};
  const size_t count = static_cast<size_t>(rows_) * config_.width;
  if (wholeRows16_.size() != count * tp_.size()) make(wholeRows16_, count * tp_.size());
  // A gather moves bytes: the 16-bit values travel as BFloat16 whichever format they are.
  tp_.comm->allGather(std::span<const BFloat16>(reinterpret_cast<const BFloat16*>(rows.h), count),
                      std::span<BFloat16>(reinterpret_cast<BFloat16*>(wholeRows16_.data()), wholeRows16_.size()));
  return Operand{nullptr, wholeRows16_.data()};
}

const uint16_t* Gpt::castWeights(const float* weights, size_t count) {
  if (castWeights_.size() < count) make(castWeights_, count);
  backend_->toFloat16(format_, weights, castWeights_.data(), count);
  return castWeights_.data();
}

void Gpt::linearForward(float* out, Operand in, const float* w, const uint16_t* wh, const float* bias, int n, int c,
                        int oc) {
  if (sixteen()) {
    backend_->matmulForward16(format_, out, in.h, wh, bias, n, c, oc);
  } else {
    backend_->matmulForward(out, in.f32, w, bias, n, c, oc);
  }
}

void Gpt::linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, Operand in, const float* w,
                         const uint16_t* wh, int n, int c, int oc) {
  if (sixteen()) {
    backend_->matmulBackward16(format_, dinp, dweight, dbias, dout, in.h, wh, n, c, oc);
  } else {
    backend_->matmulBackward(dinp, dweight, dbias, dout, in.f32, w, n, c, oc);
  }
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
    backend_->layernormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows_, C);
    return;
  }
  // This rank's rows give a part of the weight and bias gradients: summed over the tp group, then
  // added to the accumulated gradients.
  backend_->zero(lnGrad_.data(), lnGrad_.size() * sizeof(float));
  backend_->layernormBackward(dinp, lnGrad_.data(), lnGrad_.data() + C, dout, inp, weight, mean, rstd, rows_, C);
  tpSum(lnGrad_);
  backend_->residualForward(dweight, dweight, lnGrad_.data(), C);
  backend_->residualForward(dbias, dbias, lnGrad_.data() + C, C);
}

void Gpt::backwardChunk(int c, int slot, const float* doutput, UnitAccess& access, float lossScale) {
  const bool first = firstChunk(c), last = lastChunk(c);
  Activations& a = slotOf(c, slot);
  if (last && !a.haveTargets) throw Error(chorusInvalidUsage, "GPT backward: the last forward had no targets");
  if (!last && doutput == nullptr) {
    throw Error(chorusInvalidUsage, fmt::format("GPT backward: chunk {} needs the gradient of its output", c));
  }
  const LayerSpan span = chunks_[c].span;
  const int B = B_, T = T_, C = config_.width;
  const int N = B * T;
  const int v0 = layout_.vocabBegin(), Vt = layout_.vocabCount();
  const int Ct = Ct_, Ft = Ft_;
  auto zero = [&](Buffer<float>& v) { backend_->zero(v.data(), v.size() * sizeof(float)); };
  // Input gradients of the column-parallel layers are partial sums over whole rows (dln_); this
  // rank's rows of their total go to dlnRows (the same buffer without sequence parallelism).
  float* dlnRows = sequenceParallel_ ? dlnRows_.data() : dln_.data();
  // The row-parallel layers and the embedding take every row of dres.
  auto dresWhole = [&]() -> const float* {
    if (!sequenceParallel_) return dres_.data();
    tp_.comm->allGather(std::span<const float>(dres_), std::span<float>(wholeRows_));
    return wholeRows_.data();
  };

  if (last) {
    // The loss and the head: dlogits from the logits and the forward's row statistics (in place,
    // or in 16-bit compute straight into the head's 16-bit operand where the backend can), then
    // dlnf (into dln_) and dwte. With tp, each
    // rank's vocabulary columns give a part of dlnf: summed over the ranks.
    const float scale = lossScale / static_cast<float>(N);
    const int head = layout_.headUnit();
    const float* wte = access.acquire(head, Pass::kBackward);
    zero(dln_);
    const Operand lnfRows = sequenceParallel_ ? keptOperand(a.lnfWhole, a.lnfWholeh) : keptOperand(a.lnf, a.lnfh);
    if (sixteen()) {
      backend_->crossEntropyHeadBackward16(format_, dln_.data(), access.gradients(head), a.logits.data(),
                                           a.rowMax.data(), a.expSums.data(), a.targets.data(), lnfRows.h,
                                           castWeights(wte, static_cast<size_t>(Vt) * C), N, C, Vt, scale, v0);
    } else {
      backend_->crossEntropyBackward(a.logits.data(), a.logits.data(), a.rowMax.data(), a.expSums.data(),
                                     a.targets.data(), N, Vt, scale, v0);
      linearBackward(dln_.data(), access.gradients(head), nullptr, a.logits.data(), lnfRows, wte, nullptr, N, C, Vt);
    }
    a.haveTargets = false;  // logits may hold the gradient now: a second backward needs a new forward
    access.release(head, Pass::kBackward);
    if (head != layout_.embeddingUnit()) access.gradientsDone(head);
    sumRows(dln_.data(), dlnRows);
    const int u = layout_.finalNormUnit();
    const float* lnf = access.acquire(u, Pass::kBackward);
    float* g = access.gradients(u);
    zero(dres_);
    layernormBackwardRows(dres_.data(), g, g + C, dlnRows, a.residual.back().data(), lnf, a.lnfMean.data(),
                          a.lnfRstd.data());
    access.release(u, Pass::kBackward);
    access.gradientsDone(u);
  } else {
    backend_->copy(dres_.data(), doutput, dres_.size() * sizeof(float));
  }

  // dres_ holds d(residual[i + 1]) (this rank's rows); each block turns it into d(residual[i]).
  // The row-parallel layers take the whole dres (their input gradients are this rank's columns);
  // the column-parallel layers' input gradients are partial sums, summed over the ranks (the
  // conjugate of the forward all-reduce, or reduce-scatter with sequence parallelism).
  for (int i = span.layers() - 1; i >= 0; --i) {
    const int u = layout_.blockUnit(span.begin + i);
    const int expertUnit = layout_.expertUnit(span.begin + i);
    const float* weights = access.acquire(u, Pass::kBackward);
    const float* experts = expertUnit >= 0 ? access.acquire(expertUnit, Pass::kBackward) : nullptr;
    const auto w = blockPtrs<const float*>(weights, C, Ct, Ft);
    const auto g = blockPtrs<float*>(access.gradients(u), C, Ct, Ft);
    Layer& L = layerOf(a, i);
    // Recompute what the block did not keep: the whole block from its input, or the attention
    // probabilities from q, k, v (the output goes to datty_, which is rewritten before it is read).
    if (recompute_ == Recompute::kFull) {
      blockForward(weights, experts, L, a.residual[i].data(), recomputeOut_.data(), span.begin + i);
    }
    const auto wh =
        sixteen() ? blockPtrs(castWeights(weights, layout_.unitCount(u)), C, Ct, Ft) : BlockPtrs<const uint16_t*>{};
    if (recompute_ == Recompute::kSelective && cp_.size() == 1) attention(L, datty_.data());
    if (config_.moeLayer(span.begin + i)) {
      moeBackward(w.fcw, experts, g.fcw, access.gradients(expertUnit), L, dlnRows, lossScale);
      access.release(expertUnit, Pass::kBackward);
      access.gradientsDone(expertUnit);
    } else {
      // out = res2 + fcproj(gelu(fc(ln2(res2)))): d(fcproj output) = dres.
      zero(dfchGelu_);
      linearBackward(dfchGelu_.data(), g.fcprojw, g.fcprojb, dresWhole(), keptOperand(L.fchGelu, L.fchGeluh), w.fcprojw,
                     wh.fcprojw, N, Ft, C);
      zero(dfch_);
      backend_->geluBackward(dfch_.data(), widened(L.fch, L.fchh), dfchGelu_.data(), static_cast<size_t>(N) * Ft);
      zero(dln_);
      linearBackward(dln_.data(), g.fcw, g.fcb, dfch_.data(), gathered(keptOperand(L.ln2, L.ln2h)), w.fcw, wh.fcw, N, C,
                     Ft);
      sumRows(dln_.data(), dlnRows);
    }
    // dres becomes d(res2): the residual path plus the path through ln2.
    layernormBackwardRows(dres_.data(), g.ln2w, g.ln2b, dlnRows, L.res2.data(), w.ln2w, L.ln2Mean.data(),
                          L.ln2Rstd.data());
    // res2 = in + proj(attention(qkv(ln1(in)))): d(proj output) = d(res2).
    zero(datty_);
    linearBackward(datty_.data(), g.projw, g.projb, dresWhole(), keptOperand(L.atty, L.attyh), w.projw, wh.projw, N, Ct,
                   C);
    zero(dqkv_);
    if (cp_.size() > 1) {
      ringAttention(L, Pass::kBackward);
    } else {
      // (a 16-bit kept output is widened only for a backend that reads it)
      attentionBackward(L, backend_->attentionBackwardReadsOutput() ? widened(L.atty, L.attyh) : nullptr);
    }
    zero(dln_);
    linearBackward(dln_.data(), g.qkvw, g.qkvb, dqkv_.data(), gathered(keptOperand(L.ln1, L.ln1h)), w.qkvw, wh.qkvw, N,
                   C, 3 * Ct);
    sumRows(dln_.data(), dlnRows);
    layernormBackwardRows(dres_.data(), g.ln1w, g.ln1b, dlnRows, a.residual[i].data(), w.ln1w, L.ln1Mean.data(),
                          L.ln1Rstd.data());
    access.release(u, Pass::kBackward);
    access.gradientsDone(u);
  }

  if (first) {
    const int u = layout_.embeddingUnit();
    float* gEmbed = access.gradients(u);
    backend_->embeddingBackward(gEmbed, gEmbed + static_cast<size_t>(Vt) * C, dresWhole(), a.tokens.data(), B, T, C, v0,
                                Vt, positionsOn_.data());
    access.gradientsDone(u);
  }
}

// ---- ring attention ----
//
// Step s of cp: this rank holds the keys and values of cp rank (r - s) mod cp, passes them on to
// r + 1 and takes the next from r - 1 while it attends to them. Each rank's two chunks (its query
// halves) meet each block's two chunks (key halves): a key chunk before the query chunk is attended
// whole, the same chunk causally, a later one not at all. The blocks hold k and v of each row side
// by side (2 Ct floats).

namespace {

// The chunk of the whole sequence (of 2 cp) that half h of cp rank r's positions is.
int chunkOf(int r, int h, int cp) { return h == 0 ? r : 2 * cp - 1 - r; }

// Waits for a ring transfer; a failed or timed-out one names the step and the peers.
void finish(Request& r, const std::string& what, int step, int peerTo, int peerFrom) {
  try {
    r.wait();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("ring attention, step {}: {} (to cp rank {}, from cp rank {}): {}", step, what,
                                      peerTo, peerFrom, e.what()));
  }
}

}  // namespace

void Gpt::ringAttention(Layer& L, Pass pass) {
  const bool forward = pass == Pass::kForward;
  const int cp = cp_.size(), r = cp_.rank(), next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  const int B = B_, T = T_, Tc = T_ / 2, Ct = Ct_, NH = heads_;
  const size_t N = static_cast<size_t>(B) * T;
  // Every sequence of the micro-batch in one call per block pair: sequence b's rows T apart, its
  // statistics NH T floats apart.
  const Backend::Batch sequences{B, static_cast<size_t>(T), static_cast<size_t>(T), static_cast<size_t>(NH) * T};
  // Forward: the output accumulates unnormalised beside each row's running max and sum. Backward:
  // delta (the row dot products of the output and its gradient) takes the sums' place, and this
  // rank's block starts its way round with zero gradients.
  float* delta = ringSum_.data();
  if (forward) {
    backend_->zero(L.atty.data(), L.atty.size() * sizeof(float));
    backend_->fill(ringMax_.data(), ringMax_.size(), -std::numeric_limits<float>::infinity());
    backend_->zero(ringSum_.data(), ringSum_.size() * sizeof(float));
  } else {
    backend_->attentionBlockDelta(delta, T, datty_.data(), L.atty.data(), Ct, T, Ct, NH, sequences);
    backend_->zero(ringDkv_[0].data(), ringDkv_[0].size() * sizeof(float));
  }
  // q, k and v in the compute type: fp32, or 16 bits (their bits travel as BFloat16 either way).
  // This rank's keys and values start the ring: each row's k and v, side by side.
  const bool half = sixteen();
  if (half) {
    backend_->copyRows(ringKv16_[0].data(), 2 * Ct * sizeof(uint16_t), L.qkvh.data() + Ct, 3 * Ct * sizeof(uint16_t),
                       2 * Ct * sizeof(uint16_t), N);
  } else {
    backend_->copyRows(ringKv_[0].data(), 2 * Ct * sizeof(float), L.qkv.data() + Ct, 3 * Ct * sizeof(float),
                       2 * Ct * sizeof(float), N);
  }
  // One ring transfer, this rank's block to the next while the previous rank's arrives. On the
  // CPU non-blocking calls straight between the buffers, which finish() waits for; on a device a
  // group of a device send and receive on the context-parallel lane, after the compute queue's
  // work so far (which wrote the block that leaves and last read the buffer it arrives in), and
  // land() has the compute queue wait for it before anything reads what arrived.
  const bool onDevice = backend_->device() != Device::kCpu;
  constexpr int kLane = Backend::kContextParallelLane;
  Backend::Mark arrived;
  auto start = [&]<typename T>(const T* from, T* to, size_t n, Request& send, Request& recv) {
    if (!onDevice) {
      send = cp_.comm->isend(std::span<const T>(from, n), next);
      recv = cp_.comm->irecv(std::span<T>(to, n), prev);
      return;
    }
    backend_->wait(Backend::Queue::kComm, backend_->mark(Backend::Queue::kCompute), kLane);
    const auto stream = static_cast<chorusStream_t>(backend_->stream(Backend::Queue::kComm, kLane));
    chorus::group([&] {
      cp_.comm->send(std::span<const T>(from, n), next, stream);
      cp_.comm->recv(std::span<T>(to, n), prev, stream);
    });
    arrived = backend_->mark(Backend::Queue::kComm, kLane);
  };
  // Waits for a transfer (on a device: the compute queue waits), naming the step where it failed.
  auto complete = [&](Request& send, Request& recv, const char* what, int step) {
    if (!onDevice) {
      finish(recv, std::string("receiving ") + what, step, next, prev);
      finish(send, std::string("sending ") + what, step, next, prev);
      return;
    }
    backend_->wait(Backend::Queue::kCompute, std::exchange(arrived, nullptr));
  };
  auto as16 = [](Buffer<uint16_t>& v) { return reinterpret_cast<BFloat16*>(v.data()); };
  for (int s = 0; s < cp; ++s) {
    const int owner = (r - s + cp) % cp;
    const float* kv = half ? nullptr : ringKv_[s % 2].data();
    const uint16_t* kv16 = half ? ringKv16_[s % 2].data() : nullptr;
    Buffer<float>& dkv = ringDkv_[s % 2];
    Request send, recv;
    if (s + 1 < cp) {
      if (half) {
        start(static_cast<const BFloat16*>(as16(ringKv16_[s % 2])), as16(ringKv16_[(s + 1) % 2]),
              ringKv16_[s % 2].size(), send, recv);
      } else {
        start(static_cast<const float*>(ringKv_[s % 2].data()), ringKv_[(s + 1) % 2].data(), ringKv_[s % 2].size(),
              send, recv);
      }
    }
    for (int qh = 0; qh < 2; ++qh) {
      for (int kh = 0; kh < 2; ++kh) {
        const int qChunk = chunkOf(r, qh, cp), kChunk = chunkOf(owner, kh, cp);
        if (kChunk > qChunk) continue;
        const size_t qRow = static_cast<size_t>(qh) * Tc, kRow = static_cast<size_t>(kh) * Tc;
        const size_t stat = static_cast<size_t>(qh) * Tc;
        float* dk = dkv.data() + kRow * 2 * Ct;
        // One block in the compute type: fp32, or 16 bits from L.qkvh and the 16-bit ring.
        auto attend = [&](const auto* qkv, const auto* keysValues) {
          using Element = std::remove_cv_t<std::remove_pointer_t<decltype(qkv)>>;
          const kn::AttentionBlockOf<Element> blk{.q = qkv + qRow * 3 * Ct,
                                                  .qStride = 3 * Ct,
                                                  .k = keysValues + kRow * 2 * Ct,
                                                  .v = keysValues + kRow * 2 * Ct + Ct,
                                                  .kvStride = 2 * Ct,
                                                  .Tq = Tc,
                                                  .Tk = Tc,
                                                  .C = Ct,
                                                  .NH = NH,
                                                  .diagonal = kChunk == qChunk,
                                                  .format = format_};
          if (forward) {
            backend_->attentionBlockForward(blk, sequences, L.atty.data() + qRow * Ct, Ct, ringMax_.data() + stat,
                                            ringSum_.data() + stat, T);
          } else {
            backend_->attentionBlockBackward(blk, sequences, datty_.data() + qRow * Ct, Ct, L.lse.data() + stat,
                                             delta + stat, T, dqkv_.data() + qRow * 3 * Ct, 3 * Ct, dk, dk + Ct,
                                             2 * Ct);
          }
        };
        if (half) {
          attend(L.qkvh.data(), kv16);
        } else {
          attend(L.qkv.data(), kv);
        }
        if (s + 1 < cp && !onDevice) recv.test();  // progress the transfer between blocks of work
      }
    }
    if (s + 1 < cp) complete(send, recv, "keys and values", s);
    if (!forward) {
      // The block's key and value gradients go on with it; after the last step, home to their
      // owner (r + 1's block is the one held last), and this rank's own come back from r - 1.
      Request dsend, drecv;
      start(static_cast<const float*>(dkv.data()), ringDkv_[(s + 1) % 2].data(), dkv.size(), dsend, drecv);
      complete(dsend, drecv, "key and value gradients", s);
    }
  }
  if (forward) {
    backend_->attentionBlockFinish(L.atty.data(), Ct, L.lse.data(), ringMax_.data(), ringSum_.data(), T, T, Ct, NH,
                                   sequences);
  } else {
    backend_->addRows(dqkv_.data() + Ct, 3 * Ct, ringDkv_[cp % 2].data(), 2 * Ct, 2 * Ct, N);
  }
}

}  // namespace chorus::training
