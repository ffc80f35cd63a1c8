// planner_test.cc: the planner against closed forms and against the runtime itself: the presets'
// parameter counts; each stage's parameters against ParamLayout's; ZeRO's bytes (Rajbhandari et
// al. 2020); Korthikanti et al.'s activation formulas; Narayanan et al.'s FLOPs and bubble; the
// activation bytes of a model that has run (Gpt::activationBytes); communication volumes; the
// search.
#include "src/training/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "chorus/error.hpp"
#include "src/training/gpt.h"
#include "src/training/pipeline.h"

namespace chorus::training {
namespace {

Machine machineOf(int devices) { return machinePreset("dgx-h100", devices); }

PlanLayout layoutOf(int dp, int tp, int pp, int cp, int micro, long global) {
  PlanLayout l;
  l.dp = dp, l.tp = tp, l.pp = pp, l.cp = cp, l.micro = micro, l.globalBatch = global;
  return l;
}

TEST(PlannerTest, PresetsHaveTheirPublishedParameterCounts) {
  EXPECT_EQ(modelPreset("gpt2-124m").parameters(), 124439808.0);
  EXPECT_EQ(modelPreset("gpt2-1.5b").parameters(), 1557611200.0);
  EXPECT_EQ(modelPreset("gpt3-175b").parameters(), 174604259328.0);
  EXPECT_EQ(modelPreset("llama3-8b").parameters(), 8030261248.0);
  EXPECT_EQ(modelPreset("llama3-70b").parameters(), 70553706496.0);
  try {
    modelPreset("gpt5");
    FAIL() << "an unknown preset was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model preset 'gpt5' (presets: gpt2-124m"), std::string::npos) << e.what();
  }
  // The runtime's GPT-2 counted by its own layout.
  const GptConfig config{3, 4, 32, 24, 37};
  EXPECT_EQ(shapeOf(config, 16).parameters(), static_cast<double>(ParamLayout(config).globalTotal()));
}

// Each stage's parameters (tp rank 0) are what ParamLayout gives that rank, on the trainer's cut.
TEST(PlannerTest, EachStagesParametersAreTheRuntimeLayouts) {
  const GptConfig config{6, 4, 32, 16, 37};  // 37 tokens: uneven vocabulary shards
  for (const auto& [tp, pp, vpp] :
       std::vector<std::array<int, 3>>{{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 3, 1}, {4, 2, 1}, {1, 2, 2}, {2, 3, 2}}) {
    SCOPED_TRACE(testing::Message() << "tp " << tp << " pp " << pp << " vpp " << vpp);
    PlanLayout l = layoutOf(1, tp, pp, 1, 2, 12);
    l.vpp = vpp;
    l.schedule = vpp > 1 ? Schedule::kInterleaved : Schedule::kOneFOneB;
    const Plan plan = makePlan(shapeOf(config, 16), l, machineOf(tp * pp), parsePrecision("fp32"));
    const auto cut = balanceLayers(config, 2, 16, pp * vpp);
    ASSERT_EQ(plan.stages.size(), static_cast<size_t>(pp));
    for (int s = 0; s < pp; ++s) {
      EXPECT_EQ(plan.stages[s].chunks, stageSpans(cut, pp, s)) << "stage " << s;
      const ParamLayout layout(config, tp, 0, stageSpans(cut, pp, s));
      EXPECT_EQ(plan.stages[s].parameters, static_cast<double>(layout.total())) << "stage " << s;
    }
  }
}

