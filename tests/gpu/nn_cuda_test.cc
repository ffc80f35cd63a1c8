// nn_cuda_test.cc: the transformer's CUDA kernels (kernels/cuda/nn.h, matmul.h, moe.h) against the
// CPU reference (kernels/cpu/nn.h, matmul.h, moe.h) on random inputs, forward and backward: every
// result within 1e-5 of the reference's largest magnitude in fp32 (the GPU sums in another order),
// what involves no sum in another order bit for bit (the embedding, the positions' gradient, the
// experts' choices, rows and gates, dispatch and combine), 16-bit products against the reference's
// own 16-bit products, TF32 within its 10-bit mantissas. Skipped (with the reason) without a device.
// tests/unit/nn_emulated_test.cc compiles this file again against tests/support/cuda_emulation.h
// (its folder emulated_cuda/ standing in for CUDA's headers), where its tests run on the host.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/nn.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nn.h"
#include "tests/gpu/device.h"

namespace chorus::kernels {
namespace {

using chorus::testing::DeviceBuffer;

std::vector<float> randomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

std::vector<int> randomTokens(size_t n, int v, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, v - 1);
  std::vector<int> t(n);
  for (int& x : t) x = pick(gen);
  return t;
}

// Every element of gpu within rel x (the reference's largest magnitude) of the reference.
void expectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double largest = 0.0;
  for (const float c : cpu) largest = std::max(largest, std::fabs(static_cast<double>(c)));
  const double bound = rel * std::max(largest, 1e-30);
  size_t wrong = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(diff <= bound)) {
      if (wrong++ == 0) first = i;
    }
    worst = std::max(worst, diff);
  }
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << cpu.size() << " beyond " << bound << "; first at " << first
                       << " (gpu " << gpu[first] << ", cpu " << cpu[first] << "), worst " << worst;
}

using cuda::errorName;
void expectOk(int code, const char* call) { ASSERT_EQ(code, 0) << call << ": " << errorName(code); }
#define CUDA_OK(call) expectOk((call), #call)

void sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

TEST(CudaNnTest, EmbeddingsForwardAndBackward) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int V = 53, v0 = 11, vcount = 30;
  // 51 rows, and 600 rows of 53 tokens (about 11 rows each): each token's rows sorted by the block
  // that sums them; 700 rows of which 600 are one token: sorted too, more rows than the block's
  // threads; 1400 rows of which 1200 are one token: more rows than a block sorts, so that token's
  // block scans every row, a tile at a time.
  for (const auto& [B, T, frequent] :
       std::vector<std::tuple<int, int, bool>>{{3, 17, false}, {2, 300, false}, {2, 350, true}, {2, 700, true}}) {
    std::vector<int> tokens = randomTokens(static_cast<size_t>(B) * T, V, 1);
    if (frequent) {
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 7 == 3 ? tokens[i] : v0 + 5;
    }
    std::vector<int> positions(T);
    for (int t = 0; t < T; ++t) positions[t] = 3 * t + 1;  // context parallelism's kind of positions
    const int context = 3 * T + 1;
    // Rows of 40 go 16 bytes at a time on the GPU, rows of 42 a float at a time.
    for (const int C : {40, 42}) {
      const auto wte = randomVector(static_cast<size_t>(vcount) * C, 2);
      const auto wpe = randomVector(static_cast<size_t>(context) * C, 3);
      const auto dout = randomVector(static_cast<size_t>(B) * T * C, 4);
      for (const bool withPositions : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << B << " x " << T << " rows of " << C << (withPositions ? ", positions" : ""));
        const int* pos = withPositions ? positions.data() : nullptr;
        std::vector<float> out(dout.size()), dwte = randomVector(wte.size(), 5), dwpe = randomVector(wpe.size(), 6);
        DeviceBuffer<int> dTokens(tokens), dPositions(positions);
        DeviceBuffer<float> dWte(wte), dWpe(wpe), dOut(out.size()), dDout(dout), dDwte(dwte), dDwpe(dwpe);
        DeviceBuffer<char> scratch(cuda::embeddingBackwardScratchBytes(B * T, vcount));
        ASSERT_EQ(cudaMemset(scratch.data, 0xff, scratch.count), cudaSuccess);  // what a last call left
        embeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, v0, vcount, pos);
        embeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, v0, vcount, pos);
        const int* dPos = withPositions ? dPositions.data : nullptr;
        CUDA_OK(
            cuda::embeddingForward(dOut.data, dTokens.data, dWte.data, dWpe.data, B, T, C, v0, vcount, dPos, nullptr));
        CUDA_OK(cuda::embeddingBackward(dDwte.data, dDwpe.data, dDout.data, dTokens.data, B, T, C, v0, vcount, dPos,
                                        scratch.data, nullptr));
        sync();
        EXPECT_EQ(dOut.read(), out) << "forward is one addition per element, as on the CPU";
        EXPECT_EQ(dDwpe.read(), dwpe) << "the positions' gradient is added in batch order, as on the CPU";
        EXPECT_EQ(dDwte.read(), dwte) << "a token's rows are added in row order, as on the CPU";
      }
    }
  }
}

