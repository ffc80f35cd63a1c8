// planner.cc: the memory, FLOPs, communication and time model of a training layout (see planner.h).
#include "src/training/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <tuple>

#include "chorus/chorus.hpp"
#include "chorus/error.hpp"
#include "src/training/trainer.h"

namespace chorus::training {

namespace {

Error invalid(const std::string& what) { return Error(chorusInvalidArgument, "plan: " + what); }

double normParameters(const ModelShape& m) { return m.layerNorm ? 2.0 * m.hidden : m.hidden; }
double kvWidth(const ModelShape& m) { return static_cast<double>(m.kv()) * m.headDim(); }
double mlpMatrices(const ModelShape& m) { return m.gated ? 3.0 : 2.0; }
double expertMatrices(const ModelShape& m) { return m.gatedExperts ? 3.0 : 2.0; }
double attentionMatmulParameters(const ModelShape& m) {
  const double h = m.hidden;
  return 2.0 * h * h + 2.0 * h * kvWidth(m);
}
double expertMatmulParameters(const ModelShape& m) {
  return expertMatrices(m) * static_cast<double>(m.hidden) * m.expertUnits();
}
// An expert's biases: its first layer's (cut over tp, as the MLP's column-parallel layer) and its
// output's (hidden, replicated).
double expertFirstBiases(const ModelShape& m) {
  return m.biases ? (m.gatedExperts ? 2.0 : 1.0) * m.expertUnits() : 0.0;
}
double expertOutputBiases(const ModelShape& m) { return m.biases ? static_cast<double>(m.hidden) : 0.0; }
// The weights a block multiplies by (its matmuls): q, k, v, the attention output, the MLP; an MoE
// block's router and, of its experts, those a token uses (active) or all of them.
double blockMatmulParameters(const ModelShape& m, bool moe = false, bool active = true) {
  const double h = m.hidden;
  if (!moe) return attentionMatmulParameters(m) + mlpMatrices(m) * h * m.ffnUnits();
  const double experts = (active ? m.topK : m.experts) + m.sharedExperts;
  return attentionMatmulParameters(m) + m.experts * h + experts * expertMatmulParameters(m);
}
// The attention's biases (q, k, v and the output's).
double attentionBiases(const ModelShape& m) { return m.biases ? 2.0 * m.hidden + 2.0 * kvWidth(m) : 0.0; }
// A block's parameters, its MoE experts counted as blockMatmulParameters counts them.
double blockParametersOf(const ModelShape& m, bool moe, bool active) {
  const double h = m.hidden, F = m.ffnUnits();
  double n = blockMatmulParameters(m, moe, active) + 2.0 * normParameters(m) + attentionBiases(m);
  if (!moe) return n + (m.biases ? (m.gated ? 2.0 : 1.0) * F + h : 0.0);
  const double experts = (active ? m.topK : m.experts) + m.sharedExperts;
  return n + experts * (expertFirstBiases(m) + expertOutputBiases(m));
}
// Rank 0's rows of a vocabulary cut over tp ranks as ParamLayout cuts it.
double vocabShard(const ModelShape& m, int tp) { return static_cast<double>(m.vocab / tp); }

}  // namespace

const char* const kModelPresets =
    "gpt2-124m, gpt2-1.5b, gpt3-175b, llama3-8b, llama3-70b, mixtral-8x7b, deepseek-moe-16b";

int ModelShape::moeBlocks(int begin, int end) const {
  int n = 0;
  for (int l = begin; l < end; ++l) n += moeBlock(l);
  return n;
}

double ModelShape::expertParameters() const {
  return expertMatmulParameters(*this) + expertFirstBiases(*this) + expertOutputBiases(*this);
}

double ModelShape::blockParameters(bool moe) const { return blockParametersOf(*this, moe, false); }

namespace {

double modelParameters(const ModelShape& m, bool active) {
  const double h = m.hidden;
  double n = (m.tied ? 1.0 : 2.0) * m.vocab * h + m.positions() * h + normParameters(m);
  for (int l = 0; l < m.layers; ++l) n += blockParametersOf(m, m.moeBlock(l), active);
  return n;
}

}  // namespace

double ModelShape::parameters() const { return modelParameters(*this, false); }
double ModelShape::activeParameters() const { return modelParameters(*this, true); }

void ModelShape::validate() const {
  auto bad = [&](const std::string& what) { return invalid(fmt::format("model {}: {}", name, what)); };
  if (layers < 1 || hidden < 1 || heads < 1 || seq < 1 || vocab < 1) {
    throw bad(fmt::format("layers {}, hidden {}, heads {}, seq {}, vocab {} must all be at least 1", layers, hidden,
                          heads, seq, vocab));
  }
  if (hidden % heads != 0) throw bad(fmt::format("hidden {} is not a multiple of heads {}", hidden, heads));
  if (heads % kv() != 0) throw bad(fmt::format("heads {} is not a multiple of kv heads {}", heads, kv()));
  if (learnedPositions && context > 0 && context < seq)
    throw bad(fmt::format("seq {} exceeds context {}", seq, context));
  if (experts < 0 || (experts > 0 && (topK < 1 || topK > experts || expertUnits() < 1 || sharedExperts < 0 ||
                                      moeEvery < 1 || firstDense < 0))) {
    throw bad(
        fmt::format("experts {}, top-k {}, expert ffn {}, shared experts {}, moe every {}, first dense {}: "
                    "top-k must be 1..experts, the rest at least 1 (shared and first dense at least 0)",
                    experts, topK, expertUnits(), sharedExperts, moeEvery, firstDense));
  }
}

ModelShape modelPreset(const std::string& name) {
  ModelShape m;
  m.name = name;
  auto llama = [&](int L, int h, int a, int kv, int F) {
    m.layers = L, m.hidden = h, m.heads = a, m.kvHeads = kv, m.ffn = F, m.seq = 8192, m.vocab = 128256;
    m.gated = true, m.tied = false, m.learnedPositions = false, m.biases = false, m.layerNorm = false;
  };
  if (name == "gpt2-124m") {
    m.layers = 12, m.hidden = 768, m.heads = 12, m.seq = 1024;
  } else if (name == "gpt2-1.5b") {
    m.layers = 48, m.hidden = 1600, m.heads = 25, m.seq = 1024;
  } else if (name == "gpt3-175b") {
    m.layers = 96, m.hidden = 12288, m.heads = 96, m.seq = 2048;
  } else if (name == "llama3-8b") {
    llama(32, 4096, 32, 8, 14336);
  } else if (name == "llama3-70b") {
    llama(80, 8192, 64, 8, 28672);
  } else if (name == "mixtral-8x7b") {
    // Mistral 7B's attention with 8 SwiGLU experts of 14336 in every block, 2 per token.
    llama(32, 4096, 32, 8, 14336);
    m.seq = 4096, m.vocab = 32000;
    m.experts = 8, m.topK = 2, m.expertFfn = 14336, m.gatedExperts = true;
  } else if (name == "deepseek-moe-16b") {
    // DeepSeek-MoE 16B: fine-grained experts (64 routed of 1408, 6 per token) and 2 shared ones in
    // every block but the first, which is dense (10944); multi-head attention.
    llama(28, 2048, 16, 16, 10944);
    m.seq = 4096, m.vocab = 102400;
    m.experts = 64, m.topK = 6, m.expertFfn = 1408, m.sharedExperts = 2, m.firstDense = 1, m.gatedExperts = true;
  } else {
    throw invalid(fmt::format("no model preset '{}' (presets: {})", name, kModelPresets));
  }
  return m;
}

ModelShape shapeOf(const GptConfig& config, int seq) {
  ModelShape m;
  m.name = "gpt2";
  m.layers = config.layers, m.hidden = config.width, m.heads = config.heads;
  m.seq = seq, m.context = config.context, m.vocab = config.vocab;
  if (config.moe.enabled()) {
    m.experts = config.moe.experts, m.topK = config.moe.topK, m.expertFfn = config.moe.hiddenFor(config.width);
    m.gatedExperts = config.moe.swiglu, m.moeEvery = config.moeEvery;
  }
  return m;
}

Precision parsePrecision(const std::string& name) {
  if (name == "fp32") return Precision{"fp32", 4, 4, 8, 4, "fp32", 4, 4};
  if (name == "bf16") return Precision{"bf16", 2, 2, 12, 2, "bf16", 2, 2};
  throw invalid(fmt::format("precision '{}' is not fp32 or bf16", name));
}

Precision withCompute(Precision precision, const std::string& compute, const std::string& reduce) {
  if (compute != "fp32" && compute != "bf16" && compute != "fp16") {
    throw invalid(fmt::format("compute '{}' is not fp32, bf16 or fp16", compute));
  }
  if (reduce != "fp32" && reduce != "bf16") throw invalid(fmt::format("reduce '{}' is not fp32 or bf16", reduce));
  precision.compute = compute;
  precision.linear = compute == "fp32" ? precision.activation : 2;
  precision.wire = reduce == "bf16" ? 2 : precision.grad;
  if (compute != "fp32") precision.name += "/" + compute;
  return precision;
}

int PlanLayout::accumulate() const {
  const long global = globalBatch > 0 ? globalBatch : static_cast<long>(micro) * dp;
  return static_cast<int>(global / (static_cast<long>(micro) * dp));
}

std::string PlanLayout::describe() const {
  std::string s = fmt::format("dp{} tp{} pp{} cp{}", dp, tp, pp, cp);
  if (ep > 1) s += fmt::format(" ep{}", ep);
  if (vpp > 1) s += fmt::format(" vpp{}", vpp);
  s += fmt::format(" zero{}", zero);
  if (sequenceParallel && tp > 1) s += " sp";
  if (recompute != Recompute::kNone) s += recompute == Recompute::kFull ? " full" : " selective";
  if (pp > 1) s += std::string(" ") + scheduleName(schedule);
  if (syncEvery > 0) s += fmt::format(" {}:{}", diloco ? "diloco" : "local", syncEvery);
  if (offloadOptimizer != OffloadTarget::kNone) {
    s += fmt::format(" offload:{}{}", offloadTargetName(offloadOptimizer), offloadParams ? "+params" : "");
  }
  return s + fmt::format(" micro{}", micro);
}

Machine machinePreset(const std::string& name, int devices) {
  Machine m;
  m.name = name;
  if (name != "dgx-h100") throw invalid(fmt::format("no machine preset '{}' (presets: dgx-h100)", name));
  // H100 SXM: 989 TFLOP/s dense bf16; NVLink 4 through NVSwitch, 450 GB/s each way; one
  // 400 Gb/s InfiniBand port per GPU.
  m.devices = devices > 0 ? devices : 8;
  return m;
}

LayerActivations layerActivations(const ModelShape& m, const PlanLayout& l, const Precision& precision, bool moe) {
  const double e = precision.activation, d = l.dropout ? 1.0 : 0.0;
  // What the linear layers read and write: in `linear` bytes, but the attention output in fp32
  // under context parallelism (ring attention accumulates it) and an MoE block's second layernorm
  // output (its router is fp32).
  const double lin = precision.linear, attyBytes = l.cp > 1 ? e : lin;
  const double s = static_cast<double>(m.seq) / l.cp, b = l.micro, h = m.hidden, a = m.heads, t = l.tp;
  const double rowsShare = l.sequenceParallel && l.tp > 1 ? 1.0 / t : 1.0;
  LayerActivations r;
  // The block's input, the first layernorm's output, the second's input and output; a dropout
  // mask after the attention and after the MLP.
  r.replicated = (2.0 * e + lin + (moe ? e : lin) + 2.0 * d) * s * b * h * rowsShare;
  // q, k, v; the attention output (the projection's input); the MLP's hidden activations (GELU's
  // input and output, or SwiGLU's gate, up and product).
  r.split =
      s * b * (lin * (h + 2.0 * kvWidth(m)) + attyBytes * h + (moe ? 0.0 : lin * mlpMatrices(m) * m.ffnUnits())) / t;
  if (moe) {
    // Not cut over tp: the router's probabilities (fp32), then each row's topK copies: the
    // expert's input, its hidden activations, its output back home. Cut: the shared experts'
    // hidden activations.
    const double rows = s * b * rowsShare;
    r.replicated += 4.0 * rows * m.experts + e * rows * m.topK * (2.0 * h + expertMatrices(m) * m.expertUnits());
    r.split += e * s * b * m.sharedExperts * expertMatrices(m) * m.expertUnits() / t;
  }
  // The softmax output (in `linear` bytes: 16-bit compute keeps it in the format), its dropout
  // mask and dropout output; ring attention keeps the fp32 log-sum-exp of each query row instead.
  if (l.cp > 1) {
    r.scores = 4.0 * a * s * b / t;
  } else if (l.recompute == Recompute::kNone) {
    r.scores = (lin + d + d * lin) * a * s * s * b / t;
  }
  r.stats = 2.0 * 2.0 * 4.0 * s * b * rowsShare;
  if (l.recompute == Recompute::kFull) {  // only the block's input
    r = LayerActivations{e * s * b * h * rowsShare, 0, 0, 0};
  }
  return r;
}

double Plan::peakBytes() const {
  double peak = 0;
  for (const auto& s : stages) peak = std::max(peak, s.totalBytes());
  return peak;
}

namespace {

// The links of a group of `size` ranks, `stride` apart in the mesh (ranks are numbered node by node).
chorusLinkModel_t linkFor(const Machine& m, int stride, int size) {
  chorusLinkModel_t link{1, m.intraAlphaUs, m.intraGBps, m.intraAlphaUs, m.intraGBps, m.reduceGBps};
  const long span = static_cast<long>(stride) * size;
  if (span > m.devicesPerNode) {
    link.hosts = static_cast<int>(std::min<long>(size, (span + m.devicesPerNode - 1) / m.devicesPerNode));
    link.alphaUs = m.interAlphaUs;
    link.bandwidthGBps = m.interGBps;
  }
  return link;
}

// One call's time, from the runtime's cost model.
double collectiveSeconds(chorusCollective_t c, int ranks, double bytes, const chorusLinkModel_t& link) {
  if (ranks < 2 || bytes <= 0) return 0.0;
  return predictMicroseconds(c, ranks, static_cast<size_t>(bytes), link) * 1e-6;
}

// What a rank of n sends for one call (ring-like volumes: the bandwidth-optimal ones).
double sentPerCall(chorusCollective_t c, int n, double bytes) {
  switch (c) {
    case chorusCollAllReduce:
      return 2.0 * (n - 1) / n * bytes;
    case chorusCollSend:
      return bytes;
    default:
      return static_cast<double>(n - 1) / n * bytes;
  }
}

const char* opName(chorusCollective_t c) {
  switch (c) {
    case chorusCollAllReduce:
      return "all_reduce";
    case chorusCollAllGather:
      return "all_gather";
    case chorusCollReduceScatter:
      return "reduce_scatter";
    case chorusCollAllToAll:
      return "all_to_all";
    default:
      return "send_recv";
  }
}

// The most micro-batches each chunk of a stage holds at once under the schedule.
std::vector<int> chunkInFlight(Schedule schedule, int stages, int stage, int chunks, int micros) {
  std::vector<int> now(chunks, 0), peak(chunks, 0);
  if (stages == 1) return std::vector<int>(chunks, 1);
  for (const PipeAction& a : pipelineSchedule(schedule, stages, stage, chunks, micros)) {
    now[a.chunk] += a.forward ? 1 : -1;
    peak[a.chunk] = std::max(peak[a.chunk], now[a.chunk]);
  }
  return peak;
}

}  // namespace

Plan makePlan(const ModelShape& model, const PlanLayout& layout, const Machine& machine, const Precision& precision) {
  model.validate();
  const PlanLayout& l = layout;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.vpp < 1 || l.cp < 1 || l.ep < 1 || l.micro < 1) {
    throw invalid(fmt::format("layout {}: every size must be at least 1", l.describe()));
  }
  if (l.ep > 1 && (model.experts == 0 || l.dp % l.ep != 0 || model.experts % l.ep != 0)) {
    throw invalid(fmt::format("ep = {} must divide dp = {} and the model's {} experts", l.ep, l.dp, model.experts));
  }
  if (l.devices() != machine.devices) {
    throw invalid(
        fmt::format("layout {} uses {} devices; the machine has {}", l.describe(), l.devices(), machine.devices));
  }
  if (model.heads % l.tp != 0 || model.kv() % l.tp != 0) {
    throw invalid(fmt::format("heads {} (kv heads {}) cannot be split over tp = {}", model.heads, model.kv(), l.tp));
  }
  if (l.cp > 1 && model.seq % (2 * l.cp) != 0) {
    throw invalid(fmt::format("seq {} cannot be cut into 2 x cp = {} chunks", model.seq, 2 * l.cp));
  }
  const long global = l.globalBatch > 0 ? l.globalBatch : static_cast<long>(l.micro) * l.dp;
  if (global % (static_cast<long>(l.micro) * l.dp) != 0) {
    throw invalid(fmt::format("the global batch {} is not a multiple of micro x dp = {} x {}", global, l.micro, l.dp));
  }
  if (l.zero < 0 || l.zero > 3) throw invalid(fmt::format("zero = {} is not 0..3", l.zero));
  if (l.syncEvery < 0 || (l.syncEvery > 0 && (l.zero != 0 || l.ep > 1 || l.cp > 1))) {
    throw invalid(fmt::format("local steps every {} with zero = {}, ep = {}, cp = {} (ZeRO 0, no ep or cp)",
                              l.syncEvery, l.zero, l.ep, l.cp));
  }
  if (l.pp > 1 && l.zero > 1) throw invalid(fmt::format("zero = {} with pp = {} (ZeRO 0 or 1 only)", l.zero, l.pp));
  if (l.offloadParams && (l.zero != 3 || l.offloadOptimizer != OffloadTarget::kFile)) {
    throw invalid(fmt::format("parameters offloaded with zero = {} and the optimizer state in {} (zero 3, file)",
                              l.zero, offloadTargetName(l.offloadOptimizer)));
  }
  if ((l.schedule == Schedule::kInterleaved) != (l.vpp > 1)) {
    throw invalid(fmt::format("vpp = {} with the {} schedule", l.vpp, scheduleName(l.schedule)));
  }
  const int m = l.accumulate();
  const int chunks = l.pp * l.vpp;
  if (model.layers < chunks) throw invalid(fmt::format("{} layers over pp x vpp = {} chunks", model.layers, chunks));
  if (l.pp > 1) pipelineSchedule(l.schedule, l.pp, 0, l.vpp, m);  // throws when the micro-batches do not fit

