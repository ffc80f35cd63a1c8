// kill_test.cc: kill -9 of a random rank at a random moment of a run of random collectives, on
// real forked ranks, over and over (CHORUS_KILL_TRIALS, default 100; CHORUS_KILL_SEED repeats a
// run). Every survivor's call must end with chorusRemoteError naming the dead rank within twice
// the timeout, and nothing may hang (the harness kills what is left at its deadline); then the
// survivors shrink the communicator to themselves and all-reduce over the new one.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using testing::runProcesses;

constexpr int kMaxRanks = 5;
constexpr int kTimeoutMs = 5000;

// What one rank of a trial reports, in memory shared with the test.
struct Outcome {
  std::atomic<int64_t> errorNs{0};
  std::atomic<int> result{-1};
  int callsDone = 0;
  int64_t shrunkSum = -1;  // an all-reduce of the old ranks over the survivors' new communicator
  char message[1024] = {};
};
struct Trial {
  std::atomic<int> ready{0};
  std::atomic<int64_t> killNs{0};
  Outcome outcomes[kMaxRanks];
};

struct Plan {
  const char* transport;
  int nranks;
  int victim;
  int delayUs;        // after every rank is ready
  bool shareable;     // buffers from chorusMemAlloc (the direct path) or the heap
  uint32_t callSeed;  // the same on every rank: they call the same collectives
};

// Calls random collectives until one fails (or 60 s pass); the values of completed all-reduces
// are checked. Returns the failing call's result.
chorusResult_t callUntilFailure(chorusComm_t comm, int rank, const Plan& plan, Outcome& outcome) {
  constexpr size_t kMaxCount = 1 << 18;
  const size_t n = static_cast<size_t>(plan.nranks);
  float* send = nullptr;
  float* recv = nullptr;
  const size_t bytes = kMaxCount * n * sizeof(float);
  if (plan.shareable) {
    if (chorusMemAlloc(reinterpret_cast<void**>(&send), bytes) != chorusSuccess ||
        chorusMemAlloc(reinterpret_cast<void**>(&recv), bytes) != chorusSuccess) {
      ADD_FAILURE() << "chorusMemAlloc: " << chorusGetLastError(nullptr);
      return chorusSystemError;
    }
  } else {
    send = static_cast<float*>(std::malloc(bytes));
    recv = static_cast<float*>(std::malloc(bytes));
  }
  std::fill(send, send + kMaxCount * n, 1.0f);
  std::mt19937 pick(plan.callSeed);
  const size_t counts[] = {0, 1, 7, 1000, 4096, 65536, kMaxCount};
  const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  chorusResult_t result = chorusSuccess;
  while (result == chorusSuccess && std::chrono::steady_clock::now() < giveUp) {
    const size_t count = counts[pick() % std::size(counts)];
    const int root = static_cast<int>(pick() % n);
    switch (pick() % 7) {
      case 0:
        result = chorusAllReduce(send, recv, count, chorusFloat32, chorusSum, comm, nullptr);
        if (result == chorusSuccess && count > 0 && (recv[0] != plan.nranks || recv[count - 1] != plan.nranks)) {
          ADD_FAILURE() << "rank " << rank << ": all-reduce of " << count << " gave " << recv[0];
        }
        break;
      case 1:
        result = chorusAllGather(send, recv, count, chorusFloat32, comm, nullptr);
        break;
      case 2:
        result = chorusReduceScatter(send, recv, count, chorusFloat32, chorusMax, comm, nullptr);
        break;
      case 3:
        result = chorusBroadcast(send, recv, count, chorusFloat32, root, comm, nullptr);
        break;
      case 4:
        result = chorusAllToAll(send, recv, count, chorusFloat32, comm, nullptr);
        break;
      case 5: {
        chorusRequest_t request = nullptr;
        result = chorusIAllReduce(send, recv, count, chorusFloat32, chorusSum, comm, &request);
        if (result == chorusSuccess) result = chorusWait(&request);
        break;
      }
      default:
        result = chorusBarrier(comm, nullptr);
        break;
    }
    if (result == chorusSuccess) ++outcome.callsDone;
  }
  return result;
}

