// gpt_test.cc: the GPT model's layout (GPT-2 124M's exact parameter count), its initialisation (any
// shard equals the same range of the whole), input checks, and its gradient against central
// differences of its own loss. The comparison with PyTorch is tests/e2e/torch_reference.sh.
#include "src/training/gpt.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "chorus/error.hpp"
#include "kernels/cpu/nn.h"

namespace chorus::training {
namespace {

TEST(GptTest, Gpt2SmallHasGpt2sParameterCount) {
  const ParamLayout layout(GptConfig::gpt2_124m());
  EXPECT_EQ(layout.total(), 124439808u);  // GPT-2 "124M" with the tied head
  EXPECT_EQ(layout.units(), 14);
  EXPECT_EQ(layout.unitCount(0), 50257u * 768 + 1024u * 768);
  EXPECT_EQ(layout.unitCount(1), 12u * 768 * 768 + 13u * 768);
  EXPECT_EQ(layout.unitCount(13), 2u * 768);
  size_t sum = 0;
  for (int u = 0; u < layout.units(); ++u) {
    EXPECT_EQ(layout.unitOffset(u), sum);
    sum += layout.unitCount(u);
  }
  EXPECT_EQ(sum, layout.total());
  EXPECT_EQ(layout.tensor("h.11.mlp.c_proj.weight").shape, (std::vector<int>{768, 3072}));
  EXPECT_TRUE(layout.tensor("wte.weight").decay);
  EXPECT_FALSE(layout.tensor("h.0.ln_1.bias").decay);
  EXPECT_THROW(layout.tensor("lm_head.weight"), Error);
}

TEST(GptTest, ConfigurationsThatCannotWorkAreRefused) {
  GptConfig c;
  c.width = 100;
  c.heads = 12;
  try {
    ParamLayout layout(c);
    FAIL() << "width not a multiple of heads was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("width = 100"), std::string::npos) << e.what();
  }
  GptConfig small{1, 1, 8, 4, 10};
  EXPECT_THROW(Gpt(small, 1, 5), Error);  // sequence longer than the context
}

TEST(GptTest, ShardsInitialiseAsTheWhole) {
  const GptConfig c{2, 2, 16, 8, 11};
  const ParamLayout layout(c);
  std::vector<float> whole(layout.total());
  layout.initialize(7, whole.data(), 0, whole.size());
  const size_t cuts[] = {0, 13, 500, layout.total() / 2, layout.total() - 1, layout.total()};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
    std::vector<float> part(cuts[i + 1] - cuts[i]);
    layout.initialize(7, part.data(), cuts[i], cuts[i + 1]);
    for (size_t k = 0; k < part.size(); ++k) ASSERT_EQ(part[k], whole[cuts[i] + k]) << "element " << cuts[i] + k;
  }
  // GPT-2's scheme: norms one, biases zero, weights of standard deviation 0.02 (0.02/sqrt(2L) for
  // the residual projections).
  EXPECT_EQ(whole[layout.tensor("h.1.ln_2.weight").offset], 1.0f);
  EXPECT_EQ(whole[layout.tensor("h.1.mlp.c_fc.bias").offset + 3], 0.0f);
  auto stddev = [&](const std::string& name) {
    const auto& t = layout.tensor(name);
    double s = 0.0;
    for (size_t i = 0; i < t.count; ++i) s += whole[t.offset + i] * whole[t.offset + i];
    return std::sqrt(s / t.count);
  };
  EXPECT_NEAR(stddev("wte.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.0.mlp.c_proj.weight"), 0.01, 0.001);
  std::vector<float> other(layout.total());
  layout.initialize(8, other.data(), 0, other.size());
  EXPECT_NE(other, whole) << "another seed gives other values";
}

TEST(GptTest, BadTokensAreRefusedNamingThePosition) {
  const GptConfig c{1, 1, 8, 4, 10};
  Gpt model(c, 2, 4);
  std::vector<float> params(model.layout().total()), grads(params.size());
  model.layout().initialize(1, params.data(), 0, params.size());
  FlatAccess access(model.layout(), params.data(), grads.data());
  std::vector<int> tokens(8, 1), targets(8, 2);
  tokens[6] = 10;
  try {
    model.forward(tokens.data(), targets.data(), access);
    FAIL() << "token 10 with vocab 10 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 10 at batch row 1, position 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.backward(access), Error) << "backward without a forward with targets";
}

// The loss's gradient against central differences of the loss itself, on the parameters with the
// largest gradients of every tensor (in fp32 the differences resolve those to about 1%).
// The loss's gradient against central differences of the loss itself, on the parameters with the
// largest gradients of every tensor (in fp32 the differences resolve those to about 1%). With MoE
// blocks the loss includes their weighted aux and z losses.
void expectGradientMatchesDifferences(const GptConfig& c) {
  const int B = 2, T = 5;
  Gpt model(c, B, T);
  const ParamLayout& layout = model.layout();
  const size_t total = layout.total();
  std::vector<float> params(total), grads(total, 0.0f), none(total);
  layout.initialize(3, params.data(), 0, params.size());
  std::mt19937 gen(5);
  std::normal_distribution<float> jitter(0.0f, 0.3f);
  for (auto& p : params) p += jitter(gen);
  std::vector<int> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = (7 * i + 3) % c.vocab;
    targets[i] = (5 * i + 1) % c.vocab;
  }
  FlatAccess access(layout, params.data(), grads.data());
  model.forward(tokens.data(), targets.data(), access);
  model.backward(access);
  FlatAccess probe(layout, params.data(), none.data());
  auto loss = [&] {
    const double ce = model.forward(tokens.data(), targets.data(), probe);
    return ce + model.moeSummary(0, 0).weighted;
  };
  std::map<std::string, int> checkedExpertTensors;  // by block
  for (const auto& t : layout.tensors()) {
    if (t.name == "wpe.weight") continue;  // rows past T get no gradient; checked with the others below
    size_t best = t.offset;
    for (size_t i = t.offset; i < t.offset + t.count; ++i) {
      if (std::fabs(grads[i]) > std::fabs(grads[best])) best = i;
    }
    const float keep = params[best];
    const float h = 1e-2f;
    params[best] = keep + h;
    const double up = loss();
    params[best] = keep - h;
    const double down = loss();
    params[best] = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(grads[best], numeric, 0.02 * std::fabs(numeric) + 1e-4) << t.name << " element " << best - t.offset;
    // A gradient of zeros would pass the comparison without checking anything: every tensor but an
    // expert's has one (an expert may get no token), and each MoE block's router and at least one
    // of its experts (all four tensors) are checked on a real gradient.
    const bool real = std::fabs(numeric) > 1e-3;
    if (t.expert < 0) {
      EXPECT_TRUE(real) << t.name << " has no gradient to check";
    }
    if (t.expert >= 0 && real) ++checkedExpertTensors[t.name.substr(0, t.name.find(".mlp"))];
  }
  for (int l = 0; l < c.layers; ++l) {
    if (c.moeLayer(l)) {
      EXPECT_GE(checkedExpertTensors[fmt::format("h.{}", l)], 4) << "block " << l;
    }
  }
  const auto& wpe = layout.tensor("wpe.weight");
  for (size_t i = static_cast<size_t>(T) * c.width; i < wpe.count; ++i) EXPECT_EQ(grads[wpe.offset + i], 0.0f);
}

TEST(GptTest, GradientMatchesDifferencesOfTheLoss) { expectGradientMatchesDifferences(GptConfig{2, 2, 8, 6, 13}); }

// A GPT whose second block's MLP is a mixture of 4 experts (top-2, SwiGLU, aux and z losses), and
// one of top-1 GELU experts in every block.
GptConfig moeConfig(int layers, int every, int k, bool swiglu) {
  GptConfig c{layers, 2, 8, 6, 13};
  c.moe.experts = 4;
  c.moe.topK = k;
  c.moe.hidden = 12;
  c.moe.swiglu = swiglu;
  c.moe.auxCoef = 0.05f;
  c.moe.zCoef = 0.01f;
  c.moeEvery = every;
  return c;
}

TEST(GptTest, MoeGradientMatchesDifferencesOfTheLoss) {
  expectGradientMatchesDifferences(moeConfig(2, 2, 2, true));
  expectGradientMatchesDifferences(moeConfig(2, 1, 1, false));
}

TEST(GptTest, MoeBlocksHoldARouterAndTheirExpertsInPlaceOfTheMlp) {
  const GptConfig c = moeConfig(2, 2, 2, true);
  const ParamLayout whole(c);
  EXPECT_NO_THROW(whole.tensor("h.0.mlp.c_fc.weight"));
  EXPECT_THROW(whole.tensor("h.1.mlp.c_fc.weight"), Error);
  EXPECT_EQ(whole.tensor("h.1.mlp.router.weight").shape, (std::vector<int>{4, 8}));
  EXPECT_EQ(whole.tensor("h.1.mlp.experts.3.c_fc.weight").shape, (std::vector<int>{24, 8}));  // SwiGLU: 2 x 12
  EXPECT_EQ(whole.tensor("h.1.mlp.experts.3.c_proj.weight").expert, 3);
  // ep rank 1 of 2 holds experts 2 and 3, at their places in the whole model.
  const ParamLayout shard(c, 1, 0, {}, 2, 1);
  EXPECT_THROW(shard.tensor("h.1.mlp.experts.1.c_fc.weight"), Error);
  const ParamTensor& e2 = shard.tensor("h.1.mlp.experts.2.c_fc.weight");
  EXPECT_EQ(e2.globalOffset, whole.tensor("h.1.mlp.experts.2.c_fc.weight").globalOffset);
  // The experts are a unit of their own after their block's (data parallelism reduces them over
  // other ranks): units embeddings, block 0, block 1, block 1's experts, ln_f.
  const size_t expert = 24 * 8 + 24 + 8 * 12 + 8;
  for (const ParamLayout* layout : {&whole, &shard}) {
    EXPECT_EQ(layout->expertUnit(0), -1);
    EXPECT_EQ(layout->expertUnit(1), 3);
    EXPECT_EQ(layout->finalNormUnit(), 4);
    EXPECT_TRUE(layout->holdsExperts(3));
    EXPECT_FALSE(layout->holdsExperts(2));
    EXPECT_EQ(layout->unitCount(3), (layout == &whole ? 4 : 2) * expert);
    EXPECT_EQ(layout->accessOrder().units, (std::vector<int>{0, 1, 2, 3, 4, 0, 0, 4, 2, 3, 1}));
  }
  EXPECT_EQ(shard.tensor("h.1.mlp.router.weight").unit, 2);
  EXPECT_EQ(e2.unit, 3);
  EXPECT_EQ(whole.total() - shard.total(), 2 * expert);
  EXPECT_THROW(ParamLayout(c, 1, 0, {}, 3, 0), Error);  // 4 experts over 3 ranks
}

// Activation checkpointing recomputes exactly what it dropped: the same loss and bit-identical
// gradients over two micro-batches, and the activation bytes fall by what each mode leaves out:
// selective the attention probabilities of all blocks but one shared buffer, full every block's
// intermediate values but one shared set (and the rerun block's output).
TEST(GptTest, RecomputeGivesTheSameGradientsWithFewerActivationBytes) {
  const GptConfig c{3, 2, 8, 6, 13};
  const int B = 2, T = 6;
  std::vector<int> tokens(2 * B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>(7 * i + 3) % c.vocab;
    targets[i] = static_cast<int>(5 * i + 1) % c.vocab;
  }
  std::vector<float> loss[3], grads[3];
  size_t bytes[3] = {};
  const Recompute modes[3] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  for (int m = 0; m < 3; ++m) {
    Gpt model(c, B, T, TensorParallel{}, {}, modes[m]);
    std::vector<float> params(model.layout().total());
    grads[m].assign(params.size(), 0.0f);
    model.layout().initialize(3, params.data(), 0, params.size());
    FlatAccess access(model.layout(), params.data(), grads[m].data());
    for (int micro = 0; micro < 2; ++micro) {
      loss[m].push_back(model.forward(tokens.data() + micro * B * T, targets.data() + micro * B * T, access));
      model.backward(access, 0.5f);
    }
    bytes[m] = model.activationBytes();
  }
  for (int m = 1; m < 3; ++m) {
    EXPECT_EQ(loss[m], loss[0]) << "mode " << m;
    EXPECT_EQ(grads[m], grads[0]) << "mode " << m;
  }
  const size_t N = static_cast<size_t>(B) * T, C = c.width;
  const size_t att = static_cast<size_t>(B) * c.heads * T * T;
  // ln1, ln2 (N C each, with mean and rstd), qkv 3 N C, atty N C, att, res2 N C, fch and its GELU 4 N C each.
  const size_t layer = 2 * (N * C + 2 * N) + 3 * N * C + N * C + att + N * C + 8 * N * C;
  EXPECT_EQ(bytes[0] - bytes[1], (c.layers - 1) * att * sizeof(float));
  EXPECT_EQ(bytes[0] - bytes[2], ((c.layers - 1) * layer - N * C) * sizeof(float));
  EXPECT_THROW(parseRecompute("some"), Error);
}

// Mixed precision: bf16 and fp16 compute follow fp32 within their rounding (and differ from it:
// the products really are 16-bit), and keep the linear layers' inputs and outputs in half the bytes.
TEST(GptTest, SixteenBitComputeFollowsFp32AndKeepsTheLinearLayersActivationsInHalfTheBytes) {
  const GptConfig c{2, 2, 16, 8, 29};
  const int B = 2, T = 8;
  std::vector<int> tokens(B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>(7 * i + 3) % c.vocab;
    targets[i] = static_cast<int>(5 * i + 1) % c.vocab;
  }
  struct Run {
    float loss;
    std::vector<float> grads;
    size_t bytes, castCount;
  };
  auto run = [&](Compute compute) {
    Gpt model(c, B, T, TensorParallel{}, {}, Recompute::kNone, {}, {}, compute);
    EXPECT_EQ(model.compute(), compute);
    std::vector<float> params(model.layout().total());
    Run r{0, std::vector<float>(params.size(), 0.0f), 0, 0};
    model.layout().initialize(3, params.data(), 0, params.size());
    for (auto& p : params) p *= 4.0f;  // larger weights: activations well away from zero
    FlatAccess access(model.layout(), params.data(), r.grads.data());
    r.loss = model.forward(tokens.data(), targets.data(), access);
    model.backward(access);
    r.bytes = model.activationBytes();
    r.castCount = std::max(model.layout().unitCount(model.layout().blockUnit(0)),
                           static_cast<size_t>(model.layout().vocabCount()) * c.width);
    return r;
  };
  const Run fp32 = run(Compute::kFp32);
  const size_t N = static_cast<size_t>(B) * T, C = c.width;
  for (Compute compute : {Compute::kBf16, Compute::kFp16}) {
    SCOPED_TRACE(computeName(compute));
    const Run half = run(compute);
    // Measured: bf16 3.0e-5 (loss) and 7.7e-3 (gradients), fp16 4.7e-5 and 1.1e-3.
    const bool bf16 = compute == Compute::kBf16;
    EXPECT_NEAR(half.loss, fp32.loss, (bf16 ? 3e-3 : 1e-4) * fp32.loss);
    EXPECT_NE(half.loss, fp32.loss);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < fp32.grads.size(); ++i) {
      diff += (half.grads[i] - fp32.grads[i]) * (half.grads[i] - fp32.grads[i]);
      norm += fp32.grads[i] * fp32.grads[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), bf16 ? 2e-2 : 3e-3);
    EXPECT_GT(diff, 0.0);
    // Per block ln1, atty, ln2 (N C each), qkv (3 N C), the MLP's hidden values and their GELU (4 N C
    // each) and the attention probabilities (B heads T T), and the final layernorm's output, go
    // from 4 bytes to 2; two fp32 scratch buffers of 4 N C and one unit's weights cast are added,
    // and attention's scratch grows from T T floats to the 16-bit form's.
    const size_t probabilities = static_cast<size_t>(B) * c.heads * T * T;
    const size_t saved = (c.layers * (14 * N * C + probabilities) + N * C) * 2;
    const size_t scratch =
        (chorus::kernels::attention16ScratchFloats(T, c.width) - static_cast<size_t>(T) * T) * sizeof(float);
    EXPECT_EQ(half.bytes, fp32.bytes - saved + 8 * N * C * sizeof(float) + half.castCount * sizeof(uint16_t) + scratch);
  }
  EXPECT_THROW(parseCompute("fp8"), Error);
  EXPECT_EQ(parseDevice("cpu"), Device::kCpu);
  EXPECT_EQ(parseDevice("cuda"), Device::kCuda);
  EXPECT_THROW(parseDevice("tpu"), Error);
}

