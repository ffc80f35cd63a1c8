// moe.h: a mixture-of-experts MLP (GShard, Switch Transformer, Mixtral): a router (a linear map
// to E logits, softmax) sends each token to its k most probable experts, each an MLP of its own
// (GELU, or SwiGLU), and the token's output is the experts' outputs weighted by their gates. An
// expert takes at most its capacity of tokens (capacity factor x n k / E; the rest are dropped and
// carried by the residual alone), or all of them. The auxiliary load-balancing loss (Switch) and
// the router z-loss (ST-MoE) are added to the model's loss with their coefficients.
//
// Expert parallelism: with ep ranks, rank r holds experts [r E/ep, (r + 1) E/ep) and the whole
// router; each rank routes its own tokens, sends each expert's rows to its rank (dispatch: the
// row counts by all-to-all, then the rows by all-to-allv), the experts run on the rows from every
// rank (source ranks in order, each source's rows in its priority order), and the outputs go back
// the same way (combine). Every rank does the same exchanges in the same order, so the results
// do not depend on timing. Capacity is per source rank (its n tokens), as GShard's groups.
//
// Overlap: with chunks > 1 (and ep > 1) the micro-batch's tokens are routed together but exchanged
// in that many pieces, on the ep group's communication thread: while the experts compute one
// chunk's rows, the next chunk's rows are in flight, and the finished chunk's outputs travel back
// (backward likewise). Each expert then runs once per chunk on that chunk's rows, so the results
// equal the unchunked layer's up to the order of the weight gradients' sums. On a device each
// exchange is a device all-to-allv enqueued on the expert-parallel communication lane (by that
// thread, or by the training thread with one chunk), after the compute queue's work that wrote its
// rows; the compute queue waits for it only where the rows are read.
#pragma once

#include <chorus/chorus.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "src/training/backend.h"
#include "src/training/comm_worker.h"

