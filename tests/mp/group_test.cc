// group_test.cc: groups launch several collectives and send/recv pairs together, as NCCL users
// write all-to-all and pipeline exchanges: every rank posts all of a group's calls before waiting
// on any, so exchanges that would block one another outside a group complete inside one.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

class GroupTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GroupTest, AllToAllFromSendsAndReceivesWithCollectivesInOneGroup) {
  for (int n : {2, 3, 5}) {
    RanksOptions options;
    options.nranks = n;
    options.transport = GetParam();
    runRanks(options, [&](int rank, chorusComm_t comm) {
      // Big enough that no transport could buffer all sends before the receives are posted.
      const size_t count = 300001;
      std::vector<std::vector<int32_t>> out(n), in(n);
      for (int peer = 0; peer < n; ++peer) {
        out[peer].assign(count, 1000 * rank + peer);
        in[peer].assign(count, -1);
      }
      std::vector<int64_t> sums(4, rank + 1), sumsOut(4, 0);
      std::vector<float> gathered(n * 2, 0), mine(2, static_cast<float>(rank));
      ASSERT_EQ(chorusGroupStart(), chorusSuccess);
      for (int peer = 0; peer < n; ++peer) {
        ASSERT_EQ(chorusSend(out[peer].data(), count, chorusInt32, peer, comm, nullptr), chorusSuccess);
        ASSERT_EQ(chorusRecv(in[peer].data(), count, chorusInt32, peer, comm, nullptr), chorusSuccess);
      }
      ASSERT_EQ(chorusAllReduce(sums.data(), sumsOut.data(), 4, chorusInt64, chorusSum, comm, nullptr), chorusSuccess);
      ASSERT_EQ(chorusAllGather(mine.data(), gathered.data(), 2, chorusFloat32, comm, nullptr), chorusSuccess);
      ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
      for (int peer = 0; peer < n; ++peer) {
        EXPECT_EQ(in[peer].front(), 1000 * peer + rank) << "from rank " << peer;
        EXPECT_EQ(in[peer].back(), 1000 * peer + rank) << "from rank " << peer;
      }
      EXPECT_EQ(sumsOut[3], static_cast<int64_t>(n) * (n + 1) / 2);
      for (int r = 0; r < n; ++r) EXPECT_EQ(gathered[2 * r + 1], static_cast<float>(r));
    });
  }
}

TEST_P(GroupTest, NestedGroupsRunAtTheOutermostEnd) {
  RanksOptions options;
  options.nranks = 2;
  options.transport = GetParam();
  runRanks(options, [&](int rank, chorusComm_t comm) {
    int32_t send = 7 + rank, recv = 0;
    const int peer = 1 - rank;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusRecv(&recv, 1, chorusInt32, peer, comm, nullptr), chorusSuccess);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
    EXPECT_EQ(recv, 0) << "the inner end ran the receive already";
    ASSERT_EQ(chorusSend(&send, 1, chorusInt32, peer, comm, nullptr), chorusSuccess);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(recv, 7 + peer);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, GroupTest, ::testing::Values("shm", "tcp", "ucx"), testing::transportName);

}  // namespace
}  // namespace chorus
