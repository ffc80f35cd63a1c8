// grow_test.cc: chorusCommGrow (ncclCommGrow) on forked processes: new ranks join a live
// communicator with a grow id from it and the grown one's collectives are right, the parent goes
// on; the elastic cycle end to end (a rank killed, the survivors shrink, a spare process grows the
// job back to its size); and bad calls refused with what is wrong.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chorus/chorus.hpp>
#include <chrono>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

void expectAllZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "process " << r;
}

chorusComm_t initOrDie(const chorusUniqueId& id, int nranks, int rank, const char* transport) {
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  config.transport = transport;
  config.timeoutMs = 30000;
  chorusComm_t comm = nullptr;
  EXPECT_EQ(chorusCommInitRankConfig(&comm, nranks, id, rank, &config), chorusSuccess) << chorusGetLastError(nullptr);
  return comm;
}

// A grow id handed from the rank that made it to processes outside the communicator.
struct Handover {
  std::atomic<int> ready{0};
  chorusUniqueId id{};
};

// The grown communicator is right: its size, this rank's number, an all-reduce of the numbers and
// an all-gather that puts each rank's number in its place.
void checkGrown(chorusComm_t grown, int nranks, int rank) {
  int count = 0, number = -1;
  ASSERT_EQ(chorusCommCount(grown, &count), chorusSuccess);
  ASSERT_EQ(chorusCommUserRank(grown, &number), chorusSuccess);
  EXPECT_EQ(count, nranks);
  EXPECT_EQ(number, rank);
  std::vector<int64_t> values(3000, rank + 1), sums(3000, -1);
  ASSERT_EQ(chorusAllReduce(values.data(), sums.data(), values.size(), chorusInt64, chorusSum, grown, nullptr),
            chorusSuccess)
      << chorusGetLastError(grown);
  EXPECT_EQ(sums.front(), nranks * (nranks + 1) / 2);
  EXPECT_EQ(sums.back(), nranks * (nranks + 1) / 2);
  int32_t mine = rank * 7;
  std::vector<int32_t> all(static_cast<size_t>(nranks), -1);
  ASSERT_EQ(chorusAllGather(&mine, all.data(), 1, chorusInt32, grown, nullptr), chorusSuccess)
      << chorusGetLastError(grown);
  for (int r = 0; r < nranks; ++r) EXPECT_EQ(all[r], r * 7) << "rank " << rank << " sees rank " << r;
}

class GrowTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GrowTest, NewRanksJoinALiveCommunicatorAndItsRanksKeepTheirNumbers) {
  // Processes 0-2 make a communicator; 3 and 4 join it: rank 0 makes the grow id, broadcasts it to
  // ranks 1 and 2 over the communicator and hands it to the new processes; the parent still works.
  const char* transport = GetParam();
  SharedWithRanks<Handover> handover;
  expectAllZero(runProcesses(
      5,
      [&](int process, const chorusUniqueId& id) {
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.transport = transport;
        if (process >= 3) {
          while (handover->ready.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          chorusComm_t grown = nullptr;
          ASSERT_EQ(chorusCommGrow(nullptr, 5, &handover->id, process, &grown, &config), chorusSuccess)
              << chorusGetLastError(nullptr);
          checkGrown(grown, 5, process);
          chorusCommDestroy(grown);
          return;
        }
        chorusComm_t comm = initOrDie(id, 3, process, transport);
        chorusUniqueId growId{};
        if (process == 0) {
          ASSERT_EQ(chorusCommGetUniqueId(comm, &growId), chorusSuccess) << chorusGetLastError(comm);
          handover->id = growId;
          handover->ready.store(1);
        }
        ASSERT_EQ(chorusBroadcast(&growId, &growId, sizeof(growId), chorusUint8, 0, comm, nullptr), chorusSuccess)
            << chorusGetLastError(comm);
        chorusComm_t grown = nullptr;
        ASSERT_EQ(chorusCommGrow(comm, 5, &growId, -1, &grown, nullptr), chorusSuccess) << chorusGetLastError(comm);
        checkGrown(grown, 5, process);
        int32_t one = 1, three = 0;
        ASSERT_EQ(chorusAllReduce(&one, &three, 1, chorusInt32, chorusSum, comm, nullptr), chorusSuccess)
            << chorusGetLastError(comm);
        EXPECT_EQ(three, 3) << "the parent after the grow";
        chorusCommDestroy(grown);
        chorusCommDestroy(comm);
      },
      120));
}

TEST_P(GrowTest, TheElasticCycleLoseARankShrinkGrowBack) {
  // Four ranks and a spare process. Rank 2 dies (SIGKILL); the survivors' all-reduce fails naming
  // it; they shrink to three (ranks 0, 1, 3 become 0, 1, 2) and grow back to four with the spare as
  // rank 3, then train on (an all-reduce and an all-gather over the four) with the C++ API.
  const char* transport = GetParam();
  SharedWithRanks<Handover> handover;
  const std::vector<int> codes = runProcesses(
      5,
      [&](int process, const chorusUniqueId& id) {
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.transport = transport;
        config.timeoutMs = 30000;
        if (process == 4) {
          while (handover->ready.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          chorus::Communicator grown = chorus::Communicator::joinGrown(4, handover->id, 3, &config);
          checkGrown(grown.handle(), 4, 3);
          return;
        }
        chorus::Communicator comm(chorus::UniqueId(id), 4, process, &config);
        std::vector<int64_t> value{static_cast<int64_t>(process)}, sum{0};
        comm.allReduce(std::span<const int64_t>(value), std::span<int64_t>(sum));
        ASSERT_EQ(sum[0], 6);
        if (process == 2) kill(getpid(), SIGKILL);
        std::vector<float> gradients(100000, 1.0f);
        try {
          comm.allReduce(std::span<float>(gradients));
          ADD_FAILURE() << "the all-reduce without rank 2 succeeded";
        } catch (const chorus::Error& e) {
          EXPECT_EQ(e.code(), chorusRemoteError) << e.what();
          EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
        }
        const int dead[] = {2};
        chorus::Communicator survivors = comm.shrink(dead);
        comm.abort();
        chorusUniqueId growId{};
        if (survivors.rank() == 0) {
          growId = survivors.growId();
          handover->id = growId;
          handover->ready.store(1);
        }
        survivors.broadcast(std::span<uint8_t>(reinterpret_cast<uint8_t*>(&growId), sizeof(growId)), 0);
        chorus::Communicator grown = survivors.grow(4, growId);
        checkGrown(grown.handle(), 4, survivors.rank());
      },
      120);
  for (int process = 0; process < 5; ++process) {
    EXPECT_EQ(codes[process], process == 2 ? 128 + SIGKILL : 0) << "process " << process;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, GrowTest, ::testing::Values("shm", "tcp"), transportName);

TEST(GrowErrorsTest, BadCallsAreRefusedWithWhatIsWrong) {
  expectAllZero(runProcesses(2, [&](int rank, const chorusUniqueId& id) {
    chorusComm_t comm = initOrDie(id, 2, rank, "auto");
    chorusUniqueId growId{}, plain{};
    ASSERT_EQ(chorusCommGetUniqueId(comm, &growId), chorusSuccess);
    ASSERT_EQ(chorusGetUniqueId(&plain), chorusSuccess);
    auto refused = [&](chorusComm_t from, int nranks, const chorusUniqueId* with, int number, const char* says) {
      chorusComm_t grown = nullptr;
      EXPECT_EQ(chorusCommGrow(from, nranks, with, number, &grown, nullptr), chorusInvalidArgument) << says;
      EXPECT_NE(std::string(chorusGetLastError(from)).find(says), std::string::npos) << chorusGetLastError(from);
      EXPECT_EQ(grown, nullptr);
    };
    refused(comm, 3, &growId, 0, "passes rank -1");
    refused(comm, 2, &growId, -1, "do not grow this communicator of 2");
    refused(comm, 3, &plain, -1, "is not a grow id");
    refused(nullptr, 3, &plain, 2, "is not a grow id");
    refused(nullptr, 3, &growId, 1, "takes a number in [2, 3), not 1");
    refused(comm, 3, nullptr, -1, "uniqueId is NULL");
    EXPECT_EQ(chorusCommGetUniqueId(comm, nullptr), chorusInvalidArgument);
    // An id made for another communicator.
    chorusComm_t other = nullptr;
    ASSERT_EQ(chorusCommSplit(comm, 0, rank, &other, nullptr), chorusSuccess);
    chorusUniqueId otherId{};
    ASSERT_EQ(chorusCommGetUniqueId(other, &otherId), chorusSuccess);
    refused(comm, 3, &otherId, -1, "was made for another communicator");
    chorusCommDestroy(other);
    chorusCommDestroy(comm);
  }));
}

TEST(GrowErrorsTest, ARankNotFromTheCommunicatorHoldingOneOfItsNumbersFailsEveryRank) {
  // Ranks 0 and 1 make a communicator; rank 0 grows it to three, but process 1 inits with the grow
  // id as rank 1 instead of growing (as if it were new), and process 2 joins as rank 2: every
  // rank fails, naming rank 1.
  SharedWithRanks<Handover> handover;
  expectAllZero(runProcesses(
      3,
      [&](int process, const chorusUniqueId& id) {
        chorusComm_t comm = process < 2 ? initOrDie(id, 2, process, "auto") : nullptr;
        if (process == 0) {
          ASSERT_EQ(chorusCommGetUniqueId(comm, &handover->id), chorusSuccess);
          handover->ready.store(1);
        }
        while (handover->ready.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        chorusComm_t grown = nullptr;
        const chorusResult_t result = process == 0   ? chorusCommGrow(comm, 3, &handover->id, -1, &grown, nullptr)
                                      : process == 1 ? chorusCommInitRank(&grown, 3, handover->id, 1)
                                                     : chorusCommGrow(nullptr, 3, &handover->id, 2, &grown, nullptr);
        EXPECT_EQ(result, chorusInvalidUsage) << "process " << process;
        EXPECT_NE(std::string(chorusGetLastError(comm)).find("rank 1 does not come from communicator"),
                  std::string::npos)
            << chorusGetLastError(comm);
        if (comm != nullptr) chorusCommDestroy(comm);
      },
      120));
}

}  // namespace
}  // namespace chorus
