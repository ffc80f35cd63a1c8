// gpt.h: the GPT-2 model (learned positions, pre-LN blocks, tied token embedding and output head)
// for any (layers, heads, width, context, vocab), forward and backward, on the CPU or a CUDA device
// (backend.h: the layers are written once, against the backend's kernels and memory).
// Parameters live in one flat buffer split into units (the embeddings, each block, the final
// layernorm); the model reaches them, and the gradient buffers, only through a UnitAccess, so that
// data parallelism can all-reduce a unit's gradients as soon as backward is done with it and ZeRO-3
// can gather a unit's parameters just before it is used. A Gpt is used by one thread.
//
// Tensor parallelism (Megatron-LM): with tp ranks, each holds a shard of the model. The attention
// heads and the MLP's hidden units are split: QKV and MLP-up are column-parallel (each rank's
// output features), the attention output and MLP-down row-parallel (each rank's input features,
// their partial outputs summed by an all-reduce over the tp group, the conjugate all-reduce of the
// input gradient in backward). The token embedding (tied with the output head) is split by
// vocabulary rows, and the cross-entropy computed from the vocabulary shards (vocab-parallel: the
// row maximum, the exponential sums and the target logits all-reduced). Layernorms, biases of the
// row-parallel layers and the position embedding are replicated.
#pragma once

#include <chorus/chorus.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "src/training/backend.h"
#include "src/training/moe.h"

namespace chorus::training {

struct GptConfig {
  // The dense shape in order (GptConfig{layers, heads, width, context, vocab}); MoE is set after.
  GptConfig(int layers = 12, int heads = 12, int width = 768, int context = 1024, int vocab = 50257)
      : layers(layers), heads(heads), width(width), context(context), vocab(vocab) {}
  int layers = 12;
  int heads = 12;
  int width = 768;     // C, the channels; a multiple of heads
  int context = 1024;  // the longest sequence (rows of the position embedding)
  int vocab = 50257;
  // Mixture of experts: with moe.experts > 0, the MLP of every moeEvery-th block (blocks
  // moeEvery - 1, 2 moeEvery - 1, ...; 1: all) is an MoE MLP (moe.h).
  MoeConfig moe;
  int moeEvery = 1;
  bool moeLayer(int layer) const { return moe.enabled() && layer % moeEvery == moeEvery - 1; }
  // The weights block `layer` multiplies each token by: q, k, v and the projection (4 C^2), then
  // the MLP (8 C^2), or an MoE block's router (E C) and the top-k experts a token goes through.
  double matmulParameters(int layer) const;

