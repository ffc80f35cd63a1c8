// api_test.cc: the C ABI in one process: version and names, a one-rank communicator, and bad
// input: every case returns a clear error naming what is wrong, touches no buffer, and leaves
// the communicator usable.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

::testing::AssertionResult failsWith(chorusResult_t result, chorusResult_t expected, const char* needle) {
  const std::string message = chorusGetLastError(nullptr);
  if (result != expected) {
    return ::testing::AssertionFailure() << "result " << chorusGetErrorString(result) << ", expected "
                                         << chorusGetErrorString(expected) << " (message: " << message << ")";
  }
  if (message.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message '" << message << "' does not mention '" << needle << "'";
  }
  return ::testing::AssertionSuccess();
}

class OneRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chorusUniqueId id;
    ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess) << chorusGetLastError(nullptr);
    ASSERT_EQ(chorusCommInitRank(&comm_, 1, id, 0), chorusSuccess) << chorusGetLastError(nullptr);
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      EXPECT_EQ(chorusCommDestroy(comm_), chorusSuccess);
    }
  }
  // The communicator still works after an error.
  void expectStillWorks() {
    float in[3] = {1, 2, 3}, out[3] = {};
    ASSERT_EQ(chorusAllReduce(in, out, 3, chorusFloat32, chorusSum, comm_, nullptr), chorusSuccess)
        << chorusGetLastError(comm_);
    EXPECT_EQ(out[2], 3.0f);
  }
  chorusComm_t comm_ = nullptr;
};

TEST(ApiTest, VersionNamesAndSizes) {
  int version = 0;
  ASSERT_EQ(chorusGetVersion(&version), chorusSuccess);
  EXPECT_EQ(version, CHORUS_VERSION_CODE);
  EXPECT_EQ(chorusGetVersion(nullptr), chorusInvalidArgument);
  EXPECT_STREQ(chorusGetErrorString(chorusTimeout), "timeout");
  EXPECT_STREQ(chorusTypeName(chorusBfloat16), "bfloat16");
  EXPECT_STREQ(chorusOpName(chorusAvg), "avg");
  EXPECT_EQ(chorusTypeSize(chorusFloat16), 2u);
  EXPECT_EQ(chorusTypeSize(chorusUint64), 8u);
  EXPECT_EQ(chorusTypeSize(static_cast<chorusDataType_t>(99)), 0u);
}

// The cost model as the public API gives it: a send is latency + bytes / bandwidth; a large
// all-reduce costs at least the ring's bandwidth bound 2 (n-1)/n bytes / bandwidth and more over
// a slower link; one rank costs nothing; bad links are refused by name.
TEST(ApiTest, PredictTimeFollowsTheLinks) {
  const chorusLinkModel_t fast{1, 2.0, 100.0, 2.0, 100.0, 500.0}, slow{1, 2.0, 10.0, 2.0, 10.0, 500.0};
  double us = -1;
  ASSERT_EQ(chorusPredictTime(chorusCollSend, 2, 1000000, &fast, &us), chorusSuccess);
  EXPECT_DOUBLE_EQ(us, 2.0 + 1e6 / 100e3);
  const size_t bytes = size_t{64} << 20;
  double fastUs = 0, slowUs = 0;
  ASSERT_EQ(chorusPredictTime(chorusCollAllReduce, 8, bytes, &fast, &fastUs), chorusSuccess);
  ASSERT_EQ(chorusPredictTime(chorusCollAllReduce, 8, bytes, &slow, &slowUs), chorusSuccess);
  EXPECT_GE(fastUs, 2.0 * 7 / 8 * bytes / 100e3);
  EXPECT_GT(slowUs, 5 * fastUs);
  ASSERT_EQ(chorusPredictTime(chorusCollAllGather, 1, bytes, &fast, &us), chorusSuccess);
  EXPECT_EQ(us, 0.0);
  const chorusLinkModel_t broken{1, 2.0, 0.0, 2.0, 0.0, 500.0};
  EXPECT_EQ(chorusPredictTime(chorusCollAllReduce, 8, bytes, &broken, &us), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("bandwidth 0 GB/s"), std::string::npos)
      << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusPredictTime(static_cast<chorusCollective_t>(42), 8, bytes, &fast, &us), chorusInvalidArgument);
  EXPECT_EQ(chorusPredictTime(chorusCollGather, 8, bytes, &fast, &us), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("does not predict gather"), std::string::npos)
      << chorusGetLastError(nullptr);
}