TEST(CudaNnTest, LayernormForwardAndBackward) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  // Rows of any width (7); in registers, a quad a lane (96), 6 of 6 (768), 5 or 6 of 6 (700), 7 or
  // 8 of 8 (1000), 12 or 13 of 16 (1540: the forward's largest size; wider than the backward's 8);
  // wider than either keeps there (2600).
  for (const auto& [n, c] :
       std::vector<std::pair<int, int>>{{1, 7}, {37, 96}, {300, 768}, {23, 700}, {45, 1000}, {19, 1540}, {5, 2600}}) {
    const size_t count = static_cast<size_t>(n) * c;
    auto inp = randomVector(count, 7, 2.0f);
    for (size_t i = 0; i < count; ++i) inp[i] += 0.5f;  // a mean to remove
    const auto weight = randomVector(c, 8), bias = randomVector(c, 9), dout = randomVector(count, 10);
    std::vector<float> out(count), mean(n), rstd(n), dinp = randomVector(count, 11), dweight = randomVector(c, 12),
                                                     dbias = randomVector(c, 13);
    DeviceBuffer<float> dInp(inp), dWeight(weight), dBias(bias), dOut(count), dMean(n), dRstd(n), dDout(dout),
        dDinp(dinp), dDweight(dweight), dDbias(dbias), scratch(cuda::layernormBackwardScratchFloats(n, c));
    layernormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), n, c);
    layernormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                      rstd.data(), n, c);
    CUDA_OK(
        cuda::layernormForward(dOut.data, dMean.data, dRstd.data, dInp.data, dWeight.data, dBias.data, n, c, nullptr));
    CUDA_OK(cuda::layernormBackward(dDinp.data, dDweight.data, dDbias.data, dDout.data, dInp.data, dWeight.data,
                                    dMean.data, dRstd.data, n, c, scratch.data, nullptr));
    sync();
    const std::string shape = " (" + std::to_string(n) + " x " + std::to_string(c) + ")";
    expectNear(dOut.read(), out, 1e-5, "layernorm out" + shape);
    expectNear(dMean.read(), mean, 1e-5, "layernorm mean" + shape);
    expectNear(dRstd.read(), rstd, 1e-5, "layernorm rstd" + shape);
    expectNear(dDinp.read(), dinp, 1e-5, "layernorm dinp" + shape);
    expectNear(dDweight.read(), dweight, 1e-5, "layernorm dweight" + shape);
    expectNear(dDbias.read(), dbias, 1e-5, "layernorm dbias" + shape);
  }
}

TEST(CudaNnTest, GeluResidualRowsScaleFillAndColumnSums) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const size_t n = 100003;
  const auto x = randomVector(n, 14, 3.0f), y = randomVector(n, 15), dout = randomVector(n, 16);
  std::vector<float> gelu(n), dgelu = randomVector(n, 17), sum(n), da = randomVector(n, 18), db = randomVector(n, 19);
  geluForward(gelu.data(), x.data(), n);
  geluBackward(dgelu.data(), x.data(), dout.data(), n);
  residualForward(sum.data(), x.data(), y.data(), n);
  residualBackward(da.data(), db.data(), dout.data(), n);
  DeviceBuffer<float> dX(x), dY(y), dDout(dout), dGelu(n), dDgelu(randomVector(n, 17)), dSum(n),
      dDa(randomVector(n, 18)), dDb(randomVector(n, 19));
  CUDA_OK(cuda::geluForward(dGelu.data, dX.data, n, nullptr));
  CUDA_OK(cuda::geluBackward(dDgelu.data, dX.data, dDout.data, n, nullptr));
  CUDA_OK(cuda::residualForward(dSum.data, dX.data, dY.data, n, nullptr));
  CUDA_OK(cuda::residualBackward(dDa.data, dDb.data, dDout.data, n, nullptr));
  sync();
  expectNear(dGelu.read(), gelu, 1e-5, "gelu");
  expectNear(dDgelu.read(), dgelu, 1e-5, "gelu backward");
  EXPECT_EQ(dSum.read(), sum);
  EXPECT_EQ(dDa.read(), da);
  EXPECT_EQ(dDb.read(), db);
  // Views off a 16-byte boundary take the float-at-a-time path.
  residualForward(sum.data() + 1, x.data() + 1, y.data() + 2, n - 2);
  geluForward(gelu.data() + 3, x.data() + 1, n - 3);
  CUDA_OK(cuda::residualForward(dSum.data + 1, dX.data + 1, dY.data + 2, n - 2, nullptr));
  CUDA_OK(cuda::geluForward(dGelu.data + 3, dX.data + 1, n - 3, nullptr));
  sync();
  EXPECT_EQ(dSum.read(), sum);
  expectNear(dGelu.read(), gelu, 1e-5, "gelu off a 16-byte boundary");

  // Rows added with strides (a bias: source stride 0), and rows of a table by index.
  const size_t rows = 50, width = 33, stride = 40;
  const auto base = randomVector(rows * stride, 71), rowsIn = randomVector(rows * width, 72),
             table = randomVector(20 * width, 73);
  std::vector<int> index(rows);
  for (size_t r = 0; r < rows; ++r) index[r] = static_cast<int>((r * 7) % 20);
  std::vector<float> strided = base, biased = base, indexed(rowsIn);
  for (size_t r = 0; r < rows; ++r) {
    residualForward(strided.data() + r * stride, strided.data() + r * stride, rowsIn.data() + r * width, width);
    residualForward(biased.data() + r * stride, biased.data() + r * stride, rowsIn.data(), width);
    residualForward(indexed.data() + r * width, indexed.data() + r * width, table.data() + index[r] * width, width);
  }
  DeviceBuffer<float> dStrided(base), dBiased(base), dRowsIn(rowsIn), dIndexed(rowsIn), dTable(table);
  DeviceBuffer<int> dIndex(index);
  CUDA_OK(cuda::addRows(dStrided.data, stride, dRowsIn.data, width, width, rows, nullptr));
  CUDA_OK(cuda::addRows(dBiased.data, stride, dRowsIn.data, 0, width, rows, nullptr));
  CUDA_OK(cuda::addIndexedRows(dIndexed.data, dTable.data, dIndex.data, width, rows, nullptr));
  sync();
  EXPECT_EQ(dStrided.read(), strided);
  EXPECT_EQ(dBiased.read(), biased);
  EXPECT_EQ(dIndexed.read(), indexed);

  std::vector<float> scaled = x;
  scale(scaled.data(), n, 0.37f);
  CUDA_OK(cuda::scale(dX.data, n, 0.37f, nullptr));
  sync();
  EXPECT_EQ(dX.read(), scaled);
  CUDA_OK(cuda::fill(dX.data + 1, n - 2, -std::numeric_limits<float>::infinity(), nullptr));
  sync();
  const auto filled = dX.read();
  EXPECT_EQ(filled[0], scaled[0]);
  EXPECT_EQ(filled[n - 1], scaled[n - 1]);
  EXPECT_EQ(std::count(filled.begin() + 1, filled.end() - 1, -std::numeric_limits<float>::infinity()),
            static_cast<long>(n - 2));

  // The bias gradient's column sums against the CPU's matmulBackward (dbias only).
  const int sumRows = 1000, cols = 77;
  const auto m = randomVector(static_cast<size_t>(sumRows) * cols, 20);
  std::vector<float> sums = randomVector(cols, 21);
  matmulBackward(nullptr, nullptr, sums.data(), m.data(), nullptr, nullptr, sumRows, 1, cols);
  DeviceBuffer<float> dM(m), dSums(randomVector(cols, 21)), scratch(cuda::columnSumsScratchFloats(sumRows, cols));
  CUDA_OK(cuda::columnSums(dSums.data, dM.data, sumRows, cols, scratch.data, nullptr));
  sync();
  expectNear(dSums.read(), sums, 1e-5, "column sums");
}

