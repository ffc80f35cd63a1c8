// simulator_test.cc: every algorithm of every collective, run for all ranks in one process by the
// simulator (zero buffering, so no schedule can pass here and deadlock on real transports), for
// rank counts 1..33, 64, 127, 128 and 1024, with every rank's result compared with the
// closed form.
#include "src/collectives/simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/descriptor.h"
#include "src/collectives/traits.h"
#include "src/collectives/tuner.h"
#include "tests/support/pattern.h"
#include "tests/support/rank_order_fold.h"

namespace chorus::collectives {
namespace {

using pattern::asStored;
using pattern::expectedReduce;
using pattern::moveInput;
using pattern::reduceInput;

struct Case {
  Collective collective;
  Algorithm algorithm;
  int n;
  size_t count;
  chorusDataType_t type;
  chorusRedOp_t op;
  bool inPlace;
  int root;
  size_t chunkBytes;
  const int* order = nullptr;  // rank order (position -> rank), or null
  const int* hosts = nullptr;  // host of each rank, or null (one host)
  size_t recordBytes = 0;      // call records the ranks agree on first, or 0
  bool deterministic = false;  // CHORUS_DETERMINISTIC: reductions fold in rank order
};

std::string describe(const Case& c) {
  return std::string(collectiveName(c.collective)) + "/" + algorithmName(c.algorithm) + " n=" + std::to_string(c.n) +
         " count=" + std::to_string(c.count) + " " + chorusTypeName(c.type) + " " + chorusOpName(c.op) +
         (c.inPlace ? " in-place" : "") + " root=" + std::to_string(c.root) + " chunk=" + std::to_string(c.chunkBytes) +
         (c.deterministic ? " deterministic" : "");
}

// All-to-allv sizes: rank r sends (r + 2j) % 3 + count elements to rank j, packed with a gap of
// one element between blocks.
size_t vCount(int from, int to, size_t count) { return static_cast<size_t>((from + 2 * to) % 3) + count; }

bool isReduction(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

// Builds every rank, simulates, and checks; returns the number of wrong elements.
void run(const Case& c) {
  const int n = c.n;
  const size_t size = kernels::typeSize(c.type);
  const size_t count = c.count;
  std::vector<SimulatedRank> ranks(n);
  std::vector<std::vector<size_t>> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRank& rank = ranks[r];
    ScheduleArgs args{c.collective, n, r, count, size, c.root, c.op == chorusAvg, c.chunkBytes, c.algorithm};
    args.order = c.order;
    args.hosts = c.hosts;
    args.recordBytes = c.recordBytes;
    size_t inCount = count, outCount = count;
    switch (c.collective) {
      case Collective::kAllGather:
        outCount = count * n;
        break;
      case Collective::kReduceScatter:
        inCount = count * n;
        break;
      case Collective::kAllToAll:
        inCount = outCount = count * n;
        break;
      case Collective::kGather:
        outCount = count * n;
        break;
      case Collective::kScatter:
        inCount = count * n;
        break;
      case Collective::kBarrier:
        inCount = outCount = 0;
        break;
      case Collective::kAllToAllv: {
        size_t s = 0, t = 0;
        for (int j = 0; j < n; ++j) {
          sendCounts[r].push_back(vCount(r, j, count));
          sendDispls[r].push_back(s);
          s += sendCounts[r].back() + 1;
          recvCounts[r].push_back(vCount(j, r, count));
          recvDispls[r].push_back(t);
          t += recvCounts[r].back() + 1;
        }
        inCount = s;
        outCount = t;
        args.sendCounts = sendCounts[r].data();
        args.sendDispls = sendDispls[r].data();
        args.recvCounts = recvCounts[r].data();
        args.recvDispls = recvDispls[r].data();
        break;
      }
      default:
        break;
    }
    rank.schedule = buildSchedule(args);
    rank.input.assign(inCount * size + 8, 0);
    rank.output.assign(outCount * size + 8, 0);
    char* in = rank.input.data();
    if (c.inPlace) {
      rank.inPlace = true;
      if (c.collective == Collective::kAllGather) rank.inputOffset = r * count * size;
      if (c.collective == Collective::kReduceScatter) rank.outputOffset = r * count * size;
      if (c.collective == Collective::kReduceScatter) rank.output.assign(inCount * size + 8, 0);
      in = rank.output.data() + rank.inputOffset;
    }
    for (size_t i = 0; i < inCount; ++i) {
      pattern::store(in, i, c.type, isReduction(c.collective) ? reduceInput(c.op, c.type, r, i) : moveInput(r, i));
    }
  }
  const SimulationResult result = simulate(ranks, c.type, c.op);
  ASSERT_TRUE(result.ok) << describe(c) << ": " << result.error;
  for (int r = 0; r < n; ++r) {
    const char* out = ranks[r].output.data() + (c.inPlace ? ranks[r].outputOffset : 0);
    size_t wrong = 0;
    switch (c.collective) {
      case Collective::kAllReduce:
        wrong = pattern::countWrong(out, count, c.type, [&](size_t i) { return expectedReduce(c.op, c.type, n, i); });
        break;
      case Collective::kReduce:
        if (r == c.root) {
          wrong = pattern::countWrong(out, count, c.type, [&](size_t i) { return expectedReduce(c.op, c.type, n, i); });
        }
        break;
      case Collective::kReduceScatter:
        wrong = pattern::countWrong(out, count, c.type,
                                    [&](size_t i) { return expectedReduce(c.op, c.type, n, r * count + i); });
        break;
      case Collective::kAllGather:
        wrong = pattern::countWrong(out, count * n, c.type, [&](size_t j) {
          return asStored(c.type, moveInput(static_cast<int>(j / count), j % count));
        });
        break;
      case Collective::kBroadcast:
        wrong =
            pattern::countWrong(out, count, c.type, [&](size_t i) { return asStored(c.type, moveInput(c.root, i)); });
        break;
      case Collective::kAllToAll:
        wrong = pattern::countWrong(out, count * n, c.type, [&](size_t j) {
          const int from = static_cast<int>(j / count);
          return asStored(c.type, moveInput(from, r * count + j % count));
        });
        break;
      case Collective::kAllToAllv:
        for (int from = 0; from < n; ++from) {
          const char* block = out + recvDispls[r][from] * size;
          wrong += pattern::countWrong(block, recvCounts[r][from], c.type, [&](size_t i) {
            return asStored(c.type, moveInput(from, sendDispls[from][r] + i));
          });
        }
        break;
      case Collective::kGather:
        if (r == c.root) {
          wrong = pattern::countWrong(out, count * n, c.type, [&](size_t j) {
            return asStored(c.type, moveInput(static_cast<int>(j / count), j % count));
          });
        }
        break;
      case Collective::kScatter:
        wrong = pattern::countWrong(out, count, c.type,
                                    [&](size_t i) { return asStored(c.type, moveInput(c.root, r * count + i)); });
        break;
      default:
        break;
    }
    ASSERT_EQ(wrong, 0u) << describe(c) << " rank " << r;
  }
}

const Collective kCollectives[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                   Collective::kBroadcast, Collective::kReduce,    Collective::kAllToAll,
                                   Collective::kAllToAllv, Collective::kGather,    Collective::kScatter,
                                   Collective::kBarrier};

bool hasInPlace(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kAllGather || c == Collective::kReduceScatter ||
         c == Collective::kBroadcast || c == Collective::kReduce;
}

class SimulatorTest : public ::testing::TestWithParam<int> {};

TEST_P(SimulatorTest, EveryAlgorithmOfEveryCollectiveMatchesClosedForm) {
  const int n = GetParam();
  const bool large = n > 200;
  // Many ranks: one small count and one type; few ranks: sizes around the rank count and a
  // chunk size that cuts them into several pieces.
  const std::vector<size_t> counts =
      large ? std::vector<size_t>{1} : std::vector<size_t>{0, 1, 7, 2 * static_cast<size_t>(n) + 1};
  struct TypeOp {
    chorusDataType_t type;
    chorusRedOp_t op;
  };
  const std::vector<TypeOp> reductions = large ? std::vector<TypeOp>{{chorusInt32, chorusSum}}
                                               : std::vector<TypeOp>{{chorusInt32, chorusSum},
                                                                     {chorusFloat32, chorusAvg},
                                                                     {chorusFloat16, chorusMax},
                                                                     {chorusInt8, chorusProd}};
  const std::vector<chorusDataType_t> moves =
      large ? std::vector<chorusDataType_t>{chorusInt32} : std::vector<chorusDataType_t>{chorusInt32, chorusFloat16};
  for (Collective collective : kCollectives) {
    for (Algorithm algorithm : algorithmsFor(collective)) {
      for (size_t count : counts) {
        for (bool inPlace : {false, true}) {
          if (inPlace && (!hasInPlace(collective) || large)) continue;
          const int root = static_cast<int>((count + 3 * inPlace) % n);
          // 12 bytes: many pieces; 256 from 64 ranks on, where 12 would put thousands of pieces
          // in flight per rank (the recursive-doubling all-gather) and slow the simulation.
          const size_t chunk = large ? size_t{1} << 20 : n > 33 ? 256 : 12;
          if (isReduction(collective)) {
            for (const TypeOp& to : reductions) {
              run({collective, algorithm, n, count, to.type, to.op, inPlace, root, chunk});
              if (HasFatalFailure()) return;
            }
          } else {
            for (chorusDataType_t type : moves) {
              run({collective, algorithm, n, count, type, chorusSum, inPlace, root, chunk});
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// Every count to 33, then a few larger (127 the odd one; 1024 the large one: 1000 beside it took
// another minute of CI for what 127 and 1024 cover).
std::vector<int> rankCounts() {
  std::vector<int> all;
  for (int n = 1; n <= 33; ++n) all.push_back(n);
  for (int n : {64, 127, 128, 1024}) all.push_back(n);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ranks, SimulatorTest, ::testing::ValuesIn(rankCounts()));

TEST(SimulatorTest, RootedCallsAfterTheRanksAgreementAreRight) {
  // A rooted call's schedule with the agreement put first (96-byte records, as the executor's):
  // 3 steps a round, ceil(log2 n) rounds, the last merge marked as covering every rank; every
  // ordered pair meets in one round at most, so the agreement's messages match whatever the call;
  // and the call after it still matches its closed form at every rank count.
  for (int n = 1; n <= 17; ++n) {
    int rounds = 0;
    while ((1 << rounds) < n) ++rounds;
    for (Collective collective :
         {Collective::kBroadcast, Collective::kReduce, Collective::kGather, Collective::kScatter}) {
      for (Algorithm algorithm : algorithmsFor(collective)) {
        Case c{collective, algorithm, n, 7, chorusInt32, chorusSum, false, n - 1, 12};
        c.recordBytes = 96;
        run(c);
        if (HasFatalFailure()) return;
        for (int r = 0; r < n; ++r) {
          ScheduleArgs args{collective, n, r, 7, 4, n - 1, false, 12, algorithm};
          args.recordBytes = 96;
          const Schedule schedule = buildSchedule(args);
          ASSERT_EQ(schedule.agreementSteps, static_cast<size_t>(3 * rounds)) << describe(c);
          std::set<int> sentTo;
          for (size_t i = 0; i < schedule.agreementSteps; ++i) {
            const Step& step = schedule.steps[i];
            if (step.kind == StepKind::kSend) {
              EXPECT_TRUE(sentTo.insert(step.peer).second) << describe(c);
            }
            if (step.kind == StepKind::kAgree) {
              EXPECT_EQ(step.peer == kEveryRank, i + 1 == schedule.agreementSteps) << describe(c);
            }
          }
          ScheduleArgs plain = args;
          plain.recordBytes = 0;
          EXPECT_EQ(schedule.steps.size(), schedule.agreementSteps + buildSchedule(plain).steps.size());
        }
      }
    }
  }
}

TEST(SimulatorTest, RankOrderIsFollowedAndBlocksStayAtTheirRanks) {
  for (int n : {2, 3, 5, 8, 13}) {
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::mt19937 random(n);
    std::shuffle(order.begin(), order.end(), random);
    std::vector<int> position(n);
    for (int i = 0; i < n; ++i) position[order[i]] = i;
    // Every algorithm still gives every rank the closed-form result, blocks by rank number.
    for (Collective collective : kCollectives) {
      for (Algorithm algorithm : algorithmsFor(collective)) {
        for (size_t count : {size_t{1}, 2 * static_cast<size_t>(n) + 1}) {
          const int root = static_cast<int>(count % n);
          for (bool inPlace : {false, true}) {
            if (inPlace && !hasInPlace(collective)) continue;
            run({collective, algorithm, n, count, chorusInt32, chorusSum, inPlace, root, 12, order.data()});
            if (HasFatalFailure()) return;
          }
        }
      }
    }
    // The ring and the chain talk only to their neighbours in the order.
    const std::pair<Collective, Algorithm> along[] = {{Collective::kAllReduce, Algorithm::kRing},
                                                      {Collective::kAllGather, Algorithm::kRing},
                                                      {Collective::kReduceScatter, Algorithm::kRing},
                                                      {Collective::kBroadcast, Algorithm::kChain},
                                                      {Collective::kReduce, Algorithm::kChain}};
    for (const auto& [collective, algorithm] : along) {
      for (int r = 0; r < n; ++r) {
        ScheduleArgs args{collective, n, r, 100, 4, order[1], false, 64, algorithm};
        args.order = order.data();
        for (const Step& step : buildSchedule(args).steps) {
          if (step.peer < 0) continue;
          const int towards = step.kind == StepKind::kSend ? 1 : -1;
          const bool reversed = collective == Collective::kReduce;  // the chain reduce flows back to the root
          EXPECT_EQ(step.peer, order[(position[r] + (reversed ? -towards : towards) + n) % n])
              << collectiveName(collective) << " n=" << n << " rank " << r << " " << stepKindName(step.kind);
        }
      }
    }
  }
}

TEST(SimulatorTest, HierarchicalCollectivesAreRightOnEveryHostLayout) {
  // Hosts of equal rank counts (the two-level schedules), interleaved hosts, and unequal hosts (the
  // flat forms), with counts that leave blocks uneven and chunks that cut them into pieces, and
  // roots on the first, a middle and the last host.
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 1, 1},    {0, 1, 0, 1}, {0, 0, 0, 1, 1, 1, 2, 2, 2}, {0, 1, 2, 3}, {0, 0, 0, 0, 1, 1, 1, 1},
      {0, 0, 0, 1, 1}, {0, 0, 0, 0}};
  for (Collective collective : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                Collective::kBroadcast, Collective::kReduce}) {
    const bool rooted = collective == Collective::kBroadcast || collective == Collective::kReduce;
    for (const std::vector<int>& hosts : layouts) {
      const int n = static_cast<int>(hosts.size());
      for (size_t count : {size_t{1}, size_t{7}, 2 * static_cast<size_t>(n) + 1, size_t{1000}}) {
        for (const auto& [type, op] : {std::pair{chorusInt32, chorusSum}, std::pair{chorusFloat32, chorusAvg},
                                       std::pair{chorusFloat16, chorusMax}}) {
          for (int root : rooted ? std::vector<int>{0, n / 2 + 1, n - 1} : std::vector<int>{0}) {
            for (bool inPlace : {false, true}) {
              Case c{collective, Algorithm::kHierarchical, n, count, type, op, inPlace, root % n, 12};
              c.hosts = hosts.data();
              run(c);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(ScheduleShapeTest, HierarchicalCollectivesCrossHostsOnlyOnRails) {
  // 3 hosts x 4 ranks: a rank talks to its host ring's neighbours and to the ranks with its place
  // on the other hosts, and sends to other hosts: all-reduce 2(H-1)/(HL) of the buffer (up to
  // block rounding); all-gather and reduce-scatter (H-1) blocks; broadcast and reduce (root 5,
  // host 1, place 1) the buffer once per rail hop, from every rail member but the chain's end.
  const int hostsCount = 3, perHost = 4, n = hostsCount * perHost, root = 5;
  std::vector<int> hosts(n);
  for (int r = 0; r < n; ++r) hosts[r] = r / perHost;
  const size_t count = 12000;
  const size_t bytes = count * 4;
  for (Collective collective : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                Collective::kBroadcast, Collective::kReduce}) {
    for (int r = 0; r < n; ++r) {
      ScheduleArgs args{collective, n, r, count, 4, root, false, 1 << 14, Algorithm::kHierarchical};
      args.hosts = hosts.data();
      const Schedule s = buildSchedule(args);
      size_t across = 0;
      for (const Step& step : s.steps) {
        if (step.peer < 0) continue;
        const bool sameHost = hosts[step.peer] == hosts[r];
        if (sameHost) {
          const int d = (step.peer - r + perHost) % perHost;
          EXPECT_TRUE(d == 1 || d == perHost - 1)
              << collectiveName(collective) << " rank " << r << " talks to " << step.peer;
        } else {
          EXPECT_EQ(step.peer % perHost, r % perHost)
              << collectiveName(collective) << " rank " << r << " talks to " << step.peer;
          if (step.kind == StepKind::kSend) across += step.bytes;
        }
      }
      // Broadcast: the chain runs from the root's host (1) to 2, then 0; reduce the other way.
      const bool railOfRoot = r % perHost == root % perHost;
      size_t expected = 0;
      switch (collective) {
        case Collective::kAllReduce:
          expected = 2 * (hostsCount - 1) * (count / n) * 4;
          break;
        case Collective::kAllGather:
        case Collective::kReduceScatter:
          expected = (hostsCount - 1) * bytes;
          break;
        case Collective::kBroadcast:
          expected = railOfRoot && hosts[r] != 0 ? bytes : 0;
          break;
        default:
          expected = railOfRoot && hosts[r] != 1 ? bytes : 0;
          break;
      }
      EXPECT_EQ(across, expected) << collectiveName(collective) << " rank " << r;
    }
  }
}

// The issue rule every runner shares (schedule.h): a step waits for exactly the steps in flight
// that write what it touches or touch what it writes, placed in the runner's own addresses.
TEST(IssueRuleTest, AStepWaitsOnlyForConflictingStepsStillInFlight) {
  auto step = [](StepKind kind, BufferId buffer, size_t offset, size_t bytes) {
    Step s;
    s.kind = kind;
    s.peer = 1;
    s.src = s.dst = Span{buffer, offset};
    s.bytes = bytes;
    return s;
  };
  struct Entry {
    PlacedStep<uint64_t> placed;
    bool done;
  };
  auto base = [](BufferId b) { return (static_cast<uint64_t>(b) + 1) << 48; };
  std::vector<Entry> inFlight{{placeStep<uint64_t>(step(StepKind::kSend, BufferId::kInput, 0, 64), base), false},
                              {placeStep<uint64_t>(step(StepKind::kRecv, BufferId::kOutput, 0, 64), base), false}};
  auto waits = [&](const Step& next) {
    return mustWait(placeStep<uint64_t>(next, base), inFlight,
                    [](const Entry& e) { return e.done ? nullptr : &e.placed; });
  };
  // Reading what a send reads: no wait. Writing it, or touching what a receive writes: wait.
  EXPECT_FALSE(waits(step(StepKind::kSend, BufferId::kInput, 0, 64)));
  EXPECT_TRUE(waits(step(StepKind::kRecv, BufferId::kInput, 32, 64)));
  EXPECT_TRUE(waits(step(StepKind::kSend, BufferId::kOutput, 63, 1)));
  // Ranges that only touch ends, or lie in another buffer at the same offsets: no wait.
  EXPECT_FALSE(waits(step(StepKind::kRecv, BufferId::kOutput, 64, 64)));
  EXPECT_FALSE(waits(step(StepKind::kRecv, BufferId::kScratch, 0, 64)));
  // A copy reads src and writes dst: it waits for the receive into its source.
  Step copy = step(StepKind::kCopy, BufferId::kOutput, 0, 16);
  copy.dst = Span{BufferId::kScratch, 0};
  EXPECT_TRUE(waits(copy));
  // Once the receive is done, nothing holds the copy (the send only reads the input).
  inFlight[1].done = true;
  EXPECT_FALSE(waits(copy));
  // Placed on real pointers, the same rule.
  char buffers[3][128];
  auto at = [&](BufferId b) -> const char* { return buffers[static_cast<int>(b)]; };
  const auto recv = placeStep<const char*>(step(StepKind::kRecv, BufferId::kOutput, 0, 64), at);
  EXPECT_TRUE(recv.conflictsWith(placeStep<const char*>(copy, at)));
  EXPECT_FALSE(recv.conflictsWith(placeStep<const char*>(step(StepKind::kSend, BufferId::kOutput, 64, 64), at)));
}

TEST(SimulatorTest, ReportsADeadlock) {
  // Two ranks that both receive before they send can never finish.
  std::vector<SimulatedRank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].input.assign(8, 0);
    ranks[r].output.assign(8, 0);
    ranks[r].schedule.steps = {recvStep(1 - r, at(BufferId::kOutput, 0), 4),
                               sendStep(1 - r, at(BufferId::kInput, 0), 4)};
    // The receive writes what the send reads: make them conflict so the send cannot go first.
    ranks[r].schedule.steps[1].src = at(BufferId::kOutput, 0);
  }
  const SimulationResult result = simulate(ranks, chorusInt32, chorusSum);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("deadlock"), std::string::npos) << result.error;
}

TEST(SimulatorTest, ReportsMismatchedSizes) {
  std::vector<SimulatedRank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].input.assign(16, 0);
    ranks[r].output.assign(16, 0);
  }
  ranks[0].schedule.steps = {sendStep(1, at(BufferId::kInput, 0), 8)};
  ranks[1].schedule.steps = {recvStep(0, at(BufferId::kOutput, 0), 4)};
  const SimulationResult result = simulate(ranks, chorusInt32, chorusSum);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("sends 8 bytes"), std::string::npos) << result.error;
}

// ---- Timing mode: closed-form times on simple models.

NetworkModel linksOnly(double alphaUs, double betaUsPerByte) {
  NetworkModel model;
  model.intraHost = {alphaUs, betaUsPerByte};
  model.interHost = {10 * alphaUs, 10 * betaUsPerByte};
  model.gammaUsPerByte = 0;
  model.copyUsPerByte = 0;
  return model;
}

std::vector<Schedule> handMade(std::vector<std::vector<Step>> steps) {
  std::vector<Schedule> schedules(steps.size());
  for (size_t r = 0; r < steps.size(); ++r) schedules[r].steps = std::move(steps[r]);
  return schedules;
}

TEST(TimingTest, OneMessageCostsAlphaPlusBytesTimesBeta) {
  const auto schedules = handMade({{sendStep(1, at(BufferId::kInput, 0), 1000)},  //
                                   {recvStep(0, at(BufferId::kOutput, 0), 1000)}});
  const TimingResult t = simulateTime(schedules, linksOnly(3, 0.01));
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_DOUBLE_EQ(t.timeUs, 3 + 1000 * 0.01);
  EXPECT_EQ(t.messages, 1u);
}

TEST(TimingTest, MessagesIntoOneRankQueueAtItsPort) {
  // Three ranks send to rank 0 at once: its incoming port carries them one after another.
  std::vector<std::vector<Step>> steps(4);
  for (int r = 1; r < 4; ++r) {
    steps[0].push_back(recvStep(r, at(BufferId::kOutput, 100 * r), 100));
    steps[r].push_back(sendStep(0, at(BufferId::kInput, 0), 100));
  }
  const TimingResult t = simulateTime(handMade(steps), linksOnly(2, 0.5));
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_DOUBLE_EQ(t.timeUs, 2 + 3 * 100 * 0.5);
}

TEST(TimingTest, RanksOfAHostShareItsNic) {
  // Two hosts of two ranks: 0 -> 2 and 1 -> 3 both cross, through one NIC per host.
  auto schedules = handMade({{sendStep(2, at(BufferId::kInput, 0), 100)},
                             {sendStep(3, at(BufferId::kInput, 0), 100)},
                             {recvStep(0, at(BufferId::kOutput, 0), 100)},
                             {recvStep(1, at(BufferId::kOutput, 0), 100)}});
  NetworkModel model = linksOnly(1, 0.1);
  model.ranksPerHost = 2;
  const TimingResult across = simulateTime(schedules, model);
  ASSERT_TRUE(across.ok) << across.error;
  EXPECT_DOUBLE_EQ(across.timeUs, 10 + 2 * 100 * 1.0);
  model.ranksPerHost = 4;  // one host: separate ports, no NIC
  const TimingResult within = simulateTime(schedules, model);
  EXPECT_DOUBLE_EQ(within.timeUs, 1 + 100 * 0.1);
}

TEST(TimingTest, RingAllReduceTakesTwoNMinusOneSteps) {
  for (int n : {2, 3, 4, 7, 16}) {
    ScheduleArgs args;
    args.collective = Collective::kAllReduce;
    args.algorithm = Algorithm::kRing;
    args.nranks = n;
    args.count = static_cast<size_t>(n) * 256;  // one 1 KiB chunk per block
    args.typeSize = 4;
    const ScheduleSet set = buildAllSchedules(args);
    ASSERT_TRUE(set.error.empty()) << set.error;
    const TimingResult t = simulateTime(set.schedules, linksOnly(5, 0.001));
    ASSERT_TRUE(t.ok) << t.error;
    EXPECT_NEAR(t.timeUs, 2 * (n - 1) * (5 + 1024 * 0.001), 1e-9) << n << " ranks";
    // A reduction cost adds one reduction per reduce-scatter step on the critical path.
    NetworkModel withGamma = linksOnly(5, 0.001);
    withGamma.gammaUsPerByte = 0.002;
    EXPECT_NEAR(simulateTime(set.schedules, withGamma).timeUs,
                2 * (n - 1) * (5 + 1024 * 0.001) + (n - 1) * 1024 * 0.002, 1e-9)
        << n << " ranks";
  }
}

TEST(TimingTest, SixteenThousandRanks) {
  // Recursive doubling: log2(n) rounds of the whole buffer, each after the last.
  const int n = 16384;
  ScheduleArgs args;
  args.collective = Collective::kAllReduce;
  args.algorithm = Algorithm::kRecursiveDoubling;
  args.nranks = n;
  args.count = 256;
  args.typeSize = 4;
  ScheduleSet set = buildAllSchedules(args);
  ASSERT_TRUE(set.error.empty()) << set.error;
  TimingResult t = simulateTime(set.schedules, linksOnly(2, 0.001));
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_NEAR(t.timeUs, 14 * (2 + 1024 * 0.001), 1e-9);
  EXPECT_EQ(t.messages, static_cast<size_t>(n) * 14);
  // The double binary tree at the same scale, across hosts of 8 ranks: it finishes, and no sooner
  // than a message up and down each tree's depth.
  args.algorithm = Algorithm::kTree;
  set = buildAllSchedules(args);
  ASSERT_TRUE(set.error.empty()) << set.error;
  NetworkModel hosts = linksOnly(2, 0.001);
  hosts.ranksPerHost = 8;
  t = simulateTime(set.schedules, hosts);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_GT(t.timeUs, 2 * 13 * 2.0);
  // The ring at this scale has about 10^9 steps in all, too many to hold: one rank stands for
  // all (every rank's schedule is rank 0's shifted), and the ring's 2(n-1) steps of one 4-byte
  // element each come out in closed form.
  args.algorithm = Algorithm::kRing;
  args.count = n;
  set = buildAllSchedules(args);
  ASSERT_TRUE(set.error.empty()) << set.error;
  EXPECT_EQ(set.schedules.size(), 1u);
  t = simulateTime(set.schedules, linksOnly(2, 0.001), set.nranks);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_NEAR(t.timeUs, 2 * (n - 1) * (2 + 4 * 0.001), 1e-6);
  EXPECT_EQ(t.messages, static_cast<size_t>(n) * 2 * (n - 1));
  // Pairwise all-to-all of one element per peer: every rank posts its n-1 sends at once, its port
  // sends them one after another, and the last lands alpha after the port is done.
  args.collective = Collective::kAllToAll;
  args.algorithm = Algorithm::kPairwise;
  args.count = 1;
  set = buildAllSchedules(args);
  ASSERT_TRUE(set.error.empty()) << set.error;
  EXPECT_EQ(set.schedules.size(), 1u);
  t = simulateTime(set.schedules, linksOnly(2, 0.001), set.nranks);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_NEAR(t.timeUs, 2 + (n - 1) * 4 * 0.001, 1e-6);
  EXPECT_EQ(t.messages, static_cast<size_t>(n) * (n - 1));
  args.collective = Collective::kAllReduce;
  // The tree's ranks are not shifted copies of each other: with too small a budget it is refused,
  // and the error says why.
  args.algorithm = Algorithm::kTree;
  set = buildAllSchedules(args, 0, 1000);
  EXPECT_TRUE(set.schedules.empty());
  EXPECT_NE(set.error.find("is not rank 0's shifted"), std::string::npos) << set.error;
}

// The timing simulator against each algorithm's closed form (the cost in its descriptor, which the
// tuner weighs), with no per-message overhead (the simulator has none), at the chunk the tuner
// picks, from 8 bytes per rank to 1 GiB.
//
// Uniform network: every pair of ranks alpha 5 us and 5 GB/s, reductions 4 GB/s, copies 10 GB/s.
// Every algorithm agrees to rounding, the pipelined double binary tree within 10% (15% at 16384
// ranks: the other tree's traffic meets the first chunk's climb on more of its 14 levels), except
// the pipelined reductions (chain and binomial reduce): their closed form charges a hop's transfer
// and reduction one after the other, while the simulator's ports run apart from the core, so a
// rank takes in the next chunk while it reduces this one. They lie between the two extremes: the
// closed form (nothing overlaps) and the larger of it without transfers and without reductions
// (all overlaps).
//
// Two levels: hosts of 8 ranks, alpha 2 us and 50 GB/s within a host, 10 us and 12.5 GB/s
// between. The hierarchical broadcast and reduce agree to rounding. The hierarchical all-reduce,
// all-gather and reduce-scatter are the sum of their two levels, which their schedules overlap
// (a chunk's host steps wait only for its own network steps): the simulator lies between the
// larger level and the sum. A flat algorithm's closed form prices its messages across hosts as
// the ranks that cross at once share their host's link (recursive doubling and halving,
// Rabenseifner, Bruck, pairwise all-to-all) or, where they cross one per host (rings, chains,
// binomial trees), at the network's prices: the simulator keeps a host's messages at local prices,
// so it lies between the closed form at local prices throughout and the closed form. The double
// binary tree's closed form prices every hop as sharing its host's link with all the host's
// ranks (heap-order trees cross hosts on nearly every edge): within 10% of it or below.
enum class Expect : uint8_t { kAgrees, kOverlapsReduction, kLevelsOverlap, kBetweenLevels, kSharedLink };

struct AgreementCase {
  Collective collective;
  Algorithm algorithm;
  int nranks;
  int perHost;  // 0: a uniform network
  size_t maxBytes;
};

void PrintTo(const AgreementCase& c, std::ostream* os) {
  *os << collectiveName(c.collective) << " " << algorithmName(c.algorithm) << " at " << c.nranks << " ranks"
      << (c.perHost > 0 ? ", 8 per host" : "");
}

bool pipelinedReduce(const AgreementCase& c) {
  return c.collective == Collective::kReduce &&
         (c.algorithm == Algorithm::kChain || c.algorithm == Algorithm::kBinomial);
}

Expect expectationFor(const AgreementCase& c) {
  if (c.perHost == 0) return pipelinedReduce(c) ? Expect::kOverlapsReduction : Expect::kAgrees;
  if (c.algorithm == Algorithm::kHierarchical) {
    const bool chains = c.collective == Collective::kBroadcast || c.collective == Collective::kReduce;
    return chains ? Expect::kAgrees : Expect::kLevelsOverlap;
  }
  return c.algorithm == Algorithm::kTree ? Expect::kSharedLink : Expect::kBetweenLevels;
}

class TimingAgreementTest : public ::testing::TestWithParam<AgreementCase> {};

TEST_P(TimingAgreementTest, TheSimulatorAgreesWithTheClosedForm) {
  const AgreementCase& c = GetParam();
  CostParams params;
  params.overheadUs = 0;
  NetworkModel model;
  model.intraHost = {params.alphaUs, params.betaUsPerByte};
  model.interHost = model.intraHost;
  if (c.perHost > 0) {
    model.ranksPerHost = c.perHost;
    model.intraHost = {2, 2e-5};
    model.interHost = {10, 8e-5};
    params.alphaUs = model.interHost.alphaUs;
    params.betaUsPerByte = model.interHost.betaUsPerByte;
    params.localAlphaUs = model.intraHost.alphaUs;
    params.localBetaUsPerByte = model.intraHost.betaUsPerByte;
    params.hosts = c.nranks / c.perHost;
  }
  model.gammaUsPerByte = params.gammaUsPerByte;
  model.copyUsPerByte = params.copyUsPerByte;
  std::vector<int> hosts(c.nranks);
  for (int r = 0; r < c.nranks; ++r) hosts[r] = c.perHost > 0 ? r / c.perHost : 0;
  const Expect expect = expectationFor(c);
  const size_t n = static_cast<size_t>(c.nranks);
  const size_t blocks = wholeElements(c.collective, 1, c.nranks);
  int checked = 0;
  for (size_t bytes : {8 * n, size_t{64} << 10, size_t{1} << 20, size_t{64} << 20, size_t{1} << 30}) {
    if (bytes > c.maxBytes || (c.nranks > 1024 && (bytes == size_t{64} << 10 || bytes == size_t{64} << 20))) continue;
    ScheduleArgs args;
    args.collective = c.collective;
    args.algorithm = c.algorithm;
    args.nranks = c.nranks;
    args.typeSize = 4;
    args.count = c.collective == Collective::kBarrier ? 0 : bytes / 4 / blocks;
    args.hosts = hosts.data();
    const size_t shown = args.count * blocks * 4;
    args.chunkBytes = chooseChunkBytes(c.collective, c.algorithm, c.nranks, shown, params);
    // Where a set that large is shifted copies (rings, recursive algorithms), one host stands for all.
    const ScheduleSet set = buildAllSchedules(args, c.perHost, 4'000'000);
    ASSERT_TRUE(set.error.empty()) << set.error;
    const TimingResult t = simulateTime(set.schedules, model, set.nranks);
    ASSERT_TRUE(t.ok) << t.error;
    auto formula = [&](const CostParams& p) {
      return formulaUs(c.collective, c.algorithm, c.nranks, shown, args.chunkBytes, p);
    };
    const double closed = formula(params);
    const std::string what = std::string(collectiveName(c.collective)) + " " + algorithmName(c.algorithm) + ", " +
                             std::to_string(c.nranks) + " ranks, " + std::to_string(shown) + " bytes, chunk " +
                             std::to_string(args.chunkBytes) + ": simulated " + std::to_string(t.timeUs) +
                             " us, closed form " + std::to_string(closed) + " us";
    ++checked;
    switch (expect) {
      case Expect::kAgrees: {
        const double tolerance = c.algorithm != Algorithm::kTree ? 0.01 : (c.nranks > 1024 ? 0.15 : 0.10);
        EXPECT_NEAR(t.timeUs / closed, 1.0, tolerance) << what;
        break;
      }
      case Expect::kOverlapsReduction: {
        CostParams noTransfer = params, noReduction = params;
        noTransfer.betaUsPerByte = 0;
        noReduction.gammaUsPerByte = 0;
        EXPECT_LE(t.timeUs, closed * 1.01) << what;
        EXPECT_GE(t.timeUs, std::max(formula(noTransfer), formula(noReduction)) * 0.99) << what;
        break;
      }
      case Expect::kLevelsOverlap: {
        CostParams networkOnly = params, hostOnly = params;
        networkOnly.localAlphaUs = networkOnly.localBetaUsPerByte = networkOnly.gammaUsPerByte = 0;
        hostOnly.alphaUs = hostOnly.betaUsPerByte = 0;
        EXPECT_LE(t.timeUs, closed * 1.01) << what;
        EXPECT_GE(t.timeUs, std::max(formula(networkOnly), formula(hostOnly)) * 0.99) << what;
        break;
      }
      case Expect::kBetweenLevels:
      case Expect::kSharedLink: {
        CostParams local = params;
        local.hosts = 1;
        local.alphaUs = params.localAlphaUs;
        local.betaUsPerByte = params.localBetaUsPerByte;
        EXPECT_LE(t.timeUs, closed * (expect == Expect::kSharedLink ? 1.10 : 1.01)) << what;
        double lowest = formula(local);
        if (pipelinedReduce(c)) {  // its transfers and reductions may overlap too (above)
          CostParams noTransfer = local, noReduction = local;
          noTransfer.betaUsPerByte = 0;
          noReduction.gammaUsPerByte = 0;
          lowest = std::max(formula(noTransfer), formula(noReduction));
        }
        EXPECT_GE(t.timeUs, lowest * 0.99) << what;
        break;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

std::vector<AgreementCase> agreementCases() {
  std::vector<AgreementCase> cases;
  constexpr size_t kAll = size_t{1} << 30;
  constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter,
                                         Collective::kBroadcast, Collective::kReduce,    Collective::kAllToAll,
                                         Collective::kGather,    Collective::kScatter,   Collective::kBarrier};
  for (int perHost : {0, 8}) {
    for (int n : {64, 1024}) {
      for (Collective collective : kCollectives) {
        for (Algorithm algorithm : algorithmsFor(collective)) {
          // The direct algorithm maps every rank's buffers (one host; the simulator does not
          // model it); hierarchical ones need several hosts.
          if (algorithm == Algorithm::kDirect || (algorithm == Algorithm::kHierarchical && perHost == 0)) continue;
          // All-to-all at 1024 ranks: Bruck's 11.5 million steps are not shifted copies; the
          // pairwise one's million messages take a minute even at 8 KiB (64 ranks cover both).
          if (n == 1024 && collective == Collective::kAllToAll) continue;
          size_t most = kAll;
          // Whole schedules too large to simulate in seconds (not shifted copies of one another:
          // rooted trees and chains, the double binary tree).
          if (n == 1024 && (collective == Collective::kReduce || collective == Collective::kBroadcast ||
                            algorithm == Algorithm::kTree)) {
            most = size_t{1} << 20;
          }
          if (n == 1024 && perHost > 0 && algorithm == Algorithm::kTree) most = size_t{64} << 10;
          cases.push_back({collective, algorithm, n, perHost, most});
        }
      }
    }
  }
  // 16384 ranks, uniform: the all-reduce algorithms (the tree to 1 MiB), and the algorithms of
  // all-gather and reduce-scatter whose ranks are shifted copies (recursive doubling's all-gather
  // pairs ranks by xor: not shifts).
  for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kRabenseifner}) {
    cases.push_back({Collective::kAllReduce, a, 16384, 0, kAll});
  }
  cases.push_back({Collective::kAllReduce, Algorithm::kTree, 16384, 0, size_t{1} << 20});
  for (Algorithm a : {Algorithm::kRing, Algorithm::kBruck}) {
    cases.push_back({Collective::kAllGather, a, 16384, 0, kAll});
  }
  for (Algorithm a : {Algorithm::kRing, Algorithm::kRecursiveHalving}) {
    cases.push_back({Collective::kReduceScatter, a, 16384, 0, kAll});
  }
  // The rooted algorithms and the barrier at 16384 ranks, simulated whole (their ranks are not
  // shifted copies), at 8 bytes per rank; not those with a ring phase (scatter + all-gather,
  // reduce-scatter + gather: n-1 steps a rank, 268 million in all).
  for (Collective collective :
       {Collective::kBroadcast, Collective::kReduce, Collective::kGather, Collective::kScatter, Collective::kBarrier}) {
    for (Algorithm a : algorithmsFor(collective)) {
      if (a == Algorithm::kDirect || a == Algorithm::kHierarchical || a == Algorithm::kScatterAllGather ||
          a == Algorithm::kReduceScatterGather) {
        continue;
      }
      cases.push_back({collective, a, 16384, 0, 8 * 16384});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Algorithms, TimingAgreementTest, ::testing::ValuesIn(agreementCases()),
                         [](const ::testing::TestParamInfo<AgreementCase>& info) {
                           return std::string(collectiveName(info.param.collective)) + "_" +
                                  algorithmName(info.param.algorithm) + "_" + std::to_string(info.param.nranks) +
                                  (info.param.perHost > 0 ? "_hosts" : "");
                         });

// Runs args both ways, every rank and one host standing for all (forced by a small budget), and
// expects the same time and message count.
void expectStandInsAgree(ScheduleArgs args, const NetworkModel& model) {
  const ScheduleSet all = buildAllSchedules(args, model.ranksPerHost);
  ASSERT_TRUE(all.error.empty()) << all.error;
  ASSERT_EQ(all.schedules.size(), static_cast<size_t>(args.nranks));
  const ScheduleSet host = buildAllSchedules(args, model.ranksPerHost, all.schedules[0].steps.size() * 8);
  ASSERT_TRUE(host.error.empty()) << host.error;
  ASSERT_EQ(host.schedules.size(), static_cast<size_t>(std::max(model.ranksPerHost, 1)));
  const TimingResult whole = simulateTime(all.schedules, model);
  const TimingResult standIn = simulateTime(host.schedules, model, host.nranks);
  ASSERT_TRUE(whole.ok) << whole.error;
  ASSERT_TRUE(standIn.ok) << standIn.error;
  EXPECT_NEAR(standIn.timeUs, whole.timeUs, 1e-9 * whole.timeUs)
      << algorithmName(args.algorithm) << " " << collectiveName(args.collective) << ", " << model.ranksPerHost
      << " ranks per host";
  EXPECT_EQ(standIn.messages, whole.messages);
  EXPECT_EQ(standIn.steps, whole.steps);
}

TEST(TimingTest, OneHostStandsForAllAndPredictsTheSameTimes) {
  NetworkModel model = linksOnly(3, 0.002);
  model.gammaUsPerByte = 0.001;
  model.copyUsPerByte = 0.0005;
  const int n = 24;
  struct Case {
    Collective collective;
    Algorithm algorithm;
    size_t count;
  };
  for (const Case& c :
       {Case{Collective::kAllReduce, Algorithm::kRing, n * 700}, Case{Collective::kAllGather, Algorithm::kRing, 500},
        Case{Collective::kReduceScatter, Algorithm::kRing, 300}, Case{Collective::kAllToAll, Algorithm::kPairwise, 200},
        Case{Collective::kBarrier, Algorithm::kDissemination, 0}}) {
    for (int perHost : {0, 4, 6}) {
      ScheduleArgs args;
      args.collective = c.collective;
      args.algorithm = c.algorithm;
      args.nranks = n;
      args.count = c.count;
      args.typeSize = 4;
      args.chunkBytes = 1024;
      model.ranksPerHost = perHost;
      expectStandInsAgree(args, model);
    }
  }
}

TEST(TimingTest, ShiftedCopiesAreCheckedStepByStep) {
  ScheduleArgs args;
  args.collective = Collective::kAllReduce;
  args.algorithm = Algorithm::kRing;
  args.nranks = 8;
  args.count = 8 * 100;
  args.typeSize = 4;
  const Schedule zero = buildSchedule(args);
  args.rank = 3;
  const Schedule three = buildSchedule(args);
  std::string why;
  EXPECT_TRUE(isShiftedCopy(zero, three, 3, 8, &why)) << why;
  EXPECT_FALSE(isShiftedCopy(zero, three, 2, 8, &why));
  EXPECT_NE(why.find("peer"), std::string::npos) << why;
  // Unequal blocks (count not a multiple of the ranks): some rank sends a different size.
  args.count = 8 * 100 + 3;
  args.rank = 0;
  const Schedule unevenZero = buildSchedule(args);
  args.rank = 5;
  EXPECT_FALSE(isShiftedCopy(unevenZero, buildSchedule(args), 5, 8, &why));
  EXPECT_NE(why.find("bytes"), std::string::npos) << why;
  // Byte ranges renamed inconsistently: two steps on one range in rank 0, on two ranges in the other.
  Schedule a, b;
  a.steps = {copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), 8),
             copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 8), 8)};
  b.steps = {copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), 8),
             copyStep(at(BufferId::kInput, 16), at(BufferId::kOutput, 8), 8)};
  EXPECT_FALSE(isShiftedCopy(a, b, 0, 1, &why));
  EXPECT_NE(why.find("maps byte ranges differently"), std::string::npos) << why;
  // Renamed one to one, but the ranges overlap where the originals did not: the second copy
  // would wait for the first in one rank and not in the other.
  b.steps = {copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 0), 8),
             copyStep(at(BufferId::kInput, 0), at(BufferId::kOutput, 4), 8)};
  EXPECT_FALSE(isShiftedCopy(a, b, 0, 1, &why));
  EXPECT_NE(why.find("overlap differently"), std::string::npos) << why;
}

TEST(TimingTest, ReportsAStepThatCanNeverRun) {
  // Rank 0 waits for a message rank 1 never sends.
  const auto schedules = handMade({{recvStep(1, at(BufferId::kOutput, 0), 4),  //
                                    copyStep(at(BufferId::kOutput, 0), at(BufferId::kScratch, 0), 4)},
                                   {}});
  const TimingResult t = simulateTime(schedules, linksOnly(1, 1));
  EXPECT_FALSE(t.ok);
  EXPECT_NE(t.error.find("rank 0 at step 1"), std::string::npos) << t.error;
}

TEST(ScheduleShapeTest, RingAllReduceSendsTwiceNMinusOneOverNOfTheBuffer) {
  // Bandwidth optimality: each rank sends 2(n-1)/n of the data (up to block rounding).
  const int n = 8;
  const size_t count = 8000;
  const Schedule s = ringAllReduce({Collective::kAllReduce, n, 3, count, 4, 0, false, 4096});
  size_t sent = 0;
  for (const Step& step : s.steps) sent += step.kind == StepKind::kSend ? step.bytes : 0;
  EXPECT_EQ(sent, 2 * (n - 1) * (count / n) * 4);
}

TEST(AlgorithmTest, CommaListsSplitKeepingEmptyItems) {
  EXPECT_EQ(splitCommas("a,,b"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(splitCommas(""), (std::vector<std::string>{""}));
  EXPECT_EQ(splitCommas("ring,"), (std::vector<std::string>{"ring", ""}));
}

TEST(AlgorithmTest, RankOrdersParseAndBadOnesAreNamed) {
  EXPECT_EQ(parseRankOrder("2,0,1"), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(parseRankOrder("0"), (std::vector<int>{0}));
  auto error = [](const std::string& text) {
    try {
      parseRankOrder(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("0,1,1").find("rank 1 appears at positions 1 and 2"), std::string::npos) << error("0,1,1");
  EXPECT_NE(error("0,3,1").find("rank 3 at position 1 is out of range for an order of 3 ranks"), std::string::npos);
  EXPECT_NE(error("0,x,1").find("'x' at position 1 is not a rank number"), std::string::npos);
  EXPECT_NE(error("0,,1").find("'' at position 1"), std::string::npos);
  EXPECT_NE(error("0,-1").find("'-1'"), std::string::npos);
  EXPECT_NE(error("1.5").find("'1.5'"), std::string::npos);
}

TEST(AlgorithmTest, OverridesParseAndRejectWhatDoesNotApply) {
  const AlgorithmOverrides o = parseAlgorithmOverrides("allreduce:rabenseifner,allgather:bruck,,broadcast:binomial");
  EXPECT_EQ(o[static_cast<int>(Collective::kAllReduce)], Algorithm::kRabenseifner);
  EXPECT_EQ(o[static_cast<int>(Collective::kAllGather)], Algorithm::kBruck);
  EXPECT_FALSE(o[static_cast<int>(Collective::kReduce)].has_value());
  EXPECT_EQ(parseAlgorithmOverrides("allreduce:rd")[0], Algorithm::kRecursiveDoubling);
  // "default" names a collective without naming reduce, whose name it contains.
  const AlgorithmOverrides d = parseAlgorithmOverrides("allreduce:default");
  EXPECT_EQ(d[static_cast<int>(Collective::kAllReduce)], Algorithm::kDefault);
  EXPECT_FALSE(d[static_cast<int>(Collective::kReduce)].has_value());
  EXPECT_THROW(parseAlgorithmOverrides("allreduce:bruck"), std::invalid_argument);
  EXPECT_THROW(parseAlgorithmOverrides("allreduce"), std::invalid_argument);
  EXPECT_THROW(parseAlgorithmOverrides("nosuch:ring"), std::invalid_argument);
  try {
    parseAlgorithmOverrides("gather:ring");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("it has: binomial"), std::string::npos) << e.what();
  }
}

// The device engine's algorithms are rows of the same table: which collectives each takes, in the
// engine's order of preference. CHORUS_ALGO takes them as it takes the host's; each engine follows
// only its own (direct is both).
TEST(AlgorithmTest, DeviceAlgorithmsAreRowsOfTheOneTable) {
  auto names = [](const std::vector<Algorithm>& list) {
    std::string text;
    for (Algorithm a : list) text += std::string(text.empty() ? "" : ",") + algorithmName(a);
    return text;
  };
  const std::string ring = "direct,ipc,staged", blocks = "direct,staged", other = "staged";
  const std::pair<Collective, std::string> expected[] = {
      {Collective::kAllReduce, ring}, {Collective::kAllGather, ring}, {Collective::kReduceScatter, ring},
      {Collective::kBroadcast, ring}, {Collective::kReduce, ring},    {Collective::kAllToAll, blocks},
      {Collective::kGather, blocks},  {Collective::kScatter, blocks}, {Collective::kAllToAllv, other},
      {Collective::kSend, other},     {Collective::kRecv, other},     {Collective::kBarrier, other}};
  for (const auto& [collective, list] : expected) {
    EXPECT_EQ(names(deviceAlgorithmsFor(collective)), list) << collectiveName(collective);
    // direct takes exactly the collectives whose ranks read fixed blocks of each other's inputs.
    const CollectiveTraits& t = traitsOf(collective);
    EXPECT_EQ(runsOnDevice(Algorithm::kDirect, collective),
              !t.pointToPoint && t.input != Extent::kNone && t.input != Extent::kVector)
        << collectiveName(collective);
    // Device algorithms are not the host's: its lists, its default and its builder never see them.
    for (Algorithm a : {Algorithm::kIpc, Algorithm::kStaged}) {
      EXPECT_FALSE(runsOnHost(a, collective));
      EXPECT_EQ(descriptorOf(collective, a), nullptr);
    }
    for (Algorithm a : algorithmsFor(collective)) EXPECT_NE(descriptorOf(collective, a), nullptr);
  }
  EXPECT_TRUE(runsOnHost(Algorithm::kDirect, Collective::kAllReduce));
  EXPECT_FALSE(runsOnHost(Algorithm::kDirect, Collective::kBroadcast));
  EXPECT_TRUE(runsOnDevice(Algorithm::kDirect, Collective::kBroadcast));
  EXPECT_FALSE(runsOnDevice(Algorithm::kRing, Collective::kAllReduce));
  const AlgorithmOverrides o = parseAlgorithmOverrides("allreduce:ipc,broadcast:direct,alltoallv:staged");
  EXPECT_EQ(o[static_cast<int>(Collective::kAllReduce)], Algorithm::kIpc);
  EXPECT_EQ(o[static_cast<int>(Collective::kBroadcast)], Algorithm::kDirect);
  EXPECT_EQ(o[static_cast<int>(Collective::kAllToAllv)], Algorithm::kStaged);
  ScheduleArgs args;
  args.collective = Collective::kAllReduce;
  args.algorithm = Algorithm::kIpc;
  EXPECT_THROW(buildSchedule(args), std::invalid_argument);
  try {
    parseAlgorithmOverrides("alltoallv:ipc");
    ADD_FAILURE() << "alltoallv:ipc was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("it has: pairwise; on device buffers: staged"), std::string::npos) << e.what();
  }
}

constexpr uint64_t kSeed = 0x5eed;

// A reduction (all-reduce, reduce-scatter, reduce) of pattern::unorderedInput simulated on every
// rank: its elements whose bits differ from the rank-order fold (a reduce-scatter's rank r holds
// block r; a reduce's root is c.root), or 1 with *error set where the simulation failed.
size_t wrongElements(const Case& c, std::string* error) {
  const int n = c.n;
  const size_t size = kernels::typeSize(c.type);
  const bool scatter = c.collective == Collective::kReduceScatter;
  const size_t inCount = scatter ? c.count * n : c.count;
  std::vector<SimulatedRank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ScheduleArgs args{c.collective, n, r, c.count, size, c.root, c.op == chorusAvg, c.chunkBytes, c.algorithm};
    args.order = c.order;
    args.hosts = c.hosts;
    args.deterministic = c.deterministic;
    SimulatedRank& rank = ranks[r];
    rank.schedule = buildSchedule(args);
    rank.input.assign(inCount * size, 0);
    rank.output.assign(inCount * size, 0);
    char* in = rank.input.data();
    if (c.inPlace) {
      rank.inPlace = true;
      if (scatter) rank.outputOffset = r * c.count * size;
      in = rank.output.data();
    }
    for (size_t i = 0; i < inCount; ++i)
      pattern::store(in, i, c.type, pattern::unorderedInput(c.op, c.type, r, i, kSeed));
  }
  const SimulationResult result = simulate(ranks, c.type, c.op);
  if (!result.ok) {
    *error = result.error;
    return 1;
  }
  size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    if (c.collective == Collective::kReduce && r != c.root) continue;
    const char* out = ranks[r].output.data() + (c.inPlace ? ranks[r].outputOffset : 0);
    const size_t first = scatter ? r * c.count : 0;
    wrong += pattern::countWrong(out, c.count, c.type,
                                 [&](size_t i) { return pattern::rankOrderFold(c.op, c.type, n, first + i, kSeed); });
  }
  return wrong;
}

TEST(DeterministicTest, ReductionsFoldInRankOrderWhateverTheAlgorithmChunkOrderOrHosts) {
  // CHORUS_DETERMINISTIC: every algorithm of every reduction, every chunk size, rank order and
  // host layout gives every rank the rank-order fold, bit for bit, on inputs whose sums round
  // differently in other orders; in place too, and Avg divided once.
  const std::pair<chorusDataType_t, chorusRedOp_t> kinds[] = {{chorusFloat32, chorusSum},  {chorusFloat16, chorusSum},
                                                              {chorusBfloat16, chorusAvg}, {chorusFloat64, chorusProd},
                                                              {chorusInt8, chorusSum},     {chorusFloat32, chorusMax}};
  for (int n : {1, 2, 3, 4, 5, 7, 8, 12}) {
    std::vector<int> reversed(n), pairs(n);
    for (int i = 0; i < n; ++i) reversed[i] = n - 1 - i, pairs[i] = i / 2;
    for (const int* order : {static_cast<const int*>(nullptr), static_cast<const int*>(reversed.data())}) {
      for (const int* hosts : {static_cast<const int*>(nullptr), static_cast<const int*>(pairs.data())}) {
        if ((order != nullptr && n < 3) || (hosts != nullptr && n % 2 != 0)) continue;
        for (Collective collective : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kReduce}) {
          int variant = 0;
          for (Algorithm algorithm : algorithmsFor(collective)) {
            for (size_t chunkBytes : {size_t{8}, size_t{96}, size_t{512 * 1024}}) {
              for (const auto& [type, op] : kinds) {
                for (size_t count : {size_t{37}, size_t{1000}}) {
                  Case c{collective,         algorithm, n,          count, type, op,
                         ++variant % 2 == 0, n - 1,     chunkBytes, order, hosts};
                  c.deterministic = true;
                  std::string error;
                  ASSERT_EQ(wrongElements(c, &error), 0u) << describe(c) << " " << error;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(DeterministicTest, WithoutItTheRingAddsInAnotherOrder) {
  // The inputs are chosen so order shows: the ring's float32 all-reduce, which adds each block
  // starting from another rank, differs from the rank-order fold (the check above could fail), and
  // the same call with the flag set does not.
  Case c{Collective::kAllReduce, Algorithm::kRing, 5, 1000, chorusFloat32, chorusSum, false, 0, 4096};
  std::string error;
  EXPECT_GT(wrongElements(c, &error), 100u) << error;
  c.deterministic = true;
  EXPECT_EQ(wrongElements(c, &error), 0u) << error;
  ScheduleArgs args{Collective::kAllReduce, 5, 0, 1000, 4, 0, false, 4096, Algorithm::kRing};
  args.deterministic = true;
  EXPECT_STREQ(buildSchedule(args).algorithm, "ordered");
  args.algorithm = Algorithm::kDirect;
  EXPECT_STREQ(buildSchedule(args).algorithm, "direct");  // folds in rank order already
}

}  // namespace
}  // namespace chorus::collectives
