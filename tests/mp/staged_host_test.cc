// staged_host_test.cc: the host side of the staged device path, as its proxy runs it: a split of
// the communicator, driven from a thread of its own, with one input area and one output area
// (here plain memory, pinned on a GPU machine) reused by every call, so each call's data lies
// where the last call's did. The sequence is the gpu tests' (all-gather, reduce-scatter,
// all-to-all at counts 3 and 70001; all-reduce of every type and op at counts 1, 4099 and 65537),
// each checked against its closed form: what a staged device call gets back is what this gets.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tests/support/multiprocess.h"
#include "tests/support/pattern.h"

namespace chorus::testing {
namespace {

class StagedHostTest : public ::testing::TestWithParam<int> {};

TEST_P(StagedHostTest, AProxyThreadOnASplitReusingTwoAreasGetsEveryResult) {
  RanksOptions options;
  options.nranks = GetParam();
  options.transport = "shm";
  runRanks(options, [&](int rank, chorusComm_t comm) {
    const int n = GetParam();
    chorusComm_t proxy = nullptr;
    ASSERT_EQ(chorusCommSplit(comm, 0, rank, &proxy, nullptr), chorusSuccess) << chorusGetLastError(comm);
    constexpr size_t kAreaBytes = 4 << 20;
    std::vector<char> in(kAreaBytes), out(kAreaBytes);
    std::thread thread([&] {
      const auto type = chorusFloat32;
      for (const size_t count : {size_t{3}, size_t{70001}}) {
        for (size_t i = 0; i < count; ++i) pattern::store(in.data(), i, type, pattern::moveInput(rank, i));
        ASSERT_EQ(chorusAllGather(in.data(), out.data(), count, type, proxy, nullptr), chorusSuccess);
        EXPECT_EQ(
            pattern::countWrong(out.data(), n * count, type,
                                [&](size_t i) { return pattern::moveInput(static_cast<int>(i / count), i % count); }),
            0u)
            << "all-gather count " << count;
        for (size_t i = 0; i < n * count; ++i)
          pattern::store(in.data(), i, type, pattern::reduceInput(chorusSum, type, rank, i));
        ASSERT_EQ(chorusReduceScatter(in.data(), out.data(), count, type, chorusSum, proxy, nullptr), chorusSuccess);
        EXPECT_EQ(pattern::countWrong(
                      out.data(), count, type,
                      [&](size_t i) { return pattern::expectedReduce(chorusSum, type, n, rank * count + i); }),
                  0u)
            << "reduce-scatter count " << count;
        for (size_t i = 0; i < n * count; ++i) pattern::store(in.data(), i, type, pattern::moveInput(rank, i));
        ASSERT_EQ(chorusAllToAll(in.data(), out.data(), count, type, proxy, nullptr), chorusSuccess);
        EXPECT_EQ(
            pattern::countWrong(
                out.data(), n * count, type,
                [&](size_t i) { return pattern::moveInput(static_cast<int>(i / count), rank * count + i % count); }),
            0u)
            << "all-to-all count " << count;
      }
      for (int t = 0; t < chorusNumTypes; ++t) {
        const auto type = static_cast<chorusDataType_t>(t);
        for (int o = 0; o < chorusNumOps; ++o) {
          const auto op = static_cast<chorusRedOp_t>(o);
          for (const size_t count : {size_t{1}, size_t{4099}, size_t{65537}}) {
            for (size_t i = 0; i < count; ++i)
              pattern::store(in.data(), i, type, pattern::reduceInput(op, type, rank, i));
            ASSERT_EQ(chorusAllReduce(in.data(), out.data(), count, type, op, proxy, nullptr), chorusSuccess);
            EXPECT_EQ(pattern::countWrong(out.data(), count, type,
                                          [&](size_t i) { return pattern::expectedReduce(op, type, n, i); }),
                      0u)
                << chorusTypeName(type) << " " << chorusOpName(op) << " count " << count;
          }
        }
      }
    });
    thread.join();
    EXPECT_EQ(chorusCommDestroy(proxy), chorusSuccess);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, StagedHostTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace chorus::testing