  Plan plan;
  plan.model = model, plan.layout = l, plan.machine = machine, plan.precision = precision;
  const double e = precision.activation, h = model.hidden, t = l.tp;
  const double s = static_cast<double>(model.seq) / l.cp, b = l.micro, N = s * b;  // this rank's rows
  const bool sp = l.sequenceParallel && l.tp > 1;
  const double rowsShare = sp ? 1.0 / t : 1.0;
  const double V = model.vocab, Vt = vocabShard(model, l.tp);
  const double speed = machine.peakFlops * machine.efficiency;

  // FLOPs (Narayanan et al. 2021, generalised to any block): forward 2 x (matmul weights) per
  // token plus 4 s h per token for the attention scores and their use; backward twice forward.
  // An MoE block counts its router and the experts a token uses.
  const double tokensPerStep = static_cast<double>(global) * model.seq;
  std::vector<double> blockForwardPerToken(model.layers);
  for (int layer = 0; layer < model.layers; ++layer) {
    blockForwardPerToken[layer] = 2.0 * blockMatmulParameters(model, model.moeBlock(layer)) + 4.0 * model.seq * h;
  }
  const double blocksForwardPerToken = std::accumulate(blockForwardPerToken.begin(), blockForwardPerToken.end(), 0.0);
  const double headForwardPerToken = 2.0 * h * V;
  plan.modelFlops = 3.0 * tokensPerStep * (blocksForwardPerToken + headForwardPerToken);
  double recomputePerToken = 0;
  if (l.recompute == Recompute::kFull) recomputePerToken = blocksForwardPerToken;
  if (l.recompute == Recompute::kSelective && l.cp == 1) recomputePerToken = model.layers * 4.0 * model.seq * h;
  plan.hardwareFlops = plan.modelFlops + tokensPerStep * recomputePerToken;

