// failure_test.cc: what happens when things go wrong, on real forked ranks: ranks that call
// different operations or sizes fail with a remote error instead of hanging or corrupting; a
// dead peer is noticed long before the timeout; missing ranks at init are named; a process with
// the wrong secret is turned away; and init from the torchrun-style environment works.
#include <arpa/inet.h>
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using testing::runProcesses;

chorusComm_t initOrDie(const chorusUniqueId& id, int nranks, int rank, const char* transport, int timeoutMs = 60000,
                       int initTimeoutMs = 30000) {
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  config.transport = transport;
  config.timeoutMs = timeoutMs;
  config.initTimeoutMs = initTimeoutMs;
  chorusComm_t comm = nullptr;
  const chorusResult_t result = chorusCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (result != chorusSuccess) {
    ADD_FAILURE() << "rank " << rank << " init: " << chorusGetLastError(nullptr);
    _exit(2);
  }
  return comm;
}

void expectAllZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

class FailureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FailureTest, MismatchedCountsFailOnEveryRankAndLeaveTheCommunicatorUnusable) {
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  expectAllZero(runProcesses(2, [&](int rank, const chorusUniqueId& id) {
    chorusComm_t comm = initOrDie(id, 2, rank, transport);
    std::vector<float> buffer(64, 1.0f);
    const size_t count = rank == 0 ? 10 : 20;
    const chorusResult_t result =
        chorusAllReduce(buffer.data(), buffer.data(), count, chorusFloat32, chorusSum, comm, nullptr);
    EXPECT_EQ(result, chorusRemoteError) << chorusGetLastError(comm);
    const std::string message = chorusGetLastError(comm);
    EXPECT_NE(message.find("rank " + std::to_string(rank)), std::string::npos) << message;
    EXPECT_NE(message.find("allreduce #0"), std::string::npos) << message;
    EXPECT_EQ(chorusAllReduce(buffer.data(), buffer.data(), 4, chorusFloat32, chorusSum, comm, nullptr),
              chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("failed earlier"), std::string::npos);
    chorusCommDestroy(comm);
  }));
}

TEST_P(FailureTest, DifferentCollectivesFailInsteadOfHanging) {
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  expectAllZero(runProcesses(2, [&](int rank, const chorusUniqueId& id) {
    chorusComm_t comm = initOrDie(id, 2, rank, transport);
    std::vector<float> buffer(8, 1.0f);
    const chorusResult_t result =
        rank == 0 ? chorusAllReduce(buffer.data(), buffer.data(), 8, chorusFloat32, chorusSum, comm, nullptr)
                  : chorusBroadcast(buffer.data(), buffer.data(), 8, chorusFloat32, 0, comm, nullptr);
    EXPECT_EQ(result, chorusRemoteError) << "rank " << rank << ": " << chorusGetLastError(comm);
    chorusCommDestroy(comm);
  }));
}

TEST_P(FailureTest, ADeadPeerIsReportedLongBeforeTheTimeout) {
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId& id) {
        // A 10-minute timeout: only noticing the death can end the call in time for the test's
        // deadline below.
        chorusComm_t comm = initOrDie(id, 3, rank, transport, 600000);
        if (rank == 2) _exit(0);  // dies without a word
        std::vector<float> buffer(1000, 1.0f);
        const chorusResult_t result =
            chorusAllReduce(buffer.data(), buffer.data(), buffer.size(), chorusFloat32, chorusSum, comm, nullptr);
        EXPECT_EQ(result, chorusRemoteError) << "rank " << rank << ": " << chorusGetLastError(comm);
        chorusCommDestroy(comm);
      },
      120));
}