TEST(ApiTest, CollectiveInfoSizesEachRanksBuffers) {
  chorusCollectiveInfo_t info{};
  ASSERT_EQ(chorusGetCollectiveInfo(chorusCollReduceScatter, 4, 10, &info), chorusSuccess);
  EXPECT_STREQ(info.name, "reducescatter");
  EXPECT_TRUE(info.reduces);
  EXPECT_FALSE(info.rooted);
  EXPECT_EQ(info.inputElements, 40u);
  EXPECT_EQ(info.outputElements, 10u);
  EXPECT_EQ(info.wholeElements, 40u);
  ASSERT_EQ(chorusGetCollectiveInfo(chorusCollGather, 3, 5, &info), chorusSuccess);
  EXPECT_TRUE(info.rooted);
  EXPECT_TRUE(info.outputAtRootOnly);
  EXPECT_FALSE(info.inputAtRootOnly);
  EXPECT_EQ(info.inputElements, 5u);
  EXPECT_EQ(info.outputElements, 15u);
  ASSERT_EQ(chorusGetCollectiveInfo(chorusCollAllToAll, 3, 5, &info), chorusSuccess);
  EXPECT_FALSE(info.inPlace);
  EXPECT_EQ(info.outputElements, 15u);
  ASSERT_EQ(chorusGetCollectiveInfo(chorusCollRecv, 3, 5, &info), chorusSuccess);
  EXPECT_TRUE(info.pointToPoint);
  EXPECT_EQ(info.inputElements, 0u);
  EXPECT_EQ(info.outputElements, 5u);
  EXPECT_EQ(chorusGetCollectiveInfo(static_cast<chorusCollective_t>(12), 3, 5, &info), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("collective 12 is not a chorusCollective_t"),
            std::string::npos)
      << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusGetCollectiveInfo(chorusCollAllReduce, 0, 5, &info), chorusInvalidArgument);
  EXPECT_EQ(chorusGetCollectiveInfo(chorusCollAllGather, 4, SIZE_MAX / 4, &info), chorusInvalidArgument);
  EXPECT_EQ(chorusGetCollectiveInfo(chorusCollAllReduce, 4, 5, nullptr), chorusInvalidArgument);
}

