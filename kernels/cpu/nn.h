// nn.h: the transformer's layers on host memory, forward and backward (GPT-2: embeddings,
// layernorm, causal multi-head attention, GELU, residual, softmax cross-entropy). The CPU reference
// the CUDA kernels must match. Shapes are stated as (B, T, C) etc. and are row-major, the last index
// fastest. Backward functions accumulate (+=) into parameter gradients and input gradients unless
// they say otherwise, so several micro-batches (or several uses of a tied weight) add up. Pure
// functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/half.h"

namespace chorus::kernels {

// out(B, T, C) = wte[tokens(B, T)] + wpe[t]: token and position embeddings. Every token must be in
// [0, V) and T no more than wpe's rows; the caller checks. Vocab-parallel: wte holds rows
// [v0, v0 + vcount) of the whole table; tokens outside them give zeros (the ranks' outputs are then
// summed), and wpe may be null (no position term). positions(T), when given, are the positions of
// the T columns in the whole sequence (context parallelism holds some of them): row t uses
// wpe[positions[t]].
void embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C,
                      int v0 = 0, int vcount = std::numeric_limits<int>::max(), const int* positions = nullptr);
// dwte[tokens[b, t]] += dout[b, t] (tokens in [v0, v0 + vcount) only, at row token - v0),
// dwpe[positions[t] or t] += dout[b, t].
void embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0 = 0,
                       int vcount = std::numeric_limits<int>::max(), const int* positions = nullptr);

// Layernorm over the last dimension of inp(n, c): out = (inp - mean) * rstd * weight + bias, with the
// biased variance and eps = 1e-5 as GPT-2; saves mean(n) and rstd(n) for backward.
constexpr float kLayernormEps = 1e-5f;
void layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                      int n, int c);
void layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const float* mean, const float* rstd, int n, int c);

// Causal multi-head self-attention. qkv(B, T, 3C) holds q, k, v side by side, each (NH heads x
// C/NH); out(B, T, C) gets the heads side by side; att(B, NH, T, T) saves the softmax
// probabilities (zero above the diagonal) for backward. Scores are scaled by 1/sqrt(C/NH).
void attentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv(B, T, 3C) += the gradient through attention; scratch holds T*T floats.
void attentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B, int T,
                       int C, int NH);
// The same in 16 bits (mixed precision): qkv and the kept probabilities att in the format (bf16 or
// fp16), the four products by gemm16 (16-bit operands, fp32 sums), the softmax and its backward in
// fp32; out and dqkv are fp32. P is rounded to the format once, as it is kept, and used rounded in
// P v and in backward; backward rounds dO and dS to the format for their products. scratch holds
// attention16ScratchFloats(T, C) floats.
size_t attention16ScratchFloats(int T, int C);
void attentionForward16(Float16 format, float* out, uint16_t* att, const uint16_t* qkv, float* scratch, int B, int T,
                        int C, int NH);
void attentionBackward16(Float16 format, float* dqkv, float* scratch, const float* dout, const uint16_t* qkv,
                         const uint16_t* att, int B, int T, int C, int NH);

// Attention one block of keys at a time (ring attention, for context parallelism): the softmax is
// kept online, as a running maximum and sum of exponentials per query row (Milakov and
// Gimelshein 2018, as FlashAttention does), so the key blocks may come in any order and the
// probabilities are never stored whole. One sequence, every head: queries q(Tq rows), keys k and
// values v (Tk rows); head h of each at columns [h C/NH, (h + 1) C/NH), rows `stride` floats apart.
// diagonal: the two blocks are the same positions (Tq == Tk) and key j > query i is masked;
// otherwise every key precedes every query (a block wholly after the queries is not attended).
// Element: float, or uint16_t for 16-bit compute's blocks, whose format says bf16 or fp16.
template <typename Element>
struct AttentionBlockOf {
  const Element* q;
  int qStride;
  const Element* k;
  const Element* v;
  int kvStride;
  int Tq, Tk, C, NH;
  bool diagonal;
  Float16 format = Float16::kBf16;  // 16-bit blocks only
};
using AttentionBlock = AttentionBlockOf<float>;
using AttentionBlock16 = AttentionBlockOf<uint16_t>;
// Adds the block into out(Tq, C; rows outStride apart), unnormalised, and updates rowMax and
// rowSum (NH x Tq, heads statStride apart; start them at -infinity and 0, out at 0). scratch: Tq x Tk.
void attentionBlockForward(const AttentionBlock& blk, float* out, int outStride, float* rowMax, float* rowSum,
                           int statStride, float* scratch);