  static GptConfig gpt2_124m() { return GptConfig{}; }
  // Throws chorus::Error (kInvalidArgument) naming the field when the shape cannot work.
  void validate() const;
  std::string describe() const;
};

// How a tensor is initialised (GPT-2's scheme): normal(0, 0.02), normal(0, 0.02 / sqrt(2 layers))
// for the projections into the residual stream, zeros, ones.
enum class Init { kNormal, kResidualNormal, kZeros, kOnes };

// How a tensor is cut over the tp ranks: not at all (replicated), by rows (output features;
// the rows may be `parts` equal blocks, as QKV's q, k and v, each cut alike), or by columns (input
// features).
enum class Split { kReplicated, kRows, kColumns };

struct ParamTensor {
  std::string name;              // PyTorch-style, e.g. "h.3.attn.c_attn.weight"
  std::vector<int> shape;        // this rank's shard
  std::vector<int> globalShape;  // the whole tensor
  size_t offset = 0;             // in the flat buffer, in elements
  size_t count = 0;
  size_t globalOffset = 0;  // in the whole model's flat layout (tp = 1)
  int unit = 0;
  Init init = Init::kNormal;
  bool decay = false;  // weight decay applies (matrices and embeddings), not to biases and norms
  Split split = Split::kReplicated;
  // Whether this rank counts the tensor in sums over the model-parallel group (the gradient norm,
  // checkpoints): shards always, replicated tensors on tp rank 0 only, the lm_head copy never.
  bool counted = true;
  int expert = -1;  // an MoE expert's tensor: the expert's number (its ep rank holds it), else -1
};

// A run of elements contiguous both in this rank's flat buffer and in the whole model's.
struct ParamRun {
  size_t local = 0, global = 0, count = 0;
  int tensor = 0;
};

// A contiguous range of transformer blocks [begin, end): a model chunk (a pipeline stage, or one
// of a stage's virtual stages).
struct LayerSpan {
  int begin = 0, end = 0;
  int layers() const { return end - begin; }
  bool operator==(const LayerSpan&) const = default;
};

// The flat layout of the units this rank holds, in model order: the embeddings wte (V, C) and wpe
// (context, C) with block 0; each block (an MoE block followed by its experts' unit); the final
// layernorm with the last block. Units are numbered in that order from 0 (the whole dense model:
// 0 = embeddings, 1 + l = block l, layers + 1 = ln_f). A unit's tensors are contiguous, units in order. spans: the
// blocks this rank holds (pipeline parallelism), in order; empty: all. A rank that holds the last block but not the
// first holds a copy of wte for the tied output head (lm_head.weight, its own unit after ln_f).
// With tp > 1, the shard of tp rank tpRank (heads % tp == 0; the vocabulary rows are cut as
// evenly as they go). An MoE block holds mlp.router.weight (E, C); its experts' unit, of its
// experts, those of ep rank epRank (experts / ep of them), each mlp.experts.<e>.c_fc.weight, c_fc.bias,
// c_proj.weight, c_proj.bias (MoeMlp's order); experts are not cut over tp.
class ParamLayout {
 public:
  explicit ParamLayout(const GptConfig& config, int tp = 1, int tpRank = 0, std::vector<LayerSpan> spans = {},
                       int ep = 1, int epRank = 0);
  size_t total() const { return total_; }
  size_t globalTotal() const { return globalTotal_; }
  int tp() const { return tp_; }
  int tpRank() const { return tpRank_; }
  int ep() const { return ep_; }
  int epRank() const { return epRank_; }
  const std::vector<LayerSpan>& spans() const { return spans_; }
  // Local unit numbers, -1 where not held. headUnit: the output head's weights, the embedding unit
  // when this rank holds both ends of the model, else the lm_head copy.
  int embeddingUnit() const { return embeddingUnit_; }
  int blockUnit(int layer) const { return blockUnit_[layer]; }
  // The experts of an MoE block (this ep rank's): a unit of their own after the block's; -1 for a
  // dense block or one not held.
  int expertUnit(int layer) const { return expertUnit_[layer]; }
  // Whether the unit holds MoE experts (whose gradients are reduced over the expert-data-parallel
  // group when ep > 1).
  bool holdsExperts(int unit) const;
  int finalNormUnit() const { return finalNormUnit_; }
  int headUnit() const { return headUnit_; }
  // For one span: the order of UnitAccess::acquire calls in a training micro-batch (see
  // UnitAccess), the first forwardLength of them in forward.
  struct AccessOrder {
    std::vector<int> units;
    size_t forwardLength = 0;
  };
  AccessOrder accessOrder() const;
  // This rank's rows [vocabBegin, vocabBegin + vocabCount) of the token embedding.
  int vocabBegin() const { return vocabBegin_; }
  int vocabCount() const { return vocabCount_; }
  const std::vector<ParamRun>& runs() const { return runs_; }
  // local (total()) -> whole (globalTotal()): writes this rank's elements; counted only: those
  // of the tensors this rank counts, and on ep ranks but the first only the experts (so that a sum
  // over the model-parallel ranks, tp x pp x ep, has each element once).
  void toGlobal(const float* local, float* whole, bool countedOnly) const;
  // whole -> local: this rank's shard of a whole model.
  void fromGlobal(const float* whole, float* local) const;
  int units() const { return static_cast<int>(unitOffset_.size()); }
  size_t unitOffset(int unit) const { return unitOffset_[unit]; }
  size_t unitCount(int unit) const { return unitCount_[unit]; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(const std::string& name) const;
  // Fills elements [begin, end) of the flat buffer (dst[0] is element begin) with the initial
  // values of a model seeded with seed. Each element depends only on (seed, its index in the whole
  // model), so any shard can be initialised on its own and equals the same elements of a whole
  // initialisation.
  void initialize(uint64_t seed, float* dst, size_t begin, size_t end) const;

 private:
  std::vector<LayerSpan> spans_;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamRun> runs_;
  std::vector<size_t> unitOffset_, unitCount_;
  std::vector<int> blockUnit_, expertUnit_;
  size_t total_ = 0, globalTotal_ = 0;
  int layers_ = 0, tp_ = 1, tpRank_ = 0, ep_ = 1, epRank_ = 0, vocabBegin_ = 0, vocabCount_ = 0;
  int embeddingUnit_ = -1, finalNormUnit_ = -1, headUnit_ = -1;
};

// This rank's place in tensor parallelism: comm is the tp group (null for tp = 1). The model
// uses it from its own thread only. sequenceParallel (Megatron's sequence parallelism, tp > 1):
// outside the tensor-parallel layers (layernorms, residuals, the embedding's output) each rank
// holds only its block of the B x T rows, so their activations shrink by tp; the all-reduces
// become a reduce-scatter after each row-parallel layer and an all-gather before each
// column-parallel one (their conjugates in backward), and the layernorms' weight gradients,
// partial per block of rows, are summed over the group. B x T must be a multiple of tp.
struct TensorParallel {
  Communicator* comm = nullptr;
  bool sequenceParallel = false;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// This rank's place in context parallelism: comm is the cp group (null for cp = 1), used from the
// model's thread only. The sequence is cut into 2 cp equal chunks and cp rank r holds chunks r and
// 2 cp - 1 - r (causal load balancing: an early chunk has few keys before it and a late one many,
// so every rank's pair has the same attention work). Everything but attention works on each
// position alone; attention is ring attention: each rank's keys and values travel around the cp
// ring while every rank attends its queries to each block as it passes (the softmax kept online),
// and in backward the key and value gradients travel with their blocks back to their owners.
struct ContextParallel {
  Communicator* comm = nullptr;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};
// The positions in the whole sequence of length seq that cp rank `rank` of `size` holds, in the
// order it holds them (seq a multiple of 2 size; size 1: all, in order).
std::vector<int> contextPositions(int seq, int size, int rank);

enum class Pass { kForward, kBackward };

// Mixed precision: the compute type of the linear layers. kFp32: everything fp32. kBf16, kFp16:
// their products take 16-bit operands with fp32 accumulation (kernels::gemm16); the weights are
// cast on each use (after ZeRO-3's gather, so the master weights, their gradients and the optimizer
// stay fp32), and the activations they read are kept for backward in the 16-bit type, half the
// bytes; their outputs, layernorm, attention, softmax and the loss stay fp32. MoE experts compute
// in the 16-bit type too but keep fp32 activations; the router is fp32.
enum class Compute { kFp32, kBf16, kFp16 };
// "fp32", "bf16", "fp16"; throws chorus::Error naming the word otherwise.
Compute parseCompute(const std::string& name);
const char* computeName(Compute compute);

// Activation checkpointing: what a block keeps of a micro-batch between its forward and backward.
// kNone: everything backward reads. kSelective (Korthikanti et al. 2022): all but the attention
// probabilities (B x heads x T x T, the part that grows with T squared), recomputed from the kept
// q, k, v in backward. kFull: only the block's input; backward reruns the block's forward (its
// collectives included) into one shared set of buffers first.
enum class Recompute { kNone, kSelective, kFull };
// "none", "selective", "full"; throws chorus::Error naming the word otherwise.
Recompute parseRecompute(const std::string& name);

// How the model reaches parameters and gradients, unit by unit. For a micro-batch through a span
// of units (ParamLayout's numbers), the model calls, in order: forward: acquire/release for the
// embeddings, the blocks, the final layernorm, then the head (the embeddings again when tied on
// this rank); backward: acquire/release the head (then gradientsDone when it is the lm_head copy),
// the final layernorm and the blocks down, each followed by gradientsDone; then the embeddings'
// gradient (no parameters needed) and their gradientsDone. Units a span lacks are skipped.
class UnitAccess {
 public:
  virtual ~UnitAccess() = default;
  // The unit's parameters, valid until release(unit, pass).
  virtual const float* acquire(int unit, Pass pass) = 0;
  virtual void release(int /*unit*/, Pass /*pass*/) {}
  // The unit's gradient buffer; backward adds into it.
  virtual float* gradients(int unit) = 0;
  // Backward will not touch the unit's gradients again.
  virtual void gradientsDone(int /*unit*/) {}
};

// Parameters and gradients in two whole flat buffers (one process, or plain data parallel).
class FlatAccess : public UnitAccess {
 public:
  FlatAccess(const ParamLayout& layout, float* params, float* grads)
      : layout_(layout), params_(params), grads_(grads) {}
  const float* acquire(int unit, Pass) override { return params_ + layout_.unitOffset(unit); }
  float* gradients(int unit) override { return grads_ + layout_.unitOffset(unit); }

