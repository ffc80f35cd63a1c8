// pipeline_test.cc: pipeline parallelism without processes: the schedules (every micro-batch's
// forward and backward once, in an order that cannot deadlock, holding the activations the
// published schedules hold), their simulated idle share against the published bubble, the cut of
// the blocks by cost, the stage layouts (each element of the whole model counted on exactly one
// stage, the tied head's copy mapped onto wte), and a model run chunk by chunk (activations handed
// on by hand) against the whole model: the same loss and gradients.
#include "src/training/pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <vector>

#include "chorus/error.hpp"

namespace chorus::training {
namespace {

struct Case {
  Schedule schedule;
  int stages, chunks, micros;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      all.push_back({Schedule::kGpipe, p, 1, m});
      all.push_back({Schedule::kOneFOneB, p, 1, m});
      for (int v : {2, 3, 4}) {
        if (p >= 2 && m % p == 0) all.push_back({Schedule::kInterleaved, p, v, m});
      }
    }
  }
  return all;
}

TEST(PipelineTest, EveryMicroBatchPassesEachChunkOnceForwardThenBackward) {
  for (const Case& c : cases()) {
    for (int s = 0; s < c.stages; ++s) {
      const auto actions = pipelineSchedule(c.schedule, c.stages, s, c.chunks, c.micros);
      ASSERT_EQ(actions.size(), 2u * c.micros * c.chunks);
      std::set<std::pair<int, int>> forwarded, backwarded;
      for (const auto& a : actions) {
        ASSERT_TRUE(a.micro >= 0 && a.micro < c.micros && a.chunk >= 0 && a.chunk < c.chunks);
        if (a.forward) {
          EXPECT_TRUE(forwarded.insert({a.micro, a.chunk}).second);
        } else {
          EXPECT_TRUE(forwarded.count({a.micro, a.chunk})) << "backward before forward";
          EXPECT_TRUE(backwarded.insert({a.micro, a.chunk}).second);
        }
      }
      EXPECT_EQ(backwarded.size(), static_cast<size_t>(c.micros * c.chunks));
    }
  }
}

TEST(PipelineTest, SchedulesCompleteAndMatchThePublishedBubbleAndMemory) {
  for (const Case& c : cases()) {
    const auto sim = simulateSchedule(c.schedule, c.stages, c.chunks, c.micros);
    const std::string name = fmt::format("{} p={} v={} m={}", scheduleName(c.schedule), c.stages, c.chunks, c.micros);
    ASSERT_TRUE(sim.completes) << name;
    // Forward 1, backward 2: a step is the micro-batches' work plus the bubble.
    const double formula = bubbleShare(c.stages, c.chunks, c.micros);
    if (c.schedule != Schedule::kInterleaved) {
      EXPECT_NEAR(sim.idleShare(), formula, 1e-12) << name;
      EXPECT_NEAR(sim.makespan, (c.micros + c.stages - 1) * 3.0, 1e-12) << name;
    } else {
      // The interleaved schedule reaches the published bubble when every stage has micro-batches
      // to fill it; it never does worse than plain 1F1B.
      EXPECT_LE(sim.idleShare(), bubbleShare(c.stages, 1, c.micros) + 1e-12) << name;
      EXPECT_GE(sim.idleShare(), formula - 1e-12) << name;
      if (c.micros >= 2 * c.stages) {
        EXPECT_NEAR(sim.idleShare(), formula, 1e-12) << name;
      }
    }
    for (int s = 0; s < c.stages; ++s) {
      // GPipe holds every micro-batch; 1F1B at most stages - s of them (Narayanan et al. 2021);
      // interleaved its warm-up's chunk passes, 2 (stages - s - 1) + (chunks - 1) stages, plus one
      // (all of them when the micro-batches just fill the stages).
      const int all = c.micros * c.chunks;
      const int interleaved =
          c.micros == c.stages ? all : std::min(all, 2 * (c.stages - s - 1) + (c.chunks - 1) * c.stages + 1);
      const int expected = c.schedule == Schedule::kGpipe      ? c.micros
                           : c.schedule == Schedule::kOneFOneB ? std::min(c.stages - s, c.micros)
                                                               : interleaved;
      EXPECT_EQ(sim.peakInFlight[s], expected) << name << " stage " << s;
    }
  }
}