  // This rank's share of one block's forward for one micro-batch: the matmuls over tp, attention
  // over tp and cp (ring attention computes 2 cp + 1 of the (2 cp)^2 chunk pairs, each a full square).
  // An MoE block: the attention over tp; the router and the routed experts on all of a rank's rows
  // (its block with sequence parallelism: experts are not cut over tp), as many rows as it routes
  // with even routing; the shared experts over tp.
  const double attention = l.cp == 1 ? 4.0 * b * s * s * h / t : (2.0 * l.cp + 1) * 4.0 * b * (s / 2) * (s / 2) * h / t;
  const double blockForward = 2.0 * N * blockMatmulParameters(model) / t + attention;
  const double moeBlockForward =
      2.0 * N * attentionMatmulParameters(model) / t + attention +
      2.0 * N * rowsShare * (model.experts * h + model.topK * expertMatmulParameters(model)) +
      2.0 * N * model.sharedExperts * expertMatmulParameters(model) / t;
  auto recomputeOf = [&](double forward) {
    return l.recompute == Recompute::kFull                       ? forward
           : (l.recompute == Recompute::kSelective && l.cp == 1) ? attention
                                                                 : 0.0;
  };

  // Communication per micro-batch, by group.
  struct Calls {
    std::string group;
    chorusCollective_t op;
    int ranks;
    double bytes, calls;
    std::string overlap;
  };
  // Mesh order (pp, dp, cp, tp): tp neighbours, cp next, then dp; dp x cp is contiguous.
  // The ep ranks are dp neighbours (tp x cp apart); the experts' dp group strides over them.
  const chorusLinkModel_t tpLink = linkFor(machine, 1, l.tp), cpLink = linkFor(machine, l.tp, l.cp),
                          dpLink = linkFor(machine, l.tp, l.dp * l.cp),
                          ppLink = linkFor(machine, l.tp * l.cp * l.dp, std::min(l.pp, 2)),
                          epLink = linkFor(machine, l.tp * l.cp, l.ep),
                          edpLink = linkFor(machine, l.tp * l.cp * l.ep, l.dp / l.ep);
  auto linkOf = [&](const std::string& group) -> const chorusLinkModel_t& {
    if (group == "tp") return tpLink;
    if (group == "cp") return cpLink;
    if (group == "pp" || group == "embedding") return ppLink;
    if (group == "ep") return epLink;
    if (group == "edp") return edpLink;
    return dpLink;
  };
  const double rowsBytes = e * N * h;                  // one activation of all this rank's rows
  const double linearRows = precision.linear * N * h;  // the same kept for a linear layer