// ZeRO's bytes per rank for P parameters over N = dp x cp ranks: fp32 (4 + 4 + 8 bytes) 16P,
// 8P + 8P/N, 4P + 12P/N, 16P/N; mixed precision (2 + 2 + K, K = 12) 16P, 4P + 12P/N, 2P + 14P/N, 16P/N.
TEST(PlannerTest, StateBytesFollowZero) {
  const ModelShape model = modelPreset("gpt2-124m");
  const double P = model.parameters();
  for (const auto& [dp, cp] : std::vector<std::pair<int, int>>{{8, 1}, {4, 2}}) {
    const double N = dp * cp;
    for (int zero = 0; zero <= 3; ++zero) {
      PlanLayout l = layoutOf(dp, 1, 1, cp, 1, dp * 4);
      l.zero = zero;
      const double fp32[4] = {16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N};
      const double mixed[4] = {16 * P, 4 * P + 12 * P / N, 2 * P + 14 * P / N, 16 * P / N};
      const Plan a = makePlan(model, l, machineOf(dp * cp), parsePrecision("fp32"));
      const Plan b = makePlan(model, l, machineOf(dp * cp), parsePrecision("bf16"));
      EXPECT_DOUBLE_EQ(a.stages[0].stateBytes(), fp32[zero]) << "ZeRO-" << zero << " over " << N;
      EXPECT_DOUBLE_EQ(b.stages[0].stateBytes(), mixed[zero]) << "ZeRO-" << zero << " over " << N;
    }
  }
}

// Korthikanti et al. 2022 (16-bit activations, dropout, plain attention, MLP of 4h): per block
// sbh (34 + 5 a s / h); with tp t: sbh (10 + 24/t + 5 a s / (h t)); with sequence parallelism
// sbh / t (34 + 5 a s / h); selective recompute sbh 34 / t; full recompute 2 sbh (/ t with sp).
TEST(PlannerTest, ActivationsFollowKorthikanti) {
  ModelShape m = modelPreset("gpt2-1.5b");
  m.heads = 32, m.seq = 2048;
  const double s = m.seq, b = 2, h = m.hidden, a = m.heads;
  const Precision bf16 = parsePrecision("bf16");
  auto perLayer = [&](int tp, bool sp, Recompute r) {
    PlanLayout l = layoutOf(1, tp, 1, 1, 2, 2);
    l.sequenceParallel = sp, l.recompute = r, l.dropout = true;
    const LayerActivations x = layerActivations(m, l, bf16);
    return x.total() - x.stats;  // the paper leaves out the layernorm statistics
  };
  const double sbh = s * b * h, as2b = a * s * s * b;
  EXPECT_DOUBLE_EQ(perLayer(1, false, Recompute::kNone), 34 * sbh + 5 * as2b);
  EXPECT_DOUBLE_EQ(perLayer(8, false, Recompute::kNone), sbh * (10 + 24.0 / 8) + 5 * as2b / 8);
  EXPECT_DOUBLE_EQ(perLayer(8, true, Recompute::kNone), (34 * sbh + 5 * as2b) / 8);
  EXPECT_DOUBLE_EQ(perLayer(8, true, Recompute::kSelective), 34 * sbh / 8);
  EXPECT_DOUBLE_EQ(perLayer(8, false, Recompute::kFull), 2 * sbh);
  EXPECT_DOUBLE_EQ(perLayer(8, true, Recompute::kFull), 2 * sbh / 8);
}

// The activation bytes of a model that has run one micro-batch forward and backward equal the
// plan's, for every recompute mode: what chorus keeps, counted another way.
TEST(PlannerTest, ActivationBytesAreWhatTheModelHolds) {
  const GptConfig config{3, 4, 32, 16, 37};
  for (const char* compute : {"fp32", "bf16", "fp16"}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      Gpt model(config, 2, 16, {}, {}, r, {}, {}, parseCompute(compute));
      std::vector<float> p(model.layout().total()), g(p.size(), 0.0f);
      model.layout().initialize(1, p.data(), 0, p.size());
      FlatAccess access(model.layout(), p.data(), g.data());
      std::vector<int> tokens(32, 3), targets(32, 5);
      model.forward(tokens.data(), targets.data(), access);
      model.backward(access);
      PlanLayout l = layoutOf(1, 1, 1, 1, 2, 2);
      l.recompute = r;
      const Plan plan = makePlan(shapeOf(config, 16), l, machineOf(1), withCompute(parsePrecision("fp32"), compute));
      EXPECT_EQ(plan.stages[0].activationBytes, static_cast<double>(model.activationBytes()))
          << compute << ", recompute " << static_cast<int>(r);
    }
  }
  EXPECT_THROW(withCompute(parsePrecision("fp32"), "fp8"), Error);
  EXPECT_THROW(withCompute(parsePrecision("fp32"), "bf16", "fp16"), Error);
}

