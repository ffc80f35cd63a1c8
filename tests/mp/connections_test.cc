// connections_test.cc: transports connect when a peer is first used (CHORUS_CONNECT=lazy, the
// default), on forked ranks over shm and tcp: none after init, two after a ring all-reduce (its
// neighbours), every peer after an all-to-all; with CHORUS_CONNECT=eager every peer at init, n-1
// more descriptors per rank than lazily; the direct all-reduce connects every pair first; the
// results are right either way; a lower rank that made a pair and died is named at once by the
// higher; ranks that disagree on the knob fail init, naming it.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;
using nlohmann::json;

int connectionsOf(chorusComm_t comm) {
  size_t size = 0;
  EXPECT_EQ(chorusCommGetStats(comm, CHORUS_STATS_JSON, nullptr, &size), chorusSuccess) << chorusGetLastError(comm);
  std::string text(size, '\0');
  EXPECT_EQ(chorusCommGetStats(comm, CHORUS_STATS_JSON, text.data(), &size), chorusSuccess) << chorusGetLastError(comm);
  text.resize(size > 0 ? size - 1 : 0);
  return json::parse(text)["connections"].get<int>();
}

int openDescriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// A sum all-reduce of every rank's (rank + 1) * (i + 1), checked against n(n+1)/2 * (i + 1).
void checkAllReduce(int nranks, int rank, chorusComm_t comm) {
  constexpr size_t kCount = 5000;
  std::vector<int64_t> data(kCount);
  for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<int64_t>((rank + 1) * (i + 1));
  ASSERT_EQ(chorusAllReduce(data.data(), data.data(), kCount, chorusInt64, chorusSum, comm, nullptr), chorusSuccess)
      << chorusGetLastError(comm);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(data[i], static_cast<int64_t>(nranks * (nranks + 1) / 2 * (i + 1))) << "element " << i;
  }
}

class ConnectionsTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override { unsetenv("CHORUS_CONNECT"); }
};

constexpr int kRanks = 6;