TEST_F(OneRankTest, RankCountAndEveryCollectiveOnOneRank) {
  int count = 0, rank = -1;
  ASSERT_EQ(chorusCommCount(comm_, &count), chorusSuccess);
  ASSERT_EQ(chorusCommUserRank(comm_, &rank), chorusSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(rank, 0);
  int32_t in[4] = {5, -6, 7, 8}, out[4] = {};
  ASSERT_EQ(chorusAllReduce(in, out, 4, chorusInt32, chorusAvg, comm_, nullptr), chorusSuccess);
  EXPECT_EQ(out[1], -6);
  ASSERT_EQ(chorusBroadcast(in, out, 4, chorusInt32, 0, comm_, nullptr), chorusSuccess);
  EXPECT_EQ(out[3], 8);
  ASSERT_EQ(chorusBarrier(comm_, nullptr), chorusSuccess);
}

TEST_F(OneRankTest, NullBufferIsRejectedAndNothingIsWritten) {
  float out[2] = {42, 42};
  EXPECT_TRUE(failsWith(chorusAllReduce(nullptr, out, 2, chorusFloat32, chorusSum, comm_, nullptr),
                        chorusInvalidArgument, "sendbuff is NULL"));
  EXPECT_EQ(out[0], 42.0f);
  EXPECT_TRUE(failsWith(chorusAllGather(out, nullptr, 2, chorusFloat32, comm_, nullptr), chorusInvalidArgument,
                        "recvbuff is NULL"));
  EXPECT_TRUE(
      failsWith(chorusSend(nullptr, 1, chorusFloat32, 0, comm_, nullptr), chorusInvalidArgument, "sendbuff is NULL"));
  // Count 0 accepts NULL buffers.
  EXPECT_EQ(chorusAllReduce(nullptr, nullptr, 0, chorusFloat32, chorusSum, comm_, nullptr), chorusSuccess);
  expectStillWorks();
}

TEST_F(OneRankTest, OverflowingCountIsRejected) {
  float buffer[1];
  EXPECT_TRUE(failsWith(chorusAllReduce(buffer, buffer, SIZE_MAX / 2, chorusFloat32, chorusSum, comm_, nullptr),
                        chorusInvalidArgument, "overflows"));
  EXPECT_TRUE(failsWith(chorusAllGather(buffer, buffer, SIZE_MAX / 8, chorusFloat64, comm_, nullptr),
                        chorusInvalidArgument, "overflows"));
  expectStillWorks();
}

TEST_F(OneRankTest, UnknownTypeAndOpAreRejected) {
  float buffer[1] = {1};
  EXPECT_TRUE(
      failsWith(chorusAllReduce(buffer, buffer, 1, static_cast<chorusDataType_t>(42), chorusSum, comm_, nullptr),
                chorusInvalidArgument, "unknown datatype 42"));
  EXPECT_TRUE(
      failsWith(chorusAllReduce(buffer, buffer, 1, chorusFloat32, static_cast<chorusRedOp_t>(99), comm_, nullptr),
                chorusInvalidArgument, "unknown reduction op 99"));
  EXPECT_TRUE(failsWith(chorusBroadcast(buffer, buffer, 1, static_cast<chorusDataType_t>(10), 0, comm_, nullptr),
                        chorusInvalidArgument, "unknown datatype"));
  expectStillWorks();
}

TEST_F(OneRankTest, RootAndPeerOutOfRangeAreRejected) {
  float buffer[1] = {1};
  EXPECT_TRUE(failsWith(chorusBroadcast(buffer, buffer, 1, chorusFloat32, 1, comm_, nullptr), chorusInvalidArgument,
                        "root 1 is out of range [0, 1)"));
  EXPECT_TRUE(failsWith(chorusReduce(buffer, buffer, 1, chorusFloat32, chorusSum, -1, comm_, nullptr),
                        chorusInvalidArgument, "root -1 is out of range"));
  EXPECT_TRUE(failsWith(chorusSend(buffer, 1, chorusFloat32, 5, comm_, nullptr), chorusInvalidArgument,
                        "peer 5 is out of range"));
  EXPECT_TRUE(failsWith(chorusRecv(buffer, 1, chorusFloat32, 1, comm_, nullptr), chorusInvalidArgument,
                        "peer 1 is out of range"));
  expectStillWorks();
}

// Host buffers with a stream: without CUDA (in the build or on the machine) the stream is refused;
// with it, the buffers are (they are not device memory). Either way nothing runs.
TEST_F(OneRankTest, HostBuffersWithAStreamAreRefused) {
  float buffer[1] = {1};
  auto fakeStream = reinterpret_cast<chorusStream_t>(0x1);  // cudaStreamLegacy's value
  EXPECT_TRUE(failsWith(chorusAllReduce(buffer, buffer, 1, chorusFloat32, chorusSum, comm_, fakeStream),
                        chorusInvalidArgument, "stream was given"));
  EXPECT_EQ(buffer[0], 1.0f);
  expectStillWorks();
}

TEST_F(OneRankTest, SelfMessagesNeedAGroup) {
  int32_t out = 0, in = 77;
  EXPECT_TRUE(failsWith(chorusSend(&in, 1, chorusInt32, 0, comm_, nullptr), chorusInvalidUsage, "outside a group"));
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusRecv(&out, 1, chorusInt32, 0, comm_, nullptr), chorusSuccess);
  ASSERT_EQ(chorusSend(&in, 1, chorusInt32, 0, comm_, nullptr), chorusSuccess);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm_);
  EXPECT_EQ(out, 77);
}