// Narayanan et al. 2021: a step of B sequences costs 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
// FLOPs, and 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute; the runtime's count is
// the same. The bubble is (p - 1) / (v m + p - 1); 1F1B stage s holds min(p - s, m) micro-batches.
TEST(PlannerTest, FlopsAndBubbleFollowNarayanan) {
  const ModelShape m = modelPreset("gpt2-124m");
  const double B = 64, s = m.seq, l = m.layers, h = m.hidden, V = m.vocab;
  PlanLayout layout = layoutOf(2, 1, 4, 1, 2, 64);
  Plan plan = makePlan(m, layout, machineOf(8), parsePrecision("bf16"));
  EXPECT_NEAR(plan.modelFlops, 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)), 1e-9 * plan.modelFlops);
  EXPECT_DOUBLE_EQ(plan.hardwareFlops, plan.modelFlops);
  EXPECT_DOUBLE_EQ(plan.bubbleFormula, 3.0 / (16 + 3));
  for (int st = 0; st < 4; ++st) EXPECT_EQ(plan.stages[st].inFlight[0], 4 - st);
  layout.recompute = Recompute::kFull;
  plan = makePlan(m, layout, machineOf(8), parsePrecision("bf16"));
  EXPECT_NEAR(plan.hardwareFlops, 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)),
              1e-9 * plan.hardwareFlops);
  const GptConfig config{2, 4, 32, 16, 37};
  const Gpt gpt(config, 2, 16);
  const Plan small = makePlan(shapeOf(config, 16), layoutOf(4, 1, 1, 1, 2, 24), machineOf(4), parsePrecision("fp32"));
  EXPECT_NEAR(small.modelFlops, gpt.flopsPerStep() * 3 * 4, 1e-9 * small.modelFlops);
  layout.vpp = 2, layout.recompute = Recompute::kNone, layout.schedule = Schedule::kInterleaved;
  EXPECT_DOUBLE_EQ(makePlan(m, layout, machineOf(8), parsePrecision("bf16")).bubbleFormula, 3.0 / (32 + 3));
}

