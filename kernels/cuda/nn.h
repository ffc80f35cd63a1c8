// nn.h (CUDA): the transformer's layers on device memory, forward and backward, matching
// kernels/cpu/nn.h (the reference) function for function: the same shapes, the same accumulate
// (+=) or write rules, the same formulas. Host code includes this header; it holds no CUDA runtime
// types. Every function enqueues its kernels on `stream` (a cudaStream_t; null: the default
// stream), does not wait for them, and returns 0 or the cudaError_t of the first launch that
// failed. Pointers are device memory unless a comment says otherwise. Sums over rows (layernorm's
// weight gradients, the gradient norm, the token embedding's gradient) are folded in a fixed order,
// so results repeat bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/half.h"
#include "kernels/cpu/nn.h"

namespace chorus::kernels::cuda {

// As kernels::embeddingForward / embeddingBackward. tokens and positions are device arrays.
// embeddingBackward adds the rows of a token that repeats in row order (one block per token, no
// atomic additions), dwpe's in batch order: both as the CPU adds them, to the bit. Its scratch
// (embeddingBackwardScratchBytes(B * T, vcount) bytes, 4-byte aligned) groups the rows by token.
int embeddingForward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C, int v0,
                     int vcount, const int* positions, void* stream);
size_t embeddingBackwardScratchBytes(int rows, int vcount);
int embeddingBackward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T, int C, int v0,
                      int vcount, const int* positions, void* scratch, void* stream);

// As kernels::layernormForward / layernormBackward. Backward's weight and bias gradients are summed
// over blocks of rows into scratch first (layernormBackwardScratchFloats(n, c) floats), then in
// block order into dweight and dbias.
int layernormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                     int n, int c, void* stream);
size_t layernormBackwardScratchFloats(int n, int c);
int layernormBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, const float* mean, const float* rstd, int n, int c, float* scratch,
                      void* stream);

// Fused causal attention (FlashAttention's way: the scores of one block of keys at a time, the
// softmax kept online, no T x T matrix in memory), in the block form of kernels::AttentionBlock so
// that the whole attention and ring attention (context parallelism) share one kernel. One call
// covers `batch` sequences: sequence b's first query row is qRows rows after sequence b - 1's (in
// q, out, dout and dq, each with its own row stride), its first key row kvRows rows after (k, v,
// dk, dv), and its statistics batchStatStride floats after (rowMax, rowSum, lse, delta; heads
// statStride apart within a sequence, as on the CPU). The head size C / NH must be at most
// kMaxAttentionHeadSize (cudaErrorInvalidValue otherwise, before anything is launched). Element:
// float, or uint16_t for 16-bit compute (blk.format says bf16 or fp16). 16-bit heads whose size is
// a multiple of 16 take the tensor cores and round as the CPU's 16-bit attention does (the
// probabilities for P V; dO and dS in backward; fp32 sums); other 16-bit heads are computed in
// fp32 from the 16-bit values.
constexpr int kMaxAttentionHeadSize = 128;
struct AttentionBatch {
  int batch = 1;
  size_t qRows = 0;
  size_t kvRows = 0;
  size_t batchStatStride = 0;
};
// As kernels::attentionBlockForward (no scratch needed).
int attentionBlockForward(const AttentionBlock& blk, const AttentionBatch& bat, float* out, int outStride,
                          float* rowMax, float* rowSum, int statStride, void* stream);
int attentionBlockForward(const AttentionBlock16& blk, const AttentionBatch& bat, float* out, int outStride,
                          float* rowMax, float* rowSum, int statStride, void* stream);
// rowMax = -infinity, rowSum = 0 and out = 0 (Tq rows of C values, outStride apart): a block
// forward's starting state.
int attentionBlockStart(float* out, int outStride, float* rowMax, float* rowSum, int statStride, int Tq, int C, int NH,
                        const AttentionBatch& bat, void* stream);
// As kernels::attentionBlockFinish and kernels::attentionBlockDelta.
int attentionBlockFinish(float* out, int outStride, float* lse, const float* rowMax, const float* rowSum,
                         int statStride, int Tq, int C, int NH, const AttentionBatch& bat, void* stream);
int attentionBlockDelta(float* delta, int statStride, const float* dout, const float* out, int stride, int Tq, int C,
                        int NH, const AttentionBatch& bat, void* stream);
// As kernels::attentionBlockBackward (no scratch needed): dq, dk and dv are accumulated; every
// element is written by one thread, in a fixed order.
int attentionBlockBackward(const AttentionBlock& blk, const AttentionBatch& bat, const float* dout, int doutStride,
                           const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                           float* dv, int dkvStride, void* stream);