TEST_F(OneRankTest, GroupMisuseIsReported) {
  EXPECT_TRUE(failsWith(chorusGroupEnd(), chorusInvalidUsage, "without chorusGroupStart"));
  // A bad call inside a group fails the whole group at its end; nothing of it runs.
  float in[2] = {1, 2}, out[2] = {0, 0};
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  EXPECT_EQ(chorusAllReduce(in, out, 2, chorusFloat32, chorusSum, comm_, nullptr), chorusSuccess);
  EXPECT_EQ(chorusAllReduce(nullptr, out, 2, chorusFloat32, chorusSum, comm_, nullptr), chorusInvalidArgument);
  EXPECT_TRUE(failsWith(chorusGroupEnd(), chorusInvalidArgument, "none of the group's calls ran"));
  EXPECT_EQ(out[1], 0.0f);
  expectStillWorks();
}

TEST_F(OneRankTest, AllToAllMisuseIsRejected) {
  int32_t buffer[4] = {1, 2, 3, 4};
  EXPECT_TRUE(failsWith(chorusAllToAll(buffer, buffer, 4, chorusInt32, comm_, nullptr), chorusInvalidArgument,
                        "no in-place alltoall"));
  size_t counts[1] = {1}, displs[1] = {0};
  EXPECT_TRUE(
      failsWith(chorusAllToAllv(buffer, counts, nullptr, buffer + 2, counts, displs, chorusInt32, comm_, nullptr),
                chorusInvalidArgument, "array is NULL"));
  EXPECT_EQ(chorusAllToAllv(buffer, counts, displs, buffer + 2, counts, displs, chorusInt32, comm_, nullptr),
            chorusSuccess)
      << chorusGetLastError(comm_);
  EXPECT_EQ(buffer[2], 1);
  EXPECT_TRUE(failsWith(chorusAllToAllv(buffer, counts, displs, buffer, counts, displs, chorusInt32, comm_, nullptr),
                        chorusInvalidArgument, "no in-place alltoallv"));
  expectStillWorks();
}

TEST(ApiTest, AlgorithmNamesListEachCollectivesAlgorithms) {
  EXPECT_STREQ(chorusAlgorithmNames("allreduce"), "ring,tree,recursive_doubling,rabenseifner,hierarchical,direct");
  EXPECT_STREQ(chorusAlgorithmNames("broadcast"), "chain,binomial,scatter_allgather,hierarchical");
  EXPECT_STREQ(chorusAlgorithmNames("alltoall"), "pairwise,bruck");
  EXPECT_EQ(chorusAlgorithmNames("nosuch"), nullptr);
  EXPECT_EQ(chorusAlgorithmNames(nullptr), nullptr);
}

TEST_F(OneRankTest, UseAfterDestroyIsAnError) {
  ASSERT_EQ(chorusCommDestroy(comm_), chorusSuccess);
  float buffer[1] = {1};
  EXPECT_TRUE(failsWith(chorusAllReduce(buffer, buffer, 1, chorusFloat32, chorusSum, comm_, nullptr),
                        chorusInvalidUsage, "not live"));
  int count = 0;
  EXPECT_TRUE(failsWith(chorusCommCount(comm_, &count), chorusInvalidUsage, "not live"));
  EXPECT_TRUE(failsWith(chorusCommDestroy(comm_), chorusInvalidUsage, "not live"));
  EXPECT_TRUE(failsWith(chorusBarrier(nullptr, nullptr), chorusInvalidUsage, "NULL"));
  comm_ = nullptr;
}

