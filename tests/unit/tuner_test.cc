// tuner_test.cc: the tuner's cost model and choice: predictions grow with size, latency-bound
// sizes pick log-depth algorithms and bandwidth-bound sizes bandwidth-optimal ones, every choice
// applies to its collective, and tuning files are read or rejected with the line named.
#include "src/collectives/tuner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "src/collectives/algorithm.h"

namespace chorus::collectives {
namespace {

constexpr size_t kChunk = 512 * 1024;

TEST(TunerTest, PredictionsGrowWithSize) {
  const CostParams params = defaultCostParams(false);
  for (int c = 0; c < kCollectiveCount; ++c) {
    const auto collective = static_cast<Collective>(c);
    if (collective == Collective::kSend || collective == Collective::kRecv) continue;
    for (Algorithm algorithm : algorithmsFor(collective)) {
      for (int n : {2, 3, 8, 64}) {
        double last = 0;
        for (size_t bytes = 8; bytes <= (size_t{1} << 28); bytes *= 8) {
          const double us = predictUs(collective, algorithm, n, bytes * n, kChunk, params);
          EXPECT_GT(us, 0) << collectiveName(collective) << "/" << algorithmName(algorithm);
          EXPECT_GE(us, last) << collectiveName(collective) << "/" << algorithmName(algorithm) << " n=" << n
                              << " bytes=" << bytes;
          last = us;
        }
      }
    }
  }
}

TEST(TunerTest, DirectIsPickedFromItsFloorWhereItCanRun) {
  // On shm's defaults, one pass over the buffers beats every scheduled all-reduce and
  // reduce-scatter from the floor up (what CHORUS_SHM_DIRECT_BYTES chose before the tuner priced
  // it); below the floor, and where it cannot run (floor 0), never.
  CostParams params = defaultCostParams(false);
  for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter}) {
    for (int n : {2, 3, 4, 8}) {
      for (size_t bytes = 1024; bytes <= (size_t{1} << 30); bytes *= 4) {
        params.directMinBytes = 65536;
        const Algorithm chosen = choose(collective, n, bytes, params).algorithm;
        EXPECT_EQ(chosen == Algorithm::kDirect, bytes >= 65536)
            << collectiveName(collective) << " n=" << n << " bytes=" << bytes << ": " << algorithmName(chosen);
        params.directMinBytes = 0;
        EXPECT_NE(choose(collective, n, bytes, params).algorithm, Algorithm::kDirect);
      }
    }
  }
}

TEST(TunerTest, LatencyBoundSizesPickLogDepthAndLargeSizesBandwidthOptimal) {
  const CostParams params = defaultCostParams(false);
  const Algorithm small = chooseAlgorithm(Collective::kAllReduce, 64, 64, kChunk, params);
  EXPECT_TRUE(small == Algorithm::kRecursiveDoubling || small == Algorithm::kRabenseifner || small == Algorithm::kTree)
      << algorithmName(small);
  const Algorithm large = chooseAlgorithm(Collective::kAllReduce, 8, size_t{256} << 20, kChunk, params);
  EXPECT_NE(large, Algorithm::kRecursiveDoubling) << "a full-buffer exchange per round is not bandwidth-optimal";
  EXPECT_NE(chooseAlgorithm(Collective::kAllGather, 64, 64 * 8, kChunk, params), Algorithm::kRing);
  EXPECT_EQ(chooseAlgorithm(Collective::kAllToAll, 8, size_t{64} << 20, kChunk, params), Algorithm::kPairwise);
  EXPECT_EQ(chooseAlgorithm(Collective::kAllToAll, 256, 256 * 8, kChunk, params), Algorithm::kBruck);
}

