// attention_tc_emulated_test.cc: kernels/cuda/attention_tc.cuh's tensor-core attention kernels,
// compiled for the host against tests/support/cuda_emulation.h and run there, against the CPU's
// fp32 attention of the same 16-bit values widened, within the bounds tests/gpu/nn_cuda_test.cc
// holds the GPU to (4u of the largest magnitude; u the format's unit roundoff). The whole causal
// attention (one diagonal block) and ring attention's blocks (several sequences in one call, a block
// of earlier keys and then the diagonal); and that each kernel's shared memory fits a GPU at every
// head size the kernels take. The emulation checks the kernels' indexing, masking,
// tiling and rounding; the GPU test checks them on the hardware.
#include "tests/support/cuda_emulation.h"
// The emulation first: the kernels' header is written against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/nn.h"
#include "kernels/cuda/attention_tc.cuh"
#include "tests/support/gradient_check.h"

namespace chorus::kernels {
namespace {

namespace att = cuda::attention;
namespace emu = ::chorus::testing::emulation;

// The largest difference, relative to the reference's largest magnitude.
double relativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double largest = 0.0, worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return worst / std::max(largest, 1e-30);
}

double unitRoundoff(Float16 format) { return std::ldexp(1.0, format == Float16::kBf16 ? -8 : -11); }

EmulatedDim gridOf(int rows, int NH, int batch) {
  return {static_cast<unsigned>((rows + att::kTcRows - 1) / att::kTcRows), static_cast<unsigned>(NH),
          static_cast<unsigned>(batch)};
}

// The kernels of T and the pair's head size, launched as attention.cu launches them.
template <typename T>
void forwardOf(const att::Pair<uint16_t>& p, int batch, int NH, float* out, int outStride, float* rowMax,
               float* rowSum) {
  att::withHeadSize(p.hs, [&](auto size) {
    emu::launch(att::forwardTcKernel<T, size()>, gridOf(p.Tq, NH, batch), att::kTcWarps * 32,
                att::TcForwardMemory::carve(nullptr, size()).bytes, p, out, outStride, rowMax, rowSum);
    return 0;
  });
}
void forward(Float16 format, const att::Pair<uint16_t>& p, int batch, int NH, float* out, int outStride, float* rowMax,
             float* rowSum) {
  if (format == Float16::kBf16) {
    forwardOf<__nv_bfloat16>(p, batch, NH, out, outStride, rowMax, rowSum);
  } else {
    forwardOf<__half>(p, batch, NH, out, outStride, rowMax, rowSum);
  }
}

template <typename T>
void backwardOf(const att::Pair<uint16_t>& p, int batch, int NH, const float* dout, int doutStride, const float* lse,
                const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride) {
  att::withHeadSize(p.hs, [&](auto size) {
    const int threads = att::kTcWarps * 32;
    emu::launch(att::backwardQueryTcKernel<T, size()>, gridOf(p.Tq, NH, batch), threads,
                att::TcQueryMemory::carve(nullptr, size()).bytes, p, dout, doutStride, lse, delta, dq, dqStride);
    emu::launch(att::backwardKeyTcKernel<T, size()>, gridOf(p.Tk, NH, batch), threads,
                att::TcKeyMemory::carve(nullptr, size()).bytes, p, dout, doutStride, lse, delta, dk, dv, dkvStride);
    return 0;
  });
}
void backward(Float16 format, const att::Pair<uint16_t>& p, int batch, int NH, const float* dout, int doutStride,
              const float* lse, const float* delta, float* dq, int dqStride, float* dk, float* dv, int dkvStride) {
  if (format == Float16::kBf16) {
    backwardOf<__nv_bfloat16>(p, batch, NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv, dkvStride);
  } else {
    backwardOf<__half>(p, batch, NH, dout, doutStride, lse, delta, dq, dqStride, dk, dv, dkvStride);
  }
}

// Sequences of `seq` rows of qkv (3C each, 16-bit) whose last Tq rows are the queries; the keys of
// each block start at row keyRow of the sequence. The forward's state is kept on the host between
// blocks and finished there (as attentionBlockStart / Finish / Delta do on the GPU).
struct Blocks {
  int batch, seq, Tq, C, NH;
  Float16 format;
  const uint16_t* qkv;