TEST(CudaNnTest, CrossEntropyWholeAndVocabParallel) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  // An odd width: rows start at every 16-byte alignment. Row 1 starts with masked logits (-inf),
  // the first values some threads see.
  const int n = 37, V = 1001, split = 400;
  auto logits = randomVector(static_cast<size_t>(n) * V, 22, 4.0f);
  std::fill_n(logits.begin() + V, 8, -std::numeric_limits<float>::infinity());
  auto targets = randomTokens(n, V, 23);
  targets[1] = V / 2;  // a target not masked
  std::vector<float> rowMax(n), sums(n), losses(n), dlogits(logits.size());
  crossEntropyForward(rowMax.data(), sums.data(), losses.data(), logits.data(), targets.data(), n, V);
  crossEntropyBackward(dlogits.data(), logits.data(), rowMax.data(), sums.data(), targets.data(), n, V, 1.0f / n);
  DeviceBuffer<float> dLogits(logits), dRowMax(n), dSums(n), dLosses(n), dD(logits.size());
  DeviceBuffer<int> dTargets(targets);
  CUDA_OK(
      cuda::crossEntropyForward(dRowMax.data, dSums.data, dLosses.data, dLogits.data, dTargets.data, n, V, nullptr));
  CUDA_OK(cuda::crossEntropyBackward(dD.data, dLogits.data, dRowMax.data, dSums.data, dTargets.data, n, V, 1.0f / n, 0,
                                     nullptr));
  sync();
  EXPECT_EQ(dRowMax.read(), rowMax) << "row maxima";
  expectNear(dSums.read(), sums, 1e-5, "exponential sums");
  expectNear(dLosses.read(), losses, 1e-5, "losses");
  expectNear(dD.read(), dlogits, 1e-5, "dlogits");
  // Gradients a float out of step with the logits' alignment (a float at a time), and in place of
  // the logits (as fp32 training takes them): the same values.
  DeviceBuffer<float> dDShifted(logits.size() + 1);
  CUDA_OK(cuda::crossEntropyBackward(dDShifted.data + 1, dLogits.data, dRowMax.data, dSums.data, dTargets.data, n, V,
                                     1.0f / n, 0, nullptr));
  CUDA_OK(cuda::crossEntropyBackward(dLogits.data, dLogits.data, dRowMax.data, dSums.data, dTargets.data, n, V,
                                     1.0f / n, 0, nullptr));
  sync();
  const auto wanted = dD.read(), shiftedD = dDShifted.read();
  EXPECT_EQ(std::vector<float>(shiftedD.begin() + 1, shiftedD.end()), wanted) << "dlogits out of step";
  EXPECT_EQ(dLogits.read(), wanted) << "dlogits in place of the logits";

  // Two vocabulary shards [0, split) and [split, V): the per-row values combined on the host as the
  // ranks' all-reduces would, then the loss pass and each shard's gradient: the whole ones.
  const int widths[2] = {split, V - split};
  std::vector<std::vector<float>> shardLogits(2);
  for (int s = 0; s < 2; ++s) {
    for (int r = 0; r < n; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * V + (s == 0 ? 0 : split);
      shardLogits[s].insert(shardLogits[s].end(), row, row + widths[s]);
    }
  }
  std::vector<float> shardMax(n, -std::numeric_limits<float>::infinity()), shardSums(n, 0.0f), targetLogits(n, 0.0f);
  DeviceBuffer<float> dShard0(shardLogits[0]), dShard1(shardLogits[1]), dPart(n), dTargetPart(n);
  DeviceBuffer<float>* dShards[2] = {&dShard0, &dShard1};
  for (int s = 0; s < 2; ++s) {
    CUDA_OK(cuda::crossEntropyShardMax(dPart.data, dShards[s]->data, n, widths[s], nullptr));
    sync();
    const auto maxes = dPart.read();
    for (int r = 0; r < n; ++r) shardMax[r] = std::max(shardMax[r], maxes[r]);
  }
  DeviceBuffer<float> dShardMax(shardMax);
  for (int s = 0; s < 2; ++s) {
    CUDA_OK(cuda::crossEntropyShardExp(dPart.data, dTargetPart.data, dShards[s]->data, dShardMax.data, dTargets.data, n,
                                       widths[s], s == 0 ? 0 : split, nullptr));
    sync();
    const auto part = dPart.read(), target = dTargetPart.read();
    for (int r = 0; r < n; ++r) {
      shardSums[r] += part[r];
      targetLogits[r] += target[r];
    }
  }
  DeviceBuffer<float> dShardSums(shardSums), dTarget(targetLogits), dShardLosses(n);
  CUDA_OK(cuda::crossEntropyShardLoss(dShardLosses.data, dShardSums.data, dShardMax.data, dTarget.data, n, nullptr));
  sync();
  expectNear(dShardLosses.read(), losses, 1e-5, "vocab-parallel losses");
  DeviceBuffer<float> dShardD(shardLogits[1].size());
  CUDA_OK(cuda::crossEntropyBackward(dShardD.data, dShard1.data, dShardMax.data, dShardSums.data, dTargets.data, n,
                                     widths[1], 1.0f / n, split, nullptr));
  sync();
  std::vector<float> tail;
  for (int r = 0; r < n; ++r) {
    const float* row = dlogits.data() + static_cast<size_t>(r) * V + split;
    tail.insert(tail.end(), row, row + widths[1]);
  }
  expectNear(dShardD.read(), tail, 1e-5, "vocab-parallel gradient of the second shard");

  DeviceBuffer<double> sumScratch(cuda::sumScratchDoubles());
  DeviceBuffer<float> mean(1);
  CUDA_OK(cuda::meanOf(mean.data, dLosses.data, n, sumScratch.data, nullptr));
  sync();
  double total = 0.0;
  for (const float l : losses) total += l;
  EXPECT_NEAR(mean.read()[0], total / n, 1e-5 * std::fabs(total / n));
}

