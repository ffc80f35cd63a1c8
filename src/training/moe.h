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
#pragma once

#include <chorus/chorus.hpp>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace chorus::training {

struct MoeConfig {
  int experts = 0;            // E; 0: no mixture of experts (the dense MLP)
  int topK = 2;               // k, 1 or 2
  int hidden = 0;             // an expert's hidden width; 0: 4 x the model's width
  double capacityFactor = 0;  // 0: no capacity (no token dropped)
  float auxCoef = 0.01f;      // the load-balancing loss's coefficient
  float zCoef = 0.0f;         // the router z-loss's coefficient
  bool swiglu = false;        // the experts' activation: SwiGLU, else GELU
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

// This rank's place in expert parallelism: comm is the ep group (null for ep = 1).
struct ExpertParallel {
  Communicator* comm = nullptr;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// What one micro-batch through the layer keeps for backward (one per micro-batch in flight).
struct MoeActivations {
  int tokens = 0;
  std::vector<float> probs, lse, gate;             // (n, E), (n), (n, k)
  std::vector<int> expert, row, assigned, counts;  // (n, k), (n, k), (E: over the token group), (E)
  int total = 0;                                   // the token group's tokens
  std::vector<size_t> sendRows, recvRows;          // per ep rank: rows this rank sends, receives
  std::vector<int> recvCounts;                     // (ep, local experts): rows from each rank per local expert
  std::vector<float> expertIn, fc, act;            // this rank's experts' rows: input, first layer, activation
  std::vector<float> combined;                     // (rows sent, C): the experts' outputs back home
  float aux = 0, z = 0;                            // the losses (means over total), without coefficients
  int dropped = 0;                                 // choices over capacity
  size_t floats() const;
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
  MoeMlp(const MoeConfig& config, int width, ExpertParallel ep = {}, Communicator* tokenGroup = nullptr);
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

 private:
  // Rows to their experts' ranks and back: `out` gets, for each rank in order, the rows `in` holds
  // for it; forward (dispatch) or backward (combine) direction.
  void exchange(const std::vector<float>& in, std::vector<float>& out, const MoeActivations& a, bool toExperts);
  // Rows by source rank (each source's in expert order) <-> rows by local expert (each expert's
  // in source order).
  void regroup(const float* in, float* out, const MoeActivations& a, bool toExpertMajor) const;
  // The rows a local expert takes from every rank.
  int rowsOf(const MoeActivations& a, int localExpert) const;

  MoeConfig config_;
  int C_, hidden_, localExperts_;
  ExpertParallel ep_;
  Communicator* tokenGroup_;
  std::vector<float> logits_, dlogits_, dgate_, sent_, received_, dExpertIn_, dfc_, dact_, dy_, grouped_;
  std::vector<size_t> countsOut_, countsIn_;
};

}  // namespace chorus::training
