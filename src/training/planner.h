// planner.h: what a training layout costs before it runs. For a model, a batch, a layout
// (dp, tp, pp, vpp, cp, ZeRO, sequence parallelism, recompute), a precision and a machine, the
// plan gives each pipeline stage's bytes per rank (parameters, gradients and optimizer state as
// ZeRO counts them, Rajbhandari et al. 2020; activations as Korthikanti et al. 2022 count them
// under tensor and sequence parallelism and recompute), the pipeline bubble and the training
// FLOPs (Narayanan et al. 2021), the communication of every collective in a step, and the step
// time split into compute, exposed communication and bubble, the collectives priced by the
// runtime's own cost model (chorusPredictTime) on the machine's links. searchLayouts ranks
// every layout that fits in memory by predicted throughput. Pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/training/gpt.h"
#include "src/training/offload.h"
#include "src/training/pipeline.h"

namespace chorus::training {

// A decoder-only transformer: GPT-2 (learned positions, biases, layernorm, GELU MLP, tied head)
// or Llama (rotary positions, no biases, RMSNorm, SwiGLU MLP, grouped-query attention, untied),
// dense or with mixture-of-experts MLPs (Mixtral, DeepSeek-MoE).
struct ModelShape {
  std::string name = "custom";
  int layers = 12, hidden = 768, heads = 12;
  int kvHeads = 0;  // 0: heads (plain multi-head attention)
  int ffn = 0;      // MLP hidden units; 0: 4 hidden
  int seq = 1024;   // tokens per sequence in training
  int context = 0;  // rows of a learned position table; 0: seq
  int vocab = 50257;
  bool gated = false;            // SwiGLU: three MLP matrices, else two
  bool tied = true;              // the output head is the token embedding
  bool learnedPositions = true;  // else rotary (no parameters)
  bool biases = true;            // linear layers' biases
  bool layerNorm = true;         // layernorm (weight and bias), else RMSNorm (weight)
  // Mixture of experts (experts > 0): the MLP of every moeEvery-th block after the first
  // firstDense blocks is a router (experts x hidden, no bias) and `experts` routed experts of
  // expertFfn hidden units each (SwiGLU when gatedExperts), topK of them used by each token, plus
  // sharedExperts of the same shape that every token uses (DeepSeek-MoE). Routed experts are whole
  // on a rank (as chorus-train keeps them), split over the ep ranks; shared experts and the router
  // are cut and kept as the dense MLP is.
  int experts = 0, topK = 2, expertFfn = 0, sharedExperts = 0, moeEvery = 1, firstDense = 0;
  bool gatedExperts = false;
  int kv() const { return kvHeads > 0 ? kvHeads : heads; }
  int ffnUnits() const { return ffn > 0 ? ffn : 4 * hidden; }
  int expertUnits() const { return expertFfn > 0 ? expertFfn : ffnUnits(); }
  int headDim() const { return hidden / heads; }
  int positions() const { return learnedPositions ? (context > 0 ? context : seq) : 0; }
  bool moeBlock(int layer) const {
    return experts > 0 && layer >= firstDense && (layer - firstDense) % moeEvery == moeEvery - 1;
  }
  int moeBlocks(int begin, int end) const;  // among blocks [begin, end)
  // One expert's parameters (its matrices and biases).
  double expertParameters() const;
  // Parameters of one block (dense, or MoE with all its experts), and of the whole model; active:
  // those one token uses (of an MoE block's routed experts, its topK).
  double blockParameters(bool moe = false) const;
  double parameters() const;
  double activeParameters() const;
  // Throws chorus::Error naming the field that cannot work.
  void validate() const;
};
// gpt2-124m, gpt2-1.5b, gpt3-175b, llama3-8b, llama3-70b, mixtral-8x7b, deepseek-moe-16b; throws
// chorus::Error listing them.
ModelShape modelPreset(const std::string& name);
extern const char* const kModelPresets;  // "gpt2-124m, gpt2-1.5b, ..."
// The runtime's GPT-2 at sequence length seq.
ModelShape shapeOf(const GptConfig& config, int seq);

// Bytes per element: parameters, gradients, optimizer state (per parameter: AdamW's m and v, plus
// an fp32 master copy under mixed precision) and activations.
struct Precision {
  std::string name = "fp32";
  double param = 4, grad = 4, optimizer = 8, activation = 4;
  // chorus-train's mixed precision ([precision] compute = bf16 or fp16): the state and most
  // activations as `activation` says, but what the linear layers read and write (the layernorms'
  // outputs, q, k, v, the attention output, the MLP's hidden values and the head's input) kept in
  // `linear` bytes, with the runtime's buffers for 16-bit compute (an fp32 scratch for what is made
  // before its cast, one unit's weights cast, sequence parallelism's 16-bit gathered rows).
  std::string compute = "fp32";
  double linear = 4;
  // The gradients' bytes on the data-parallel wire (chorus-train's [precision] reduce).
  double wire = 4;
};
// "fp32" (chorus's CPU training: 4 + 4 + 8 = ZeRO's 16 bytes per parameter) or "bf16" (mixed
// precision as ZeRO's paper counts it: 2 + 2 + K = 12).
Precision parsePrecision(const std::string& name);
// precision with chorus-train's compute type ("fp32", "bf16", "fp16": 16-bit linear layers) and
// gradient reduction type ("fp32", "bf16"); throws chorus::Error naming a word it does not know.
Precision withCompute(Precision precision, const std::string& compute, const std::string& reduce = "fp32");

struct PlanLayout {
  int dp = 1, tp = 1, pp = 1, vpp = 1, cp = 1;
  int ep = 1;  // expert parallel ranks, carved from dp (as chorus-train carves them)
  int zero = 0;
  bool sequenceParallel = false;
  Recompute recompute = Recompute::kNone;
  Schedule schedule = Schedule::kOneFOneB;
  int micro = 1;         // sequences per rank per micro-batch
  long globalBatch = 0;  // sequences per step; 0: micro x dp
  bool dropout = false;  // dropout masks kept (Korthikanti's accounting); chorus trains without
  // Local SGD / DiLoCo (chorus-train's [parallel] sync): the data-parallel ranks reduce no gradients
  // and agree every syncEvery steps by one fp32 all-reduce of the parameters (or DiLoCo's delta);
  // DiLoCo keeps three more copies of the parameters (anchor, outer momentum, delta). 0: every step.
  int syncEvery = 0;
  bool diloco = false;
  // Offload (chorus-train's [offload]): the optimizer state in host memory (kHost: out of the
  // device's memory, except on a machine whose devices share the host's cores, where it already
  // is) or in a file streamed through offloadWindowBytes of memory (kFile; with ZeRO-3 and
  // offloadParams, the parameter shard too). The window is cut as the runtime cuts it.
  OffloadTarget offloadOptimizer = OffloadTarget::kNone;
  bool offloadParams = false;
  double offloadWindowBytes = 64.0 * (1 << 20);
  int devices() const { return dp * tp * pp * cp; }
  int accumulate() const;        // micro-batches per step
  std::string describe() const;  // "dp2 tp2 pp2 cp1 zero1 sp 1f1b", " ep2" after cp with ep
};

// The devices and their links. A group of ranks within one node uses the intra-node link; one
// across nodes the inter-node link (and the hierarchical algorithms' two levels).
struct Machine {
  std::string name = "custom";
  int devices = 8;
  int devicesPerNode = 8;
  double memoryBytes = 80.0 * (1ull << 30);
  double peakFlops = 989e12;  // per device, at the training precision
  double efficiency = 0.5;    // the share of peak a step's compute reaches
  double intraGBps = 450, intraAlphaUs = 3;
  double interGBps = 50, interAlphaUs = 6;
  double reduceGBps = 1000;  // a reduction's throughput per device
  // Devices share one node's cores (ranks on a CPU host, more ranks than cores): a rank that
  // waits gives its cores to the others, so the pipeline bubble costs nothing and communication
  // is work the cores do (not overlapped).
  bool sharedCores = false;
};
// "dgx-h100" (nodes of 8 H100 80 GB, NVLink and 400 Gb/s InfiniBand per GPU); devices = the
// count asked for. Throws chorus::Error listing the names.
Machine machinePreset(const std::string& name, int devices);

// One collective of a step: on which group, how many calls of how many bytes, what a rank sends
// in all, and its predicted time.
struct CollectiveCost {
  int stage = 0;      // the pipeline stage whose rank makes the calls
  std::string group;  // "tp", "cp", "pp", "dp" (dp x cp), "embedding", "ep", "edp" (dp / ep x cp: the experts')
  std::string op;     // "all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all"
  int ranks = 0;
  double bytes = 0;      // per call (the user's buffer: whole for all-gather and reduce-scatter)
  double calls = 0;      // per step
  double sentBytes = 0;  // per step, what a rank puts on its links
  double seconds = 0;    // per step, all calls
  std::string overlap;   // what hides it, if anything
};

// The activation bytes one block holds for one micro-batch, split as Korthikanti et al. count
// them: the part tensor parallelism leaves whole on every rank (layernorm inputs and outputs,
// dropout masks; split too with sequence parallelism), the part it splits (q, k, v, the attention
// output, the MLP), the attention scores (heads x s^2, absent under selective recompute and
// ring attention), and the layernorm statistics (fp32 mean and 1/std per row, which the paper
// leaves out). With element bytes 2 and dropout: 10 + 24 / t sbh, 5 a s^2 b / t.
struct LayerActivations {
  double replicated = 0, split = 0, scores = 0, stats = 0;
  double total() const { return replicated + split + scores + stats; }
};
// An MoE block (moe): the MLP's part is the router's probabilities (fp32), each row's topK
// dispatched copies (the expert's input, hidden activations and output), and the shared experts'
// hidden activations; the routed experts' rows are not cut over tp (all of a rank's rows, or its
// block with sequence parallelism).
LayerActivations layerActivations(const ModelShape& model, const PlanLayout& layout, const Precision& precision,
                                  bool moe = false);

struct StagePlan {
  int stage = 0;
  std::vector<LayerSpan> chunks;  // its blocks
  std::vector<int> inFlight;      // per chunk: the most micro-batches whose activations it holds
  double parameters = 0;          // elements on this rank (tp rank 0)
  double expertParameters = 0;    // of them, routed experts' (ZeRO shards them over dp / ep x cp)
  double paramBytes = 0, gradBytes = 0, optimizerBytes = 0, activationBytes = 0;
  double offloadedBytes = 0;  // state moved out of the device's memory (to the host or a file), not in the others
  double stateBytes() const { return paramBytes + gradBytes + optimizerBytes; }
  double totalBytes() const { return stateBytes() + activationBytes; }
  double forwardSeconds = 0, backwardSeconds = 0;  // one micro-batch through all its chunks
};

struct Plan {
  ModelShape model;
  PlanLayout layout;
  Machine machine;
  Precision precision;
  std::vector<StagePlan> stages;
  double bubbleFormula = 0;    // (p - 1) / (v m + p - 1)
  double bubbleSimulated = 0;  // of the schedule with the stages' times
  double modelFlops = 0;       // per step, all ranks: forward + backward (3x forward)
  double hardwareFlops = 0;    // with recompute's extra forward work
  std::vector<CollectiveCost> collectives;
  double computeSeconds = 0, commSeconds = 0, bubbleSeconds = 0, stepSeconds = 0;
  double tokensPerSecond = 0, mfu = 0;
  bool fits = true;
  std::string problem;  // why it does not fit or cannot run; empty when it can
  double peakBytes() const;
};

// Throws chorus::Error naming what cannot be laid out (heads over tp, seq over 2 cp, layers over
// pp x vpp, the batch over micro x dp, devices, the schedule).
Plan makePlan(const ModelShape& model, const PlanLayout& layout, const Machine& machine, const Precision& precision);

// Every layout of the machine's devices (dp, tp within a node, pp, vpp, cp; ZeRO; sequence parallel
// with tp; each recompute mode; micro-batches dividing the global batch) that can run and fits,
// fastest first. Options not searched come from base (precision, dropout, global batch).
std::vector<Plan> searchLayouts(const ModelShape& model, const PlanLayout& base, const Machine& machine,
                                const Precision& precision);

std::string describePlan(const Plan& plan);
nlohmann::json planJson(const Plan& plan);

}  // namespace chorus::training