// The loss's gradient rounded to 16 bits as it is made is the fp32 gradient rounded after (bit for
// bit), and the head's products from it are matmulBackward16's: rows at every alignment (an odd
// width), the 16-bit rows also a half out of step (2 bytes at a time), a vocabulary shard.
TEST(CudaNnTest, LossGradientIn16BitsIsTheRoundedOneAndFeedsTheHeadAsMatmulBackward16) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 37, V = 1001, c = 24;
  const auto logits = randomVector(static_cast<size_t>(n) * V, 31, 4.0f);
  const auto targets = randomTokens(n, V, 32);
  DeviceBuffer<float> dLogits(logits), dRowMax(n), dSums(n), dLosses(n), dD(logits.size());
  DeviceBuffer<int> dTargets(targets);
  CUDA_OK(
      cuda::crossEntropyForward(dRowMax.data, dSums.data, dLosses.data, dLogits.data, dTargets.data, n, V, nullptr));
  for (const Float16 format : {Float16::kBf16, Float16::kFp16}) {
    for (const int v0 : {0, 400}) {  // 400: the shard of columns [400, 1401), some targets outside it
      SCOPED_TRACE(::testing::Message() << float16Name(format) << ", first column " << v0);
      const float scale = 3.0f / n;
      CUDA_OK(cuda::crossEntropyBackward(dD.data, dLogits.data, dRowMax.data, dSums.data, dTargets.data, n, V, scale,
                                         v0, nullptr));
      DeviceBuffer<uint16_t> d16(logits.size() + 1);
      CUDA_OK(cuda::crossEntropyBackward16(format, d16.data, dLogits.data, dRowMax.data, dSums.data, dTargets.data, n,
                                           V, scale, v0, nullptr));
      sync();
      const auto gradient = dD.read();
      std::vector<uint16_t> rounded(gradient.size());
      toFloat16(format, gradient.data(), rounded.data(), gradient.size());
      EXPECT_EQ(d16.read(gradient.size()), rounded) << "the gradient rounded as it is made";
      DeviceBuffer<uint16_t> d16Shifted(logits.size() + 1);
      CUDA_OK(cuda::crossEntropyBackward16(format, d16Shifted.data + 1, dLogits.data, dRowMax.data, dSums.data,
                                           dTargets.data, n, V, scale, v0, nullptr));
      sync();
      const auto shifted = d16Shifted.read();
      EXPECT_EQ(std::vector<uint16_t>(shifted.begin() + 1, shifted.end()), rounded) << "a half out of step";

      // The head's backward: from the fp32 gradient (matmulBackward16 rounds it) and from the
      // rounded one, the same products to the bit.
      std::vector<uint16_t> inp16(static_cast<size_t>(n) * c), weight16(static_cast<size_t>(V) * c);
      const auto inp = randomVector(inp16.size(), 33), weight = randomVector(weight16.size(), 34);
      toFloat16(format, inp.data(), inp16.data(), inp.size());
      toFloat16(format, weight.data(), weight16.data(), weight.size());
      DeviceBuffer<uint16_t> dInp16(inp16), dWeight16(weight16);
      const auto dinp0 = randomVector(inp.size(), 35), dweight0 = randomVector(weight.size(), 36);
      DeviceBuffer<float> dinpA(dinp0), dweightA(dweight0), dinpB(dinp0), dweightB(dweight0);
      DeviceBuffer<char> scratch(cuda::matmulBackward16ScratchBytes(n, V));
      CUDA_OK(cuda::matmulBackward16(format, dinpA.data, dweightA.data, nullptr, dD.data, dInp16.data, dWeight16.data,
                                     n, c, V, scratch.data, nullptr));
      CUDA_OK(cuda::matmulBackward16Rounded(format, dinpB.data, dweightB.data, d16.data, dInp16.data, dWeight16.data, n,
                                            c, V, nullptr));
      sync();
      EXPECT_EQ(dinpB.read(), dinpA.read()) << "dinp";
      EXPECT_EQ(dweightB.read(), dweightA.read()) << "dweight";
    }
  }
}