 private:
  const ParamLayout& layout_;
  float* params_;
  float* grads_;
};

class Gpt {
 public:
  // A model for batches of `batch` sequences of `seq` tokens (seq <= context); with tp, this
  // rank's shard of it (collective over the tp group in forward and backward). spans: the model
  // chunks this rank runs (pipeline parallelism; see ParamLayout), each a stage of the pipeline;
  // empty: the whole model. recompute: activation checkpointing (the results are the same). cp:
  // context parallelism (seq a multiple of 2 cp); this rank holds seq / cp positions of each
  // sequence, contextPositions(seq, cp, cp rank), and its batches hold those columns only.
  // ep: expert parallelism for MoE blocks (the layout holds this ep rank's experts; each MoE
  // block's forward and backward are collective over the ep group).
  // compute: mixed precision (see Compute). device: where the activations live and the kernels run
  // (the calling thread's current CUDA device for kCuda); the parameters and gradients the
  // UnitAccess gives, the tokens' copies, chunk inputs and outputs are in that device's memory.
  // MoE blocks route on the host (the router's logits come over, the choices go back; moe.h).
  Gpt(const GptConfig& config, int batch, int seq, TensorParallel tp = {}, std::vector<LayerSpan> spans = {},
      Recompute recompute = Recompute::kNone, ContextParallel cp = {}, ExpertParallel ep = {},
      Compute compute = Compute::kFp32, Device device = Device::kCpu);
  ~Gpt();
  const GptConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  Compute compute() const { return compute_; }
  Backend& backend() { return *backend_; }
  Device device() const { return backend_->device(); }
  int batch() const { return B_; }
  // The positions this rank holds of each sequence (all of them without context parallelism),
  // and their places in the whole sequence.
  int seq() const { return T_; }
  std::span<const int> positions() const { return positions_; }
  int chunks() const { return static_cast<int>(chunks_.size()); }
  // Whether chunk c begins the model (takes tokens) and ends it (gives the loss).
  bool firstChunk(int c) const { return layout_.spans()[c].begin == 0; }
  bool lastChunk(int c) const { return layout_.spans()[c].end == config_.layers; }
  // The floats of the activation between two chunks (this rank's rows x width), and of its gradient.
  size_t boundaryFloats() const { return static_cast<size_t>(rows_) * config_.width; }