// After the last block: out /= rowSum, and lse = rowMax + log(rowSum), the log-sum-exp backward
// needs (lse may be rowMax itself).
void attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                          int statStride, int Tq, int C, int NH);
// delta(NH x Tq, heads statStride apart) = per head, the dot product of each row of dout and out.
void attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                         int NH);
// Backward through one block, the probabilities rebuilt from lse: dq (rows dqStride apart), dk and
// dv (rows dkvStride apart) are accumulated. scratch: 2 Tq x Tk.
void attentionBlockBackward(const AttentionBlock& blk, const float* dout, int doutStride, const float* lse,
                            const float* delta, int statStride, float* dq, int dqStride, float* dk, float* dv,
                            int dkvStride, float* scratch);
// The same blocks in 16-bit compute: q, k and v in the format (bf16 or fp16), their products by
// gemm16 (fp32 sums); the scores, the online softmax, out and every gradient in fp32. Forward rounds
// the block's unnormalised probabilities to the format for P v; backward rounds P, dS and dO for its
// products. scratch: attentionBlock16ScratchFloats(Tq, Tk, C) floats.
size_t attentionBlock16ScratchFloats(int Tq, int Tk, int C);
void attentionBlockForward(const AttentionBlock16& blk, float* out, int outStride, float* rowMax, float* rowSum,
                           int statStride, float* scratch);
void attentionBlockBackward(const AttentionBlock16& blk, const float* dout, int doutStride, const float* lse,
                            const float* delta, int statStride, float* dq, int dqStride, float* dk, float* dv,
                            int dkvStride, float* scratch);

// GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void geluForward(float* out, const float* inp, size_t n);
void geluBackward(float* dinp, const float* inp, const float* dout, size_t n);

// out = a + b; out may alias a or b.
void residualForward(float* out, const float* a, const float* b, size_t n);
// da += dout, db += dout.
void residualBackward(float* da, float* db, const float* dout, size_t n);

// Softmax cross-entropy over logits(n, v): rowMax(n) and sums(n) (each row's largest logit and
// its sum of exp(logit - max), what crossEntropyBackward recomputes the probabilities from),
// losses(n) = -log softmax[target], and returns the mean loss. Targets must be in [0, v). No
// n x v array is written: the probabilities are not kept.
float crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                          int v);
// dlogits(n, v) = (probs - onehot(target)) * scale, written (not accumulated), probs = exp(logits -
// rowMax) / sums recomputed from the forward's statistics (rounded as the forward rounded them:
// exp(x - max) times the reciprocal of the sum); dlogits may be logits itself. For the mean loss,
// scale = 1/n. Vocab-parallel: the columns are [v0, v0 + v) of the whole vocabulary, the
// statistics are the whole rows', and the one-hot term applies where the target is among them.
void crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                          const int* targets, int n, int v, float scale, int v0 = 0);
// crossEntropyForward in three passes, for logits(n, v) that are columns [v0, v0 + v) of the whole
// vocabulary (vocab-parallel): between the passes the ranks reduce the per-row values, the maxima
// by max, the sums and target logits by sum. One rank with v0 = 0 is crossEntropyForward.
// 1. rowMax(n) = the largest logit of each row.
void crossEntropyShardMax(float* rowMax, const float* logits, int n, int v);
// 2. sums(n) = the row sums of exp(logits - rowMax), targetLogits(n) = the target's logit where it
//    is among the columns, else 0.
void crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax,
                          const int* targets, int n, int v, int v0);
// 3. losses(n) = log(sum) + max - targetLogit; returns the mean loss.
float crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits, int n);

// The optimizers, one step over n elements; step counts from 1. The caller passes weightDecay 0
// for tensors not decayed (biases, layernorm) and the learning rate of this step in lr.
//
// AdamW as PyTorch's torch.optim.AdamW (decoupled weight decay):
//   param *= 1 - lr * weightDecay; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   param -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
// SGD with momentum as PyTorch's torch.optim.SGD (no dampening; weight decay added to the
// gradient): g += weightDecay param; m = g at step 1, else momentum m + g;
//   param -= lr (nesterov ? g + momentum m : m).
enum class Optimizer { kAdamW, kSgd };
struct OptimizerSettings {
  Optimizer kind = Optimizer::kAdamW;
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weightDecay = 0.1f;
  float momentum = 0.9f;  // SGD
  bool nesterov = false;  // SGD
};
void adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step, const OptimizerSettings& s);
void sgdStep(float* param, const float* grad, float* m, size_t n, long step, const OptimizerSettings& s);

// Sum of squares of x(n), accumulated in double: for the global gradient norm.
double sumOfSquares(const float* x, size_t n);
// x *= factor.
void scale(float* x, size_t n, float factor);

}  // namespace chorus::kernels
