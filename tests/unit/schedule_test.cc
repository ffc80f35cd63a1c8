// schedule_test.cc: runs every rank's schedule in one process, passing messages through
// in-memory mailboxes, for rank counts beyond what forked tests can afford (up to 64) and tiny
// chunks (many pipelined pieces). Checks that every receive matches a send of the same size,
// that no rank is left waiting (no deadlock), and that results equal the closed-form values.
#include "src/collectives/schedule.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "bench/pattern.h"
#include "kernels/cpu/reduce.h"

namespace chorus::collectives {
namespace {

struct SimRank {
  Schedule schedule;
  std::vector<char> buffers[kBufferCount];
  size_t next = 0;
  char* at(const Span& span) { return buffers[static_cast<int>(span.buffer)].data() + span.offset; }
};

// Executes all ranks' steps round-robin; a receive waits for its message. Sends copy their data
// when posted, which is what the executor guarantees by waiting on conflicting ranges.
void simulate(std::vector<SimRank>& ranks, chorusDataType_t type, chorusRedOp_t op) {
  const int n = static_cast<int>(ranks.size());
  std::vector<std::deque<std::vector<char>>> mailbox(static_cast<size_t>(n) * n);
  const size_t size = kernels::typeSize(type);
  for (;;) {
    bool moved = false;
    bool done = true;
    for (int r = 0; r < n; ++r) {
      SimRank& rank = ranks[r];
      while (rank.next < rank.schedule.steps.size()) {
        const Step& step = rank.schedule.steps[rank.next];
        for (const Span* span : {&step.src, &step.dst, &step.tmp}) {
          ASSERT_LE(span->offset, rank.buffers[static_cast<int>(span->buffer)].size()) << "rank " << r;
        }
        if (step.kind == StepKind::kRecv || step.kind == StepKind::kRecvReduce) {
          auto& box = mailbox[static_cast<size_t>(step.peer) * n + r];
          if (box.empty()) break;
          ASSERT_EQ(box.front().size(), step.bytes) << "rank " << r << " step " << rank.next << " from " << step.peer;
          char* into = step.kind == StepKind::kRecv ? rank.at(step.dst) : rank.at(step.tmp);
          std::memcpy(into, box.front().data(), step.bytes);
          box.pop_front();
          if (step.kind == StepKind::kRecvReduce) {
            kernels::reduce(rank.at(step.dst), rank.at(step.src), rank.at(step.tmp), step.bytes / size, type, op);
          }
        } else if (step.kind == StepKind::kSend) {
          const char* from = rank.at(step.src);
          mailbox[static_cast<size_t>(r) * n + step.peer].emplace_back(from, from + step.bytes);
        } else if (step.kind == StepKind::kCopy) {
          if (rank.at(step.src) != rank.at(step.dst)) std::memmove(rank.at(step.dst), rank.at(step.src), step.bytes);
        } else {
          kernels::divide(rank.at(step.dst), step.bytes / size, type, n);
        }
        ++rank.next;
        moved = true;
      }
      done = done && rank.next == rank.schedule.steps.size();
    }
    if (done) break;
    ASSERT_TRUE(moved) << "deadlock: some rank waits for a message no one sends";
  }
  for (const auto& box : mailbox) ASSERT_TRUE(box.empty()) << "a message was sent but never received";
}

std::vector<SimRank> makeRanks(Collective collective, int n, size_t count, size_t typeSize, int root, bool divide,
                               size_t chunkBytes, size_t inCount, size_t outCount) {
  std::vector<SimRank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ScheduleArgs args{collective, n, r, count, typeSize, root, divide, chunkBytes};
    ranks[r].schedule = buildSchedule(args);
    ranks[r].buffers[0].assign(inCount * typeSize, 0);
    ranks[r].buffers[1].assign(outCount * typeSize, 0);
    ranks[r].buffers[2].assign(ranks[r].schedule.scratchBytes, 0);
  }
  return ranks;
}

class ScheduleTest : public ::testing::TestWithParam<int> {};

TEST_P(ScheduleTest, EveryCollectiveMatchesClosedForm) {
  const int n = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(3 * n + 1), size_t{1000}}) {
    for (size_t chunkBytes : {size_t{8}, size_t{52}, size_t{1} << 20}) {
      for (chorusDataType_t type : {chorusInt32, chorusFloat32, chorusFloat16}) {
        const size_t size = kernels::typeSize(type);
        const std::string what = "n=" + std::to_string(n) + " count=" + std::to_string(count) +
                                 " chunk=" + std::to_string(chunkBytes) + " " + chorusTypeName(type);
        for (chorusRedOp_t op : {chorusSum, chorusAvg, chorusMax}) {
          {  // all-reduce
            auto ranks =
                makeRanks(Collective::kAllReduce, n, count, size, 0, op == chorusAvg, chunkBytes, count, count);
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i)
                pattern::store(ranks[r].buffers[0].data(), i, type, pattern::reduceInput(op, type, r, i));
            }
            simulate(ranks, type, op);
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(pattern::countWrong(ranks[r].buffers[1].data(), count, type,
                                            [&](size_t i) { return pattern::expectedReduce(op, type, n, i); }),
                        0u)
                  << "allreduce " << what << " " << chorusOpName(op) << " rank " << r;
            }
          }
          {  // reduce-scatter
            auto ranks =
                makeRanks(Collective::kReduceScatter, n, count, size, 0, op == chorusAvg, chunkBytes, count * n, count);
            for (int r = 0; r < n; ++r) {
              for (size_t j = 0; j < count * n; ++j)
                pattern::store(ranks[r].buffers[0].data(), j, type, pattern::reduceInput(op, type, r, j));
            }
            simulate(ranks, type, op);
            for (int r = 0; r < n; ++r) {
              EXPECT_EQ(
                  pattern::countWrong(ranks[r].buffers[1].data(), count, type,
                                      [&](size_t i) { return pattern::expectedReduce(op, type, n, r * count + i); }),
                  0u)
                  << "reducescatter " << what << " " << chorusOpName(op) << " rank " << r;
            }
          }
          {  // reduce, root in the middle
            const int root = n / 2;
            auto ranks =
                makeRanks(Collective::kReduce, n, count, size, root, op == chorusAvg, chunkBytes, count, count);
            for (int r = 0; r < n; ++r) {
              for (size_t i = 0; i < count; ++i)
                pattern::store(ranks[r].buffers[0].data(), i, type, pattern::reduceInput(op, type, r, i));
            }
            simulate(ranks, type, op);
            EXPECT_EQ(pattern::countWrong(ranks[root].buffers[1].data(), count, type,
                                          [&](size_t i) { return pattern::expectedReduce(op, type, n, i); }),
                      0u)
                << "reduce " << what << " " << chorusOpName(op);
          }
        }
        {  // all-gather
          auto ranks = makeRanks(Collective::kAllGather, n, count, size, 0, false, chunkBytes, count, count * n);
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i)
              pattern::store(ranks[r].buffers[0].data(), i, type, pattern::moveInput(r, i));
          }
          simulate(ranks, type, chorusSum);
          for (int r = 0; r < n; ++r) {
            EXPECT_EQ(pattern::countWrong(ranks[r].buffers[1].data(), count * n, type,
                                          [&](size_t j) {
                                            return pattern::asStored(
                                                type, pattern::moveInput(static_cast<int>(j / count), j % count));
                                          }),
                      0u)
                << "allgather " << what << " rank " << r;
          }
        }
        {  // broadcast from the last rank
          const int root = n - 1;
          auto ranks = makeRanks(Collective::kBroadcast, n, count, size, root, false, chunkBytes, count, count);
          for (size_t i = 0; i < count; ++i)
            pattern::store(ranks[root].buffers[0].data(), i, type, pattern::moveInput(root, i));
          simulate(ranks, type, chorusSum);
          for (int r = 0; r < n; ++r) {
            EXPECT_EQ(
                pattern::countWrong(ranks[r].buffers[1].data(), count, type,
                                    [&](size_t i) { return pattern::asStored(type, pattern::moveInput(root, i)); }),
                0u)
                << "broadcast " << what << " rank " << r;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScheduleTest, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 32, 64));

TEST(ScheduleShapeTest, RingAllReduceSendsTwiceNMinusOneOverNOfTheBuffer) {
  // Bandwidth optimality: each rank sends 2(n-1)/n of the data (up to block rounding).
  const int n = 8;
  const size_t count = 8000;
  const Schedule s = ringAllReduce({Collective::kAllReduce, n, 3, count, 4, 0, false, 4096});
  size_t sent = 0;
  for (const Step& step : s.steps) sent += step.kind == StepKind::kSend ? step.bytes : 0;
  EXPECT_EQ(sent, 2 * (n - 1) * (count / n) * 4);
}

}  // namespace
}  // namespace chorus::collectives