TEST(TunerTest, HierarchicalAlgorithmsAreWeighedOnlyAcrossHostsOfEqualSize) {
  const CostParams oneHost = defaultCostParams(true);
  CostParams twoHosts = oneHost;
  twoHosts.hosts = 2;
  const CostParams shm = defaultCostParams(false);
  twoHosts.localAlphaUs = shm.alphaUs;
  twoHosts.localBetaUsPerByte = shm.betaUsPerByte;
  CostParams threeHosts = twoHosts;
  threeHosts.hosts = 3;
  // Each hierarchical algorithm against the flat one it splits in two levels.
  const std::pair<Collective, Algorithm> flat[] = {{Collective::kAllReduce, Algorithm::kRing},
                                                   {Collective::kAllGather, Algorithm::kRing},
                                                   {Collective::kReduceScatter, Algorithm::kRing},
                                                   {Collective::kBroadcast, Algorithm::kChain},
                                                   {Collective::kReduce, Algorithm::kChain}};
  for (const auto& [collective, flatAlgorithm] : flat) {
    SCOPED_TRACE(collectiveName(collective));
    for (size_t bytes : {size_t{8}, size_t{1} << 16, size_t{1} << 20, size_t{64} << 20}) {
      EXPECT_TRUE(std::isinf(predictUs(collective, Algorithm::kHierarchical, 4, bytes, kChunk, oneHost)));
      EXPECT_TRUE(std::isinf(predictUs(collective, Algorithm::kHierarchical, 4, bytes, kChunk, threeHosts)));
      EXPECT_NE(choose(collective, 4, bytes, oneHost, 0).algorithm, Algorithm::kHierarchical);
    }
    // Across 2 hosts of 4 ranks a large buffer crosses the network less often (all-reduce: a
    // host's link carries 2(H-1)/H = 1 buffer instead of the flat ring's 1.75) or over fewer
    // network hops (broadcast, reduce: 1 instead of 7), the rest at shared-memory prices. (The
    // chains' hops add latency, not bandwidth: at 64 MiB the flat chain's pace, one network
    // message per chunk, beats the rail member's, a chunk on both levels through its one port.)
    const bool chains = collective == Collective::kBroadcast || collective == Collective::kReduce;
    const size_t large = chains ? size_t{1} << 20 : size_t{64} << 20;
    EXPECT_LT(predictUs(collective, Algorithm::kHierarchical, 8, large, kChunk, twoHosts),
              predictUs(collective, flatAlgorithm, 8, large, kChunk, twoHosts));
  }
  EXPECT_EQ(choose(Collective::kAllReduce, 8, size_t{64} << 20, twoHosts, 0).algorithm, Algorithm::kHierarchical);
}

TEST(TunerTest, EveryChoiceAppliesToItsCollective) {
  for (bool network : {false, true}) {
    const CostParams params = defaultCostParams(network);
    for (int c = 0; c < kCollectiveCount; ++c) {
      const auto collective = static_cast<Collective>(c);
      for (int n : {1, 2, 5, 1024}) {
        for (size_t bytes : {size_t{0}, size_t{8}, size_t{1} << 20, size_t{1} << 30}) {
          EXPECT_TRUE(appliesTo(chooseAlgorithm(collective, n, bytes, kChunk, params), collective));
        }
      }
    }
  }
}

TEST(TunerTest, ChunkIsTheBestCandidateAndAFixedChunkIsKept) {
  const CostParams params = defaultCostParams(false);
  // A pipelined broadcast of 64 MiB down a chain of 8: more chunks fill the pipe sooner, at one
  // alpha each, so the best chunk is neither the smallest nor the largest candidate.
  const size_t bytes = size_t{64} << 20;
  const size_t chunk = chooseChunkBytes(Collective::kBroadcast, Algorithm::kChain, 8, bytes, params);
  EXPECT_GT(chunk, kMinChunkBytes);
  EXPECT_LT(chunk, kMaxChunkBytes);
  const double best = predictUs(Collective::kBroadcast, Algorithm::kChain, 8, bytes, chunk, params);
  for (size_t c = kMinChunkBytes; c <= kMaxChunkBytes; c *= 2) {
    EXPECT_LE(best, predictUs(Collective::kBroadcast, Algorithm::kChain, 8, bytes, c, params)) << c;
  }
  // Where the chunk does not matter (a binomial tree of a small message), the largest is taken.
  EXPECT_EQ(chooseChunkBytes(Collective::kBroadcast, Algorithm::kBinomial, 8, 1024, params), kMaxChunkBytes);
  const TunerChoice free = choose(Collective::kBroadcast, 8, bytes, params);
  EXPECT_TRUE(appliesTo(free.algorithm, Collective::kBroadcast));
  EXPECT_DOUBLE_EQ(free.predictedUs,
                   predictUs(Collective::kBroadcast, free.algorithm, 8, bytes, free.chunkBytes, params));
  const TunerChoice fixed = choose(Collective::kBroadcast, 8, bytes, params, 12345);
  EXPECT_EQ(fixed.chunkBytes, 12345u);
  EXPECT_GE(fixed.predictedUs, free.predictedUs);
}

TEST(TunerTest, TuningFilesAreReadAndBadLinesNamed) {
  char path[] = "/tmp/chorus-tuning-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    out << "# measured on a test machine\nshm alpha_us=3 beta_GBps=8\ntcp alpha_us=40 gamma_GBps=2 copy_GBps=20\n";
  }
  const CostParams shm = loadCostParams(path, false, defaultCostParams(false));
  EXPECT_DOUBLE_EQ(shm.alphaUs, 3);
  EXPECT_DOUBLE_EQ(shm.betaUsPerByte, 1e-3 / 8);
  EXPECT_DOUBLE_EQ(shm.gammaUsPerByte, defaultCostParams(false).gammaUsPerByte);  // not given: kept
  const CostParams tcp = loadCostParams(path, true, defaultCostParams(true));
  EXPECT_DOUBLE_EQ(tcp.alphaUs, 40);
  EXPECT_DOUBLE_EQ(tcp.copyUsPerByte, 1e-3 / 20);
  {
    std::ofstream out(path);
    out << "shm alpha_us=3\nshm speed=fast\n";
  }
  try {
    loadCostParams(path, false, CostParams{});
    ADD_FAILURE() << "a bad key was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(":2:"), std::string::npos) << e.what();
  }
  std::remove(path);
  EXPECT_THROW(loadCostParams("/nonexistent/tuning", false, CostParams{}), std::invalid_argument);
}