  // The whole model (one chunk holding every block), micro-batch slot 0. Runs the model on
  // tokens(B, T). With targets(B, T), returns the mean cross-entropy loss and keeps what backward
  // needs; without (nullptr), only the logits are computed and the result is 0. Tokens and targets
  // must lie in [0, vocab): checked, chorus::Error names the position.
  float forward(const int* tokens, const int* targets, UnitAccess& access);
  // The gradient of lossScale x (the mean loss of the last forward with targets), added into the
  // gradient buffers. For micro-batches of one step, lossScale = 1 / micro-batches.
  void backward(UnitAccess& access, float lossScale = 1.0f);

  // One chunk, one micro-batch: its activations are kept in `slot` (slots are made on first use;
  // a pipeline keeps several micro-batches in flight) until backwardChunk on the same slot, or
  // the slot's next forward. The first chunk reads tokens, any other input (boundaryFloats: the
  // previous chunk's output); the last chunk reads targets and returns the loss (0 without
  // targets), any other chunk returns 0 and leaves its output in chunkOutput(c, slot).
  float forwardChunk(int c, int slot, const int* tokens, const float* input, const int* targets, UnitAccess& access);
  std::span<const float> chunkOutput(int c, int slot) const;
  // Backward of the chunk's micro-batch in slot: from the loss (last chunk; lossScale as in
  // backward) or from doutput, the gradient of its output. A chunk that is not the first leaves
  // the gradient of its input in inputGradient() (until the next backward).
  void backwardChunk(int c, int slot, const float* doutput, UnitAccess& access, float lossScale = 1.0f);
  std::span<const float> inputGradient() const { return dres_; }
  // What the MoE blocks of chunk c did with the micro-batch in slot (its last forward): the blocks
  // counted, their aux and z losses summed (before their coefficients: divide by layers for the
  // mean), the weighted sum added to the training loss (already in the gradients), the choices
  // each expert got and the choices dropped, summed over the blocks. Zeros without MoE blocks.
  struct MoeSummary {
    int layers = 0;
    double aux = 0, z = 0, weighted = 0;
    std::vector<long> expertChoices;
    long dropped = 0;
    void add(const MoeActivations& block, double weightedLoss);
  };
  const MoeSummary& moeSummary(int c, int slot) const { return chunks_.at(c).slots.at(slot)->moe; }
  // The same over every forward since the last call (all chunks and slots), and starts again.
  MoeSummary takeMoeTotals();
  // Where the MoE blocks' time went since the last call (moe.h), and starts again.
  MoeProfile takeMoeProfile() { return moe_ ? moe_->takeProfile() : MoeProfile{}; }