TEST_P(FailureTest, AsyncErrorReportsAMismatchFoundWhileNonBlockingOperationsRun) {
  // chorusCommGetAsyncError progresses what is in flight: matching non-blocking all-reduces
  // leave it at chorusSuccess; mismatched ones (10 vs 20 elements) turn it to chorusRemoteError
  // on both ranks with the call named (on rank 0 found by the polling alone, no chorusTest or
  // chorusWait made), and it stays so.
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  int posted0[2];  // rank 0 writes a byte here once its mismatched call is posted
  ASSERT_EQ(pipe(posted0), 0);
  expectAllZero(runProcesses(2, [&](int rank, const chorusUniqueId& id) {
    chorusComm_t comm = initOrDie(id, 2, rank, transport);
    chorusResult_t async = chorusInternalError;
    EXPECT_EQ(chorusCommGetAsyncError(comm, nullptr), chorusInvalidArgument);
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    EXPECT_EQ(async, chorusSuccess);

    std::vector<float> buffer(64, 1.0f);
    chorusRequest_t request = nullptr;
    ASSERT_EQ(chorusIAllReduce(buffer.data(), buffer.data(), 64, chorusFloat32, chorusSum, comm, &request),
              chorusSuccess);
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    EXPECT_EQ(async, chorusSuccess);
    ASSERT_EQ(chorusWait(&request), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(buffer[63], 2.0f);

    // Rank 1 posts after rank 0 has, so rank 0's call is in flight when the mismatch comes (rank 1
    // may find it at once, while posting).
    char byte = 0;
    if (rank == 1) {
      ASSERT_EQ(read(posted0[0], &byte, 1), 1);
    }
    const chorusResult_t posted =
        chorusIAllReduce(buffer.data(), buffer.data(), rank == 0 ? 10 : 20, chorusFloat32, chorusSum, comm, &request);
    if (rank == 0) {
      ASSERT_EQ(write(posted0[1], &byte, 1), 1);
      ASSERT_EQ(posted, chorusSuccess) << chorusGetLastError(comm);
    }
    if (posted != chorusSuccess) {
      EXPECT_EQ(posted, chorusRemoteError) << chorusGetLastError(comm);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    do {
      ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    } while (async == chorusSuccess && std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(async, chorusRemoteError) << "rank " << rank;
    const std::string message = chorusGetLastError(comm);
    EXPECT_NE(message.find("allreduce #1"), std::string::npos) << message;
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    EXPECT_EQ(async, chorusRemoteError);
    if (posted == chorusSuccess) {
      EXPECT_EQ(chorusWait(&request), chorusRemoteError);
    }
    chorusCommDestroy(comm);
  }));
  close(posted0[0]);
  close(posted0[1]);
}

// One disagreement between the calls of rank 1 and those of ranks 0 and 2.
struct Mismatch {
  const char* name;
  // The call each rank makes; `odd` is true on rank 1.
  chorusResult_t (*call)(chorusComm_t comm, std::vector<float>& buffer, bool odd);
  const char* ours;    // how rank 0's error names its own call
  const char* theirs;  // and rank 1's; where one of the two is not rooted, what names a rooted call
};

const Mismatch kMismatches[] = {
    {"count",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return chorusAllReduce(b.data(), b.data(), odd ? 20 : 10, chorusFloat32, chorusSum, comm, nullptr);
     },
     "allreduce #0 (count 10 float32 sum", "allreduce #0 (count 20 float32 sum"},
    {"collective",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return odd ? chorusBroadcast(b.data(), b.data(), 10, chorusFloat32, 0, comm, nullptr)
                  : chorusReduce(b.data(), b.data(), 10, chorusFloat32, chorusSum, 0, comm, nullptr);
     },
     "reduce #0 (count 10 float32 sum root 0", "broadcast #0 (count 10 float32 root 0"},
    // A rooted call meets one that is not: the rooted one's agreement message arrives where the
    // other expects its data, and is named as such.
    {"rooted or not",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return odd ? chorusBroadcast(b.data(), b.data(), 10, chorusFloat32, 0, comm, nullptr)
                  : chorusAllReduce(b.data(), b.data(), 10, chorusFloat32, chorusSum, comm, nullptr);
     },
     "allreduce #0 (count 10 float32 sum", "the agreement before rooted collective"},
    {"type",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return chorusAllReduce(b.data(), b.data(), 10, odd ? chorusInt32 : chorusFloat32, chorusSum, comm, nullptr);
     },
     "allreduce #0 (count 10 float32 sum", "allreduce #0 (count 10 int32 sum"},
    {"op",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return chorusAllReduce(b.data(), b.data(), 10, chorusFloat32, odd ? chorusMax : chorusSum, comm, nullptr);
     },
     "allreduce #0 (count 10 float32 sum", "allreduce #0 (count 10 float32 max"},
    {"root",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       return chorusBroadcast(b.data(), b.data(), 10, chorusFloat32, odd ? 1 : 0, comm, nullptr);
     },
     "broadcast #0 (count 10 float32 root 0", "broadcast #0 (count 10 float32 root 1"},
    {"skipped call",
     [](chorusComm_t comm, std::vector<float>& b, bool odd) {
       // Rank 1 skips all-reduce #0 (of 10): its all-reduce of 30 is #0 to it, #1 to the others.
       if (!odd) {
         const chorusResult_t first = chorusAllReduce(b.data(), b.data(), 10, chorusFloat32, chorusSum, comm, nullptr);
         if (first != chorusSuccess) return first;
       }
       return chorusAllReduce(b.data(), b.data(), 30, chorusFloat32, chorusSum, comm, nullptr);
     },
     "allreduce #0 (count 10 float32 sum", "allreduce #0 (count 30 float32 sum"},
};

