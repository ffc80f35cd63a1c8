// gpt_cuda_test.cc: the GPT model on a CUDA device against the same model on the CPU: one forward
// and backward of a small model from the same parameters and tokens, every parameter's gradient
// compared, in fp32 (within 1e-4 of the CPU's, relative to the largest gradient: the GPU sums in
// another order and keeps attention's log-sum-exp instead of its probabilities) and bf16 (both
// round attention's probabilities, dO and dS to bf16, but from values computed in other orders, so
// a rounding may go the other way: within the bounds below), with each recompute mode; and a model
// with MoE blocks. Skipped (with the reason) without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "chorus/error.hpp"
#include "src/training/gpt.h"
#include "tests/gpu/device.h"

namespace chorus::training {
namespace {

using chorus::testing::DeviceBuffer;

struct Step {
  float loss = 0;
  std::vector<float> grads;
};

Step runStep(Device device, const GptConfig& config, int B, int T, Compute compute, Recompute recompute,
             const std::vector<int>& tokens, const std::vector<int>& targets) {
  Gpt model(config, B, T, {}, {}, recompute, {}, {}, compute, device);
  EXPECT_EQ(model.device(), device);
  std::vector<float> params(model.layout().total());
  model.layout().initialize(7, params.data(), 0, params.size());
  Step step;
  if (device == Device::kCpu) {
    step.grads.assign(params.size(), 0.0f);
    FlatAccess access(model.layout(), params.data(), step.grads.data());
    step.loss = model.forward(tokens.data(), targets.data(), access);
    model.backward(access);
    return step;
  }
  DeviceBuffer<float> dParams(params), dGrads(params.size());
  FlatAccess access(model.layout(), dParams.data, dGrads.data);
  step.loss = model.forward(tokens.data(), targets.data(), access);
  model.backward(access);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  step.grads = dGrads.read();
  return step;
}

// count random tokens and targets in [0, vocab).
void randomTokens(unsigned seed, int count, int vocab, std::vector<int>& tokens, std::vector<int>& targets) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  tokens.resize(count);
  targets.resize(count);
  for (int i = 0; i < count; ++i) {
    tokens[i] = pick(gen);
    targets[i] = pick(gen);
  }
}

TEST(CudaGptTest, OneStepOnTheGpuFollowsTheCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const GptConfig config{2, 4, 64, 48, 97};
  const int B = 2, T = 40;
  std::vector<int> tokens, targets;
  randomTokens(11, B * T, config.vocab, tokens, targets);
  for (const Compute compute : {Compute::kFp32, Compute::kBf16}) {
    for (const Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      SCOPED_TRACE(std::string(computeName(compute)) + ", recompute " + std::to_string(static_cast<int>(recompute)));
      const Step cpu = runStep(Device::kCpu, config, B, T, compute, recompute, tokens, targets);
      const Step gpu = runStep(Device::kCuda, config, B, T, compute, recompute, tokens, targets);
      const bool fp32 = compute == Compute::kFp32;
      EXPECT_NEAR(gpu.loss, cpu.loss, (fp32 ? 1e-5 : 2e-3) * cpu.loss);
      ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
      double largest = 0, diff = 0, norm = 0, worst = 0;
      for (size_t i = 0; i < cpu.grads.size(); ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(cpu.grads[i])));
        const double d = static_cast<double>(gpu.grads[i]) - cpu.grads[i];
        diff += d * d;
        norm += static_cast<double>(cpu.grads[i]) * cpu.grads[i];
        worst = std::max(worst, std::fabs(d));
      }
      if (fp32) {
        EXPECT_LE(worst, 1e-4 * largest) << "largest gradient " << largest;
      } else {
        EXPECT_LT(std::sqrt(diff / norm), 2e-2) << "relative distance of the gradients";
      }
    }
  }
}

// MoE blocks on the GPU: the router's product, the experts' rows, products and gated sum on the
// device, the routing on the host from the device's logits. Two of the four blocks are MoE (top-2
// of 4 experts, GELU and then SwiGLU): one step's loss and gradients against the CPU, fp32. The
// routing takes the same choices unless two experts' probabilities tie within rounding, which
// random weights make unlikely for these 80 tokens.
TEST(CudaGptTest, MoeBlocksOnTheGpuFollowTheCpu) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "SwiGLU experts" : "GELU experts");
    GptConfig config{4, 4, 64, 48, 97};
    config.moe.experts = 4;
    config.moe.topK = 2;
    config.moe.swiglu = swiglu;
    config.moeEvery = 2;
    const int B = 2, T = 40;
    std::vector<int> tokens, targets;
    randomTokens(5, B * T, config.vocab, tokens, targets);
    const Step cpu = runStep(Device::kCpu, config, B, T, Compute::kFp32, Recompute::kNone, tokens, targets);
    const Step gpu = runStep(Device::kCuda, config, B, T, Compute::kFp32, Recompute::kNone, tokens, targets);
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    double largest = 0, worst = 0;
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(cpu.grads[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(gpu.grads[i]) - cpu.grads[i]));
    }
    EXPECT_LE(worst, 1e-4 * largest) << "largest gradient " << largest;
  }
}

}  // namespace
}  // namespace chorus::training