// Recompute in bf16: attention and whole blocks rerun from the 16-bit values forward kept give
// the very gradients of keeping everything (forward itself goes on with the rounded values).
TEST(GptTest, RecomputeInBf16GivesTheSameGradients) {
  const GptConfig c{3, 2, 8, 6, 13};
  const int B = 2, T = 6;
  std::vector<int> tokens(B * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int>(7 * i + 3) % c.vocab;
    targets[i] = static_cast<int>(5 * i + 1) % c.vocab;
  }
  std::vector<float> grads[3];
  float loss[3];
  const Recompute modes[3] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  for (int m = 0; m < 3; ++m) {
    Gpt model(c, B, T, TensorParallel{}, {}, modes[m], {}, {}, Compute::kBf16);
    std::vector<float> params(model.layout().total());
    grads[m].assign(params.size(), 0.0f);
    model.layout().initialize(3, params.data(), 0, params.size());
    FlatAccess access(model.layout(), params.data(), grads[m].data());
    loss[m] = model.forward(tokens.data(), targets.data(), access);
    model.backward(access);
  }
  for (int m = 1; m < 3; ++m) {
    EXPECT_EQ(loss[m], loss[0]) << "mode " << m;
    EXPECT_EQ(grads[m], grads[0]) << "mode " << m;
  }
}

}  // namespace
}  // namespace chorus::training