TEST_P(FailureTest, EveryKindOfDisagreementFailsOnEveryRankNamingBothCalls) {
  // Three ranks; rank 1's call differs in count, collective, type, op or root, or rank 1 skips a
  // call. Every rank fails in the call with chorusRemoteError (no hang: a 10-minute timeout would
  // outlast the test's deadline); the messages of ranks 0 and 1 name both their calls. Two roots of
  // one broadcast, which only send, fail too: the ranks agree on a rooted call before it runs.
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  for (const Mismatch& mismatch : kMismatches) {
    SCOPED_TRACE(mismatch.name);
    expectAllZero(runProcesses(
        3,
        [&](int rank, const chorusUniqueId& id) {
          chorusComm_t comm = initOrDie(id, 3, rank, transport, 600000);
          std::vector<float> buffer(64, 1.0f);
          const chorusResult_t result = mismatch.call(comm, buffer, rank == 1);
          const std::string message = chorusGetLastError(comm);
          EXPECT_EQ(result, chorusRemoteError) << mismatch.name << ", rank " << rank << ": " << message;
          if (rank <= 1) {
            EXPECT_NE(message.find(mismatch.ours), std::string::npos) << mismatch.name << ": " << message;
            EXPECT_NE(message.find(mismatch.theirs), std::string::npos) << mismatch.name << ": " << message;
          }
          chorusCommDestroy(comm);
        },
        120));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FailureTest, ::testing::Values("shm", "tcp", "ucx"), testing::transportName);

// Comma-separated names, split.
std::vector<std::string> splitNames(const char* text) {
  std::vector<std::string> names;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) names.push_back(name);
  return names;
}

class RootedAgreementTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RootedAgreementTest, RanksThatDisagreeOnARootedCallAllFailNamingBothCalls) {
  // Every rooted collective with every one of its algorithms, on 4 ranks: ranks 2 and 3 name root
  // 3 where ranks 0 and 1 name root 0 (so each side has a root that only sends, and ranks that
  // hear only from their own side), or rank 3 alone passes one element more. Every rank fails in
  // the call with chorusRemoteError, and its message names a call of each side.
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  constexpr int kRanks = 4;
  constexpr size_t kCount = 1000;
  struct Rooted {
    const char* name;
    chorusResult_t (*call)(chorusComm_t comm, std::vector<float>& in, std::vector<float>& out, size_t count, int root);
    const char* detail;  // between the count and the root in the call's name
  };
  const Rooted kRooted[] = {
      {"broadcast",
       [](chorusComm_t comm, std::vector<float>& in, std::vector<float>& out, size_t count, int root) {
         return chorusBroadcast(in.data(), out.data(), count, chorusFloat32, root, comm, nullptr);
       },
       ""},
      {"reduce",
       [](chorusComm_t comm, std::vector<float>& in, std::vector<float>& out, size_t count, int root) {
         return chorusReduce(in.data(), out.data(), count, chorusFloat32, chorusSum, root, comm, nullptr);
       },
       " sum"},
      {"gather",
       [](chorusComm_t comm, std::vector<float>& in, std::vector<float>& out, size_t count, int root) {
         return chorusGather(in.data(), out.data(), count, chorusFloat32, root, comm, nullptr);
       },
       ""},
      {"scatter",
       [](chorusComm_t comm, std::vector<float>& in, std::vector<float>& out, size_t count, int root) {
         return chorusScatter(in.data(), out.data(), count, chorusFloat32, root, comm, nullptr);
       },
       ""},
  };
  for (const Rooted& rooted : kRooted) {
    for (const std::string& algorithm : splitNames(chorusAlgorithmNames(rooted.name))) {
      for (const bool onRoot : {true, false}) {
        SCOPED_TRACE(std::string(rooted.name) + ":" + algorithm + (onRoot ? ", roots 0 and 3" : ", counts differ"));
        const std::string call = std::string(rooted.name) + " #0 (count ";
        // What names a call of each side.
        const std::string first = call + std::to_string(kCount) + " float32" + rooted.detail + " root 0, ";
        const std::string second = onRoot
                                       ? call + std::to_string(kCount) + " float32" + rooted.detail + " root 3, "
                                       : call + std::to_string(kCount + 1) + " float32" + rooted.detail + " root 0, ";
        expectAllZero(runProcesses(
            kRanks,
            [&](int rank, const chorusUniqueId& id) {
              chorusComm_t comm = initOrDie(id, kRanks, rank, transport, 600000);
              const std::string algorithms = std::string(rooted.name) + ":" + algorithm;
              ASSERT_EQ(chorusCommSetAlgorithms(comm, algorithms.c_str()), chorusSuccess) << chorusGetLastError(comm);
              std::vector<float> in(2 * kRanks * kCount, 1.0f), out(2 * kRanks * kCount, 0.0f);
              const int root = onRoot && rank >= 2 ? 3 : 0;
              const size_t count = !onRoot && rank == 3 ? kCount + 1 : kCount;
              const chorusResult_t result = rooted.call(comm, in, out, count, root);
              const std::string message = chorusGetLastError(comm);
              EXPECT_EQ(result, chorusRemoteError) << "rank " << rank << ": " << message;
              EXPECT_NE(message.find("the ranks disagree on collective #0"), std::string::npos) << message;
              EXPECT_NE(message.find(first), std::string::npos) << message;
              EXPECT_NE(message.find(second), std::string::npos) << message;
              chorusCommDestroy(comm);
            },
            120));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, RootedAgreementTest, ::testing::Values("shm", "tcp"), testing::transportName);

TEST(BootstrapFailureTest, MissingRanksAreNamedAtTheInitTimeout) {
  const auto codes = runProcesses(
      4,
      [&](int rank, const chorusUniqueId& id) {
        if (rank == 1 || rank == 3) return;  // never arrive
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.initTimeoutMs = 1500;
        chorusComm_t comm = nullptr;
        EXPECT_EQ(chorusCommInitRankConfig(&comm, 4, id, rank, &config), chorusTimeout);
        const std::string message = chorusGetLastError(nullptr);
        EXPECT_NE(message.find("missing rank(s) 1, 3"), std::string::npos) << message;
        EXPECT_EQ(comm, nullptr);
      },
      60);
  expectAllZero(codes);
}

TEST(BootstrapFailureTest, RanksThatDisagreeOnTheSizeAreTold) {
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.initTimeoutMs = 1500;
        chorusComm_t comm = nullptr;
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 sets the size
        const chorusResult_t result = chorusCommInitRankConfig(&comm, rank == 0 ? 2 : 3, id, rank, &config);
        if (rank == 1) {
          EXPECT_EQ(result, chorusRemoteError);
          EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("nranks=3"), std::string::npos)
              << chorusGetLastError(nullptr);
        } else {
          EXPECT_EQ(result, chorusTimeout) << chorusGetLastError(nullptr);
        }
      },
      60));
}

TEST(BootstrapFailureTest, AProcessWithTheWrongSecretIsTurnedAway) {
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId& realId) {
        if (rank == 2) {
          chorusUniqueId forged = realId;
          forged.internal[8] ^= 0x5a;  // the secret follows the magic and version
          chorusComm_t comm = nullptr;
          EXPECT_EQ(chorusCommInitRank(&comm, 2, forged, 1), chorusRemoteError);
          EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("wrong secret"), std::string::npos)
              << chorusGetLastError(nullptr);
          return;
        }
        if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the stranger comes first
        chorusComm_t comm = initOrDie(realId, 2, rank, "auto");
        int64_t value = rank + 1, sum = 0;
        EXPECT_EQ(chorusAllReduce(&value, &sum, 1, chorusInt64, chorusSum, comm, nullptr), chorusSuccess);
        EXPECT_EQ(sum, 3);
        chorusCommDestroy(comm);
      },
      60));
}

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(EnvInitTest, TorchrunStyleVariablesWithChorusSpellingsWinning) {
  const std::string port = std::to_string(freePort());
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId&) {
        setenv("RANK", "not-a-number", 1);  // must be ignored: CHORUS_RANK wins
        setenv("CHORUS_RANK", std::to_string(rank).c_str(), 1);
        setenv("WORLD_SIZE", "3", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port.c_str(), 1);
        setenv("CHORUS_SECRET", "test-secret", 1);
        chorusComm_t comm = nullptr;
        ASSERT_EQ(chorusCommInitFromEnv(&comm, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
        int got = -1, size = 0;
        chorusCommUserRank(comm, &got);
        chorusCommCount(comm, &size);
        EXPECT_EQ(got, rank);
        EXPECT_EQ(size, 3);
        int32_t value = 10 * (rank + 1), sum = 0;
        ASSERT_EQ(chorusAllReduce(&value, &sum, 1, chorusInt32, chorusSum, comm, nullptr), chorusSuccess);
        EXPECT_EQ(sum, 60);
        chorusCommDestroy(comm);
      },
      60));
}

