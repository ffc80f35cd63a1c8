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

constexpr size_t kCounts[] = {0, 1, 7, 1023, (1u << 20) + 3};
constexpr chorusDataType_t kTypes[] = {chorusInt8,   chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,
                                       chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16};
constexpr chorusRedOp_t kOps[] = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};

class CollectivesTest : public ::testing::TestWithParam<TransportRanks> {};

TEST_P(CollectivesTest, EveryCollectiveTypeOpCountAndPlacement) {
  const TransportRanks param = GetParam();
  testing::RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    const int n = param.nranks;
    int variant = 0;
    for (size_t count : kCounts) {
      for (chorusDataType_t type : kTypes) {
        for (bool inPlace : {false, true}) {
          const int root = (variant++) % n;
          for (chorusRedOp_t op : kOps) {
            checkAllReduce(comm, rank, n, count, type, op, inPlace);
            checkReduceScatter(comm, rank, n, count, type, op, inPlace);
            checkReduce(comm, rank, n, count, type, op, inPlace, root);
          }
          checkAllGather(comm, rank, n, count, type, inPlace);
          checkBroadcast(comm, rank, n, count, type, inPlace, root);
          checkGather(comm, rank, n, count, type, inPlace, root);
          checkScatter(comm, rank, n, count, type, inPlace, root);
        }
        checkSendRecv(comm, rank, n, count, type);
        checkAllToAll(comm, rank, n, count, type);
        checkAllToAllv(comm, rank, n, count, type);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
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