TEST(PipelineTest, SchedulesThatCannotRunAreRefusedNamingWhy) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { pipelineSchedule(Schedule::kInterleaved, 4, 0, 2, 6); }).find("multiple of the 4 stages"),
            std::string::npos);
  EXPECT_NE(message([] { pipelineSchedule(Schedule::kOneFOneB, 2, 0, 2, 4); }).find("virtual stages"),
            std::string::npos);
  EXPECT_NE(message([] { pipelineSchedule(Schedule::kGpipe, 2, 2, 1, 4); }).find("stage 2"), std::string::npos);
  EXPECT_NE(message([] { parseSchedule("zigzag"); }).find("zigzag"), std::string::npos);
  EXPECT_EQ(parseSchedule("1f1b"), Schedule::kOneFOneB);
}

TEST(PipelineTest, BlocksAreCutByCostWithTheHeadOnTheLastStage) {
  GptConfig c{8, 4, 64, 32, 256};  // layers, heads, width, context, vocab
  // A light head: blocks spread evenly.
  auto even = balanceLayers(c, 4, 32, 4);
  ASSERT_EQ(even.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(even[i], (LayerSpan{2 * i, 2 * i + 2}));
  // A head as costly as about 4 blocks (vocab 4 x 12 x width): the last stage takes fewer.
  c.vocab = 3072;
  auto heavy = balanceLayers(c, 4, 32, 2);
  EXPECT_EQ(heavy[0].begin, 0);
  EXPECT_EQ(heavy[1].end, 8);
  EXPECT_EQ(heavy[0].end, heavy[1].begin);
  EXPECT_LT(heavy[1].layers(), heavy[0].layers());
  EXPECT_THROW(balanceLayers(c, 4, 32, 9), Error);
  const auto parts = balanceLayers(c, 4, 32, 8);
  EXPECT_EQ(stageSpans(parts, 4, 1), (std::vector<LayerSpan>{parts[1], parts[5]}));
}

// An MoE block is costed by the experts a token goes through: with the last of 4 blocks a mixture
// of 8 SwiGLU experts 16 x width wide (top-2: about 8 dense blocks' work), two stages take the
// three dense blocks and the MoE block apart, where equal costs would cut 2 + 2.
TEST(PipelineTest, MoeBlocksAreCutByTheirActiveExperts) {
  GptConfig c{4, 4, 64, 32, 37};
  EXPECT_EQ(balanceLayers(c, 4, 32, 2), (std::vector<LayerSpan>{{0, 2}, {2, 4}}));
  c.moe.experts = 8, c.moe.topK = 2, c.moe.hidden = 16 * 64, c.moe.swiglu = true, c.moeEvery = 4;
  EXPECT_EQ(balanceLayers(c, 4, 32, 2), (std::vector<LayerSpan>{{0, 3}, {3, 4}}));
}

GptConfig small() { return GptConfig{4, 2, 16, 8, 37}; }

TEST(PipelineTest, StageLayoutsCountEachElementOfTheWholeOnce) {
  const GptConfig c = small();
  const ParamLayout whole(c);
  for (int tp : {1, 2}) {
    // Stages [0,1) [1,3) [3,4), and virtual stages: rank 0 with [0,1) and [2,3), rank 1 with the rest.
    for (const auto& stages : std::vector<std::vector<std::vector<LayerSpan>>>{{{{0, 1}}, {{1, 3}}, {{3, 4}}},
                                                                               {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}}}) {
      std::vector<int> counts(whole.globalTotal(), 0);
      for (const auto& spans : stages) {
        for (int t = 0; t < tp; ++t) {
          const ParamLayout layout(c, tp, t, spans);
          EXPECT_EQ(layout.globalTotal(), whole.globalTotal());
          const bool first = spans.front().begin == 0, last = spans.back().end == c.layers;
          EXPECT_EQ(layout.embeddingUnit() >= 0, first);
          EXPECT_EQ(layout.finalNormUnit() >= 0, last);
          EXPECT_EQ(layout.headUnit() >= 0, last);
          if (last && !first) {
            const ParamTensor& head = layout.tensor("lm_head.weight");
            EXPECT_FALSE(head.counted);
            EXPECT_EQ(head.globalOffset, 0u);
            EXPECT_EQ(head.unit, layout.headUnit());
          }
          // Marks: a whole array of index + 1 through fromGlobal, then back through toGlobal.
          std::vector<float> marks(whole.globalTotal()), local(layout.total()), back(whole.globalTotal(), 0.0f);
          for (size_t i = 0; i < marks.size(); ++i) marks[i] = static_cast<float>(i + 1);
          layout.fromGlobal(marks.data(), local.data());
          layout.toGlobal(local.data(), back.data(), true);
          for (size_t i = 0; i < back.size(); ++i) {
            if (back[i] != 0.0f) {
              ASSERT_EQ(back[i], marks[i]);
              ++counts[i];
            }
          }
        }
      }
      for (size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], 1) << "element " << i << " tp " << tp;
    }
  }
  EXPECT_THROW(ParamLayout(c, 1, 0, {{1, 1}}), Error);          // no block
  EXPECT_THROW(ParamLayout(c, 1, 0, {{0, 2}, {1, 3}}), Error);  // overlap
  EXPECT_THROW(ParamLayout(c, 1, 0, {{2, 5}}), Error);          // past the last block
}