TEST(CudaNnTest, OptimizersAndGradientNorm) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const size_t n = 50001;
  for (const Optimizer kind : {Optimizer::kAdamW, Optimizer::kSgd}) {
    for (const bool nesterov : {false, true}) {
      if (kind == Optimizer::kAdamW && nesterov) continue;
      OptimizerSettings s;
      s.kind = kind;
      s.lr = 1e-2f;
      s.nesterov = nesterov;
      auto param = randomVector(n, 24), m = std::vector<float>(n), v = std::vector<float>(n);
      DeviceBuffer<float> dParam(param), dM(n), dV(n);
      for (long step = 1; step <= 3; ++step) {
        const auto grad = randomVector(n, 25 + static_cast<uint32_t>(step));
        DeviceBuffer<float> dGrad(grad);
        if (kind == Optimizer::kAdamW) {
          adamwStep(param.data(), grad.data(), m.data(), v.data(), n, step, s);
          CUDA_OK(cuda::adamwStep(dParam.data, dGrad.data, dM.data, dV.data, n, step, s, nullptr));
        } else {
          sgdStep(param.data(), grad.data(), m.data(), n, step, s);
          CUDA_OK(cuda::sgdStep(dParam.data, dGrad.data, dM.data, n, step, s, nullptr));
        }
        sync();
      }
      const std::string name = kind == Optimizer::kAdamW ? "AdamW" : nesterov ? "SGD nesterov" : "SGD";
      expectNear(dParam.read(), param, 1e-5, name + " parameters");
      expectNear(dM.read(), m, 1e-5, name + " momentum");
      if (kind == Optimizer::kAdamW) expectNear(dV.read(), v, 1e-5, name + " second moment");
    }
  }
  const auto x = randomVector(n, 30);
  DeviceBuffer<float> dX(x);
  DeviceBuffer<double> result(1), scratch(cuda::sumScratchDoubles());
  CUDA_OK(cuda::sumOfSquares(result.data, dX.data, n, scratch.data, nullptr));
  sync();
  const double cpu = sumOfSquares(x.data(), n);
  EXPECT_NEAR(result.read()[0], cpu, 1e-12 * cpu);
}

// The products, through cuBLAS.
TEST(CudaNnTest, MatrixProductsFp32Bf16Fp16AndTf32) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 75, c = 96, oc = 130;
  const auto inp = randomVector(static_cast<size_t>(n) * c, 31), weight = randomVector(static_cast<size_t>(oc) * c, 32);
  const auto bias = randomVector(oc, 33), dout = randomVector(static_cast<size_t>(n) * oc, 34);
  const auto dinp0 = randomVector(inp.size(), 35), dweight0 = randomVector(weight.size(), 36),
             dbias0 = randomVector(oc, 37);
  {
    std::vector<float> out(static_cast<size_t>(n) * oc), dinp = dinp0, dweight = dweight0, dbias = dbias0;
    matmulForward(out.data(), inp.data(), weight.data(), bias.data(), n, c, oc);
    matmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), n, c, oc);
    DeviceBuffer<float> dInp(inp), dWeight(weight), dBias(bias), dOut(out.size()), dDout(dout), dDinp(dinp0),
        dDweight(dweight0), dDbias(dbias0);
    DeviceBuffer<char> scratch(cuda::matmulBackwardScratchBytes(n, oc));
    CUDA_OK(cuda::matmulForward(dOut.data, dInp.data, dWeight.data, dBias.data, n, c, oc, nullptr));
    CUDA_OK(cuda::matmulBackward(dDinp.data, dDweight.data, dDbias.data, dDout.data, dInp.data, dWeight.data, n, c, oc,
                                 scratch.data, nullptr));
    sync();
    expectNear(dOut.read(), out, 1e-5, "fp32 forward");
    expectNear(dDinp.read(), dinp, 1e-5, "fp32 dinp");
    expectNear(dDweight.read(), dweight, 1e-5, "fp32 dweight");
    expectNear(dDbias.read(), dbias, 1e-5, "fp32 dbias");

    // TF32: products of 10-bit mantissas (relative error up to 2^-10 each), fp32 sums.
    cuda::setTf32(true);
    CUDA_OK(cuda::matmulForward(dOut.data, dInp.data, dWeight.data, dBias.data, n, c, oc, nullptr));
    sync();
    cuda::setTf32(false);
    expectNear(dOut.read(), out, 1e-2, "TF32 forward");
  }
  for (const Float16 format : {Float16::kBf16, Float16::kFp16}) {
    std::vector<uint16_t> inp16(inp.size()), weight16(weight.size());
    toFloat16(format, inp.data(), inp16.data(), inp.size());
    toFloat16(format, weight.data(), weight16.data(), weight.size());
    std::vector<float> out(static_cast<size_t>(n) * oc), dinp = dinp0, dweight = dweight0, dbias = dbias0;
    matmulForward16(format, out.data(), inp16.data(), weight16.data(), bias.data(), n, c, oc);
    matmulBackward16(format, dinp.data(), dweight.data(), dbias.data(), dout.data(), inp16.data(), weight16.data(), n,
                     c, oc);
    DeviceBuffer<uint16_t> dInp(inp16), dWeight(weight16);
    DeviceBuffer<float> dBias(bias), dOut(out.size()), dDout(dout), dDinp(dinp0), dDweight(dweight0), dDbias(dbias0);
    DeviceBuffer<char> scratch(cuda::matmulBackward16ScratchBytes(n, oc));
    CUDA_OK(cuda::matmulForward16(format, dOut.data, dInp.data, dWeight.data, dBias.data, n, c, oc, nullptr));
    CUDA_OK(cuda::matmulBackward16(format, dDinp.data, dDweight.data, dDbias.data, dDout.data, dInp.data, dWeight.data,
                                   n, c, oc, scratch.data, nullptr));
    sync();
    // The same products of the same 16-bit values, exact in fp32: only the order of the sums differs.
    const std::string name = float16Name(format);
    expectNear(dOut.read(), out, 1e-5, name + " forward");
    expectNear(dDinp.read(), dinp, 1e-5, name + " dinp");
    expectNear(dDweight.read(), dweight, 1e-5, name + " dweight");
    expectNear(dDbias.read(), dbias, 1e-5, name + " dbias");
  }
}