namespace chorus::training {

struct MoeConfig {
  int experts = 0;            // E; 0: no mixture of experts (the dense MLP)
  int topK = 2;               // k, 1 or 2
  int hidden = 0;             // an expert's hidden width; 0: 4 x the model's width
  double capacityFactor = 0;  // 0: no capacity (no token dropped)
  float auxCoef = 0.01f;      // the load-balancing loss's coefficient
  float zCoef = 0.0f;         // the router z-loss's coefficient
  bool swiglu = false;        // the experts' activation: SwiGLU, else GELU
  int chunks = 1;             // exchanges per dispatch and combine (ep > 1): see "Overlap" above
  bool enabled() const { return experts > 0; }
  // Gates renormalised over the k chosen (k > 1, as Mixtral and GShard); Switch's k = 1 keeps the
  // probability, so that the router learns through it.
  bool normalizeGates() const { return topK > 1; }
  int hiddenFor(int width) const { return hidden > 0 ? hidden : 4 * width; }
  // Throws chorus::Error (kInvalidArgument) naming the field when it cannot work with this width
  // and ep ranks.
  void validate(int width, int ep = 1) const;
  std::string describe() const;
};

// This rank's place in expert parallelism: comm is the ep group (null for ep = 1). worker: a
// communication thread owning comm while the layer runs (its exchanges go there, so that they
// overlap the experts' compute); null: the exchanges run on the calling thread, one at a time.
struct ExpertParallel {
  Communicator* comm = nullptr;
  CommWorker* worker = nullptr;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// One piece of a micro-batch's tokens, dispatched and combined on its own.
struct MoeChunk {
  int first = 0, tokens = 0;               // its tokens: [first, first + tokens)
  std::vector<int> row;                    // (tokens, k): each kept choice's row in the chunk's dispatch buffer
  std::vector<int> counts;                 // (E): the rows it sends to each expert
  std::vector<size_t> sendRows, recvRows;  // per ep rank: rows it sends, receives
  std::vector<int> recvCounts;             // (ep, local experts): rows from each rank per local expert
  size_t sentAt = 0, expertAt = 0;         // where its rows start: in `combined`, in expertIn / fc / act
  size_t sent() const;
  size_t received() const;
};

// What one micro-batch through the layer keeps for backward (one per micro-batch in flight). The
// routing is decided on the host (its vectors); the rows and what the kernels read of the routing
// are in the layer's backend's memory (the Buffers).
struct MoeActivations {
  int tokens = 0;
  std::vector<float> probs, lse, gate;             // (n, E), (n), (n, k)
  std::vector<int> expert, row, assigned, counts;  // (n, k), (n, k), (E: over the token group), (E)
  int total = 0;                                   // the token group's tokens
  std::vector<MoeChunk> chunks;                    // the exchanges' pieces, in token order
  Buffer<int> chunkRows;                           // (n, k): each chunk's row, chunk after chunk (token order)
  Buffer<float> gates;                             // (n, k): gate, where the kernels read it
  Buffer<float> expertIn, fc, act;  // this rank's experts' rows (chunk by chunk): input, first layer, activation
  Buffer<float> combined;           // (rows sent, C): the experts' outputs back home
  float aux = 0, z = 0;             // the losses (means over total), without coefficients
  int dropped = 0;                  // choices over capacity
  size_t floats() const;
};

// Where the layer's time went on this rank (forward and backward together), in seconds: routing
// (the router, the top-k, the losses' sums, the gradient through them), dispatch (gathering the
// rows, the counts, waiting for the rows to reach their experts; backward: the gradient's way
// back), the experts' products, combine (waiting for the outputs to come back, the gated sum;
// backward: the gradient's way to the experts). wait: the part of dispatch and combine spent
// in exchanges or waiting for them (ep = 1: the local copies). chunks: the chunks whose experts ran; overlapped: those
// of them that ran while a later chunk's exchange was still in flight.
struct MoeProfile {
  double route = 0, dispatch = 0, experts = 0, combine = 0, wait = 0;
  long chunks = 0, overlapped = 0;
  void add(const MoeProfile& other);
};

// The layer's parameters, two blocks: the router's, router.weight (E, C); the experts', each of
// this rank's experts in turn: c_fc.weight (F, C) and c_fc.bias (F) with F = hidden (2 hidden with
// SwiGLU: the gate's half, then the value's), c_proj.weight (C, hidden), c_proj.bias (C). The
// model keeps them apart (the experts are reduced over other ranks than the router).
class MoeMlp {
 public:
  // tokenGroup: the ranks whose tokens together are the batch the aux and z losses are means over
  // (tensor parallelism's group with sequence parallelism, each holding some rows of it); null:
  // this rank's tokens alone.
  // sixteen: the experts' products in that 16-bit format (mixed precision; their activations stay
  // fp32, the router is fp32); none: fp32.
  // backend: where the layer computes and its inputs, outputs, parameters and rows live (the
  // model's); null: host memory (a CPU backend of its own). The routing (the router's softmax, the
  // top-k, the losses) runs on the host: the logits come over (n x E floats), the choices go back.
  // With ep > 1 on a device the rows travel through host memory.
  MoeMlp(const MoeConfig& config, int width, ExpertParallel ep = {}, Communicator* tokenGroup = nullptr,
         std::optional<kernels::Float16> sixteen = std::nullopt, Backend* backend = nullptr);
  const MoeConfig& config() const { return config_; }
  int localExperts() const { return localExperts_; }
  int firstExpert() const { return ep_.rank() * localExperts_; }
  size_t routerFloats() const { return static_cast<size_t>(config_.experts) * C_; }
  size_t expertFloats() const;
  size_t paramFloats() const { return routerFloats() + localExperts_ * expertFloats(); }
  // Offsets within the experts' block, for naming and initialising the tensors.
  struct ExpertTensors {
    size_t fcWeight, fcBias, projWeight, projBias;
  };
  ExpertTensors expertTensors(int localExpert) const;
  int fcRows() const { return config_.swiglu ? 2 * hidden_ : hidden_; }
  int hidden() const { return hidden_; }