TEST(AbortTest, AbortEndsTheCommunicator) {
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        chorusComm_t comm = initOrDie(id, 2, rank, "auto");
        EXPECT_EQ(chorusCommAbort(comm), chorusSuccess);
        int count = 0;
        EXPECT_EQ(chorusCommCount(comm, &count), chorusInvalidUsage);
      },
      60));
}

class AbortFromAnotherThreadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(AbortFromAnotherThreadTest, ReleasesTheBlockedCallsAndTellsThePeers) {
  // Four ranks each block in a receive no one will send (10-minute timeout). On rank 0 a second
  // thread aborts the communicator: rank 0's blocked call and its non-blocking all-reduce end with
  // chorusAborted, and ranks 1-3 (rank 2 is no ring neighbour of rank 0: the word is passed on)
  // end with chorusRemoteError naming rank 0's abort, all long before the timeout.
  const char* transport = GetParam();
  CHORUS_REQUIRE_TRANSPORT(transport);
  struct Shared {
    std::atomic<int64_t> abortNs{0};
    std::atomic<int64_t> returnNs[4];
  };
  testing::SharedWithRanks<Shared> shared;
  expectAllZero(runProcesses(
      4,
      [&](int rank, const chorusUniqueId& id) {
        chorusComm_t comm = initOrDie(id, 4, rank, transport, 600000);
        std::vector<float> values(256, 1.0f);
        chorusRequest_t request = nullptr;
        std::thread aborter;
        if (rank == 0) {
          // Its peers never post the matching all-reduce.
          ASSERT_EQ(
              chorusIAllReduce(values.data(), values.data(), values.size(), chorusFloat32, chorusSum, comm, &request),
              chorusSuccess);
          aborter = std::thread([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            shared->abortNs = testing::monotonicNs();
            EXPECT_EQ(chorusCommAbort(comm), chorusSuccess) << chorusGetLastError(nullptr);
          });
        }
        float value = 0;
        const chorusResult_t result = chorusRecv(&value, 1, chorusFloat32, (rank + 1) % 4, comm, nullptr);
        shared->returnNs[rank] = testing::monotonicNs();
        const std::string message = chorusGetLastError(nullptr);
        if (rank == 0) {
          aborter.join();
          EXPECT_EQ(result, chorusAborted) << message;
          EXPECT_EQ(chorusWait(&request), chorusAborted) << chorusGetLastError(nullptr);
          int count = 0;
          EXPECT_EQ(chorusCommCount(comm, &count), chorusInvalidUsage);
          return;
        }
        EXPECT_EQ(result, chorusRemoteError) << "rank " << rank << ": " << message;
        EXPECT_NE(message.find("rank 0 failed"), std::string::npos) << message;
        EXPECT_NE(message.find("the communicator was aborted"), std::string::npos) << message;
        chorusCommDestroy(comm);
      },
      120));
  const int64_t abortNs = shared->abortNs.load();
  ASSERT_GT(abortNs, 0);
  for (int rank = 0; rank < 4; ++rank) {
    const double seconds = static_cast<double>(shared->returnNs[rank].load() - abortNs) * 1e-9;
    std::printf("rank %d returned %.3f s after the abort\n", rank, seconds);
    // Far inside the 600 s timeout: only the abort, or the word of it, can have ended the call.
    EXPECT_LT(seconds, 30.0) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, AbortFromAnotherThreadTest, ::testing::Values("shm", "tcp", "ucx"),
                         testing::transportName);

TEST(ShrinkTest, TheRemainingRanksGoOnWithoutTheExcludedOnes) {
  // Five ranks; ranks 0 and 2 are excluded (they do not call): ranks 1, 3 and 4 become ranks 0, 1
  // and 2 of a new communicator that works, and bad calls are refused with what is wrong.
  expectAllZero(runProcesses(
      5,
      [&](int rank, const chorusUniqueId& id) {
        chorusComm_t comm = initOrDie(id, 5, rank, "auto");
        if (rank == 0 || rank == 2) {
          chorusCommDestroy(comm);
          return;
        }
        const int exclude[] = {0, 2};
        chorusComm_t shrunk = nullptr;
        const int self[] = {rank};
        EXPECT_EQ(chorusCommShrink(comm, self, 1, &shrunk, nullptr), chorusInvalidArgument);
        EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("this rank is among the excluded"), std::string::npos);
        const int outside[] = {5};
        EXPECT_EQ(chorusCommShrink(comm, outside, 1, &shrunk, nullptr), chorusInvalidArgument);
        EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("excluded rank 5 is out of range"), std::string::npos);
        ASSERT_EQ(chorusCommShrink(comm, exclude, 2, &shrunk, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
        int newRank = -1, count = 0;
        ASSERT_EQ(chorusCommUserRank(shrunk, &newRank), chorusSuccess);
        ASSERT_EQ(chorusCommCount(shrunk, &count), chorusSuccess);
        EXPECT_EQ(count, 3);
        EXPECT_EQ(newRank, rank == 1 ? 0 : rank == 3 ? 1 : 2);
        std::vector<int32_t> values(1000, rank), sums(1000, -1);
        ASSERT_EQ(chorusAllReduce(values.data(), sums.data(), values.size(), chorusInt32, chorusSum, shrunk, nullptr),
                  chorusSuccess)
            << chorusGetLastError(shrunk);
        EXPECT_EQ(sums.front(), 1 + 3 + 4);
        EXPECT_EQ(sums.back(), 1 + 3 + 4);
        EXPECT_EQ(chorusCommDestroy(shrunk), chorusSuccess);
        EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);
      },
      120));
}