int attentionBlockBackward(const AttentionBlock16& blk, const AttentionBatch& bat, const float* dout, int doutStride,
                           const float* lse, const float* delta, int statStride, float* dq, int dqStride, float* dk,
                           float* dv, int dkvStride, void* stream);
// The whole causal attention of qkv(B, T, 3C) into out(B, T, C), keeping lse(B, NH, T) (the
// log-sum-exp of each query row's scores) for backward in place of the CPU's probabilities:
// start, one diagonal block, finish. Backward adds into dqkv(B, T, 3C); delta holds B NH T floats.
int attentionForward(float* out, float* lse, float* rowSum, const float* qkv, int B, int T, int C, int NH,
                     void* stream);
int attentionForward16(Float16 format, float* out, float* lse, float* rowSum, const uint16_t* qkv, int B, int T, int C,
                       int NH, void* stream);
int attentionBackward(float* dqkv, float* delta, const float* dout, const float* out, const float* qkv,
                      const float* lse, int B, int T, int C, int NH, void* stream);
int attentionBackward16(Float16 format, float* dqkv, float* delta, const float* dout, const float* out,
                        const uint16_t* qkv, const float* lse, int B, int T, int C, int NH, void* stream);

// dst(c) += the sums of src(n, c)'s columns (a linear layer's bias gradient): blocks of rows
// summed into scratch (columnSumsScratchFloats(n, c) floats), the blocks then added in order.
size_t columnSumsScratchFloats(int n, int c);
int columnSums(float* dst, const float* src, int n, int c, float* scratch, void* stream);

// As kernels::geluForward / geluBackward / residualForward / residualBackward.
int geluForward(float* out, const float* inp, size_t n, void* stream);
int geluBackward(float* dinp, const float* inp, const float* dout, size_t n, void* stream);
int residualForward(float* out, const float* a, const float* b, size_t n, void* stream);
int residualBackward(float* da, float* db, const float* dout, size_t n, void* stream);
// dst row i (width floats, rows dstStride apart) += src row i (srcStride apart; 0: one row added to
// every row, a bias), one addition per element as kernels::residualForward row by row.
int addRows(float* dst, size_t dstStride, const float* src, size_t srcStride, size_t width, size_t rows, void* stream);
// out row i (width floats) += table row index[i] (index a device array).
int addIndexedRows(float* out, const float* table, const int* index, size_t width, size_t rows, void* stream);

// As kernels::crossEntropyForward, except that the mean loss is not returned (it would wait for
// the stream): losses(n) holds each row's; meanOf gives their mean.
int crossEntropyForward(float* rowMax, float* sums, float* losses, const float* logits, const int* targets, int n,
                        int v, void* stream);
// The three vocab-parallel passes, as kernels::crossEntropyShardMax / Exp / Loss (Loss without
// the mean).
int crossEntropyShardMax(float* rowMax, const float* logits, int n, int v, void* stream);
int crossEntropyShardExp(float* sums, float* targetLogits, const float* logits, const float* rowMax, const int* targets,
                         int n, int v, int v0, void* stream);
int crossEntropyShardLoss(float* losses, const float* sums, const float* rowMax, const float* targetLogits, int n,
                          void* stream);
int crossEntropyBackward(float* dlogits, const float* logits, const float* rowMax, const float* sums,
                         const int* targets, int n, int v, float scale, int v0, void* stream);
// The same gradient rounded to `format` as it is stored (as floatToBfloat16 / floatToHalf round
// it): the 16-bit operand of the head's products (matmulBackward16Rounded), with no fp32 gradient
// written and read back between.
int crossEntropyBackward16(Float16 format, uint16_t* dlogits, const float* logits, const float* rowMax,
                           const float* sums, const int* targets, int n, int v, float scale, int v0, void* stream);

// As kernels::adamwStep / sgdStep.
int adamwStep(float* param, const float* grad, float* m, float* v, size_t n, long step, const OptimizerSettings& s,
              void* stream);
int sgdStep(float* param, const float* grad, float* m, size_t n, long step, const OptimizerSettings& s, void* stream);

// *result (device) = the sum of squares of x(n) in double, as kernels::sumOfSquares; the blocks'
// partial sums go through scratch (sumScratchDoubles() doubles) and are added in block order.
size_t sumScratchDoubles();
int sumOfSquares(double* result, const float* x, size_t n, double* scratch, void* stream);
// *result (device) = the mean of x(n), in double then rounded to float, as the CPU's mean loss.
int meanOf(float* result, const float* x, int n, double* scratch, void* stream);
// x *= factor.
int scale(float* x, size_t n, float factor, void* stream);
// x[i] = value.
int fill(float* x, size_t n, float value, void* stream);

}  // namespace chorus::kernels::cuda