// The whole causal attention against the CPU's (which keeps the probabilities), for head sizes
// that fill one to four column lanes and a length that is no multiple of the tiles.
TEST(CudaNnTest, AttentionForwardAndBackward) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape& s : {Shape{2, 67, 48, 3}, Shape{1, 130, 128, 2}, Shape{2, 45, 200, 2}, Shape{1, 33, 256, 2}}) {
    const size_t rows = static_cast<size_t>(s.B) * s.T;
    const auto qkv = randomVector(rows * 3 * s.C, 40);
    const auto dout = randomVector(rows * s.C, 41);
    const auto dqkv0 = randomVector(qkv.size(), 42);
    std::vector<float> out(rows * s.C), att(static_cast<size_t>(s.B) * s.NH * s.T * s.T),
        scratch(static_cast<size_t>(s.T) * s.T), dqkv = dqkv0;
    attentionForward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    attentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    const size_t stats = static_cast<size_t>(s.B) * s.NH * s.T;
    DeviceBuffer<float> dQkv(qkv), dOut(out.size()), dLse(stats), dSum(stats), dDelta(stats), dDout(dout), dDqkv(dqkv0);
    CUDA_OK(cuda::attentionForward(dOut.data, dLse.data, dSum.data, dQkv.data, s.B, s.T, s.C, s.NH, nullptr));
    CUDA_OK(cuda::attentionBackward(dDqkv.data, dDelta.data, dDout.data, dOut.data, dQkv.data, dLse.data, s.B, s.T, s.C,
                                    s.NH, nullptr));
    sync();
    const std::string shape = " (B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", C " +
                              std::to_string(s.C) + ", heads " + std::to_string(s.NH) + ")";
    expectNear(dOut.read(), out, 1e-5, "attention out" + shape);
    expectNear(dDqkv.read(), dqkv, 1e-5, "attention dqkv" + shape);

    // 16-bit q, k, v, against the CPU's fp32 attention of the same values widened. A head size
    // that is a multiple of 16 goes to the tensor cores, which round as the CPU's 16-bit attention
    // does (P for P V; dO and dS in backward), each rounding within the format's unit roundoff u:
    // out and the gradient stay within 4u of their largest magnitude (the sums of rounded terms
    // mostly cancel their errors), where a formula slip (a missing scale, a transposed product, a
    // mask one off) errs by far more. Other head sizes compute in fp32 from the 16-bit values and
    // match to fp32's rounding.
    const bool tensorCores = (s.C / s.NH) % 16 == 0;
    for (const Float16 format : {Float16::kBf16, Float16::kFp16}) {
      const double u = format == Float16::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      std::vector<uint16_t> qkv16(qkv.size());
      std::vector<float> widened(qkv.size());
      toFloat16(format, qkv.data(), qkv16.data(), qkv.size());
      fromFloat16(format, qkv16.data(), widened.data(), qkv.size());
      std::vector<float> out16(out.size()), dqkv16 = dqkv0;
      attentionForward(out16.data(), att.data(), widened.data(), s.B, s.T, s.C, s.NH);
      attentionBackward(dqkv16.data(), scratch.data(), dout.data(), widened.data(), att.data(), s.B, s.T, s.C, s.NH);
      DeviceBuffer<uint16_t> dQkv16(qkv16);
      DeviceBuffer<float> dDqkv16(dqkv0);
      CUDA_OK(
          cuda::attentionForward16(format, dOut.data, dLse.data, dSum.data, dQkv16.data, s.B, s.T, s.C, s.NH, nullptr));
      CUDA_OK(cuda::attentionBackward16(format, dDqkv16.data, dDelta.data, dDout.data, dOut.data, dQkv16.data,
                                        dLse.data, s.B, s.T, s.C, s.NH, nullptr));
      sync();
      const std::string name = std::string(float16Name(format)) + (tensorCores ? " (tensor cores)" : "");
      expectNear(dOut.read(), out16, tensorCores ? 4 * u : 1e-5, name + " attention out" + shape);
      if (tensorCores) {
        // dqkv starts from random values; the bound is on the gradient added to them.
        auto added = [&](std::vector<float> v) {
          for (size_t i = 0; i < v.size(); ++i) v[i] -= dqkv0[i];
          return v;
        };
        expectNear(added(dDqkv16.read()), added(dqkv16), 4 * u, name + " attention dqkv" + shape);
      } else {
        expectNear(dDqkv16.read(), dqkv16, 1e-5, name + " attention dqkv" + shape);
      }
    }
  }
  // A head larger than the kernels take is refused, not run: buffers large enough for the call keep
  // what they held (a first pass once zeroed out's row, then refused); and a buffer far too small
  // for the call is not written past its end.
  {
    const int B = 1, T = 3, C = 2 * 129, NH = 2;
    const std::vector<float> held(static_cast<size_t>(B) * T * 3 * C, 7.0f);
    DeviceBuffer<float> out(held), lse(held), sum(held), qkv(held), dqkv(held), delta(held), dout(held);
    EXPECT_EQ(cuda::attentionForward(out.data, lse.data, sum.data, qkv.data, B, T, C, NH, nullptr),
              static_cast<int>(cudaErrorInvalidValue));
    EXPECT_EQ(
        cuda::attentionBackward(dqkv.data, delta.data, dout.data, out.data, qkv.data, lse.data, B, T, C, NH, nullptr),
        static_cast<int>(cudaErrorInvalidValue));
    sync();
    EXPECT_EQ(out.read(), held) << "a refused forward wrote out";
    EXPECT_EQ(lse.read(), held) << "a refused forward wrote the log-sum-exp";
    EXPECT_EQ(sum.read(), held) << "a refused forward wrote the row sums";
    EXPECT_EQ(dqkv.read(), held) << "a refused backward wrote dqkv";
    EXPECT_EQ(delta.read(), held) << "a refused backward wrote delta";
  }
  DeviceBuffer<float> small(16);
  EXPECT_EQ(cuda::attentionForward(small.data, small.data, small.data, small.data, 1, 1, 2 * 129, 2, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
}

// Ring attention's blocks: queries against a block of earlier keys (no mask) and then their own
// (the diagonal), several sequences in one call with rows of other sequences between them, against
// the CPU's blocks one sequence at a time; then backward through both blocks.
TEST(CudaNnTest, AttentionBlocksOfRingAttention) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int batch = 3, Tq = 37, Tk = 37, C = 64, NH = 2, stride = 3 * C;
  // Each sequence holds 2 Tq rows (two chunks, as a cp rank's); the queries are the second chunk,
  // the earlier keys the first.
  const size_t seqRows = 2 * Tq;
  const auto qkv = randomVector(batch * seqRows * stride, 50);
  const auto dout = randomVector(batch * seqRows * C, 51);
  const auto grads0 = randomVector(qkv.size(), 52);
  const size_t stats = static_cast<size_t>(batch) * NH * Tq;
  std::vector<float> out(batch * seqRows * C, 0.0f), rowMax(stats, -std::numeric_limits<float>::infinity()),
      rowSum(stats, 0.0f), lse(stats), delta(stats), scratch(2 * Tq * Tk), grads = grads0;
  auto block = [&](const float* base, bool diagonal) {
    // Queries at rows Tq.. of the sequence; keys at rows 0.. (earlier) or Tq.. (the diagonal).
    return AttentionBlock{base + Tq * stride,
                          stride,
                          base + (diagonal ? Tq : 0) * stride + C,
                          base + (diagonal ? Tq : 0) * stride + 2 * C,
                          stride,
                          Tq,
                          Tk,
                          C,
                          NH,
                          diagonal};
  };
  for (int b = 0; b < batch; ++b) {
    const float* base = qkv.data() + b * seqRows * stride;
    float* o = out.data() + (b * seqRows + Tq) * C;
    const size_t st = static_cast<size_t>(b) * NH * Tq;
    for (const bool diagonal : {false, true}) {
      attentionBlockForward(block(base, diagonal), o, C, rowMax.data() + st, rowSum.data() + st, Tq, scratch.data());
    }
    attentionBlockFinish(o, C, lse.data() + st, rowMax.data() + st, rowSum.data() + st, Tq, Tq, C, NH);
    attentionBlockDelta(delta.data() + st, Tq, dout.data() + (b * seqRows + Tq) * C, o, C, Tq, C, NH);
    float* g = grads.data() + b * seqRows * stride;
    for (const bool diagonal : {false, true}) {
      const size_t kv = (diagonal ? Tq : 0) * stride;
      attentionBlockBackward(block(base, diagonal), dout.data() + (b * seqRows + Tq) * C, C, lse.data() + st,
                             delta.data() + st, Tq, g + Tq * stride, stride, g + kv + C, g + kv + 2 * C, stride,
                             scratch.data());
    }
  }
  DeviceBuffer<float> dQkv(qkv), dOut(out.size()), dMax(stats), dSum(stats), dLse(stats), dDelta(stats), dDout(dout),
      dGrads(grads0);
  const cuda::AttentionBatch bat{batch, seqRows, seqRows, static_cast<size_t>(NH) * Tq};
  float* o = dOut.data + Tq * C;
  CUDA_OK(cuda::attentionBlockStart(o, C, dMax.data, dSum.data, Tq, Tq, C, NH, bat, nullptr));
  for (const bool diagonal : {false, true}) {
    CUDA_OK(cuda::attentionBlockForward(block(dQkv.data, diagonal), bat, o, C, dMax.data, dSum.data, Tq, nullptr));
  }
  CUDA_OK(cuda::attentionBlockFinish(o, C, dLse.data, dMax.data, dSum.data, Tq, Tq, C, NH, bat, nullptr));
  CUDA_OK(cuda::attentionBlockDelta(dDelta.data, Tq, dDout.data + Tq * C, o, C, Tq, C, NH, bat, nullptr));
  for (const bool diagonal : {false, true}) {
    const size_t kv = (diagonal ? Tq : 0) * stride;
    CUDA_OK(cuda::attentionBlockBackward(block(dQkv.data, diagonal), bat, dDout.data + Tq * C, C, dLse.data,
                                         dDelta.data, Tq, dGrads.data + Tq * stride, stride, dGrads.data + kv + C,
                                         dGrads.data + kv + 2 * C, stride, nullptr));
  }
  sync();
  expectNear(dOut.read(), out, 1e-5, "blockwise out (the first chunks' rows stay 0)");
  expectNear(dLse.read(), lse, 1e-5, "blockwise lse");
  expectNear(dDelta.read(), delta, 1e-5, "blockwise delta");
  expectNear(dGrads.read(), grads, 1e-5, "blockwise dq, dk, dv");
}