TEST(ApiInitTest, BadInitArgumentsAreRejected) {
  chorusUniqueId id;
  std::memset(&id, 0, sizeof(id));
  chorusComm_t comm = nullptr;
  EXPECT_TRUE(failsWith(chorusCommInitRank(&comm, 2, id, 0), chorusInvalidArgument, "bad magic"));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&comm, 2, id, 2), chorusInvalidArgument, "rank 2 is out of range"));
  EXPECT_TRUE(failsWith(chorusCommInitRank(&comm, 0, id, 0), chorusInvalidArgument, "nranks 0"));
  EXPECT_TRUE(failsWith(chorusCommInitRank(nullptr, 1, id, 0), chorusInvalidArgument, "NULL"));
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  config.magic = 1;
  EXPECT_TRUE(failsWith(chorusCommInitRankConfig(&comm, 1, id, 0, &config), chorusInvalidArgument,
                        "CHORUS_CONFIG_INITIALIZER"));
  chorusConfig_t transport = CHORUS_CONFIG_INITIALIZER;
  transport.transport = "carrier-pigeon";
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  EXPECT_TRUE(
      failsWith(chorusCommInitRankConfig(&comm, 1, id, 0, &transport), chorusInvalidArgument, "carrier-pigeon"));
  EXPECT_EQ(comm, nullptr);
}

TEST(ApiInitTest, InitFromEnvWithoutLauncherNamesTheVariables) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CHORUS_RANK", "CHORUS_WORLD_SIZE",
                           "CHORUS_MASTER_ADDR", "CHORUS_MASTER_PORT", "PMI_FD", "PMI_RANK", "PMI_SIZE"}) {
    unsetenv(name);
  }
  chorusComm_t comm = nullptr;
  EXPECT_TRUE(failsWith(chorusCommInitFromEnv(&comm, nullptr), chorusInvalidArgument, "MASTER_ADDR"));
  setenv("RANK", "zero", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  EXPECT_TRUE(failsWith(chorusCommInitFromEnv(&comm, nullptr), chorusInvalidArgument, "RANK='zero'"));
  setenv("CHORUS_TIMEOUT_MS", "soon", 1);
  EXPECT_TRUE(failsWith(chorusCommInitFromEnv(&comm, nullptr), chorusInvalidArgument, "CHORUS_TIMEOUT_MS='soon'"));
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CHORUS_TIMEOUT_MS"}) unsetenv(name);
}

}  // namespace

// Communicators of several ranks in this process, made on threads (an init waits for its peers);
// `timeoutMs` for each (-1: the default).
static std::vector<chorusComm_t> ranksOfOneJob(int n, int timeoutMs = -1) {
  chorusUniqueId id;
  EXPECT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<chorusComm_t> comms(n, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
      config.timeoutMs = timeoutMs;
      EXPECT_EQ(chorusCommInitRankConfig(&comms[r], n, id, r, &config), chorusSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
  return comms;
}

// One thread drives every rank of a job through one group (as NCCL's groups allow): every
// communicator's calls are started before any is waited for.
TEST(GroupTest, OneThreadDrivesEveryRankThroughOneGroup) {
  const int n = 3;
  std::vector<chorusComm_t> comms = ranksOfOneJob(n);
  std::vector<std::vector<float>> sums(n, std::vector<float>(1000));
  std::vector<std::vector<int32_t>> gathered(n, std::vector<int32_t>(2 * n, -1));
  std::vector<int32_t> mine(2 * n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < sums[r].size(); ++i) sums[r][i] = static_cast<float>(r + i);
    mine[2 * r] = 10 * r;
    mine[2 * r + 1] = 10 * r + 1;
  }
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(
        chorusAllReduce(sums[r].data(), sums[r].data(), sums[r].size(), chorusFloat32, chorusSum, comms[r], nullptr),
        chorusSuccess);
    ASSERT_EQ(chorusAllGather(&mine[2 * r], gathered[r].data(), 2, chorusInt32, comms[r], nullptr), chorusSuccess);
  }
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < sums[r].size(); ++i) {
      ASSERT_EQ(sums[r][i], static_cast<float>(0 + 1 + 2 + 3 * i)) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(gathered[r], mine) << "rank " << r;
  }
  for (chorusComm_t comm : comms) EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);
}

