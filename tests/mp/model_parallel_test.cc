// model_parallel_test.cc: the device mesh's groups on real ranks, and tensor parallelism against
// the whole model: each tp rank's shard must give the whole model's loss, and its gradients the
// whole model's gradients at the same elements; context parallelism (ring attention) likewise; and
// expert parallelism against one rank holding every expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "src/training/gpt.h"
#include "src/training/mesh.h"
#include "src/training/moe.h"
#include "tests/support/multiprocess.h"

namespace chorus::training {
namespace {

using chorus::testing::runProcesses;

void expectAllZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(MeshTest, CoordinatesAndGroupsFollowTheOrderTpCpDpPp) {
  const MeshShape shape{2, 2, 2, 1};  // dp, tp, pp, cp
  for (int r = 0; r < shape.size(); ++r) EXPECT_EQ(rankOf(coordsOf(r, shape), shape), r);
  EXPECT_EQ(coordsOf(5, shape), (MeshCoords{0, 1, 1, 0}));  // 5 = (pp 1 * dp 2 + dp 0) * 2 + tp 1
  EXPECT_EQ(groupOf(5, shape, "tp"), (std::vector<int>{4, 5}));
  EXPECT_EQ(groupOf(5, shape, "dp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(groupOf(5, shape, "pp"), (std::vector<int>{1, 5}));
  const MeshShape withCp{2, 1, 1, 2};
  EXPECT_EQ(groupOf(3, withCp, "cp"), (std::vector<int>{2, 3}));
  EXPECT_EQ(groupOf(3, withCp, "dpcp"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_THROW(groupOf(0, shape, "zp"), Error);
  // Expert parallelism carved from dp 4 (ep 2; tp 2): dp ranks 0,1 and 2,3 each hold all the
  // experts between them; dp ranks 0 and 2 (and 1 and 3) hold the same ones.
  const MeshShape withEp{4, 2, 1, 1, 2};
  EXPECT_EQ(withEp.describe(), "dp4 tp2 pp1 cp1 ep2");
  EXPECT_EQ(groupOf(5, withEp, "ep"), (std::vector<int>{5, 7}));  // rank 5: dp 2, tp 1
  EXPECT_EQ(groupOf(5, withEp, "edpcp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(groupOf(7, withEp, "edpcp"), (std::vector<int>{3, 7}));
  // With cp 2, the expert-data-parallel group takes every cp rank of its dp ranks.
  const MeshShape epCp{2, 1, 1, 2, 2};
  EXPECT_EQ(groupOf(0, epCp, "ep"), (std::vector<int>{0, 2}));
  EXPECT_EQ(groupOf(0, epCp, "edpcp"), (std::vector<int>{0, 1}));
  EXPECT_EQ(groupOf(3, epCp, "edpcp"), (std::vector<int>{2, 3}));
}

TEST(MeshTest, EachRanksGroupCommunicatorsHoldTheRanksOfItsGroup) {
  for (const MeshShape shape :
       {MeshShape{2, 2, 2, 1}, MeshShape{1, 2, 2, 2}, MeshShape{2, 1, 4, 1}, MeshShape{4, 1, 1, 2, 2}}) {
    expectAllZero(runProcesses(
        8,
        [&](int rank, const chorusUniqueId& id) {
          Communicator world(UniqueId(id), 8, rank);
          DeviceMesh mesh(world, shape);
          EXPECT_EQ(mesh.coords(), coordsOf(rank, shape));
          if (shape.cp > 1) {
            EXPECT_NE(mesh.group("dpcp"), mesh.group("cp")) << "data and context parallel share a communicator";
          }
          for (const char* kind : {"dp", "tp", "pp", "cp", "dpcp", "ep", "edpcp"}) {
            const std::vector<int> members = groupOf(rank, shape, kind);
            Communicator* group = mesh.group(kind);
            if (members.size() == 1 || (shape.ep == 1 && (std::string(kind) == "ep" || std::string(kind) == "edpcp"))) {
              EXPECT_EQ(group, nullptr) << kind;
              continue;
            }
            ASSERT_NE(group, nullptr) << kind;
            EXPECT_EQ(group->size(), static_cast<int>(members.size())) << kind;
            // Gathering the world ranks in group order gives the members.
            std::vector<int32_t> mine = {rank}, all(members.size(), -1);
            group->allGather(std::span<const int32_t>(mine), std::span<int32_t>(all));
            for (size_t i = 0; i < members.size(); ++i) {
              EXPECT_EQ(all[i], members[i]) << kind << " member " << i << " in " << shape.describe();
            }
          }
        },
        120));
  }
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        Communicator world(UniqueId(id), 2, rank);
        try {
          DeviceMesh mesh(world, MeshShape{2, 2, 1, 1});
          ADD_FAILURE() << "a mesh of 4 was made over 2 ranks";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("is not the world's 2 ranks"), std::string::npos) << e.what();
        }
      },
      60));
}

// On one batch, the loss and gradients of the whole model and of its shards on tp x cp ranks, with
// or without sequence parallelism: equal within rounding. A cp rank holds some positions of each
// sequence; its loss is the mean over them, so the whole loss is the mean over the cp ranks and the
// whole gradient their mean too.
// The MoE variant: block 1's MLP is a mixture of 4 SwiGLU experts, top-2, whose aux loss is a mean
// over the whole micro-batch (the tp ranks' rows with sequence parallelism; a cp rank's positions
// alone, so it is left out with cp > 1, where it is not the whole's).
GptConfig moeVariant(GptConfig config, int cp) {
  config.moe.experts = 4;
  config.moe.topK = 2;
  config.moe.hidden = 40;
  config.moe.swiglu = true;
  config.moe.auxCoef = cp > 1 ? 0.0f : 0.05f;
  config.moe.zCoef = 0.01f;
  config.moeEvery = 2;
  return config;
}

void expectShardsGiveTheWhole(int tp, bool sequenceParallel, int cp = 1, Recompute recompute = Recompute::kNone,
                              bool moe = false) {
  // 37 tokens do not divide over 2 or 4 ranks: the vocabulary shards are uneven.
  const GptConfig config = moe ? moeVariant(GptConfig{2, 4, 32, 16, 37}, cp) : GptConfig{2, 4, 32, 16, 37};
  const int B = 2, T = cp == 1 ? 12 : 16;
  std::mt19937 random(5);
  std::vector<int> tokens(B * T), targets(B * T);
  for (auto* v : {&tokens, &targets}) {
    for (int& x : *v) x = static_cast<int>(random() % config.vocab);
  }
  const std::string what = "tp " + std::to_string(tp) + " cp " + std::to_string(cp) + (moe ? " MoE" : "") +
                           (sequenceParallel ? " with sequence parallelism" : "") +
                           (recompute == Recompute::kFull ? " with full recompute" : "");
  const int ranks = tp * cp;
  expectAllZero(runProcesses(
      ranks,
      [&](int rank, const chorusUniqueId& id) {
        Communicator world(UniqueId(id), ranks, rank);
        DeviceMesh mesh(world, MeshShape{1, tp, 1, cp});
        Communicator* cpComm = mesh.group("cp");
        Gpt whole(config, B, T);
        std::vector<float> wp(whole.layout().total()), wg(wp.size());
        whole.layout().initialize(11, wp.data(), 0, wp.size());
        FlatAccess wholeAccess(whole.layout(), wp.data(), wg.data());
        const float wholeLoss = whole.forward(tokens.data(), targets.data(), wholeAccess);
        whole.backward(wholeAccess);

        Gpt shard(config, B, T, TensorParallel{mesh.group("tp"), sequenceParallel}, {}, recompute,
                  ContextParallel{cpComm});
        const ParamLayout& layout = shard.layout();
        EXPECT_EQ(layout.globalTotal(), whole.layout().total());
        if (tp > 1) {
          EXPECT_LT(layout.total(), layout.globalTotal());
        }
        if (sequenceParallel || cp > 1) {
          EXPECT_LT(shard.activationBytes(), whole.activationBytes());
        }
        // This rank's columns of the batch.
        const auto positions = shard.positions();
        ASSERT_EQ(shard.seq(), T / cp);
        std::vector<int> myTokens(B * shard.seq()), myTargets(myTokens.size());
        for (int b = 0; b < B; ++b) {
          for (int t = 0; t < shard.seq(); ++t) {
            myTokens[b * shard.seq() + t] = tokens[b * T + positions[t]];
            myTargets[b * shard.seq() + t] = targets[b * T + positions[t]];
          }
        }
        std::vector<float> p(layout.total()), g(p.size());
        layout.initialize(11, p.data(), 0, p.size());
        // The shard's initial values are the whole's at the same elements.
        std::vector<float> placed(layout.globalTotal(), NAN);
        layout.toGlobal(p.data(), placed.data(), false);
        for (const auto& run : layout.runs()) {
          for (size_t i = 0; i < run.count; ++i) ASSERT_EQ(placed[run.global + i], wp[run.global + i]);
        }
        FlatAccess access(layout, p.data(), g.data());
        // Twice, as two micro-batches accumulate: the second adds to the gradients of the first.
        for (int pass = 1; pass <= 2; ++pass) {
          std::vector<float> loss = {shard.forward(myTokens.data(), myTargets.data(), access)};
          if (cpComm) cpComm->allReduce(std::span<float>(loss));
          EXPECT_NEAR(loss[0] / cp, wholeLoss, 1e-5 * std::abs(wholeLoss)) << what << " rank " << rank;
          shard.backward(access, 0.5f);
        }
        if (cpComm) {
          cpComm->allReduce(std::span<float>(g));
          for (float& x : g) x /= static_cast<float>(cp);
        }
        std::vector<float> gradPlaced(layout.globalTotal(), NAN);
        layout.toGlobal(g.data(), gradPlaced.data(), false);
        float largest = 0.0f;
        for (float x : wg) largest = std::max(largest, std::abs(x));
        for (const auto& run : layout.runs()) {
          for (size_t i = 0; i < run.count; ++i) {
            const size_t at = run.global + i;
            ASSERT_NEAR(gradPlaced[at], wg[at], 1e-5f * largest)
                << what << " rank " << rank << ": gradient of " << layout.tensors()[run.tensor].name
                << " at whole element " << at;
          }
        }
      },
      120));
}

TEST(TensorParallelTest, ShardsGiveTheWholeModelsLossAndGradients) {
  expectShardsGiveTheWhole(2, false);
  expectShardsGiveTheWhole(4, false);
}

TEST(TensorParallelTest, SequenceParallelShardsGiveTheWholeModelsLossAndGradients) {
  expectShardsGiveTheWhole(2, true);
  expectShardsGiveTheWhole(4, true);
}

// Ring attention with causal load balancing, alone, with tensor and sequence parallelism, and with
// full recompute (which reruns the ring in backward).
TEST(ContextParallelTest, RingAttentionGivesTheWholeModelsLossAndGradients) {
  expectShardsGiveTheWhole(1, false, 2);
  expectShardsGiveTheWhole(1, false, 4);
  expectShardsGiveTheWhole(2, true, 2);
  expectShardsGiveTheWhole(1, false, 2, Recompute::kFull);
}

// The balanced cut: rank r holds chunks r and 2 cp - 1 - r, so each rank's positions sum to the
// same (equal causal attention work), and together they are every position once.
TEST(TensorParallelTest, MoeBlocksGiveTheWholeModelsLossAndGradients) {
  expectShardsGiveTheWhole(2, false, 1, Recompute::kNone, true);
  expectShardsGiveTheWhole(2, true, 1, Recompute::kNone, true);
  expectShardsGiveTheWhole(1, false, 2, Recompute::kNone, true);
  expectShardsGiveTheWhole(2, true, 2, Recompute::kFull, true);
}

// Expert parallelism in the model: ep ranks, each with its own batch, the experts of each MoE block
// split over them. Against the whole model run on each rank's batch in turn: each rank's loss and
// dense gradients are those of its batch, each expert's gradients the sum over every batch.
void expectExpertParallelModelGivesTheWhole(int ep) {
  const GptConfig config = moeVariant(GptConfig{2, 4, 32, 16, 37}, 1);
  const int B = 2, T = 8;
  auto batchOf = [&](int r, std::vector<int>& tokens, std::vector<int>& targets) {
    std::mt19937 random(40 + r);
    tokens.resize(B * T);
    targets.resize(B * T);
    for (int& x : tokens) x = static_cast<int>(random() % config.vocab);
    for (int& x : targets) x = static_cast<int>(random() % config.vocab);
  };
  expectAllZero(runProcesses(
      ep,
      [&](int rank, const chorusUniqueId& id) {
        Communicator world(UniqueId(id), ep, rank);
        Gpt whole(config, B, T);
        std::vector<float> wp(whole.layout().total()), sum(wp.size(), 0.0f), own;
        whole.layout().initialize(11, wp.data(), 0, wp.size());
        float ownLoss = 0;
        for (int r = 0; r < ep; ++r) {
          std::vector<int> tokens, targets;
          batchOf(r, tokens, targets);
          std::vector<float> wg(wp.size(), 0.0f);
          FlatAccess access(whole.layout(), wp.data(), wg.data());
          const float loss = whole.forward(tokens.data(), targets.data(), access);
          whole.backward(access);
          for (size_t i = 0; i < wg.size(); ++i) sum[i] += wg[i];
          if (r == rank) {
            own = wg;
            ownLoss = loss;
          }
        }
        Gpt shard(config, B, T, {}, {}, Recompute::kNone, {}, ExpertParallel{&world});
        const ParamLayout& layout = shard.layout();
        EXPECT_LT(layout.total(), whole.layout().total());
        std::vector<float> p(layout.total()), g(p.size(), 0.0f);
        layout.initialize(11, p.data(), 0, p.size());
        std::vector<int> tokens, targets;
        batchOf(rank, tokens, targets);
        FlatAccess access(layout, p.data(), g.data());
        EXPECT_NEAR(shard.forward(tokens.data(), targets.data(), access), ownLoss, 1e-5 * ownLoss) << "rank " << rank;
        shard.backward(access);
        std::vector<float> placed(layout.globalTotal(), NAN);
        layout.toGlobal(g.data(), placed.data(), false);
        float largest = 0.0f;
        for (float x : sum) largest = std::max(largest, std::abs(x));
        int experts = 0;
        for (const auto& run : layout.runs()) {
          const ParamTensor& t = layout.tensors()[run.tensor];
          const std::vector<float>& want = t.expert >= 0 ? sum : own;
          experts += t.expert >= 0;
          for (size_t i = 0; i < run.count; ++i) {
            ASSERT_NEAR(placed[run.global + i], want[run.global + i], 1e-5f * largest)
                << "ep " << ep << " rank " << rank << ": gradient of " << t.name;
          }
        }
        EXPECT_EQ(experts, 4 * 4 / ep);  // 4 tensors of each of its experts
      },
      120));
}

TEST(ExpertParallelTest, TheModelsExpertsShardedGiveTheWholeModelsLossAndGradients) {
  expectExpertParallelModelGivesTheWhole(2);
  expectExpertParallelModelGivesTheWhole(4);
}

TEST(ContextParallelTest, EachRankHoldsTwoChunksOfEqualWork) {
  const int seq = 24;
  for (int cp : {1, 2, 3, 4}) {
    std::vector<int> seen(seq, 0);
    long work = -1;
    for (int r = 0; r < cp; ++r) {
      const auto positions = contextPositions(seq, cp, r);
      ASSERT_EQ(positions.size(), static_cast<size_t>(seq / cp));
      long mine = 0;
      for (int p : positions) {
        ++seen[p];
        mine += p + 1;  // the keys position p attends
      }
      if (work >= 0) {
        EXPECT_EQ(mine, work) << "cp " << cp << " rank " << r;
      }
      work = mine;
    }
    for (int p = 0; p < seq; ++p) EXPECT_EQ(seen[p], 1) << "position " << p << " with cp " << cp;
  }
  EXPECT_EQ(contextPositions(8, 2, 1), (std::vector<int>{2, 3, 4, 5}));
  try {
    contextPositions(10, 3, 0);
    FAIL() << "10 positions were cut into 6 chunks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("10 positions cannot be cut into 2 x 3"), std::string::npos) << e.what();
  }
}

// Expert parallelism: ep ranks, each with its own tokens (a different number on each), the
// experts split over them. Against one rank holding every expert and running each rank's tokens
// in turn: each rank's output, input gradient and router gradient are those of its tokens alone,
// and each expert's gradient is the sum over every rank's tokens. With chunks > 1 the exchanges
// run in pieces on a communication thread (rank 0's 5 tokens in 6 chunks: one is empty).
void expectExpertShardsGiveTheWhole(int ep, const MoeConfig& base) {
  MoeConfig config = base;
  const int C = 6;
  expectAllZero(runProcesses(
      ep,
      [&](int rank, const chorusUniqueId& id) {
        Communicator world(UniqueId(id), ep, rank);
        MoeMlp whole(config, C);
        std::optional<CommWorker> worker;
        if (config.chunks > 1) worker.emplace(world);
        MoeMlp shard(config, C, ExpertParallel{&world, worker ? &*worker : nullptr});
        ASSERT_EQ(shard.localExperts(), config.experts / ep);
        std::mt19937 random(3);
        std::normal_distribution<float> normal(0.0f, 0.5f);
        std::vector<float> wholeParams(whole.paramFloats());
        for (float& v : wholeParams) v = normal(random);
        // This rank's block: the router, then its experts.
        std::vector<float> params(wholeParams.begin(), wholeParams.begin() + whole.routerFloats());
        const size_t expertFloats = whole.expertFloats();
        const auto mine = wholeParams.begin() +
                          static_cast<std::ptrdiff_t>(whole.routerFloats() + shard.firstExpert() * expertFloats);
        params.insert(params.end(), mine, mine + static_cast<std::ptrdiff_t>(shard.localExperts() * expertFloats));
        ASSERT_EQ(params.size(), shard.paramFloats());

        // Rank r's 5 + 2 r rows of tokens (seed 100 + r) or of output gradients (200 + r).
        auto rowsOf = [&](int seed, int r) {
          std::mt19937 g(seed + r);
          std::vector<float> v(static_cast<size_t>(5 + 2 * r) * C);
          for (float& x : v) x = normal(g);
          return v;
        };
        auto tokensOf = [&](int r) { return rowsOf(100, r); };
        auto doutOf = [&](int r) { return rowsOf(200, r); };
        // The whole layer on every rank's tokens in turn.
        std::vector<float> wholeGrads(whole.paramFloats(), 0.0f), routerGrad, wantOut, wantDx;
        for (int r = 0; r < ep; ++r) {
          const std::vector<float> x = tokensOf(r), dout = doutOf(r);
          const int n = static_cast<int>(x.size()) / C;
          MoeActivations a;
          std::vector<float> out(x.size()), dx(x.size(), 0.0f), grads(whole.paramFloats(), 0.0f);
          const size_t R = whole.routerFloats();
          whole.forward(out.data(), x.data(), n, wholeParams.data(), wholeParams.data() + R, a);
          whole.backward(dx.data(), grads.data(), grads.data() + R, dout.data(), x.data(), wholeParams.data(),
                         wholeParams.data() + R, a, 0.5f);
          for (size_t i = 0; i < grads.size(); ++i) wholeGrads[i] += grads[i];
          if (r == rank) {
            wantOut = out;
            wantDx = dx;
            routerGrad.assign(grads.begin(), grads.begin() + whole.routerFloats());
          }
        }
        // The shard.
        const std::vector<float> x = tokensOf(rank), dout = doutOf(rank);
        const int n = static_cast<int>(x.size()) / C;
        MoeActivations a;
        std::vector<float> out(x.size()), dx(x.size(), 0.0f), grads(shard.paramFloats(), 0.0f);
        const size_t R = shard.routerFloats();
        shard.forward(out.data(), x.data(), n, params.data(), params.data() + R, a);
        shard.backward(dx.data(), grads.data(), grads.data() + R, dout.data(), x.data(), params.data(),
                       params.data() + R, a, 0.5f);
        auto expectNear = [&](const float* got, const float* want, size_t count, const char* what) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << what << " " << i << " rank " << rank;
          }
        };
        expectNear(out.data(), wantOut.data(), out.size(), "output");
        expectNear(dx.data(), wantDx.data(), dx.size(), "input gradient");
        expectNear(grads.data(), routerGrad.data(), routerGrad.size(), "router gradient");
        expectNear(grads.data() + shard.routerFloats(),
                   wholeGrads.data() + whole.routerFloats() + shard.firstExpert() * expertFloats,
                   shard.localExperts() * expertFloats, "expert gradient");
        // Each chunk's experts ran once in forward and once in backward.
        EXPECT_EQ(shard.takeProfile().chunks, 2 * config.chunks);
      },
      120));
}

TEST(ExpertParallelTest, ShardedExpertsGiveTheWholeLayersOutputsAndGradients) {
  MoeConfig config;
  config.experts = 8;
  config.hidden = 10;
  config.zCoef = 0.001f;
  for (const int ep : {2, 4}) {
    for (const double capacity : {0.0, 1.0}) {
      for (const int k : {1, 2}) {
        config.capacityFactor = capacity;
        config.topK = k;
        config.swiglu = k == 2;
        for (const int chunks : {1, 6}) {
          SCOPED_TRACE(::testing::Message()
                       << "ep " << ep << " capacity " << capacity << " top-" << k << " chunks " << chunks);
          config.chunks = chunks;
          expectExpertShardsGiveTheWhole(ep, config);
        }
      }
    }
  }
}

TEST(TensorParallelTest, ALayoutThatCannotBeSplitIsRefused) {
  const GptConfig config{1, 6, 24, 8, 40};
  try {
    ParamLayout layout(config, 4, 0);
    FAIL() << "6 heads were split over 4 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads = 6 cannot be split over tp = 4"), std::string::npos) << e.what();
  }
  expectAllZero(runProcesses(
      4,
      [&](int rank, const chorusUniqueId& id) {
        Communicator comm(UniqueId(id), 4, rank);
        try {
          Gpt model(GptConfig{1, 4, 16, 8, 40}, 1, 6, TensorParallel{&comm, true});
          ADD_FAILURE() << "6 rows were split over 4 ranks";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("1 x 6 = 6 rows of a micro-batch over tp = 4"), std::string::npos)
              << e.what();
        }
      },
      60));
}

}  // namespace
}  // namespace chorus::training