  // The cut as the trainer makes it: whole-model FLOPs of forward + backward per block, the
  // embedding with the first span and the head with the last.
  const double wholeRows = b * model.seq;
  std::vector<double> blockFlops(model.layers);
  for (int layer = 0; layer < model.layers; ++layer) blockFlops[layer] = 3.0 * wholeRows * blockForwardPerToken[layer];
  const std::vector<LayerSpan> cut = balanceLayers(blockFlops, 6.0 * wholeRows * h, 6.0 * wholeRows * h * V, chunks);
  const LayerActivations layer = layerActivations(model, l, precision);
  const LayerActivations moeLayer = layerActivations(model, l, precision, true);
  // Full recompute rebuilds one block at a time into buffers of a whole block's size.
  PlanLayout withoutRecompute = l;
  withoutRecompute.recompute = Recompute::kNone;
  const LayerActivations whole = layerActivations(model, withoutRecompute, precision);
  double dpExposed = 0, embeddingSeconds = 0;
  std::vector<double> commPerStage(l.pp, 0.0);
  for (int st = 0; st < l.pp; ++st) {
    StagePlan stage;
    stage.stage = st;
    stage.chunks = stageSpans(cut, l.pp, st);
    stage.inFlight = chunkInFlight(l.schedule, l.pp, st, l.vpp, m);
    const bool first = stage.chunks.front().begin == 0, last = stage.chunks.back().end == model.layers;
    int blocks = 0, moeBlocks = 0;
    for (const auto& c : stage.chunks) {
      blocks += c.layers();
      moeBlocks += model.moeBlocks(c.begin, c.end);
    }
    const int denseBlocks = blocks - moeBlocks;
    // Parameters on tp rank 0: the blocks' split matrices and column-parallel biases, their
    // replicated row-parallel biases and norms; the vocabulary rows; positions and the final norm.
    // An MoE block: its attention as a dense block's, the router replicated, the shared experts
    // cut as the MLP, and the routed experts of this ep rank whole.
    const double attentionPart = attentionMatmulParameters(model) / t + 2.0 * normParameters(model) +
                                 (model.biases ? (h + 2.0 * kvWidth(model)) / t + h : 0.0);
    const double block = attentionPart + mlpMatrices(model) * h * model.ffnUnits() / t +
                         (model.biases ? (model.gated ? 2.0 : 1.0) * model.ffnUnits() / t + h : 0.0);
    const double sharedExpert =
        (expertMatmulParameters(model) + expertFirstBiases(model)) / t + expertOutputBiases(model);
    const double moeDense = attentionPart + model.experts * h + model.sharedExperts * sharedExpert;
    stage.expertParameters = moeBlocks * (model.experts / l.ep) * model.expertParameters();
    stage.parameters = denseBlocks * block + moeBlocks * moeDense + stage.expertParameters;
    if (first) stage.parameters += Vt * h + model.positions() * h;
    if (last) stage.parameters += normParameters(model) + (model.tied && first ? 0.0 : Vt * h);
    // ZeRO over the dp x cp ranks that hold the same shard: the routed experts' over the dp / ep x cp
    // ranks that hold the same experts.
    const double Pe = l.ep > 1 ? stage.expertParameters : 0.0, P = stage.parameters - Pe;
    const double Nz = static_cast<double>(l.dp) * l.cp, Nze = static_cast<double>(l.dp / l.ep) * l.cp;
    auto zeroBytes = [&](double perParameter, int from) {
      return P * perParameter / (l.zero >= from ? Nz : 1.0) + Pe * perParameter / (l.zero >= from ? Nze : 1.0);
    };
    stage.paramBytes = zeroBytes(precision.param, 3);
    stage.gradBytes = zeroBytes(precision.grad, 2);
    stage.optimizerBytes = zeroBytes(precision.optimizer, 1);
    if (l.diloco) stage.optimizerBytes += 3.0 * 4.0 * stage.parameters;
    // Offload moves AdamW's state (not DiLoCo's anchor and outer momentum, which stay in memory).
    const double optimizerState = zeroBytes(precision.optimizer, 1);
    if (l.offloadOptimizer == OffloadTarget::kHost && !machine.sharedCores) {
      stage.offloadedBytes = optimizerState;
      stage.optimizerBytes -= optimizerState;
    } else if (l.offloadOptimizer == OffloadTarget::kFile) {
      // The file holds the optimizer's arrays (and the parameter shard) of this rank's elements; the
      // window holds up to four chunks of them, each array's share counted where it belongs.
      const int optimizerArrays = static_cast<int>(std::lround(precision.optimizer / 4.0));
      const int arrays = optimizerArrays + (l.offloadParams ? 1 : 0);
      const auto elements = static_cast<size_t>(std::ceil(zeroBytes(1.0, 1)));
      const double resident = static_cast<double>(
          storeWindow(static_cast<size_t>(l.offloadWindowBytes), arrays, elements).residentBytes(arrays));
      stage.offloadedBytes = optimizerState;
      stage.optimizerBytes += resident * optimizerArrays / arrays - optimizerState;
      if (l.offloadParams) {
        stage.offloadedBytes += stage.paramBytes;
        stage.paramBytes = resident / arrays;
      }
    }

    // Activations: each chunk's blocks for each micro-batch in flight, its output, the first chunk's
    // tokens, the last chunk's head (the final norm, the gathered rows with sp, the logits in fp32,
    // each row's maximum and exponential sum (and target logit with tp), the losses); once per
    // rank, backward's buffers for one block and attention's scratch (and full recompute's block).
    double activations = 0;
    for (size_t c = 0; c < stage.chunks.size(); ++c) {
      const LayerSpan span = stage.chunks[c];
      const int moeInSpan = model.moeBlocks(span.begin, span.end);
      double slot = (span.layers() - moeInSpan) * layer.total() + moeInSpan * moeLayer.total() + rowsBytes * rowsShare;
      if (span.begin == 0) slot += 4.0 * N;
      if (span.end == model.layers) {
        slot += 4.0 * N + linearRows * rowsShare + 8.0 * N * rowsShare + (sp ? linearRows : 0.0) + 4.0 * N * Vt +
                4.0 * N * (t > 1 ? 3 : 2) + 4.0 * N;
      }
      activations += stage.inFlight[c] * slot;
    }
    const double kvd = kvWidth(model) / t, ffn = model.ffnUnits() / t, heads = model.heads / t;
    double workspace =
        e * (N * h * rowsShare + N * h + N * h / t + N * (h / t + 2.0 * kvd) + mlpMatrices(model) * N * ffn);
    if (l.cp == 1) {
      // Backward's T x T scores; 16-bit compute's attention also widens P and rounds dS and dO
      // (kernels::attention16ScratchFloats). Selective recompute's probabilities of one block.
      workspace += precision.compute == "fp32" ? 4.0 * s * s : 4.0 * (2.5 * s * s + 0.5 * s * h / t);
      if (l.recompute == Recompute::kSelective) workspace += precision.linear * b * heads * s * s;
    } else {
      // Ring attention: two buffers of keys and values (in `linear` bytes) and two of their
      // gradients (fp32), each row's running max and sum, and a block's scratch (16-bit compute's
      // also holds the rounded P, dS and dO: kernels::attentionBlock16ScratchFloats).
      const double blockScratch =
          precision.compute == "fp32" ? 2.0 * (s / 2) * (s / 2) : 3.0 * (s / 2) * (s / 2) + 0.5 * (s / 2) * h / t;
      workspace += (2.0 * precision.linear + 2.0 * 4.0) * N * 2.0 * kvd + 4.0 * (2.0 * b * heads * s + blockScratch);
    }
    if (sp) workspace += e * (N * h + N * h / t) + 4.0 * 2.0 * h;
    if (l.recompute == Recompute::kFull) workspace += (whole.total() - e * N * h * rowsShare) + rowsBytes * rowsShare;
    if (precision.compute != "fp32") {
      // 16-bit compute's buffers: fp32 scratch for the layernorms', attention's and GELU's outputs
      // and for the linear layers' outputs before their casts; the largest unit's weights cast (a
      // block, or the head's vocabulary rows); under context parallelism the attention output's
      // cast, with sequence parallelism the gathered 16-bit rows.
      const double ffnRows = N * ffn, qkvRows = N * (h / t + 2.0 * kvd);
      workspace += e * std::max({N * h * rowsShare, N * h / t, ffnRows}) + e * std::max(qkvRows, ffnRows);
      const double castUnit = std::max(moeBlocks > 0 ? moeDense : 0.0, denseBlocks > 0 ? block : 0.0);
      workspace += precision.linear * std::max(castUnit, last ? Vt * h : 0.0);
      if (l.cp > 1) workspace += precision.linear * N * h / t;
      if (sp) workspace += precision.linear * N * h;
    }
    stage.activationBytes = activations + workspace;

    // Communication of one micro-batch through this stage, per layer and at the ends.
    std::vector<Calls> calls;
    const double fwdReruns = l.recompute == Recompute::kFull ? 2.0 : 1.0;
    if (l.tp > 1) {
      if (!sp) {
        calls.push_back({"tp", chorusCollAllReduce, l.tp, rowsBytes, blocks * (2.0 * fwdReruns + 2.0), ""});
        if (first) calls.push_back({"tp", chorusCollAllReduce, l.tp, rowsBytes, 1.0, ""});
        if (last) calls.push_back({"tp", chorusCollAllReduce, l.tp, rowsBytes, 1.0, ""});
      } else {
        calls.push_back({"tp", chorusCollAllGather, l.tp, rowsBytes, blocks * (2.0 * fwdReruns + 4.0), ""});
        calls.push_back({"tp", chorusCollReduceScatter, l.tp, rowsBytes, blocks * (2.0 * fwdReruns + 2.0), ""});
        if (first) calls.push_back({"tp", chorusCollReduceScatter, l.tp, rowsBytes, 1.0, ""});
        if (last) calls.push_back({"tp", chorusCollAllGather, l.tp, rowsBytes, 1.0, ""});
        if (last) calls.push_back({"tp", chorusCollReduceScatter, l.tp, rowsBytes, 1.0, ""});
      }
      if (last) calls.push_back({"tp", chorusCollAllReduce, l.tp, 4.0 * 3.0 * N, 1.0, ""});
    }
    const double kvBytes = e * N * 2.0 * kvd;
    if (l.cp > 1) {
      calls.push_back({"cp", chorusCollSend, l.cp, kvBytes, blocks * (l.cp - 1) * (fwdReruns + 1.0),
                       "the attention of the block in hand"});
      calls.push_back({"cp", chorusCollSend, l.cp, kvBytes, blocks * static_cast<double>(l.cp), ""});
    }
    // Expert parallelism: each MoE block sends its rows' topK copies to their experts and back
    // (dispatch and combine), in forward (again under full recompute) and in backward.
    if (l.ep > 1 && moeBlocks > 0) {
      calls.push_back({"ep", chorusCollAllToAll, l.ep, e * N * rowsShare * model.topK * h,
                       moeBlocks * (2.0 * fwdReruns + 2.0), ""});
    }
    if (l.pp > 1) {
      double sends = 0;
      for (const auto& c : stage.chunks) sends += (c.end != model.layers) + (c.begin != 0);
      calls.push_back({"pp", chorusCollSend, l.pp, rowsBytes * rowsShare, sends, ""});
    }
    double perMicroComm = 0;
    for (const auto& c : calls) {
      const double each = collectiveSeconds(c.op, c.ranks, c.bytes, linkOf(c.group));
      double exposed = each * c.calls;
      if (!c.overlap.empty()) {  // a ring step overlaps the attention of the block in hand
        const double computeEach = attention / l.cp / speed;
        exposed = machine.sharedCores ? exposed : c.calls * std::max(0.0, each - computeEach);
      }
      perMicroComm += exposed;
      plan.collectives.push_back({st, c.group, opName(c.op), c.ranks, c.bytes, c.calls * m,
                                  sentPerCall(c.op, c.ranks, c.bytes) * c.calls * m, each * c.calls * m, c.overlap});
    }
    const double blocksForward = denseBlocks * blockForward + moeBlocks * moeBlockForward;
    const double blocksRecompute = denseBlocks * recomputeOf(blockForward) + moeBlocks * recomputeOf(moeBlockForward);
    const double forwardCompute = (blocksForward + (last ? 2.0 * N * h * Vt : 0.0)) / speed;
    const double backwardCompute = (2.0 * blocksForward + blocksRecompute + (last ? 4.0 * N * h * Vt : 0.0)) / speed;
    stage.forwardSeconds = forwardCompute + perMicroComm / 3;
    stage.backwardSeconds = backwardCompute + 2 * perMicroComm / 3;
    commPerStage[st] = perMicroComm * m;

    // Data parallel (over dp x cp; the routed experts over dp / ep x cp) and the tied embedding's
    // two copies, per step.
    if (st == 0) {
      std::vector<std::pair<Calls, double>> dpCalls;  // with the compute that can hide each call
      for (const auto& [group, n, count] :
           {std::tuple<std::string, int, double>{"dp", l.dp * l.cp, P}, {"edp", l.dp / l.ep * l.cp, Pe}}) {
        if (count <= 0 || (group == "edp" && n < 2)) continue;
        const double grads = count * precision.wire, params = count * precision.param;
        if (l.syncEvery > 0) {  // local steps: one fp32 average of the parameters (or delta) per H steps
          dpCalls.push_back({{group, chorusCollAllReduce, n, count * 4.0, 1.0 / l.syncEvery, ""}, 0.0});
          continue;
        }
        if (l.zero == 0) dpCalls.push_back({{group, chorusCollAllReduce, n, grads, 1.0, "backward"}, backwardCompute});
        if (l.zero == 1) {
          dpCalls.push_back({{group, chorusCollReduceScatter, n, grads, 1.0, "backward"}, backwardCompute});
          dpCalls.push_back({{group, chorusCollAllGather, n, params, 1.0, ""}, 0.0});
        }
        if (l.zero == 2) {
          dpCalls.push_back({{group, chorusCollReduceScatter, n, grads, double(m), "backward"}, backwardCompute});
          dpCalls.push_back({{group, chorusCollAllGather, n, params, 1.0, ""}, 0.0});
        }
        if (l.zero == 3) {
          dpCalls.push_back({{group, chorusCollAllGather, n, params, 2.0 * m, "forward and backward"},
                             (forwardCompute + backwardCompute) / 2});
          dpCalls.push_back({{group, chorusCollReduceScatter, n, grads, double(m), "backward"}, backwardCompute});
        }
      }
      if (l.pp > 1) {
        dpCalls.push_back({{"embedding", chorusCollAllReduce, 2, Vt * h * precision.grad, 1.0, ""}, 0.0});
      }
      for (const auto& [c, hide] : dpCalls) {
        const double each = collectiveSeconds(c.op, c.ranks, c.bytes, linkOf(c.group));
        const double exposed =
            machine.sharedCores || c.overlap.empty() ? each * c.calls : c.calls * std::max(0.0, each - hide);
        (c.group == "embedding" ? embeddingSeconds : dpExposed) += exposed;
        plan.collectives.push_back({st, c.group, opName(c.op), c.ranks, c.bytes, c.calls,
                                    sentPerCall(c.op, c.ranks, c.bytes) * c.calls, each * c.calls, c.overlap});
      }
    }
    plan.stages.push_back(stage);
  }