// Runs body with stderr going to a temporary file; returns what was written.
std::string capturedStderr(const std::function<void()>& body) {
  std::fflush(stderr);
  char path[] = "/tmp/chorus-stderr-XXXXXX";
  const int file = mkstemp(path);
  const int saved = dup(2);
  dup2(file, 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

TEST(TimeoutTest, TheErrorNamesTheRankThatHasNotArrivedAndWhatEachLinkMoved) {
  // Three ranks finish ring all-reduce #0; rank 2 never calls #1. Rank 0, which receives from
  // rank 2 on the ring, times out saying so, with what each of its links has moved. Only rank 0
  // has a short timeout, so it is the one that times out however the ranks are scheduled.
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId& id) {
        chorusComm_t comm = initOrDie(id, 3, rank, "shm", rank == 0 ? 500 : 600000);
        ASSERT_EQ(chorusCommSetAlgorithms(comm, "allreduce:ring"), chorusSuccess);
        std::vector<float> values(3000, 1.0f);
        ASSERT_EQ(chorusAllReduce(values.data(), values.data(), values.size(), chorusFloat32, chorusSum, comm, nullptr),
                  chorusSuccess);
        if (rank == 2) {
          std::this_thread::sleep_for(std::chrono::seconds(2));
          chorusCommDestroy(comm);
          return;
        }
        const chorusResult_t result =
            chorusAllReduce(values.data(), values.data(), values.size(), chorusFloat32, chorusSum, comm, nullptr);
        const std::string message = chorusGetLastError(comm);
        if (rank == 0) {
          EXPECT_EQ(result, chorusTimeout) << message;
          EXPECT_NE(message.find("nothing moved for 500 ms"), std::string::npos) << message;
          EXPECT_NE(message.find("rank 2 has not arrived at allreduce #1"), std::string::npos) << message;
          EXPECT_NE(message.find("its last message here belonged to allreduce #0"), std::string::npos) << message;
          // A ring all-reduce of 12000 bytes on 3 ranks moves 4 blocks of 4000 bytes each way per
          // rank; #1 has sent its first.
          EXPECT_NE(message.find("links: rank 1: sent 5 messages (20000 bytes), received 0 messages (0 bytes); "
                                 "rank 2: sent 0 messages (0 bytes), received 4 messages (16000 bytes), the last "
                                 "of allreduce #0"),
                    std::string::npos)
              << message;
        } else {
          EXPECT_EQ(result, chorusRemoteError) << message;  // rank 0's word of its timeout
          EXPECT_NE(message.find("rank 0 failed, and said"), std::string::npos) << message;
        }
        chorusCommDestroy(comm);
      },
      60));
}