// The router: softmax, the top-k choice (with ties, with and without gate normalisation, with and
// without a capacity that drops choices), the load-balancing sums and backward.
TEST(CudaNnTest, RouterChoosesAsTheReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 300, E = 8, k = 2;
  auto logits = randomVector(static_cast<size_t>(n) * E, 60, 2.0f);
  for (int i = 0; i < n; i += 7)
    logits[static_cast<size_t>(i) * E + 5] = logits[static_cast<size_t>(i) * E + 2];  // ties
  std::vector<float> probs(logits.size()), lse(n), sums(E);
  routerSoftmax(probs.data(), lse.data(), logits.data(), n, E);
  routerColumnSums(sums.data(), probs.data(), n, E);
  DeviceBuffer<float> dLogits(logits), dProbs(probs.size()), dLse(n), dSums(E);
  CUDA_OK(cuda::routerSoftmax(dProbs.data, dLse.data, dLogits.data, n, E, nullptr));
  CUDA_OK(cuda::routerColumnSums(dSums.data, dProbs.data, n, E, nullptr));
  sync();
  expectNear(dProbs.read(), probs, 1e-6, "router probabilities");
  expectNear(dLse.read(), lse, 1e-6, "router lse");
  expectNear(dSums.read(), sums, 1e-6, "router column sums");
  // The choices from the same probabilities (the reference's), so ties stay ties.
  DeviceBuffer<float> dRef(probs);
  for (const bool normalize : {false, true}) {
    for (const int capacity : {-1, expertCapacity(0.6, n, E, k)}) {
      std::vector<int> expert(n * k), row(n * k), assigned(E), counts(E);
      std::vector<float> gate(n * k);
      const int dropped = routeTopK(expert.data(), gate.data(), row.data(), assigned.data(), counts.data(),
                                    probs.data(), n, E, k, normalize, capacity);
      DeviceBuffer<int> dExpert(n * k), dRow(n * k), dAssigned(E), dCounts(E), dDropped(1);
      DeviceBuffer<float> dGate(n * k);
      CUDA_OK(cuda::routeTopK(dExpert.data, dGate.data, dRow.data, dAssigned.data, dCounts.data, dDropped.data,
                              dRef.data, n, E, k, normalize, capacity, nullptr));
      sync();
      const std::string what =
          std::string(normalize ? "normalized" : "raw") + " gates, capacity " + std::to_string(capacity);
      EXPECT_EQ(dExpert.read(), expert) << what;
      EXPECT_EQ(dGate.read(), gate) << what;
      EXPECT_EQ(dRow.read(), row) << what;
      EXPECT_EQ(dAssigned.read(), assigned) << what;
      EXPECT_EQ(dCounts.read(), counts) << what;
      EXPECT_EQ(dDropped.read()[0], dropped) << what;
      if (capacity > 0) {
        EXPECT_GT(dropped, 0) << "the capacity drops choices";
      }

      const auto dgate = randomVector(n * k, 61);
      std::vector<float> dlogits(logits.size());
      const int total = 4 * n;  // as if four ranks shared the tokens
      routerBackward(dlogits.data(), dgate.data(), probs.data(), lse.data(), expert.data(), gate.data(), row.data(),
                     assigned.data(), n, total, E, k, normalize, 0.01f, 0.001f);
      DeviceBuffer<float> dDgate(dgate), dDlogits(dlogits.size());
      CUDA_OK(cuda::routerBackward(dDlogits.data, dDgate.data, dRef.data, dLse.data, dExpert.data, dGate.data,
                                   dRow.data, dAssigned.data, n, total, E, k, normalize, 0.01f, 0.001f, nullptr));
      sync();
      expectNear(dDlogits.read(), dlogits, 1e-5, "router backward, " + what);
    }
  }
}

