// traits_test.cc: each collective's traits against its schedules, computed another way: for every
// algorithm of every collective, on 1 to 5 ranks, every rank's steps read exactly the input and
// write exactly the output the traits give that rank (every byte of them, none past them); the
// direct algorithm's ranks, which read and write one another's buffers, all of them together.
#include "src/collectives/traits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "src/collectives/algorithm.h"

namespace chorus::collectives {
namespace {

// Bytes of one buffer the steps touch, one flag per byte; false where a step went past `bytes`.
struct Touched {
  std::vector<bool> byte;
  bool past = false;
  void mark(size_t offset, size_t length) {
    if (offset + length > byte.size()) {
      past = true;
      return;
    }
    for (size_t i = offset; i < offset + length; ++i) byte[i] = true;
  }
  bool all() const {
    for (bool b : byte) {
      if (!b) return false;
    }
    return true;
  }
};

TEST(TraitsTest, SchedulesTouchWhatTheTraitsSay) {
  constexpr size_t kTypeSize = 4;
  int checked = 0;
  for (int c = 0; c < kCollectiveCount; ++c) {
    const auto collective = static_cast<Collective>(c);
    const CollectiveTraits& traits = traitsOf(collective);
    EXPECT_EQ(traits.collective, collective);
    EXPECT_STREQ(traits.name, collectiveName(collective));
    if (traits.input == Extent::kVector) continue;  // per-peer counts: the call's own
    for (Algorithm algorithm : algorithmsFor(collective)) {
      for (int n = 1; n <= 5; ++n) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{300}}) {
          // A reduce-peers step reads every rank's input at its offsets (all-reduce: writes every
          // output), so such a schedule covers the buffers together with its peers': checked as one.
          std::optional<Touched> together[2];
          std::string togetherWhere;
          bool writtenTogether = false;
          for (int rank = 0; rank < n; ++rank) {
            ScheduleArgs args;
            args.collective = collective;
            args.algorithm = algorithm;
            args.nranks = n;
            args.rank = rank;
            args.count = count;
            args.typeSize = kTypeSize;
            args.chunkBytes = 256;  // several pieces per block
            args.root = n - 1;      // a root (or peer) other than rank 0 where there are two ranks
            if (traits.pointToPoint && n == 1) continue;
            const bool isRoot = rank == args.root;
            const size_t in = inputElements(collective, count, n, isRoot) * kTypeSize;
            const size_t out = outputElements(collective, count, n, isRoot) * kTypeSize;
            const Schedule schedule = buildSchedule(args);
            Touched read{std::vector<bool>(in)}, written{std::vector<bool>(out)};
            const bool readsPeers = std::any_of(schedule.steps.begin(), schedule.steps.end(),
                                                [](const Step& s) { return s.kind == StepKind::kReducePeers; });
            const bool writesPeers = std::any_of(schedule.steps.begin(), schedule.steps.end(), [](const Step& s) {
              return s.kind == StepKind::kReducePeers && s.peer == kEveryRank;
            });
            if (readsPeers && !together[0]) {
              together[0] = Touched{std::vector<bool>(in)};
              together[1] = Touched{std::vector<bool>(out)};
            }
            for (const Step& step : schedule.steps) {
              Access access[4];
              const int k = stepAccesses(step, access);
              for (int i = 0; i < k; ++i) {
                Touched& r = readsPeers ? *together[0] : read;
                Touched& w = readsPeers && step.peer == kEveryRank ? *together[1] : written;
                if (access[i].span.buffer == BufferId::kInput) {
                  EXPECT_FALSE(access[i].write);
                  r.mark(access[i].span.offset, access[i].bytes);
                } else if (access[i].span.buffer == BufferId::kOutput && access[i].write) {
                  w.mark(access[i].span.offset, access[i].bytes);
                }
              }
            }
            const std::string where = std::string(traits.name) + " " + schedule.algorithm + " n=" + std::to_string(n) +
                                      " rank " + std::to_string(rank) + " count " + std::to_string(count);
            EXPECT_FALSE(read.past) << where << ": read past the input of " << in << " bytes";
            EXPECT_FALSE(written.past) << where << ": wrote past the output of " << out << " bytes";
            if (!readsPeers) {
              EXPECT_TRUE(read.all()) << where << ": left some of the input of " << in << " bytes unread";
            }
            if (!writesPeers) {
              EXPECT_TRUE(written.all()) << where << ": left some of the output of " << out << " bytes unwritten";
            } else {
              writtenTogether = true;
            }
            togetherWhere = where;
            ++checked;
          }
          if (together[0]) {
            EXPECT_FALSE(together[0]->past || together[1]->past)
                << togetherWhere << ": past a buffer, the ranks together";
            EXPECT_TRUE(together[0]->all()) << togetherWhere << ": the ranks together left some input unread";
            if (writtenTogether) {
              EXPECT_TRUE(together[1]->all()) << togetherWhere << ": the ranks together left some output unwritten";
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(TraitsTest, WholeSizeIsNcclTestsSize) {
  EXPECT_EQ(wholeElements(Collective::kAllReduce, 10, 4), 10u);
  EXPECT_EQ(wholeElements(Collective::kBroadcast, 10, 4), 10u);
  EXPECT_EQ(wholeElements(Collective::kAllGather, 10, 4), 40u);
  EXPECT_EQ(wholeElements(Collective::kReduceScatter, 10, 4), 40u);
  EXPECT_EQ(wholeElements(Collective::kAllToAll, 10, 4), 40u);
  EXPECT_EQ(wholeElements(Collective::kGather, 10, 4), 40u);
  EXPECT_EQ(wholeElements(Collective::kScatter, 10, 4), 40u);
  EXPECT_EQ(inputElements(Collective::kBroadcast, 10, 4, false), 0u);
  EXPECT_EQ(outputElements(Collective::kReduce, 10, 4, false), 0u);
  EXPECT_EQ(outputElements(Collective::kGather, 10, 4, true), 40u);
  EXPECT_EQ(blocksOf(Collective::kScatter, 4), 4u);
  EXPECT_EQ(blocksOf(Collective::kReduce, 4), 1u);
  const size_t counts[3] = {2, 0, 3}, displs[3] = {5, 9, 1};  // blocks end at 7, 9 and 4
  EXPECT_EQ(vectorExtent(counts, displs, 3), 9u);
}

}  // namespace
}  // namespace chorus::collectives