TEST(TunerTest, CorrectionsInterpolateOnLogScalesAndApplyAtTheirRankCountOnly) {
  Correction c;
  c.nranks = 4;
  c.bytes = {1024, 65536};
  c.factors = {2, 0.5};
  EXPECT_DOUBLE_EQ(c.at(4, 8), 2);  // below the first size: the first factor
  EXPECT_DOUBLE_EQ(c.at(4, 1024), 2);
  EXPECT_NEAR(c.at(4, 8192), 1, 1e-12);                     // half way in log size: the geometric mean
  EXPECT_NEAR(c.at(4, 2048), std::pow(2, 4.0 / 6), 1e-12);  // log2 factor 1 - 2*(1/6)
  EXPECT_DOUBLE_EQ(c.at(4, 65536), 0.5);
  EXPECT_DOUBLE_EQ(c.at(4, 1e9), 0.5);  // beyond the last: the last
  EXPECT_DOUBLE_EQ(c.at(8, 8192), 1);   // another rank count: none
  EXPECT_DOUBLE_EQ(Correction{}.at(0, 8192), 1);

  CostParams params = defaultCostParams(false);
  const size_t bytes = size_t{64} << 20;
  const Algorithm plain = chooseAlgorithm(Collective::kAllReduce, 4, bytes, kChunk, params);
  const double formula = formulaUs(Collective::kAllReduce, plain, 4, bytes, kChunk, params);
  EXPECT_DOUBLE_EQ(predictUs(Collective::kAllReduce, plain, 4, bytes, kChunk, params), formula);
  // Measured ten times slower than its formula at 4 ranks: another algorithm is chosen there, and
  // the same choice as before at 8 ranks.
  params.correction(Collective::kAllReduce, plain) = {4, {1024, double(bytes)}, {10, 10}};
  EXPECT_DOUBLE_EQ(predictUs(Collective::kAllReduce, plain, 4, bytes, kChunk, params), 10 * formula);
  EXPECT_NE(chooseAlgorithm(Collective::kAllReduce, 4, bytes, kChunk, params), plain);
  EXPECT_EQ(chooseAlgorithm(Collective::kAllReduce, 8, bytes, kChunk, params),
            chooseAlgorithm(Collective::kAllReduce, 8, bytes, kChunk, defaultCostParams(false)));
}

TEST(TunerTest, CorrectionLinesAreReadAndBadOnesNamed) {
  char path[] = "/tmp/chorus-tuning-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    return loadCostParams(path, false, defaultCostParams(false));
  };
  const CostParams read = load(
      "shm alpha_us=3\n"
      "shm allgather:bruck ranks=4 bytes=128,1024 factors=1.5,0.25\n"
      "shm allreduce:tree ranks=4 bytes=128,1024 factors=2.5e-05,0.0004\n"  // as %g writes tiny factors
      "tcp allgather:ring ranks=4 bytes=128 factors=9\n"
      "shm allgather:bruck ranks=4 bytes=512 factors=0.75  # a later line wins\n");
  const Correction& bruck = read.correction(Collective::kAllGather, Algorithm::kBruck);
  EXPECT_EQ(bruck.nranks, 4);
  EXPECT_EQ(bruck.bytes, std::vector<double>{512});
  EXPECT_EQ(bruck.factors, std::vector<double>{0.75});
  EXPECT_EQ(read.correction(Collective::kAllReduce, Algorithm::kTree).factors, (std::vector<double>{2.5e-5, 4e-4}));
  EXPECT_EQ(read.correction(Collective::kAllGather, Algorithm::kRing).nranks, 0);  // a tcp line
  const std::pair<const char*, const char*> bad[] = {
      {"shm allgather:tree ranks=4 bytes=1 factors=1\n", "allgather:tree"},  // not an all-gather algorithm
      {"shm allreduce:ring ranks=4 bytes=64,8 factors=1,1\n", "ascending"},
      {"shm allreduce:ring ranks=4 bytes=8,64 factors=1\n", "(2 sizes, 1 factors)"},
      {"shm allreduce:ring bytes=8 factors=1\n", "ranks=N"},
      {"shm allreduce:ring ranks=2.5 bytes=8 factors=1\n", "whole number"},
      {"shm allreduce:ring ranks=4 bytes=8 factors=-1\n", "'-1'"},
      {"shm allreduce:ring ranks=4 bytes=8 factors=1 speed=2\n", "unknown key 'speed'"},
  };
  for (const auto& [text, named] : bad) {
    try {
      load(std::string("shm alpha_us=3\n") + text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(":2: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  }
  std::remove(path);
}

}  // namespace
}  // namespace chorus::collectives