  // The step: the slowest stage sets the pipeline's pace (its schedule simulated with per-chunk
  // times); data parallel's exposed part and the embedding's sum follow.
  double fwd = 0, bwd = 0, compute = 0;
  for (const auto& st : plan.stages) {
    fwd = std::max(fwd, st.forwardSeconds);
    bwd = std::max(bwd, st.backwardSeconds);
  }
  for (int st = 0; st < l.pp; ++st) {
    compute =
        std::max(compute, m * (plan.stages[st].forwardSeconds + plan.stages[st].backwardSeconds) - commPerStage[st]);
  }
  plan.bubbleFormula = l.pp > 1 ? bubbleShare(l.pp, l.vpp, m) : 0.0;
  double makespan = m * (fwd + bwd);
  if (l.pp > 1) {
    const ScheduleSimulation sim = simulateSchedule(l.schedule, l.pp, l.vpp, m, fwd / l.vpp, bwd / l.vpp);
    makespan = sim.makespan;
    plan.bubbleSimulated = sim.idleShare();
  }
  const double commMax = *std::max_element(commPerStage.begin(), commPerStage.end());
  if (machine.sharedCores) {
    // Idle ranks give their cores away: the step is each rank's work, on average.
    double work = 0;
    for (int st = 0; st < l.pp; ++st) work += m * (plan.stages[st].forwardSeconds + plan.stages[st].backwardSeconds);
    makespan = work / l.pp;
    plan.bubbleSeconds = 0;
  } else {
    plan.bubbleSeconds = makespan - m * (fwd + bwd);
  }
  plan.computeSeconds = compute;
  plan.commSeconds = commMax + dpExposed + embeddingSeconds;
  plan.stepSeconds = makespan + dpExposed + embeddingSeconds;
  plan.tokensPerSecond = tokensPerStep / plan.stepSeconds;
  plan.mfu = plan.modelFlops / plan.stepSeconds / (machine.devices * machine.peakFlops);
  if (plan.peakBytes() > machine.memoryBytes) {
    plan.fits = false;
    plan.problem = fmt::format("needs {:.2f} GiB on its fullest rank; a device has {:.2f} GiB",
                               plan.peakBytes() / (1ull << 30), machine.memoryBytes / (1ull << 30));
  }
  return plan;
}

