// split_test.cc: chorusCommSplit makes the sub-communicators a device mesh is built from: ranks
// grouped by color and ordered by key, nested splits, the parent still usable, and bad colors
// refused on every rank.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <string>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

int32_t sumOver(chorusComm_t comm, int32_t value) {
  std::vector<int32_t> in(1000, value), out(1000, -1);
  EXPECT_EQ(chorusAllReduce(in.data(), out.data(), in.size(), chorusInt32, chorusSum, comm, nullptr), chorusSuccess)
      << chorusGetLastError(comm);
  EXPECT_EQ(out.front(), out.back());
  return out.back();
}

void expectAllZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

class SplitTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SplitTest, RanksOfAColorFormACommunicatorOrderedByKey) {
  // Six ranks: even and odd ranks make two communicators, numbered by descending rank (key =
  // -rank); rank 5 joins none. Each new communicator reduces its members' ranks.
  RanksOptions options;
  options.nranks = 6;
  options.transport = GetParam();
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int color = rank == 5 ? CHORUS_SPLIT_NOCOLOR : rank % 2;
    chorusComm_t sub = reinterpret_cast<chorusComm_t>(1);
    ASSERT_EQ(chorusCommSplit(comm, color, -rank, &sub, nullptr), chorusSuccess) << chorusGetLastError(comm);
    if (rank == 5) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      int count = 0, newRank = -1;
      ASSERT_EQ(chorusCommCount(sub, &count), chorusSuccess);
      ASSERT_EQ(chorusCommUserRank(sub, &newRank), chorusSuccess);
      const std::vector<int> members = rank % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
      EXPECT_EQ(count, static_cast<int>(members.size()));
      ASSERT_LT(newRank, static_cast<int>(members.size()));
      EXPECT_EQ(members[newRank], rank);
      EXPECT_EQ(sumOver(sub, rank), rank % 2 == 0 ? 0 + 2 + 4 : 1 + 3);
      // Rank order in the new communicator follows the key: new rank 0 is the highest old rank.
      std::vector<int32_t> gathered(members.size(), -1);
      const int32_t mine = rank;
      ASSERT_EQ(chorusAllGather(&mine, gathered.data(), 1, chorusInt32, sub, nullptr), chorusSuccess);
      for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(gathered[i], members[i]);
      EXPECT_EQ(chorusCommDestroy(sub), chorusSuccess);
    }
    // The parent goes on working.
    EXPECT_EQ(sumOver(comm, 1), 6);
  });
}

TEST_P(SplitTest, NestedSplitsMakeAMeshOfGroups) {
  // Eight ranks as a 2 x 2 x 2 mesh (rank = 4a + 2b + c): a split per dimension, then a split of a
  // split. Each group's sum of ranks has a closed form.
  RanksOptions options;
  options.nranks = 8;
  options.transport = GetParam();
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int a = rank / 4, b = rank / 2 % 2, c = rank % 2;
    chorusComm_t cGroup = nullptr, abGroup = nullptr, bGroup = nullptr;
    ASSERT_EQ(chorusCommSplit(comm, 4 * a + 2 * b, c, &cGroup, nullptr), chorusSuccess) << chorusGetLastError(comm);
    ASSERT_EQ(chorusCommSplit(comm, c, rank, &abGroup, nullptr), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(sumOver(cGroup, rank), 2 * (4 * a + 2 * b) + 1);  // {4a + 2b, 4a + 2b + 1}
    EXPECT_EQ(sumOver(abGroup, rank), 12 + 4 * c);              // {c, 2 + c, 4 + c, 6 + c}
    // The (a, b) group split by a: {4a + c, 4a + 2 + c}; equal keys keep the order in abGroup.
    ASSERT_EQ(chorusCommSplit(abGroup, a, 0, &bGroup, nullptr), chorusSuccess) << chorusGetLastError(abGroup);
    int bRank = -1;
    ASSERT_EQ(chorusCommUserRank(bGroup, &bRank), chorusSuccess);
    EXPECT_EQ(bRank, b);
    EXPECT_EQ(sumOver(bGroup, rank), 2 * (4 * a + c) + 2);
    for (chorusComm_t group : {bGroup, abGroup, cGroup}) EXPECT_EQ(chorusCommDestroy(group), chorusSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, SplitTest, ::testing::Values("shm", "tcp"), transportName);

TEST(SplitErrorsTest, ABadColorOnOneRankFailsEveryRankNamingItAndTheParentGoesOn) {
  RanksOptions options;
  options.nranks = 4;
  runRanks(options, [&](int rank, chorusComm_t comm) {
    chorusComm_t sub = nullptr;
    EXPECT_EQ(chorusCommSplit(comm, rank == 2 ? -7 : 0, 0, &sub, nullptr), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("rank 2 passed color -7"), std::string::npos)
        << chorusGetLastError(nullptr);
    EXPECT_EQ(sub, nullptr);
    EXPECT_EQ(chorusCommSplit(comm, 0, 0, nullptr, nullptr), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("newcomm is NULL"), std::string::npos);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusCommSplit(comm, 0, 0, &sub, nullptr), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("inside a group"), std::string::npos);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
    EXPECT_EQ(sumOver(comm, rank), 0 + 1 + 2 + 3);
  });
}

TEST(SplitErrorsTest, TheCppApiSplitsAndAnEmptyCommunicatorIsFalse) {
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId& id) {
        Communicator world(UniqueId(id), 3, rank);
        Communicator pair = world.split(rank == 1 ? CHORUS_SPLIT_NOCOLOR : 0, 0);
        EXPECT_EQ(static_cast<bool>(pair), rank != 1);
        if (pair) {
          EXPECT_EQ(pair.size(), 2);
          EXPECT_EQ(pair.rank(), rank / 2);
          std::vector<int64_t> values(10, rank);
          pair.allReduce(std::span<int64_t>(values));
          EXPECT_EQ(values[9], 0 + 2);
        }
        try {
          (void)world.split(-3, 0);
          ADD_FAILURE() << "a color of -3 was accepted";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), chorusInvalidArgument);
          EXPECT_NE(std::string(e.what()).find("passed color -3"), std::string::npos) << e.what();
        }
      },
      120));
}

}  // namespace
}  // namespace chorus