// Inits inside a group (as NCCL's ncclCommInitRank in ncclGroupStart/End): each is checked and
// its handle left NULL at once, and all are made together at chorusGroupEnd, so one thread inits
// every rank of a job. The config is copied, its strings too: the caller's are gone by then.
TEST(GroupTest, OneThreadInitsEveryRankThroughOneGroup) {
  const int n = 3;
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  std::vector<chorusComm_t> comms(n, reinterpret_cast<chorusComm_t>(&id));  // not NULL before the call
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    std::string transport = "tcp", algorithms = "allreduce:recursive_doubling";
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.transport = transport.c_str();
    config.algorithms = algorithms.c_str();
    ASSERT_EQ(chorusCommInitRankConfig(&comms[r], n, id, r, &config), chorusSuccess) << chorusGetLastError(nullptr);
    EXPECT_EQ(comms[r], nullptr);
    transport.assign(64, 'x');  // what the call was given is gone
    algorithms.assign(64, 'y');
  }
  // An init's own arguments are checked at the call; the group goes on.
  chorusComm_t bad = nullptr;
  EXPECT_EQ(chorusCommInitRank(&bad, n, id, n), chorusInvalidArgument);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    ASSERT_NE(comms[r], nullptr) << "rank " << r;
    int rank = -1;
    ASSERT_EQ(chorusCommUserRank(comms[r], &rank), chorusSuccess);
    EXPECT_EQ(rank, r);
  }
  std::vector<std::vector<double>> values(n, std::vector<double>(501));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < values[r].size(); ++i) values[r][i] = r + 0.25 * static_cast<double>(i);
  }
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(chorusAllReduce(values[r].data(), values[r].data(), values[r].size(), chorusFloat64, chorusSum, comms[r],
                              nullptr),
              chorusSuccess);
  }
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < values[r].size(); ++i) {
      ASSERT_EQ(values[r][i], 3.0 + 0.75 * static_cast<double>(i)) << "rank " << r << " element " << i;
    }
  }
  for (chorusComm_t comm : comms) EXPECT_EQ(chorusCommDestroy(comm), chorusSuccess);

  // A group whose call failed its checks makes none of its inits.
  chorusComm_t never = reinterpret_cast<chorusComm_t>(&id);
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusCommInitRank(&never, 2, id, 0), chorusSuccess);
  EXPECT_EQ(chorusAllReduce(nullptr, nullptr, 1, chorusFloat32, chorusSum, nullptr, nullptr), chorusInvalidUsage);
  EXPECT_NE(chorusGroupEnd(), chorusSuccess);
  EXPECT_EQ(never, nullptr);
}

// A group over two ranks of three, whose third never calls: the group fails at the timeout,
// naming the wait, instead of hanging.
TEST(GroupTest, AGroupWhosePeerNeverComesTimesOut) {
  const int n = 3;
  std::vector<chorusComm_t> comms = ranksOfOneJob(n, 300);
  float values[2] = {1, 2};
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(chorusAllReduce(&values[r], &values[r], 1, chorusFloat32, chorusSum, comms[r], nullptr), chorusSuccess);
  }
  const chorusResult_t ended = chorusGroupEnd();
  EXPECT_TRUE(ended == chorusTimeout || ended == chorusRemoteError) << chorusGetErrorString(ended);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("nothing moved"), std::string::npos)
      << chorusGetLastError(nullptr);
  for (chorusComm_t comm : comms) chorusCommAbort(comm);
}