  int hs() const { return C / NH; }
  att::Pair<uint16_t> pair(int keyRow, bool diagonal) const {
    const int stride = 3 * C, q0 = seq - Tq;
    return att::Pair<uint16_t>{qkv + static_cast<size_t>(q0) * stride,
                               qkv + static_cast<size_t>(keyRow) * stride + C,
                               qkv + static_cast<size_t>(keyRow) * stride + 2 * C,
                               stride,
                               stride,
                               Tq,
                               Tq,
                               hs(),
                               diagonal,
                               format == Float16::kBf16,
                               static_cast<size_t>(seq),
                               static_cast<size_t>(seq),
                               static_cast<size_t>(NH) * Tq,
                               Tq,
                               1.0f / std::sqrt(static_cast<float>(hs()))};
  }
  // out (batch x seq x C, only the query rows written) and dqkv (batch x seq x 3C) from the
  // blocks whose keys start at keyRows (the last of them the diagonal).
  void run(const std::vector<int>& keyRows, const float* dout, std::vector<float>& out,
           std::vector<float>& dqkv) const {
    const size_t stats = static_cast<size_t>(batch) * NH * Tq;
    std::vector<float> rowMax(stats, -INFINITY), rowSum(stats, 0.0f), lse(stats), delta(stats);
    const int q0 = seq - Tq;
    out.assign(static_cast<size_t>(batch) * seq * C, 0.0f);
    for (size_t k = 0; k < keyRows.size(); ++k) {
      forward(format, pair(keyRows[k], k + 1 == keyRows.size()), batch, NH, out.data() + static_cast<size_t>(q0) * C, C,
              rowMax.data(), rowSum.data());
    }
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < Tq; ++i) {
        for (int h = 0; h < NH; ++h) {
          const size_t stat = (static_cast<size_t>(b) * NH + h) * Tq + i;
          const size_t row = (static_cast<size_t>(b) * seq + q0 + i) * C + h * hs();
          float dot = 0.0f;
          for (int c = 0; c < hs(); ++c) {
            out[row + c] /= rowSum[stat];
            dot += dout[row + c] * out[row + c];
          }
          lse[stat] = rowMax[stat] + std::log(rowSum[stat]);
          delta[stat] = dot;
        }
      }
    }
    dqkv.assign(static_cast<size_t>(batch) * seq * 3 * C, 0.0f);
    const int stride = 3 * C;
    for (size_t k = 0; k < keyRows.size(); ++k) {
      float* kv = dqkv.data() + static_cast<size_t>(keyRows[k]) * stride;
      backward(format, pair(keyRows[k], k + 1 == keyRows.size()), batch, NH, dout + static_cast<size_t>(q0) * C, C,
               lse.data(), delta.data(), dqkv.data() + static_cast<size_t>(q0) * stride, stride, kv + C, kv + 2 * C,
               stride);
    }
  }
};

// The CPU's fp32 causal attention of the widened values over whole sequences: the reference for
// queries in the sequences' last Tq rows (dout zero elsewhere, so the other rows are no queries).
void reference(const std::vector<float>& widened, const std::vector<float>& dout, int batch, int seq, int C, int NH,
               std::vector<float>& out, std::vector<float>& dqkv) {
  out.assign(static_cast<size_t>(batch) * seq * C, 0.0f);
  dqkv.assign(widened.size(), 0.0f);
  std::vector<float> probs(static_cast<size_t>(batch) * NH * seq * seq), scratch(static_cast<size_t>(seq) * seq);
  attentionForward(out.data(), probs.data(), widened.data(), batch, seq, C, NH);
  attentionBackward(dqkv.data(), scratch.data(), dout.data(), widened.data(), probs.data(), batch, seq, C, NH);
}