  // Micro-batch slots made so far for chunk c (the most a pipeline schedule kept in flight).
  int slots(int c) const { return static_cast<int>(chunks_[c].slots.size()); }

  // (B, T, vocab) of the last forward of the whole model (in the backend's memory, as chunkOutput's
  // and inputGradient's).
  std::span<const float> logits() const;
  // Bytes of activations and scratch held: every slot made so far, the shared scratch and the
  // backend's.
  size_t activationBytes() const;
  // Floating-point operations of one forward + backward over a batch (matmuls and attention,
  // as the 6N + 12 L T C rule of thumb counts them), for the whole model and whole sequences (all
  // tp, pp and cp ranks): for MFU.
  double flopsPerStep() const;

 private:
  struct Layer {
    // att: what the backend's attention keeps for backward (the CPU: the probabilities, B x heads x
    // T x T; CUDA: each row's log-sum-exp); with context parallelism instead lse, the log-sum-exp of
    // each query row's scores (B, heads, T), from which backward rebuilds the probabilities.
    // In 16-bit compute the linear layers' inputs and outputs are kept as ln1h, qkvh, attyh, ln2h,
    // fchh and fchGeluh instead (their fp32 vectors then empty); atty stays fp32 with context
    // parallelism (ring attention accumulates it block by block), ln2 in an MoE block (its router
    // is fp32).
    Buffer<float> ln1, ln1Mean, ln1Rstd, qkv, atty, lse, res2, ln2, ln2Mean, ln2Rstd, fch, fchGelu;
    Buffer<uint16_t> ln1h, qkvh, attyh, ln2h, fchh, fchGeluh;
    Buffer<char> att;    // what the backend's attention keeps (Backend::attentionKeptBytes)
    MoeActivations moe;  // an MoE block's MLP (fch and fchGelu unused)
    size_t bytes() const;
  };
  // One micro-batch's activations in one chunk.
  struct Activations {
    Buffer<int> tokens, targets;
    std::vector<Buffer<float>> residual;  // blocks + 1 of (rows, C): each block's input and the last output
    std::vector<Layer> layers;
    // Last chunk: the final layernorm (and with sequence parallelism its gathered rows, kept for
    // backward's weight gradient), logits (in fp32 compute then their gradient), each row's
    // largest logit and exponential sum (backward recomputes the probabilities from them; with a
    // vocab-parallel head expSums also holds each row's target logit after the sums, the two
    // summed over the ranks at once) and losses.
    // In 16-bit compute the head's input is kept as lnfh and lnfWholeh instead of lnf and lnfWhole.
    Buffer<float> lnf, lnfMean, lnfRstd, lnfWhole, logits, rowMax, expSums, losses;
    Buffer<uint16_t> lnfh, lnfWholeh;
    bool haveTargets = false;
    MoeSummary moe;
    size_t bytes() const;
  };
  struct Chunk {
    LayerSpan span;
    std::vector<std::unique_ptr<Activations>> slots;
  };
  Activations& slotOf(int c, int slot);
  // Where block i's intermediate values live: the slot's own, or the shared buffers of full recompute.
  Layer& layerOf(Activations& a, int i) { return recompute_ == Recompute::kFull ? recomputed_ : a.layers[i]; }
  // What attention keeps: the layer's own, or the shared buffer of selective recompute.
  void* attOf(Layer& L) { return L.att.empty() ? attScratch_.data() : L.att.data(); }
  // Attention forward (into out) and backward (into dqkv_, from datty_ and out) of a block without
  // context parallelism: in fp32 from L.qkv, or in 16-bit compute from L.qkvh.
  void attention(Layer& L, float* out);
  void attentionBackward(Layer& L, const float* out);
  // A row-parallel layer's partial output goes where sumRows wants it: the whole rows' scratch
  // with sequence parallelism (reduce-scattered from there), else the destination itself.
  float* partialFor(float* rowsOut) { return sequenceParallel_ ? wholeRows_.data() : rowsOut; }
  // Block `layer`'s forward: in (rows, C) -> out, its intermediate values into L. experts: an MoE
  // block's experts' unit (null for a dense block).
  void blockForward(const float* weights, const float* experts, Layer& L, const float* in, float* out, int layer);
  void allocateLayer(Layer& L, bool withAttention, bool dense) const;
  // b becomes count zeroed elements in the backend's memory.
  template <typename T>
  void make(Buffer<T>& b, size_t count) const {
    b = Buffer<T>(*backend_, count);
  }
  // An MoE block's MLP, forward (ln2 -> out) and backward (dres_ -> the ln2 rows' gradient).
  void moeForward(const float* router, const float* experts, Layer& L, float* out);
  void moeBackward(const float* router, const float* experts, float* dRouter, float* dExperts, Layer& L, float* dlnRows,
                   float lossScale);
  // Ring attention (context parallelism), collective over the cp group. Forward: L.qkv -> L.atty
  // and L.lse. Backward: from datty_ into dqkv_ (added).
  void ringAttention(Layer& L, Pass pass);
  // Sums x over the tp group in place (nothing for tp = 1).
  void tpSum(std::span<float> x, ReduceOp op = ReduceOp::kSum);
  // Sequence parallel: every rank's rows of a (rows_, C) activation, gathered into whole rows;
  // otherwise rows itself.
  const float* gatherRows(const float* rows);
  // The total of the ranks' partial (B T, C) outputs of a row-parallel layer, this rank's rows of
  // it into rows (reduce-scatter); without sequence parallelism partial is rows (all-reduce).
  void sumRows(float* partial, float* rows);
  // layernormBackward over this rank's rows; with sequence parallelism the weight and bias
  // gradients of these rows are summed over the tp group before they are added.
  void layernormBackwardRows(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd);
  void checkTokens(const int* values, const char* what) const;
  // ---- mixed precision ----
  // The input of a linear layer as the product reads it: fp32, or 16-bit (f32 then null).
  struct Operand {
    const float* f32 = nullptr;
    const uint16_t* h = nullptr;
  };
  bool sixteen() const { return compute_ != Compute::kFp32; }
  // Where an fp32 activation is made: `kept` when the model keeps it, else scratch (16-bit compute,
  // where only its cast is kept).
  float* madeIn(Buffer<float>& kept, Buffer<float>& scratch) { return kept.empty() ? scratch.data() : kept.data(); }
  // Forward, 16-bit compute: an activation just made (count values) rounded to the 16-bit type in
  // place, so that forward goes on with what backward will read, and kept in `half` unless the model
  // keeps it in fp32 (then empty).
  void keep(float* made, Buffer<uint16_t>& half, size_t count);
  // Backward: an activation in fp32, widened from `half` into scratch when kept so.
  const float* widened(Buffer<float>& full, Buffer<uint16_t>& half);
  // Forward: an activation just made in `made` (count values) as a product's operand; in 16-bit
  // compute cast into `half` (kept for backward), or into scratch when the model keeps it in fp32.
  Operand operand(const float* made, Buffer<uint16_t>& half, size_t count);
  // Backward: the operand forward kept (full or half).
  Operand keptOperand(Buffer<float>& full, Buffer<uint16_t>& half);
  // Sequence parallel: every rank's rows of an operand (this rank's rows), else the operand.
  Operand gathered(Operand rows);
  // The first count values of an acquired unit, cast to the 16-bit type (valid until the next cast).
  const uint16_t* castWeights(const float* weights, size_t count);
  // matmulForward / matmulBackward in the compute type: w the fp32 weight, wh its cast (16-bit).
  void linearForward(float* out, Operand in, const float* w, const uint16_t* wh, const float* bias, int n, int c,
                     int oc);
  void linearBackward(float* dinp, float* dweight, float* dbias, const float* dout, Operand in, const float* w,
                      const uint16_t* wh, int n, int c, int oc);
  // First: the buffers below are its memory, freed before it goes.
  std::unique_ptr<Backend> backend_;
  GptConfig config_;
  TensorParallel tp_;
  ParamLayout layout_;
  int B_, T_;
  int Ct_, Ft_, heads_;  // this rank's attention channels (C / tp), MLP hidden units (4C / tp), heads
  bool sequenceParallel_ = false;
  Recompute recompute_ = Recompute::kNone;
  Compute compute_ = Compute::kFp32;
  kernels::Float16 format_ = kernels::Float16::kBf16;  // 16-bit compute's type
  // 16-bit compute: fp32 activations between their making and their cast (work_; outWork_ for the
  // outputs of the linear layers that attention and GELU read while work_ takes their results),
  // casts not kept, a unit's weights cast, and sequence parallelism's gathered 16-bit rows.
  Buffer<float> work_, outWork_;
  Buffer<uint16_t> scratch16_, castWeights_, wholeRows16_;
  Layer recomputed_;            // full recompute: one block's intermediate values, rebuilt in backward
  Buffer<char> attScratch_;     // selective recompute: what attention keeps, for one block
  Buffer<float> recomputeOut_;  // full recompute: the rerun block's output (already kept as the next input)
  ContextParallel cp_;
  ExpertParallel ep_;
  std::unique_ptr<MoeMlp> moe_;  // the MoE blocks' layer (one: they share its shape and scratch)
  Buffer<float> moeGrad_;        // sequence parallel: one MoE block's partial gradients, summed over tp
  MoeSummary moeTotals_;         // see takeMoeTotals
  std::vector<int> positions_;   // T_ of them, see positions()
  Buffer<int> positionsOn_;      // the same in the backend's memory
  Buffer<int> rowPositions_;     // tp > 1: the position of each of this rank's rows
  // Ring attention: the key and value blocks in flight (this rank's, and the one arriving), their
  // gradients travelling with them, and each query row's running max and sum (then lse and delta).
  Buffer<float> ringKv_[2], ringDkv_[2], ringMax_, ringSum_;
  Buffer<uint16_t> ringKv16_[2];  // 16-bit compute: the keys and values on the ring
  int rows_ = 0, firstRow_ = 0;   // this rank's rows of the B x T: all, or its block with sequence parallelism
  std::vector<Chunk> chunks_;
  // Sequence parallel: one (B T, C) scratch for whole rows, used in turn for a row-parallel layer's
  // partial output, a gathered layernorm output and the gathered dres (each is done with before
  // the next is made); this rank's rows of an input gradient; and a layernorm's partial weight and
  // bias gradients.
  Buffer<float> wholeRows_, dlnRows_, lnGrad_;
  // Backward scratch, reused by every block.
  Buffer<float> dres_, dln_, datty_, dqkv_, dfch_, dfchGelu_;
};

}  // namespace chorus::training