// What a rank sends: ring all-reduce 2 (n-1)/n of the buffer; tensor parallelism's all-reduces,
// four per block and one at each end of the model, per micro-batch.
TEST(PlannerTest, CommunicationVolumesFollowTheLayout) {
  const ModelShape m = modelPreset("gpt2-124m");
  PlanLayout l = layoutOf(4, 2, 1, 1, 1, 8);
  const Plan plan = makePlan(m, l, machineOf(8), parsePrecision("fp32"));
  double tpCalls = 0;
  bool sawDp = false;
  for (const auto& c : plan.collectives) {
    if (c.group == "dp") {
      sawDp = true;
      EXPECT_EQ(c.op, "all_reduce");
      EXPECT_EQ(c.ranks, 4);
      EXPECT_DOUBLE_EQ(c.bytes, 4 * plan.stages[0].parameters);
      EXPECT_DOUBLE_EQ(c.sentBytes, 2.0 * 3 / 4 * c.bytes);
    }
    if (c.group == "tp" && c.bytes == 4.0 * m.seq * m.hidden) tpCalls += c.calls;
  }
  EXPECT_TRUE(sawDp);
  EXPECT_EQ(tpCalls, 2 * (4 * m.layers + 2));  // 2 micro-batches
  EXPECT_GT(plan.stepSeconds, plan.computeSeconds);
  // Gradients reduced in bf16: half the data-parallel bytes, the state as it was.
  const Plan halved = makePlan(m, l, machineOf(8), withCompute(parsePrecision("fp32"), "bf16", "bf16"));
  for (const auto& c : halved.collectives) {
    if (c.group == "dp") {
      EXPECT_DOUBLE_EQ(c.bytes, 2 * plan.stages[0].parameters);
    }
  }
  EXPECT_DOUBLE_EQ(halved.stages[0].stateBytes(), plan.stages[0].stateBytes());
  // Local steps: one fp32 all-reduce of the parameters per H steps, no gradients; DiLoCo keeps
  // three more copies of the parameters as optimizer state.
  PlanLayout local = l;
  local.syncEvery = 10;
  const Plan localPlan = makePlan(m, local, machineOf(8), parsePrecision("fp32"));
  int dpCalls = 0;
  for (const auto& c : localPlan.collectives) {
    if (c.group != "dp") continue;
    ++dpCalls;
    EXPECT_EQ(c.op, "all_reduce");
    EXPECT_DOUBLE_EQ(c.bytes, 4 * plan.stages[0].parameters);
    EXPECT_DOUBLE_EQ(c.calls, 0.1);
  }
  EXPECT_EQ(dpCalls, 1);
  EXPECT_DOUBLE_EQ(localPlan.stages[0].optimizerBytes, plan.stages[0].optimizerBytes);
  local.diloco = true;
  EXPECT_DOUBLE_EQ(makePlan(m, local, machineOf(8), parsePrecision("fp32")).stages[0].optimizerBytes,
                   plan.stages[0].optimizerBytes + 12 * plan.stages[0].parameters);
  local.zero = 1;
  EXPECT_THROW(makePlan(m, local, machineOf(8), parsePrecision("fp32")), Error);
}

// Offload: to the host, the optimizer state leaves a GPU's memory (ZeRO-Offload) but stays where
// it is when the devices are the host's cores; to a file, what stays is the window the runtime
// cuts (four chunks of 1024-element multiples of every array), and ZeRO-3's parameters go too.
TEST(PlannerTest, OffloadMovesTheOptimizerStateOutOfMemory) {
  const ModelShape m = modelPreset("gpt2-124m");
  const double P = m.parameters();
  PlanLayout l = layoutOf(8, 1, 1, 1, 1, 8);
  l.zero = 1;
  const Plan base = makePlan(m, l, machineOf(8), parsePrecision("fp32"));
  PlanLayout host = l;
  host.offloadOptimizer = OffloadTarget::kHost;
  const Plan onHost = makePlan(m, host, machineOf(8), parsePrecision("fp32"));
  EXPECT_DOUBLE_EQ(onHost.stages[0].optimizerBytes, 0.0);
  EXPECT_DOUBLE_EQ(onHost.stages[0].offloadedBytes, 8 * P / 8);
  Machine cores = machineOf(8);
  cores.sharedCores = true;
  EXPECT_DOUBLE_EQ(makePlan(m, host, cores, parsePrecision("fp32")).stages[0].optimizerBytes,
                   base.stages[0].optimizerBytes);
  PlanLayout file = l;
  file.offloadOptimizer = OffloadTarget::kFile;
  file.offloadWindowBytes = 4 << 20;  // 4 chunks of 65536 elements of m and v: all 4 MiB
  const Plan inFile = makePlan(m, file, machineOf(8), parsePrecision("fp32"));
  EXPECT_DOUBLE_EQ(inFile.stages[0].optimizerBytes, 4 << 20);
  EXPECT_DOUBLE_EQ(inFile.stages[0].offloadedBytes, 8 * P / 8);
  EXPECT_DOUBLE_EQ(inFile.stages[0].paramBytes, base.stages[0].paramBytes);
  file.zero = 3;
  file.offloadParams = true;
  file.offloadWindowBytes = 3 << 20;  // 4 chunks of 65536 elements of the parameters, m and v
  const Plan withParams = makePlan(m, file, machineOf(8), parsePrecision("fp32"));
  EXPECT_DOUBLE_EQ(withParams.stages[0].paramBytes, 1 << 20);
  EXPECT_DOUBLE_EQ(withParams.stages[0].optimizerBytes, 2 << 20);
  EXPECT_DOUBLE_EQ(withParams.stages[0].offloadedBytes, 12 * P / 8);
  file.zero = 2;
  EXPECT_THROW(makePlan(m, file, machineOf(8), parsePrecision("fp32")), Error);  // parameters need ZeRO-3
}