std::vector<Plan> searchLayouts(const ModelShape& model, const PlanLayout& base, const Machine& machine,
                                const Precision& precision) {
  std::vector<Plan> plans;
  const int D = machine.devices;
  const long global = base.globalBatch > 0 ? base.globalBatch : static_cast<long>(base.micro) * base.dp;
  for (int tp = 1; tp <= std::min(D, machine.devicesPerNode); tp *= 2) {
    for (int cp = 1; tp * cp <= D; cp *= 2) {
      for (int pp = 1; tp * cp * pp <= D; ++pp) {
        if (D % (tp * cp * pp) != 0) continue;
        const int dp = D / (tp * cp * pp);
        for (int ep = 1; ep <= dp; ep *= 2) {
          if (ep > 1 && (model.experts % ep != 0 || dp % ep != 0)) continue;
          for (int micro = 1; micro <= global / dp; micro *= 2) {
            if (global % (static_cast<long>(micro) * dp) != 0) continue;
            for (int vpp : {1, 2}) {
              if (vpp > 1 && pp == 1) continue;
              for (int zero = 0; zero <= (pp > 1 ? 1 : 3); ++zero) {
                for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
                  if (r == Recompute::kSelective && cp > 1) continue;  // ring attention keeps no scores to drop
                  PlanLayout l = base;
                  l.dp = dp, l.tp = tp, l.pp = pp, l.cp = cp, l.ep = ep, l.vpp = vpp, l.zero = zero, l.micro = micro;
                  l.globalBatch = global;
                  l.sequenceParallel = tp > 1;
                  l.recompute = r;
                  l.schedule = vpp > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB;
                  try {
                    Plan p = makePlan(model, l, machine, precision);
                    if (p.fits) plans.push_back(std::move(p));
                  } catch (const Error&) {
                    // a layout that cannot run (heads over tp, seq over cp, micro-batches over stages)
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
    if (a.tokensPerSecond != b.tokensPerSecond) return a.tokensPerSecond > b.tokensPerSecond;
    return a.peakBytes() < b.peakBytes();
  });
  return plans;
}

std::string describePlan(const Plan& p) {
  const ModelShape& m = p.model;
  std::string out =
      fmt::format("model {}: {} layers, hidden {}, heads {} (kv {}), ffn {}, seq {}, vocab {}: {:.4g} parameters\n",
                  m.name, m.layers, m.hidden, m.heads, m.kv(), m.ffnUnits(), m.seq, m.vocab, m.parameters());
  if (m.experts > 0) {
    out += fmt::format(
        "mixture of experts in {} of {} blocks: {} routed experts of {} (top {}), {} shared; {:.4g} parameters "
        "active per token\n",
        m.moeBlocks(0, m.layers), m.layers, m.experts, m.expertUnits(), m.topK, m.sharedExperts, m.activeParameters());
  }
  out += fmt::format("layout {}: {} micro-batch(es) of {} per step, global batch {}; precision {}\n",
                     p.layout.describe(), p.layout.accumulate(), p.layout.micro,
                     static_cast<long>(p.layout.accumulate()) * p.layout.micro * p.layout.dp, p.precision.name);
  out += fmt::format("machine {}: {} devices, {} per node, {} each, {:.4g} TFLOP/s peak x {:.2f}{}\n", p.machine.name,
                     p.machine.devices, p.machine.devicesPerNode, humanBytes(p.machine.memoryBytes, 2),
                     p.machine.peakFlops / 1e12, p.machine.efficiency, p.machine.sharedCores ? ", shared cores" : "");
  out += "\nper rank (tp rank 0 of each stage):\n";
  out += fmt::format("  {:>5}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {}\n", "stage", "parameters", "params",
                     "grads", "optimizer", "activations", "total", "blocks (in flight)");
  for (const auto& s : p.stages) {
    std::string blocks;
    for (size_t c = 0; c < s.chunks.size(); ++c) {
      blocks += fmt::format("{}[{},{}) x{}", c ? " " : "", s.chunks[c].begin, s.chunks[c].end, s.inFlight[c]);
    }
    out += fmt::format("  {:>5}  {:>12.4g}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {}\n", s.stage, s.parameters,
                       humanBytes(s.paramBytes, 2), humanBytes(s.gradBytes, 2), humanBytes(s.optimizerBytes, 2),
                       humanBytes(s.activationBytes, 2), humanBytes(s.totalBytes(), 2), blocks);
  }
  for (const auto& s : p.stages) {
    if (s.offloadedBytes > 0) {
      out += fmt::format("  stage {}: {} of state offloaded ({}), not in the columns\n", s.stage,
                         humanBytes(s.offloadedBytes, 2),
                         p.layout.offloadOptimizer == OffloadTarget::kHost ? "to host memory" : "to a file");
    }
  }
  if (p.layout.pp > 1) {
    out += fmt::format("pipeline bubble: {:.3f} of the step by the formula (p-1)/(vm+p-1), {:.3f} simulated\n",
                       p.bubbleFormula, p.bubbleSimulated);
  }
  out += fmt::format("FLOPs per step: {:.4g} (model), {:.4g} with recompute\n", p.modelFlops, p.hardwareFlops);
  out += "\ncommunication per step, per rank of each stage:\n";
  out += fmt::format("  {:>5}  {:<9}  {:<14}  {:>5}  {:>12}  {:>8}  {:>12}  {:>12}  {}\n", "stage", "group",
                     "collective", "ranks", "bytes/call", "calls", "sent", "time", "hidden by");
  for (const auto& c : p.collectives) {
    out += fmt::format("  {:>5}  {:<9}  {:<14}  {:>5}  {:>12}  {:>8.0f}  {:>12}  {:>9.3f} ms  {}\n", c.stage, c.group,
                       c.op, c.ranks, humanBytes(c.bytes, 2), c.calls, humanBytes(c.sentBytes, 2), c.seconds * 1e3,
                       c.overlap);
  }
  out += fmt::format(
      "\nstep: {:.3f} ms = compute {:.3f} + exposed communication {:.3f} + bubble {:.3f}; {:.4g} tokens/s; MFU "
      "{:.1f}%\n",
      p.stepSeconds * 1e3, p.computeSeconds * 1e3, p.commSeconds * 1e3, p.bubbleSeconds * 1e3, p.tokensPerSecond,
      100 * p.mfu);
  out += p.fits ? "fits in memory\n" : "does not fit: " + p.problem + "\n";
  return out;
}

nlohmann::json planJson(const Plan& p) {
  using nlohmann::json;
  const ModelShape& m = p.model;
  json j;
  j["model"] = {{"name", m.name},
                {"layers", m.layers},
                {"hidden", m.hidden},
                {"heads", m.heads},
                {"kv_heads", m.kv()},
                {"ffn", m.ffnUnits()},
                {"seq", m.seq},
                {"vocab", m.vocab},
                {"gated", m.gated},
                {"tied", m.tied},
                {"parameters", m.parameters()},
                {"active_parameters", m.activeParameters()}};
  if (m.experts > 0) {
    j["model"]["moe"] = {{"experts", m.experts},
                         {"top_k", m.topK},
                         {"expert_ffn", m.expertUnits()},
                         {"shared_experts", m.sharedExperts},
                         {"moe_blocks", m.moeBlocks(0, m.layers)},
                         {"expert_parameters", m.expertParameters()}};
  }
  const PlanLayout& l = p.layout;
  j["layout"] = {{"dp", l.dp},
                 {"tp", l.tp},
                 {"pp", l.pp},
                 {"vpp", l.vpp},
                 {"cp", l.cp},
                 {"ep", l.ep},
                 {"zero", l.zero},
                 {"sequence_parallel", l.sequenceParallel && l.tp > 1},
                 {"recompute", l.recompute == Recompute::kNone   ? "none"
                               : l.recompute == Recompute::kFull ? "full"
                                                                 : "selective"},
                 {"schedule", scheduleName(l.schedule)},
                 {"micro", l.micro},
                 {"accumulate", l.accumulate()},
                 {"global_batch", static_cast<long>(l.accumulate()) * l.micro * l.dp},
                 {"describe", l.describe()}};
  j["precision"] = p.precision.name;
  j["machine"] = {{"name", p.machine.name},
                  {"devices", p.machine.devices},
                  {"devices_per_node", p.machine.devicesPerNode},
                  {"memory_bytes", p.machine.memoryBytes},
                  {"peak_flops", p.machine.peakFlops},
                  {"efficiency", p.machine.efficiency},
                  {"intra_node_gbps", p.machine.intraGBps},
                  {"intra_node_latency_us", p.machine.intraAlphaUs},
                  {"inter_node_gbps", p.machine.interGBps},
                  {"inter_node_latency_us", p.machine.interAlphaUs},
                  {"shared_cores", p.machine.sharedCores}};
  json stages = json::array();
  for (const auto& s : p.stages) {
    json chunks = json::array();
    for (size_t c = 0; c < s.chunks.size(); ++c) {
      chunks.push_back({{"blocks", {s.chunks[c].begin, s.chunks[c].end}}, {"in_flight", s.inFlight[c]}});
    }
    stages.push_back({{"stage", s.stage},
                      {"parameters", s.parameters},
                      {"expert_parameters", s.expertParameters},
                      {"params_bytes", s.paramBytes},
                      {"grads_bytes", s.gradBytes},
                      {"optimizer_bytes", s.optimizerBytes},
                      {"offloaded_bytes", s.offloadedBytes},
                      {"activation_bytes", s.activationBytes},
                      {"total_bytes", s.totalBytes()},
                      {"forward_seconds", s.forwardSeconds},
                      {"backward_seconds", s.backwardSeconds},
                      {"chunks", chunks}});
  }
  j["stages"] = stages;
  json comms = json::array();
  for (const auto& c : p.collectives) {
    comms.push_back({{"stage", c.stage},
                     {"group", c.group},
                     {"op", c.op},
                     {"ranks", c.ranks},
                     {"bytes_per_call", c.bytes},
                     {"calls", c.calls},
                     {"sent_bytes", c.sentBytes},
                     {"seconds", c.seconds},
                     {"hidden_by", c.overlap}});
  }
  j["collectives"] = comms;
  j["bubble"] = {{"formula", p.bubbleFormula}, {"simulated", p.bubbleSimulated}};
  j["flops"] = {{"model", p.modelFlops}, {"hardware", p.hardwareFlops}};
  j["step"] = {{"seconds", p.stepSeconds},          {"compute_seconds", p.computeSeconds},
               {"comm_seconds", p.commSeconds},     {"bubble_seconds", p.bubbleSeconds},
               {"tokens_per_s", p.tokensPerSecond}, {"mfu", p.mfu}};
  j["fits"] = p.fits;
  j["peak_bytes"] = p.peakBytes();
  if (!p.fits) j["problem"] = p.problem;
  return j;
}

}  // namespace chorus::training