// shift: q, k, v and dO start that many elements into their buffers (1: not 16-byte aligned, so
// the kernels load their tiles an element at a time).
void check(int batch, int seq, int Tq, int C, int NH, const std::vector<int>& keyRows, int shift = 0) {
  const auto values = ::chorus::testing::randomFloats(static_cast<size_t>(batch) * seq * 3 * C, 40 + seq);
  auto dout = ::chorus::testing::randomFloats(static_cast<size_t>(batch) * seq * C, 41 + seq);
  for (int b = 0; b < batch; ++b) {  // only the last Tq rows of each sequence are queries
    std::fill(dout.begin() + static_cast<size_t>(b) * seq * C,
              dout.begin() + (static_cast<size_t>(b) * seq + seq - Tq) * C, 0.0f);
  }
  for (const Float16 format : {Float16::kBf16, Float16::kFp16}) {
    SCOPED_TRACE(::testing::Message() << float16Name(format) << ", batch " << batch << ", " << seq << " rows, " << Tq
                                      << " queries, head size " << C / NH << ", shifted by " << shift);
    std::vector<uint16_t> qkv(values.size());
    std::vector<float> widened(values.size());
    toFloat16(format, values.data(), qkv.data(), values.size());
    fromFloat16(format, qkv.data(), widened.data(), values.size());
    std::vector<float> wantOut, wantGrad, gotOut, gotGrad;
    reference(widened, dout, batch, seq, C, NH, wantOut, wantGrad);
    std::vector<uint16_t> qkvShifted(shift + qkv.size());
    std::vector<float> doutShifted(shift + dout.size());
    std::copy(qkv.begin(), qkv.end(), qkvShifted.begin() + shift);
    std::copy(dout.begin(), dout.end(), doutShifted.begin() + shift);
    Blocks{batch, seq, Tq, C, NH, format, qkvShifted.data() + shift}.run(keyRows, doutShifted.data() + shift, gotOut,
                                                                         gotGrad);
    for (int b = 0; b < batch; ++b) {  // the rows that are no queries: out is not theirs
      std::fill(wantOut.begin() + static_cast<size_t>(b) * seq * C,
                wantOut.begin() + (static_cast<size_t>(b) * seq + seq - Tq) * C, 0.0f);
    }
    const double u = unitRoundoff(format);
    const double forwardError = relativeError(gotOut, wantOut), backwardError = relativeError(gotGrad, wantGrad);
    EXPECT_LT(forwardError, 4 * u);
    EXPECT_LT(backwardError, 4 * u);
    std::printf("%s: forward %.2f u, backward %.2f u\n", float16Name(format), forwardError / u, backwardError / u);
  }
}

// The whole causal attention: one diagonal block per sequence, for head sizes 16, 64 and 128,
// lengths that are no multiple of the tiles, two blocks of queries (70 rows) and several heads.
// Small: every CUDA thread is a host thread.
TEST(TensorCoreAttentionEmulated, WholeAttentionFollowsTheCpu) {
  check(1, 70, 70, 16, 1, {0});
  check(1, 45, 45, 128, 2, {0});
  check(1, 33, 33, 256, 2, {0});
}

// Ring attention's blocks: two sequences of two chunks in one call, the second chunk's queries
// against the first chunk's keys (no mask) and then their own (the diagonal).
TEST(TensorCoreAttentionEmulated, RingBlocksFollowTheCpu) { check(2, 42, 21, 64, 2, {0, 21}); }

// Blocks long enough that some tiles hold no masked pair (the kernels then look for none): the
// diagonal past its first block of rows, and a block of earlier keys whose first tile is whole.
TEST(TensorCoreAttentionEmulated, TilesWithNothingMaskedFollowTheCpu) {
  check(1, 160, 160, 32, 2, {0});
  check(1, 200, 100, 32, 2, {0, 100});
}

// Rows that do not start 16-byte aligned: the tiles loaded an element at a time.
TEST(TensorCoreAttentionEmulated, UnalignedRowsFollowTheCpu) { check(1, 45, 45, 64, 2, {0}, 1); }

// Every head size the tensor-core kernels take (multiples of 16 up to kMaxAttentionHeadSize): each
// kernel's shared memory within what cudaFuncSetAttribute may raise a kernel's to.
TEST(TensorCoreAttentionEmulated, SharedMemoryFitsAGpuAtEveryHeadSize) {
  int taken = 0;
  for (int hs = 1; hs <= cuda::kMaxAttentionHeadSize; ++hs) {
    if (!att::tensorCoresTake(hs)) continue;
    ++taken;
    EXPECT_LE(att::TcForwardMemory::carve(nullptr, hs).bytes, emu::kMostSharedBytes) << "forward, head size " << hs;
    EXPECT_LE(att::TcQueryMemory::carve(nullptr, hs).bytes, emu::kMostSharedBytes) << "dq, head size " << hs;
    EXPECT_LE(att::TcKeyMemory::carve(nullptr, hs).bytes, emu::kMostSharedBytes) << "dk dv, head size " << hs;
  }
  EXPECT_EQ(taken, cuda::kMaxAttentionHeadSize / 16);
}

}  // namespace
}  // namespace chorus::kernels