TEST(PlannerTest, BadLayoutsAreRefusedByName) {
  const ModelShape m = modelPreset("gpt2-124m");
  auto message = [&](PlanLayout l, int devices) {
    try {
      makePlan(m, l, machineOf(devices), parsePrecision("fp32"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(layoutOf(1, 8, 1, 1, 1, 1), 8).find("heads 12 (kv heads 12) cannot be split over tp = 8"),
            std::string::npos);
  EXPECT_NE(message(layoutOf(1, 1, 1, 3, 1, 1), 3).find("seq 1024 cannot be cut into 2 x cp = 6"), std::string::npos);
  EXPECT_NE(message(layoutOf(2, 1, 1, 1, 1, 2), 8).find("uses 2 devices; the machine has 8"), std::string::npos);
  EXPECT_NE(message(layoutOf(2, 1, 1, 1, 3, 8), 2).find("global batch 8 is not a multiple of micro x dp = 3 x 2"),
            std::string::npos);
}

// Every layout the search returns fits and runs; they come fastest first. llama3-70b in mixed
// precision needs 16 bytes per parameter, 141 GB per GPU even when 8 share it all: no layout of
// one 8-GPU node fits, and on 4 nodes only those that shard the state 16 ways or more do.
TEST(PlannerTest, SearchRanksLayoutsThatFitFastestFirst) {
  PlanLayout base;
  base.globalBatch = 32;
  const ModelShape model = modelPreset("llama3-70b");
  EXPECT_TRUE(searchLayouts(model, base, machineOf(8), parsePrecision("bf16")).empty());
  const Machine machine = machineOf(32);
  const auto plans = searchLayouts(model, base, machine, parsePrecision("bf16"));
  ASSERT_FALSE(plans.empty());
  for (size_t i = 0; i < plans.size(); ++i) {
    const PlanLayout& l = plans[i].layout;
    EXPECT_TRUE(plans[i].fits);
    EXPECT_LE(plans[i].peakBytes(), machine.memoryBytes);
    EXPECT_EQ(l.devices(), 32);
    if (i > 0) {
      EXPECT_GE(plans[i - 1].tokensPerSecond, plans[i].tokensPerSecond);
    }
    const int stateShards = l.tp * l.pp * (l.zero >= 3 ? l.dp * l.cp : 1);
    EXPECT_TRUE(stateShards >= 16 || l.zero >= 1) << l.describe();
  }
}

// Mixture of experts, counted by hand: Mixtral 8x7B (Mistral 7B's attention, 8 SwiGLU experts
// of 14336, 2 per token; published: 46.7 B parameters, 12.9 B active) and DeepSeek-MoE 16B (its
// first block dense, 64 routed experts of 1408 and 2 shared in the others, 6 routed per token;
// published: 16.4 B, 2.8 B active).
TEST(PlannerMoeTest, PresetsHaveTheirPublishedParameterCounts) {
  const ModelShape mixtral = modelPreset("mixtral-8x7b");
  const double h = 4096, attention = 2 * h * h + 2 * h * 1024, norms = 2 * h, expert = 3 * h * 14336;
  const double embeddings = 2 * 32000 * h + h;
  EXPECT_EQ(mixtral.parameters(), 32 * (attention + norms + 8 * h + 8 * expert) + embeddings);
  EXPECT_EQ(mixtral.activeParameters(), 32 * (attention + norms + 8 * h + 2 * expert) + embeddings);
  EXPECT_NEAR(mixtral.parameters(), 46.7e9, 0.05e9);
  EXPECT_NEAR(mixtral.activeParameters(), 12.9e9, 0.05e9);
  const ModelShape deepseek = modelPreset("deepseek-moe-16b");
  const double d = 2048, attn = 4 * d * d, small = 3 * d * 1408, dense = attn + 2 * d + 3 * d * 10944;
  const double ends = 2 * 102400 * d + d;
  EXPECT_EQ(deepseek.parameters(), dense + 27 * (attn + 2 * d + 64 * d + (64 + 2) * small) + ends);
  EXPECT_EQ(deepseek.activeParameters(), dense + 27 * (attn + 2 * d + 64 * d + (6 + 2) * small) + ends);
  EXPECT_NEAR(deepseek.parameters(), 16.4e9, 0.05e9);
  EXPECT_NEAR(deepseek.activeParameters(), 2.8e9, 0.05e9);
  EXPECT_EQ(deepseek.moeBlocks(0, 28), 27);
  // The runtime's MoE GPT counted by its own layout.
  GptConfig config{4, 4, 32, 16, 37};
  config.moe.experts = 4, config.moe.hidden = 24, config.moe.swiglu = true, config.moeEvery = 2;
  EXPECT_EQ(shapeOf(config, 16).parameters(), static_cast<double>(ParamLayout(config).globalTotal()));
}

// Each stage's parameters, and its experts', are what ParamLayout gives tp rank 0 and ep rank 0.
TEST(PlannerMoeTest, EachStagesParametersAreTheRuntimeLayouts) {
  GptConfig config{4, 4, 32, 16, 37};
  config.moe.experts = 4, config.moe.hidden = 24, config.moe.swiglu = true, config.moeEvery = 2;
  for (const auto& [tp, pp, ep] : std::vector<std::array<int, 3>>{{1, 1, 2}, {2, 1, 4}, {1, 2, 2}, {2, 2, 1}}) {
    SCOPED_TRACE(testing::Message() << "tp " << tp << " pp " << pp << " ep " << ep);
    PlanLayout l = layoutOf(ep, tp, pp, 1, 2, 2 * ep * 2);
    l.ep = ep;
    const Plan plan = makePlan(shapeOf(config, 16), l, machineOf(tp * pp * ep), parsePrecision("fp32"));
    const auto cut = balanceLayers(config, 2, 16, pp);
    for (int s = 0; s < pp; ++s) {
      const ParamLayout layout(config, tp, 0, stageSpans(cut, pp, s), ep, 0);
      double experts = 0;
      for (const auto& t : layout.tensors()) experts += t.expert >= 0 ? static_cast<double>(t.count) : 0.0;
      EXPECT_EQ(plan.stages[s].parameters, static_cast<double>(layout.total())) << "stage " << s;
      EXPECT_EQ(plan.stages[s].expertParameters, experts) << "stage " << s;
    }
  }
}

// With ep: each rank holds E / ep experts of every MoE block; ZeRO shards them over the dp / ep
// ranks that hold the same ones (the rest over all dp); each MoE block sends its rows' top-k copies
// by all-to-all over the ep group twice in forward and twice in backward, priced by the runtime's
// model on the links between the ep ranks; the experts' gradients go over their own group.
TEST(PlannerMoeTest, ExpertParallelismShardsExpertsAndExchangesTokens) {
  const ModelShape m = modelPreset("mixtral-8x7b");
  PlanLayout l = layoutOf(8, 1, 1, 1, 1, 16);  // 2 micro-batches
  l.ep = 4, l.zero = 1;
  const Machine machine = machineOf(8);
  const Precision bf16 = parsePrecision("bf16");
  const Plan plan = makePlan(m, l, machine, bf16);
  const double h = m.hidden, expert = 3 * h * 14336;
  const double Pe = 32 * 2 * expert, P = plan.stages[0].parameters;
  EXPECT_EQ(plan.stages[0].expertParameters, Pe);
  EXPECT_EQ(P - Pe, m.parameters() - 32 * 8 * expert);
  EXPECT_DOUBLE_EQ(plan.stages[0].optimizerBytes, (P - Pe) * 12 / 8 + Pe * 12 / 2);
  EXPECT_DOUBLE_EQ(plan.stages[0].paramBytes, P * 2);
  bool sawEp = false, sawEdp = false, sawDp = false;
  for (const auto& c : plan.collectives) {
    if (c.group == "ep") {
      sawEp = true;
      const double bytes = 2.0 * m.seq * 2 * h;  // bf16, seq rows of one sequence, 2 copies each
      EXPECT_EQ(c.op, "all_to_all");
      EXPECT_EQ(c.ranks, 4);
      EXPECT_DOUBLE_EQ(c.bytes, bytes);
      EXPECT_DOUBLE_EQ(c.calls, 32 * 4 * 2);
      EXPECT_DOUBLE_EQ(c.sentBytes, 3.0 / 4 * bytes * c.calls);
      const chorusLinkModel_t link{
          1, machine.intraAlphaUs, machine.intraGBps, machine.intraAlphaUs, machine.intraGBps, machine.reduceGBps};
      double us = 0;
      ASSERT_EQ(chorusPredictTime(chorusCollAllToAll, 4, static_cast<size_t>(bytes), &link, &us), chorusSuccess);
      EXPECT_NEAR(c.seconds, c.calls * us * 1e-6, 1e-9 * c.seconds);
    }
    if (c.group == "edp" && c.op == "reduce_scatter") {
      sawEdp = true;
      EXPECT_EQ(c.ranks, 2);
      EXPECT_DOUBLE_EQ(c.bytes, Pe * 2);
    }
    if (c.group == "dp" && c.op == "reduce_scatter") {
      sawDp = true;
      EXPECT_EQ(c.ranks, 8);
      EXPECT_DOUBLE_EQ(c.bytes, (P - Pe) * 2);
    }
  }
  EXPECT_TRUE(sawEp && sawEdp && sawDp);
  // Model FLOPs count the experts a token uses: 6 x active matmul weights per token, plus attention.
  PlanLayout one = layoutOf(8, 1, 1, 1, 1, 8);
  const Plan dense = makePlan(m, one, machine, bf16);
  const double tokens = 8.0 * m.seq, s = m.seq;
  const double matmuls = 32 * (2 * h * h + 2 * h * 1024 + 8 * h + 2 * expert) + 32000 * h;
  EXPECT_NEAR(dense.modelFlops, 6 * tokens * matmuls + 3 * tokens * 32 * 4 * s * h, 1e-9 * dense.modelFlops);
  // Bad expert-parallel layouts are refused by name.
  auto message = [&](const ModelShape& model, int ep) {
    PlanLayout bad = layoutOf(8, 1, 1, 1, 1, 8);
    bad.ep = ep;
    try {
      makePlan(model, bad, machine, bf16);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(m, 3).find("ep = 3 must divide dp = 8 and the model's 8 experts"), std::string::npos);
  EXPECT_NE(message(modelPreset("llama3-8b"), 2).find("ep = 2 must divide dp = 8 and the model's 0 experts"),
            std::string::npos);
}

// The search tries ep among the dp ranks: DeepSeek-MoE on 16 GPUs in mixed precision needs its
// experts sharded (16.4 B parameters x 16 bytes), and every plan it returns fits, fastest first.
TEST(PlannerMoeTest, SearchTriesExpertParallelism) {
  PlanLayout base;
  base.globalBatch = 64;
  const Machine machine = machineOf(16);
  const auto plans = searchLayouts(modelPreset("deepseek-moe-16b"), base, machine, parsePrecision("bf16"));
  ASSERT_FALSE(plans.empty());
  bool sawEp = false;
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_TRUE(plans[i].fits);
    EXPECT_LE(plans[i].peakBytes(), machine.memoryBytes);
    if (i > 0) {
      EXPECT_GE(plans[i - 1].tokensPerSecond, plans[i].tokensPerSecond);
    }
    sawEp |= plans[i].layout.ep > 1;
  }
  EXPECT_TRUE(sawEp);
}

}  // namespace
}  // namespace chorus::training