TEST(DumpStateTest, ListsPendingOperationsAndWhatTheyWait) {
  // chorusCommDumpState on rank 0 with an all-reduce rank 1 has not posted; then, with
  // CHORUS_DUMP_SIGNAL=1, SIGUSR1 while rank 0 waits in a receive: the waiting call prints.
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        setenv("CHORUS_DUMP_SIGNAL", "1", 1);
        chorusComm_t comm = initOrDie(id, 2, rank, "auto");
        std::vector<float> values(256, 1.0f);
        float one = 0;
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          ASSERT_EQ(chorusAllReduce(values.data(), values.data(), 256, chorusFloat32, chorusSum, comm, nullptr),
                    chorusSuccess);
          std::this_thread::sleep_for(std::chrono::milliseconds(700));  // rank 0 waits in its receive meanwhile
          one = 1.0f;
          ASSERT_EQ(chorusSend(&one, 1, chorusFloat32, 0, comm, nullptr), chorusSuccess);
          chorusCommDestroy(comm);
          return;
        }
        chorusRequest_t request = nullptr;
        ASSERT_EQ(chorusIAllReduce(values.data(), values.data(), 256, chorusFloat32, chorusSum, comm, &request),
                  chorusSuccess);
        const std::string dump = capturedStderr([&] { EXPECT_EQ(chorusCommDumpState(comm), chorusSuccess); });
        EXPECT_NE(dump.find("chorus rank 0: rank 0 of 2"), std::string::npos) << dump;
        EXPECT_NE(dump.find("chorus rank 0: pending: allreduce #0 (count 256 float32 sum"), std::string::npos) << dump;
        EXPECT_NE(dump.find("rank 1 has not arrived at allreduce #0 (count 256 float32 sum"), std::string::npos)
            << dump;
        EXPECT_NE(dump.find("(no message from it yet)"), std::string::npos) << dump;
        EXPECT_NE(dump.find("chorus rank 0: link to rank 1: sent"), std::string::npos) << dump;
        // What the transport holds for the peer: its receive posted, nothing in from rank 1.
        EXPECT_NE(dump.find("chorus rank 0:   shm: link up"), std::string::npos) << dump;
        EXPECT_NE(dump.find("1 receive(s) posted, the first 0 of"), std::string::npos) << dump;
        ASSERT_EQ(chorusWait(&request), chorusSuccess) << chorusGetLastError(comm);

        const std::string signalled = capturedStderr([&] {
          std::thread signaller([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            kill(getpid(), SIGUSR1);
          });
          EXPECT_EQ(chorusRecv(&one, 1, chorusFloat32, 1, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
          signaller.join();
        });
        EXPECT_EQ(one, 1.0f);
        EXPECT_NE(signalled.find("chorus rank 0: pending: recv #0 (count 1 float32, from rank 1)"), std::string::npos)
            << signalled;
        EXPECT_NE(signalled.find("rank 1 has not sent it (its last message here belonged to allreduce #0)"),
                  std::string::npos)
            << signalled;
        EXPECT_NE(signalled.find("received 1 messages (1024 bytes), the last of allreduce #0"), std::string::npos)
            << signalled;
        chorusCommDestroy(comm);
      },
      60));
}

// The addresses this process listens on, from /proc: its socket inodes, looked up among the
// kernel's TCP sockets in state LISTEN ("1.2.3.4:5678").
std::vector<std::string> listeningAddresses() {
  std::set<std::string> inodes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> found;
  std::ifstream table("/proc/self/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
    if (state != "0A" || inodes.count(inode) == 0) continue;
    const uint32_t address = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));  // host order
    const unsigned port = static_cast<unsigned>(std::stoul(local.substr(9), nullptr, 16));
    found.push_back(std::to_string(address & 0xff) + "." + std::to_string((address >> 8) & 0xff) + "." +
                    std::to_string((address >> 16) & 0xff) + "." + std::to_string(address >> 24) + ":" +
                    std::to_string(port));
  }
  return found;
}