TEST_P(ConnectionsTest, ARingConnectsEachRankToItsTwoNeighboursAndAnAllToAllToEveryPeer) {
  RanksOptions options;
  options.nranks = kRanks;
  options.transport = GetParam();
  runRanks(options, [&](int rank, chorusComm_t comm) {
    EXPECT_EQ(connectionsOf(comm), 0) << "rank " << rank << " connected at init";
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:ring"), chorusSuccess);
    checkAllReduce(kRanks, rank, comm);
    EXPECT_EQ(connectionsOf(comm), 2) << "rank " << rank << " after a ring all-reduce";
    checkAllReduce(kRanks, rank, comm);
    EXPECT_EQ(connectionsOf(comm), 2) << "rank " << rank << " after a second one";
    std::vector<int32_t> send(kRanks * 3), recv(kRanks * 3, -1);
    for (int peer = 0; peer < kRanks; ++peer) {
      for (int i = 0; i < 3; ++i) send[peer * 3 + i] = rank * 100 + peer * 10 + i;
    }
    ASSERT_EQ(chorusAllToAll(send.data(), recv.data(), 3, chorusInt32, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    for (int peer = 0; peer < kRanks; ++peer) {
      for (int i = 0; i < 3; ++i) ASSERT_EQ(recv[peer * 3 + i], peer * 100 + rank * 10 + i);
    }
    EXPECT_EQ(connectionsOf(comm), kRanks - 1) << "rank " << rank << " after an all-to-all";
  });
}

TEST_P(ConnectionsTest, EagerConnectsEveryPeerAtInitWithADescriptorEach) {
  // Each connection holds one descriptor (a tcp socket; shm: the peer's pidfd; the FIFOs are
  // mapped, their descriptors closed), so eager ranks hold n-1 more than lazy ones after init.
  SharedWithRanks<std::array<int, kRanks>> lazyFds, eagerFds;
  RanksOptions options;
  options.nranks = kRanks;
  options.transport = GetParam();
  runRanks(options, [&](int rank, chorusComm_t comm) {
    (*lazyFds)[rank] = openDescriptors();
    EXPECT_EQ(connectionsOf(comm), 0);
  });
  ASSERT_EQ(setenv("CHORUS_CONNECT", "eager", 1), 0);
  runRanks(options, [&](int rank, chorusComm_t comm) {
    (*eagerFds)[rank] = openDescriptors();
    EXPECT_EQ(connectionsOf(comm), kRanks - 1) << "rank " << rank;
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:ring"), chorusSuccess);
    checkAllReduce(kRanks, rank, comm);
    EXPECT_EQ(connectionsOf(comm), kRanks - 1) << "rank " << rank;
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ((*eagerFds)[rank] - (*lazyFds)[rank], kRanks - 1) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ConnectionsTest, ::testing::Values("shm", "tcp"), transportName);

TEST(ConnectionsDirectTest, TheDirectAllReduceConnectsEveryPairFirst) {
  ASSERT_EQ(setenv("CHORUS_SHM_DIRECT_BYTES", "1", 1), 0);
  RanksOptions options;
  options.nranks = 4;
  options.transport = "shm";
  runRanks(options, [&](int rank, chorusComm_t comm) {
    ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:direct"), chorusSuccess);
    constexpr size_t kCount = 1 << 16;
    void* memory = nullptr;
    ASSERT_EQ(chorusMemAlloc(&memory, kCount * sizeof(float)), chorusSuccess);
    auto* data = static_cast<float*>(memory);
    for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
    ASSERT_EQ(chorusAllReduce(data, data, kCount, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(data[i], 10.0f * static_cast<float>(i % 7)) << "element " << i;
    EXPECT_EQ(connectionsOf(comm), 3) << "rank " << rank;
    ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess);  // the peers are done with `data`
    ASSERT_EQ(chorusMemFree(memory), chorusSuccess);
  });
  unsetenv("CHORUS_SHM_DIRECT_BYTES");
}

// Runs fn(rank, comm) on nranks forked ranks, each with a shm communicator of a 20 s timeout (the
// failure tests' errors must come well before it), direct all-reduces taken at any size; returns
// the ranks' exit codes.
std::vector<int> runOnShm(int nranks, const std::function<void(int, chorusComm_t)>& fn) {
  EXPECT_EQ(setenv("CHORUS_SHM_DIRECT_BYTES", "1", 1), 0);
  const std::vector<int> codes = runProcesses(nranks, [&](int rank, const chorusUniqueId& id) {
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.transport = "shm";
    config.timeoutMs = 20000;
    chorusComm_t comm = nullptr;
    ASSERT_EQ(chorusCommInitRankConfig(&comm, nranks, id, rank, &config), chorusSuccess) << chorusGetLastError(nullptr);
    fn(rank, comm);
  });
  unsetenv("CHORUS_SHM_DIRECT_BYTES");
  return codes;
}

// A direct all-reduce on comm fails with chorusRemoteError naming `named`, long before the
// timeout; then the communicator is aborted. `after` runs as soon as the call returns.
void expectDirectAllReduceFailsFast(chorusComm_t comm, const std::string& named,
                                    const std::function<void()>& after = {}) {
  ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:direct"), chorusSuccess);
  void* memory = nullptr;
  ASSERT_EQ(chorusMemAlloc(&memory, 1024 * sizeof(float)), chorusSuccess);
  const auto start = std::chrono::steady_clock::now();
  const chorusResult_t result = chorusAllReduce(memory, memory, 1024, chorusFloat32, chorusSum, comm, nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (after) after();
  EXPECT_EQ(result, chorusRemoteError) << chorusGetLastError(comm);
  EXPECT_NE(std::string(chorusGetLastError(comm)).find(named), std::string::npos) << chorusGetLastError(comm);
  EXPECT_LT(seconds, 10.0) << "the error waited for the timeout (20 s)";
  chorusCommAbort(comm);
  chorusMemFree(memory);
}

// The lower rank of a pair makes its segment when it first sends, then dies before answering the
// higher rank's probes. The higher rank opens the segment in the direct all-reduce's connectAll
// and must name the dead rank at once, not wait out its timeout.
TEST(ConnectionsDirectTest, ALowerRankThatMadeThePairAndDiedIsNamed) {
  struct Shared {
    std::atomic<int> victimPid{0};
    std::atomic<int> sent{0};
  };
  SharedWithRanks<Shared> shared;
  const std::vector<int> codes = runOnShm(2, [&](int rank, chorusComm_t comm) {
    if (rank == 0) {
      shared->victimPid = getpid();
      const int32_t value = 7;
      ASSERT_EQ(chorusSend(&value, 1, chorusInt32, 1, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      shared->sent = 1;
      kill(getpid(), SIGKILL);
    }
    while (shared->sent.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Rank 0 is gone (a zombie until the parent reaps it) before rank 1 touches the pair.
    const std::string stat = "/proc/" + std::to_string(shared->victimPid.load()) + "/stat";
    for (;;) {
      std::ifstream in(stat);
      std::string pid, name, state;
      if (!(in >> pid >> name >> state) || state == "Z") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    expectDirectAllReduceFailsFast(comm, "rank 0 has exited");
  });
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes[0], 128 + SIGKILL);
  EXPECT_EQ(codes[1], 0);
}

// A rank that stops on hearing of a failure never answers a peer that is still setting up a pair
// with it, though it is alive. That peer must hear the failure told on the failure line while it
// waits to connect, not wait out its timeout (kill_test met it: rank 3 waited for rank 2, which had
// stopped when rank 4 died). Here rank 2 aborts; ranks 0 and 1 run a direct all-reduce, which
// first connects every pair.
TEST(ConnectionsDirectTest, AFailureToldWhileConnectingIsHeard) {
  struct Shared {
    std::atomic<int> finished{0};
  };
  SharedWithRanks<Shared> shared;
  const std::vector<int> codes = runOnShm(3, [&](int rank, chorusComm_t comm) {
    if (rank == 2) {
      chorusCommAbort(comm);  // tells the others, and stays alive until they are done
      while (shared->finished.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    expectDirectAllReduceFailsFast(comm, "rank 2 failed, and said: rank 2: the communicator was aborted",
                                   [&] { shared->finished.fetch_add(1); });
  });
  for (int code : codes) EXPECT_EQ(code, 0);
}

TEST(ConnectionsKnobTest, RanksThatDisagreeOnTheKnobFailInitNamingIt) {
  const std::vector<int> codes = runProcesses(2, [](int rank, const chorusUniqueId& id) {
    setenv("CHORUS_CONNECT", rank == 0 ? "eager" : "lazy", 1);
    chorusComm_t comm = nullptr;
    const chorusResult_t result = chorusCommInitRank(&comm, 2, id, rank);
    EXPECT_EQ(result, chorusInvalidUsage) << "rank " << rank;
    EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("CHORUS_CONNECT must agree"), std::string::npos)
        << chorusGetLastError(nullptr);
    if (result == chorusSuccess) chorusCommDestroy(comm);
  });
  for (int code : codes) EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace chorus
