// tuner_test.cc: the tuner's cost model and choice: predictions grow with size, latency-bound
// sizes pick log-depth algorithms and bandwidth-bound sizes bandwidth-optimal ones, every choice
// applies to its collective, and tuning files are read or rejected with the line named.
#include "src/collectives/tuner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace chorus::collectives