TEST(InterfaceTest, ListenersBindToTheInterfaceChorusSocketIfnameNames) {
  // "=lo": every listener of every rank (its ring listener, which stays open) is on 127.0.0.1,
  // and the communicator works over tcp; a name that matches nothing fails init, naming the
  // interfaces there are.
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        setenv("CHORUS_SOCKET_IFNAME", "=nosuch0", 1);
        chorusComm_t comm = nullptr;
        chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
        config.initTimeoutMs = 2000;
        EXPECT_EQ(chorusCommInitRankConfig(&comm, 2, id, rank, &config), chorusInvalidArgument);
        const std::string message = chorusGetLastError(nullptr);
        EXPECT_NE(message.find("CHORUS_SOCKET_IFNAME='=nosuch0' matches no interface"), std::string::npos) << message;
        EXPECT_NE(message.find("lo (127.0.0.1:0)"), std::string::npos) << message;
      },
      60));
  expectAllZero(runProcesses(
      2,
      [&](int rank, const chorusUniqueId& id) {
        setenv("CHORUS_SOCKET_IFNAME", "=lo", 1);
        chorusComm_t comm = initOrDie(id, 2, rank, "tcp");
        const std::vector<std::string> listening = listeningAddresses();
        EXPECT_FALSE(listening.empty());
        for (const std::string& address : listening) EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
        int64_t value = rank + 1, sum = 0;
        EXPECT_EQ(chorusAllReduce(&value, &sum, 1, chorusInt64, chorusSum, comm, nullptr), chorusSuccess);
        EXPECT_EQ(sum, 3);
        chorusCommDestroy(comm);
      },
      60));
}

TEST(ShrinkTest, AStrangerAtARanksListenerIsTurnedAwayAndTheShrinkGoesOn) {
  // Rank 2 connects to rank 1's open ring listener (found in /proc), with the right purpose but a
  // wrong secret, while rank 1 waits for the shrink's new id; rank 1 turns it away and takes
  // rank 0's offer, and the two go on.
  int portPipe[2];
  ASSERT_EQ(pipe(portPipe), 0);
  expectAllZero(runProcesses(
      3,
      [&](int rank, const chorusUniqueId& id) {
        chorusComm_t comm = initOrDie(id, 3, rank, "auto");
        if (rank == 2) {
          char text[64] = {};
          ASSERT_GT(read(portPipe[0], text, sizeof(text) - 1), 0);
          const int port = std::atoi(std::strchr(text, ':') + 1);
          const int fd = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in address{};
          address.sin_family = AF_INET;
          address.sin_port = htons(static_cast<uint16_t>(port));
          address.sin_addr.s_addr = inet_addr(std::string(text, std::strchr(text, ':')).c_str());
          ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
          // A connection hello (wire.h): magic, version 2, a made-up secret and communicator, rank 2,
          // purpose shrink.
          const uint64_t forged[4] = {0x0000000263686f50ull, 12345, 0, (3ull << 32) | 2};
          ASSERT_EQ(write(fd, forged, sizeof(forged)), static_cast<ssize_t>(sizeof(forged)));
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          close(fd);
          chorusCommDestroy(comm);
          return;
        }
        if (rank == 1) {
          const std::vector<std::string> listening = listeningAddresses();
          ASSERT_EQ(listening.size(), 1u);
          ASSERT_GT(write(portPipe[1], listening[0].c_str(), listening[0].size()), 0);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the stranger comes first
        }
        const int exclude[] = {2};
        chorusComm_t shrunk = nullptr;
        ASSERT_EQ(chorusCommShrink(comm, exclude, 1, &shrunk, nullptr), chorusSuccess) << chorusGetLastError(nullptr);
        int64_t value = rank + 1, sum = 0;
        EXPECT_EQ(chorusAllReduce(&value, &sum, 1, chorusInt64, chorusSum, shrunk, nullptr), chorusSuccess);
        EXPECT_EQ(sum, 3);
        chorusCommDestroy(shrunk);
        chorusCommDestroy(comm);
      },
      60));
  close(portPipe[0]);
  close(portPipe[1]);
}

}  // namespace
}  // namespace chorus