// Chunk by chunk on one process: the loss and every gradient equal the whole model's, the two
// copies of the tied embedding's gradient summing to the whole's.
TEST(PipelineTest, ChunksHandingOnActivationsComputeTheWholeModel) {
  const GptConfig c = small();
  const int B = 2, T = 8;
  std::vector<int> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = (7 * i + 3) % c.vocab;
    targets[i] = (5 * i + 1) % c.vocab;
  }
  Gpt whole(c, B, T);
  std::vector<float> params(whole.layout().total()), grads(params.size(), 0.0f);
  whole.layout().initialize(11, params.data(), 0, params.size());
  FlatAccess wholeAccess(whole.layout(), params.data(), grads.data());
  const float wholeLoss = whole.forward(tokens.data(), targets.data(), wholeAccess);
  whole.backward(wholeAccess, 0.5f);

  // Two stages, the first with two chunks: [0,1) and [2,3) | [1,2) and [3,4); a micro-batch visits
  // rank 0, 1, 0, 1.
  const std::vector<std::vector<LayerSpan>> ranks = {{{0, 1}, {2, 3}}, {{1, 2}, {3, 4}}};
  std::vector<std::unique_ptr<Gpt>> stage;
  std::vector<std::vector<float>> p(2), g(2);
  std::vector<std::unique_ptr<FlatAccess>> access;
  for (int r = 0; r < 2; ++r) {
    stage.push_back(std::make_unique<Gpt>(c, B, T, TensorParallel{}, ranks[r]));
    const ParamLayout& layout = stage[r]->layout();
    p[r].resize(layout.total());
    g[r].assign(layout.total(), 0.0f);
    layout.initialize(11, p[r].data(), 0, p[r].size());
    access.push_back(std::make_unique<FlatAccess>(layout, p[r].data(), g[r].data()));
  }
  std::vector<float> carry;
  float loss = 0.0f;
  for (int v = 0; v < 4; ++v) {
    const int r = v % 2, chunk = v / 2;
    loss = stage[r]->forwardChunk(chunk, 0, tokens.data(), carry.data(), targets.data(), *access[r]);
    if (v < 3) {
      const auto out = stage[r]->chunkOutput(chunk, 0);
      carry.assign(out.begin(), out.end());
    }
  }
  EXPECT_FLOAT_EQ(loss, wholeLoss);
  for (int v = 3; v >= 0; --v) {
    const int r = v % 2, chunk = v / 2;
    stage[r]->backwardChunk(chunk, 0, carry.data(), *access[r], 0.5f);
    if (v > 0) {
      const auto in = stage[r]->inputGradient();
      carry.assign(in.begin(), in.end());
    }
  }
  // Gradients in the whole layout: the counted tensors of each stage, plus the head copy's onto wte.
  std::vector<float> got(whole.layout().globalTotal(), 0.0f);
  for (int r = 0; r < 2; ++r) stage[r]->layout().toGlobal(g[r].data(), got.data(), true);
  const ParamTensor& head = stage[1]->layout().tensor("lm_head.weight");
  for (size_t i = 0; i < head.count; ++i) got[i] += g[1][head.offset + i];
  float largest = 0.0f;
  for (float x : grads) largest = std::max(largest, std::fabs(x));
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_NEAR(got[i], grads[i], 1e-5f * largest) << "element " << i;
  EXPECT_GT(largest, 0.0f);
  EXPECT_EQ(stage[0]->slots(0), 1);
  EXPECT_THROW(stage[1]->forward(tokens.data(), targets.data(), *access[1]), Error);  // not the whole model
}

}  // namespace
}  // namespace chorus::training