  // out(n, C) = the layer on x(n, C), written; `a` keeps what backward needs. x must stay as it
  // is until backward. Collective over the ep group.
  void forward(float* out, const float* x, int n, const float* router, const float* experts, MoeActivations& a);
  // dx(n, C) += the gradient of the input, dRouter and dExperts += the parameters', from dout(n, C); the aux
  // and z losses' gradients are scaled by lossScale as the model's loss is. Collective over ep.
  void backward(float* dx, float* dRouter, float* dExperts, const float* dout, const float* x, const float* router,
                const float* experts, const MoeActivations& a, float lossScale);
  // The coefficient-weighted losses of a forward, to add to the model's loss.
  float weightedLoss(const MoeActivations& a) const { return config_.auxCoef * a.aux + config_.zCoef * a.z; }
  // Scratch floats (shared by all micro-batches).
  size_t scratchFloats() const;
  // The time spent since the last call, and starts again.
  MoeProfile takeProfile();

 private:
  // Cuts the routed micro-batch into chunks (each chunk's rows in expert order, each expert's in
  // the whole batch's priority order) and swaps the chunks' counts with the ep ranks.
  void planChunks(MoeActivations& a);
  // Starts moving chunk c's rows to their experts' ranks or back: `out` gets, for each rank in
  // order, the rows `in` holds for it (both in the backend's memory; on a device by a device
  // all-to-allv on the expert-parallel lane). Both must stay as they are until finish().
  std::future<void> startExchange(const Buffer<float>& in, float* out, size_t c, const MoeChunk& chunk, bool toExperts);
  // Waits for an exchange, counting the wait; on a device, the compute queue then waits for it.
  void finish(std::future<void>& exchange, size_t c);
  // The per-chunk buffers of a's chunks, sized.
  void sizeChunkBuffers(const MoeActivations& a);
  // Waits for chunk c's rows (its exchange, the time added to phase) before its experts run;
  // counts the chunk, and whether the next chunk's exchange is still in flight.
  void arrive(std::vector<std::future<void>>& exchanges, size_t c, double& phase);
  // Rows by source rank (each source's in expert order) <-> rows by local expert (each expert's
  // in source order), of one chunk.
  void regroup(const float* in, float* out, const MoeChunk& chunk, bool toExpertMajor) const;
  // The rows a local expert takes from every rank in a chunk.
  int rowsOf(const MoeChunk& chunk, int localExpert) const;
  // fn(tensors, first row, rows) for each local expert with rows in the chunk (rows from expertIn's start).
  template <typename Fn>
  void forEachExpert(const MoeChunk& chunk, Fn fn) const;
  // The experts' forward and backward on one chunk's rows (expert-major, from expertIn's
  // chunk.expertAt on): y = the outputs; backward: dx = the inputs' gradient from dy.
  void expertsForward(float* y, const float* experts, MoeActivations& a, const MoeChunk& chunk);
  // An expert's linear layer in its compute precision (sixteen_: the operands cast first).
  void expertLinearForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc);
  void expertLinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int n, int c, int oc);
  // The operands of a 16-bit product, cast into inp16_ and weight16_.
  void castOperands(const float* inp, size_t inCount, const float* weight, size_t weightCount);
  void expertsBackward(float* dx, float* dExperts, const float* dy, const float* experts, const MoeActivations& a,
                       const MoeChunk& chunk);

  MoeConfig config_;
  int C_, hidden_, localExperts_;
  ExpertParallel ep_;
  Communicator* tokenGroup_;
  std::optional<kernels::Float16> sixteen_;
  std::unique_ptr<Backend> ownBackend_;  // without a backend given: host memory
  Backend& backend_;
  bool onDevice_;  // on a device with ep > 1: the exchanges are device calls
  // The routing's host side: logits, the gates' and logits' gradients.
  std::vector<float> logits_, dlogits_, dgate_;
  // In the backend's memory: the same, and the experts' work.
  Buffer<float> logitsOn_, dlogitsOn_, dgateOn_, dExpertIn_, dfc_, dact_, grouped_;
  Buffer<uint16_t> inp16_, weight16_;
  // Per chunk: the rows leaving this rank, arriving, and going back (alive while in flight), and
  // on a device with ep > 1 where its exchange in flight ends on the expert-parallel lane.
  std::vector<Buffer<float>> sent_, received_, returned_;
  std::vector<Backend::Mark> arrived_;
  MoeProfile profile_;
};

}  // namespace chorus::training