TEST(CudaNnTest, DispatchCombineAndSwiglu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const int n = 203, E = 4, k = 2;  // not a multiple of a block's 8 rows
  const auto probs0 = randomVector(static_cast<size_t>(n) * E, 62);
  std::vector<float> probs(probs0.size()), lse(n);
  routerSoftmax(probs.data(), lse.data(), probs0.data(), n, E);
  std::vector<int> expert(n * k), row(n * k), assigned(E), counts(E);
  std::vector<float> gate(n * k);
  routeTopK(expert.data(), gate.data(), row.data(), assigned.data(), counts.data(), probs.data(), n, E, k, true,
            expertCapacity(0.8, n, E, k));
  int rows = 0;
  for (const int c : counts) rows += c;
  // Rows of 96 and 772 go 16 bytes at a time on the GPU, rows of 98 and 770 a float at a time; a
  // lane takes 4 units of a row at a time, so 772 (193 quads) ends in a partial batch after a whole one.
  for (const int C : {96, 98, 772, 770}) {
    const auto x = randomVector(static_cast<size_t>(n) * C, 63), y = randomVector(static_cast<size_t>(rows) * C, 64);
    const auto dout = randomVector(static_cast<size_t>(n) * C, 65), dbuffer = randomVector(y.size(), 66);
    const auto dx0 = randomVector(x.size(), 67);
    std::vector<float> buffer(y.size()), dx = dx0, out(x.size()), dy(y.size()), dgate(n * k);
    moeDispatch(buffer.data(), x.data(), row.data(), n, k, C);
    moeDispatchBackward(dx.data(), dbuffer.data(), row.data(), n, k, C);
    moeCombine(out.data(), y.data(), row.data(), gate.data(), n, k, C);
    moeCombineBackward(dy.data(), dgate.data(), dout.data(), y.data(), row.data(), gate.data(), n, k, C);
    DeviceBuffer<int> dRow(row);
    DeviceBuffer<float> dGate(gate), dX(x), dY(y), dDout(dout), dDbuffer(dbuffer), dBuffer(buffer.size()), dDx(dx0),
        dOut(out.size()), dDy(dy.size()), dDgate(dgate.size());
    CUDA_OK(cuda::moeDispatch(dBuffer.data, dX.data, dRow.data, n, k, C, nullptr));
    CUDA_OK(cuda::moeDispatchBackward(dDx.data, dDbuffer.data, dRow.data, n, k, C, nullptr));
    CUDA_OK(cuda::moeCombine(dOut.data, dY.data, dRow.data, dGate.data, n, k, C, nullptr));
    CUDA_OK(
        cuda::moeCombineBackward(dDy.data, dDgate.data, dDout.data, dY.data, dRow.data, dGate.data, n, k, C, nullptr));
    sync();
    EXPECT_EQ(dBuffer.read(), buffer);
    EXPECT_EQ(dDx.read(), dx);
    EXPECT_EQ(dOut.read(), out);
    EXPECT_EQ(dDy.read(), dy);
    expectNear(dDgate.read(), dgate, 1e-6, "gates' gradient");
  }

  // Rows of 152 go 16 bytes at a time on the GPU, rows of 150 a float at a time.
  for (const int h : {152, 150}) {
    const auto inp = randomVector(static_cast<size_t>(n) * 2 * h, 68, 2.0f),
               dact = randomVector(static_cast<size_t>(n) * h, 69);
    const auto dinp0 = randomVector(inp.size(), 70);
    std::vector<float> act(static_cast<size_t>(n) * h), dinp = dinp0;
    swigluForward(act.data(), inp.data(), n, h);
    swigluBackward(dinp.data(), inp.data(), dact.data(), n, h);
    DeviceBuffer<float> dInp(inp), dAct(act.size()), dDact(dact), dDinp(dinp0);
    CUDA_OK(cuda::swigluForward(dAct.data, dInp.data, n, h, nullptr));
    CUDA_OK(cuda::swigluBackward(dDinp.data, dInp.data, dDact.data, n, h, nullptr));
    sync();
    expectNear(dAct.read(), act, 1e-5, "swiglu, h " + std::to_string(h));
    expectNear(dDinp.read(), dinp, 1e-5, "swiglu backward, h " + std::to_string(h));
  }
}

}  // namespace
}  // namespace chorus::kernels
