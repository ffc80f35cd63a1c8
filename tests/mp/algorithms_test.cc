// algorithms_test.cc: every algorithm of every collective on real forked ranks over shm and tcp.
// Round k forces, for each collective, its k-th algorithm (chorusCommSetAlgorithms), so four
// rounds cover them all; each round checks every collective at several sizes, types and ops
// against closed-form results.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "src/collectives/algorithm.h"
#include "tests/support/collective_checks.h"
#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using collectives::Collective;
using namespace chorus::testing;

// CHORUS_ALGO text for round k: each collective's k-th algorithm (wrapping around).
std::string roundSpec(size_t k) {
  std::string spec;
  for (int c = 0; c < collectives::kCollectiveCount; ++c) {
    const auto collective = static_cast<Collective>(c);
    if (collective == Collective::kSend || collective == Collective::kRecv) continue;
    const auto& all = collectives::algorithmsFor(collective);
    spec += std::string(spec.empty() ? "" : ",") + collectives::collectiveName(collective) + ":" +
            collectives::algorithmName(all[k % all.size()]);
  }
  return spec;
}

size_t maxAlgorithms() {
  size_t most = 0;
  for (int c = 0; c < collectives::kCollectiveCount; ++c) {
    most = std::max(most, collectives::algorithmsFor(static_cast<Collective>(c)).size());
  }
  return most;
}

class AlgorithmsTest : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(AlgorithmsTest, EveryAlgorithmIsRightOnRealRanks) {
  const TransportRanks param = GetParam();
  RanksOptions options = optionsFor(param);
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int n = param.nranks;
    for (size_t k = 0; k < maxAlgorithms(); ++k) {
      const std::string spec = roundSpec(k);
      ASSERT_EQ(chorusCommSetAlgorithms(comm, spec.c_str()), chorusSuccess) << chorusGetLastError(comm);
      SCOPED_TRACE("algorithms " + spec);
      // Sizes past the 512 KiB chunk, so pipelined algorithms run several pieces.
      checkEveryCollective(comm, rank, n, {0, 1, 7, 1023, 300007}, {chorusInt32, chorusFloat16, chorusFloat64},
                           {chorusSum, chorusAvg, chorusMin}, /*withSendRecv=*/false);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

TEST(AlgorithmsApiTest, UnknownOrInapplicableAlgorithmsAreRejected) {
  RanksOptions options;
  options.nranks = 1;
  runRanks(options, [&](int, chorusComm_t comm) {
    EXPECT_EQ(chorusCommSetAlgorithms(comm, "allreduce:bruck"), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("does not implement allreduce"), std::string::npos)
        << chorusGetLastError(comm);
    EXPECT_EQ(chorusCommSetAlgorithms(comm, "allreduce:fastest"), chorusInvalidArgument);
    EXPECT_EQ(chorusCommSetAlgorithms(comm, nullptr), chorusInvalidArgument);
    EXPECT_EQ(chorusCommSetAlgorithms(comm, "allreduce:rabenseifner,allreduce:default"), chorusSuccess);
  });
  // From the config and the environment, a bad value fails init with the variable's words.
  const auto codes = runProcesses(1, [](int, const chorusUniqueId& id) {
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.algorithms = "allgather:tree";
    chorusComm_t comm = nullptr;
    EXPECT_EQ(chorusCommInitRankConfig(&comm, 1, id, 0, &config), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("allgather:tree"), std::string::npos)
        << chorusGetLastError(nullptr);
  });
  EXPECT_EQ(codes[0], 0);
}

// Device algorithms forced for collectives (ipc and staged only run on device buffers; direct
// also runs on the host, but broadcast has no host direct): host calls take the library's choice
// and stay right.
TEST(AlgorithmsApiTest, DeviceAlgorithmsLeaveHostCallsToTheLibrary) {
  RanksOptions options;
  options.nranks = 3;
  runRanks(options, [&](int rank, chorusComm_t comm) {
    ASSERT_EQ(
        chorusCommSetAlgorithms(comm, "allreduce:ipc,broadcast:direct,alltoallv:staged,gather:staged,barrier:staged"),
        chorusSuccess)
        << chorusGetLastError(comm);
    checkEveryCollective(comm, rank, 3, {1, 7, 300007}, {chorusInt32, chorusFloat32}, {chorusSum, chorusMax},
                         /*withSendRecv=*/true);
  });
}

TEST(RankOrderTest, EveryAlgorithmIsRightWithAGivenRankOrder) {
  // Rings, chains and trees visit the ranks in CHORUS_RANK_ORDER; every result stays laid out by
  // rank number. Set before the ranks start, so every rank reads the same order.
  for (const char* transport : {"shm", "tcp"}) {
    ASSERT_EQ(setenv("CHORUS_RANK_ORDER", "3,0,4,2,1", 1), 0);
    RanksOptions options;
    options.nranks = 5;
    options.transport = transport;
    runRanks(options, [&](int rank, chorusComm_t comm) {
      for (size_t k = 0; k < maxAlgorithms(); ++k) {
        const std::string spec = roundSpec(k);
        ASSERT_EQ(chorusCommSetAlgorithms(comm, spec.c_str()), chorusSuccess) << chorusGetLastError(comm);
        SCOPED_TRACE(std::string(transport) + " algorithms " + spec);
        checkEveryCollective(comm, rank, 5, {1, 7, 300007}, {chorusInt32, chorusFloat32}, {chorusSum, chorusMax},
                             /*withSendRecv=*/false);
        if (::testing::Test::HasFatalFailure()) return;
      }
    });
    unsetenv("CHORUS_RANK_ORDER");
  }
}

TEST(RankOrderTest, BadOrDisagreeingOrdersFailWithTheirWords) {
  ASSERT_EQ(setenv("CHORUS_RANK_ORDER", "0,2,0", 1), 0);
  auto codes = runProcesses(1, [](int, const chorusUniqueId& id) {
    chorusComm_t comm = nullptr;
    EXPECT_EQ(chorusCommInitRank(&comm, 1, id, 0), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("rank 0 appears at positions 0 and 2"), std::string::npos)
        << chorusGetLastError(nullptr);
  });
  EXPECT_EQ(codes[0], 0);
  // Ranks that follow different orders fail on the operation signature instead of mixing data.
  unsetenv("CHORUS_RANK_ORDER");
  codes = runProcesses(3, [](int rank, const chorusUniqueId& id) {
    setenv("CHORUS_RANK_ORDER", rank == 0 ? "0,1,2" : "0,2,1", 1);
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.timeoutMs = 5000;
    config.algorithms = "allreduce:ring";
    chorusComm_t comm = nullptr;
    ASSERT_EQ(chorusCommInitRankConfig(&comm, 3, id, rank, &config), chorusSuccess);
    std::vector<float> data(3000, 1.0f);
    EXPECT_NE(chorusAllReduce(data.data(), data.data(), data.size(), chorusFloat32, chorusSum, comm, nullptr),
              chorusSuccess);
    chorusCommAbort(comm);
  });
  for (int code : codes) EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AlgorithmsTest, ::testing::ValuesIn(transportRankMatrix()), transportRanksName);

}  // namespace
}  // namespace chorus
