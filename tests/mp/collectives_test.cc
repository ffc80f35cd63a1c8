// collectives_test.cc: every collective x rank count x element count x type x op x in/out of
// place, on real forked ranks over shm and over tcp, checked against closed-form results.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/pattern.h"
#include "tests/support/collective_checks.h"
#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

class CollectivesTest : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(CollectivesTest, EveryCollectiveTypeOpCountAndPlacement) {
  const TransportRanks param = GetParam();
  testing::RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    checkEveryCollective(comm, rank, param.nranks, {0, 1, 7, 1023, (1u << 20) + 3},
                         {chorusInt8, chorusUint8, chorusInt32, chorusUint32, chorusInt64, chorusUint64, chorusFloat16,
                          chorusFloat32, chorusFloat64, chorusBfloat16},
                         {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}, /*withSendRecv=*/true);
  });
}

// The barrier lets nobody out before everyone is in: each rank arrives late by a different
// amount and bumps a counter in memory shared by the forked ranks; after the barrier every rank
// must see the full count.
TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  const TransportRanks param = GetParam();
  auto* counter = static_cast<std::atomic<int>*>(
      mmap(nullptr, sizeof(std::atomic<int>) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(counter, MAP_FAILED);
  new (counter) std::atomic<int>(0);
  testing::RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    for (int round = 1; round <= 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * ((rank + round) % param.nranks)));
      counter->fetch_add(1);
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      EXPECT_GE(counter->load(), round * param.nranks) << "rank " << rank << " left barrier " << round << " early";
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    }
  });
  munmap(counter, sizeof(std::atomic<int>) * 2);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::ValuesIn(transportRankMatrix()), transportRanksName);

}  // namespace
}  // namespace chorus