TEST(RankFailureTest, KillNineOfARandomRankAtARandomMomentOfRandomCollectives) {
  const char* trialsText = std::getenv("CHORUS_KILL_TRIALS");
  const int trials = trialsText != nullptr ? std::atoi(trialsText) : 100;
  const char* seedText = std::getenv("CHORUS_KILL_SEED");
  const uint32_t seed =
      seedText != nullptr ? static_cast<uint32_t>(std::strtoul(seedText, nullptr, 10)) : std::random_device{}();
  std::printf("%d trials, CHORUS_KILL_SEED=%u\n", trials, seed);
  std::mt19937 pick(seed);
  testing::SharedWithRanks<Trial> shared;

  constexpr const char* kTransports[] = {"shm", "tcp", "ucx"};
  std::vector<double> seconds[3];  // survivors' time from the kill to their error, by transport
  int survivors = 0;
  for (int t = 0; t < trials && !HasFailure(); ++t) {
    Plan plan;
    plan.transport = kTransports[t % 3];
    if (!chorus::testing::transportBuilt(plan.transport)) plan.transport = kTransports[t % 2];  // a build without UCX
    plan.nranks = 2 + static_cast<int>(pick() % (kMaxRanks - 1));
    plan.victim = static_cast<int>(pick() % static_cast<uint32_t>(plan.nranks));
    plan.delayUs = static_cast<int>(pick() % 100000);
    plan.shareable = pick() % 2 == 0;
    plan.callSeed = static_cast<uint32_t>(pick());
    shared.reset();
    Trial* trial = &*shared;
    const std::string what = "trial " + std::to_string(t) + " (" + plan.transport + ", " + std::to_string(plan.nranks) +
                             " ranks, rank " + std::to_string(plan.victim) + " killed " + std::to_string(plan.delayUs) +
                             " us in, " + (plan.shareable ? "chorusMemAlloc" : "heap") + " buffers)";
    const auto codes = runProcesses(
        plan.nranks,
        [&](int rank, const chorusUniqueId& id) {
          chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
          config.transport = plan.transport;
          config.timeoutMs = kTimeoutMs;
          chorusComm_t comm = nullptr;
          ASSERT_EQ(chorusCommInitRankConfig(&comm, plan.nranks, id, rank, &config), chorusSuccess)
              << chorusGetLastError(nullptr);
          trial->ready.fetch_add(1);
          while (trial->ready.load() < plan.nranks) std::this_thread::sleep_for(std::chrono::microseconds(200));
          if (rank == plan.victim) {
            std::thread([&] {
              std::this_thread::sleep_for(std::chrono::microseconds(plan.delayUs));
              trial->killNs = testing::monotonicNs();
              kill(getpid(), SIGKILL);
            }).detach();
          }
          Outcome& outcome = trial->outcomes[rank];
          const chorusResult_t result = callUntilFailure(comm, rank, plan, outcome);
          outcome.errorNs = testing::monotonicNs();
          std::snprintf(outcome.message, sizeof(outcome.message), "%s", chorusGetLastError(nullptr));
          outcome.result = result;
          // The survivors go on without the dead rank: a communicator of their own that works.
          chorusComm_t shrunk = nullptr;
          ASSERT_EQ(chorusCommShrink(comm, &plan.victim, 1, &shrunk, nullptr), chorusSuccess)
              << chorusGetLastError(nullptr);
          int64_t value = rank, sum = -1;
          ASSERT_EQ(chorusAllReduce(&value, &sum, 1, chorusInt64, chorusSum, shrunk, nullptr), chorusSuccess)
              << chorusGetLastError(shrunk);
          outcome.shrunkSum = sum;
          chorusCommDestroy(shrunk);
          chorusCommAbort(comm);
        },
        120);
    for (int rank = 0; rank < plan.nranks; ++rank) {
      if (rank == plan.victim) {
        EXPECT_EQ(codes[rank], 128 + SIGKILL) << what << ": the victim was not killed";
        continue;
      }
      const Outcome& outcome = trial->outcomes[rank];
      EXPECT_EQ(codes[rank], 0) << what << ": rank " << rank << (codes[rank] == 124 ? " hung" : " failed");
      EXPECT_EQ(outcome.result.load(), chorusRemoteError) << what << ": rank " << rank << ": " << outcome.message;
      const std::string named = "rank " + std::to_string(plan.victim) + " has exited";
      EXPECT_NE(std::string(outcome.message).find(named), std::string::npos)
          << what << ": rank " << rank << " does not name the dead rank: " << outcome.message;
      EXPECT_EQ(outcome.shrunkSum, plan.nranks * (plan.nranks - 1) / 2 - plan.victim) << what << ": rank " << rank;
      const double took = static_cast<double>(outcome.errorNs.load() - trial->killNs.load()) * 1e-9;
      EXPECT_LE(took, 2 * kTimeoutMs * 1e-3) << what << ": rank " << rank << ": " << outcome.message;
      seconds[t % 3].push_back(took);
      ++survivors;
    }
  }
  for (int k = 0; k < 3; ++k) {
    std::vector<double>& s = seconds[k];
    if (s.empty()) continue;
    std::sort(s.begin(), s.end());
    std::printf("%s: %zu survivors: time from the kill to their error: median %.3f s, max %.3f s (timeout %.1f s)\n",
                kTransports[k], s.size(), s[s.size() / 2], s.back(), kTimeoutMs * 1e-3);
  }
  std::printf("%d kills, %d survivors, every one told and on a shrunk communicator\n", trials, survivors);
}

}  // namespace
}  // namespace chorus
