// collectives_test.cc: every collective x rank count x element count x type x op x in/out of
// place, on real forked ranks over shm and over tcp, checked against closed-form results.
#include <chorus/chorus.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/pattern.h"
#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using pattern::expectedReduce;
using pattern::moveInput;
using pattern::reduceInput;

constexpr size_t kCounts[] = {0, 1, 7, 1023, (1u << 20) + 3};
constexpr chorusDataType_t kTypes[] = {chorusInt8,   chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,
                                       chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16};
constexpr chorusRedOp_t kOps[] = {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg};

struct Buffer {
  explicit Buffer(size_t bytes) : bytes_(bytes + 64) {}
  // NULL when empty, to check that count 0 accepts NULL buffers.
  char* data() { return bytes_.size() > 64 ? bytes_.data() : nullptr; }
  std::vector<char> bytes_;
};

std::string describe(const char* what, int nranks, size_t count, chorusDataType_t type, const char* op, bool inPlace) {
  return std::string(what) + " nranks=" + std::to_string(nranks) + " count=" + std::to_string(count) +
         " type=" + chorusTypeName(type) + " op=" + op + (inPlace ? " in-place" : " out-of-place");
}

void checkAllReduce(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                    bool inPlace) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * size);
  for (size_t i = 0; i < count; ++i) pattern::store(send.data(), i, type, reduceInput(op, type, rank, i));
  const std::vector<char> original = send.bytes_;
  char* out = inPlace ? send.data() : recv.data();
  const std::string what = describe("allreduce", n, count, type, chorusOpName(op), inPlace);
  ASSERT_EQ(chorusAllReduce(send.data(), out, count, type, op, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(out, count, type, [&](size_t i) { return expectedReduce(op, type, n, i); }), 0u)
      << what;
  if (!inPlace) {
    EXPECT_TRUE(original == send.bytes_) << what << ": the input changed";
  }
}

void checkReduceScatter(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                        bool inPlace) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * n * size), recv(count * size);
  for (size_t j = 0; j < count * n; ++j) pattern::store(send.data(), j, type, reduceInput(op, type, rank, j));
  char* out = inPlace ? (count ? send.data() + rank * count * size : nullptr) : recv.data();
  const std::string what = describe("reducescatter", n, count, type, chorusOpName(op), inPlace);
  ASSERT_EQ(chorusReduceScatter(send.data(), out, count, type, op, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(
      pattern::countWrong(out, count, type, [&](size_t i) { return expectedReduce(op, type, n, rank * count + i); }),
      0u)
      << what;
}

void checkReduce(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                 bool inPlace, int root) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * size);
  for (size_t i = 0; i < count; ++i) pattern::store(send.data(), i, type, reduceInput(op, type, rank, i));
  char* out = inPlace ? send.data() : (rank == root ? recv.data() : nullptr);
  const std::string what =
      describe("reduce", n, count, type, chorusOpName(op), inPlace) + " root=" + std::to_string(root);
  ASSERT_EQ(chorusReduce(send.data(), out, count, type, op, root, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  if (rank == root) {
    EXPECT_EQ(pattern::countWrong(out, count, type, [&](size_t i) { return expectedReduce(op, type, n, i); }), 0u)
        << what;
  }
}

void checkAllGather(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * n * size);
  char* in = inPlace ? (count ? recv.data() + rank * count * size : nullptr) : send.data();
  for (size_t i = 0; i < count; ++i) pattern::store(in, i, type, moveInput(rank, i));
  const std::string what = describe("allgather", n, count, type, "-", inPlace);
  ASSERT_EQ(chorusAllGather(in, recv.data(), count, type, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(
                recv.data(), count * n, type,
                [&](size_t j) { return pattern::asStored(type, moveInput(static_cast<int>(j / count), j % count)); }),
            0u)
      << what;
}

void checkBroadcast(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * size);
  char* out = recv.data();
  char* in = inPlace ? out : send.data();
  if (rank == root) {
    for (size_t i = 0; i < count; ++i) pattern::store(in, i, type, moveInput(root, i));
  }
  const std::string what = describe("broadcast", n, count, type, "-", inPlace) + " root=" + std::to_string(root);
  ASSERT_EQ(chorusBroadcast(rank == root ? in : nullptr, out, count, type, root, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(
      pattern::countWrong(out, count, type, [&](size_t i) { return pattern::asStored(type, moveInput(root, i)); }), 0u)
      << what;
}

// Each rank sends to rank+1 and receives from rank-1 in one group (a ring shift); with one
// rank, that is a message to itself.
void checkSendRecv(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * size);
  for (size_t i = 0; i < count; ++i) pattern::store(send.data(), i, type, moveInput(rank, i));
  const int next = (rank + 1) % n;
  const int prev = (rank + n - 1) % n;
  const std::string what = describe("sendrecv", n, count, type, "-", false);
  ASSERT_EQ(chorusGroupStart(), chorusSuccess);
  ASSERT_EQ(chorusSend(send.data(), count, type, next, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
  ASSERT_EQ(chorusRecv(recv.data(), count, type, prev, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
  ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(recv.data(), count, type,
                                [&](size_t i) { return pattern::asStored(type, moveInput(prev, i)); }),
            0u)
      << what;
  // Outside a group: even positions send first, odd ones receive first (a blocking exchange).
  if (n > 1 && n % 2 == 0) {
    std::fill(recv.bytes_.begin(), recv.bytes_.end(), 0);
    if (rank % 2 == 0) {
      ASSERT_EQ(chorusSend(send.data(), count, type, next, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      ASSERT_EQ(chorusRecv(recv.data(), count, type, prev, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    } else {
      ASSERT_EQ(chorusRecv(recv.data(), count, type, prev, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      ASSERT_EQ(chorusSend(send.data(), count, type, next, comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    }
    EXPECT_EQ(pattern::countWrong(recv.data(), count, type,
                                  [&](size_t i) { return pattern::asStored(type, moveInput(prev, i)); }),
              0u)
        << what << " (blocking, ungrouped)";
  }
}

struct Param {
  const char* transport;
  int nranks;
};
void PrintTo(const Param& param, std::ostream* os) { *os << param.transport << " x " << param.nranks << " ranks"; }

class CollectivesTest : public ::testing::TestWithParam<Param> {};

TEST_P(CollectivesTest, EveryCollectiveTypeOpCountAndPlacement) {
  const Param param = GetParam();
  testing::RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    const int n = param.nranks;
    int variant = 0;
    for (size_t count : kCounts) {
      for (chorusDataType_t type : kTypes) {
        for (bool inPlace : {false, true}) {
          const int root = (variant++) % n;
          for (chorusRedOp_t op : kOps) {
            checkAllReduce(comm, rank, n, count, type, op, inPlace);
            checkReduceScatter(comm, rank, n, count, type, op, inPlace);
            checkReduce(comm, rank, n, count, type, op, inPlace, root);
          }
          checkAllGather(comm, rank, n, count, type, inPlace);
          checkBroadcast(comm, rank, n, count, type, inPlace, root);
        }
        checkSendRecv(comm, rank, n, count, type);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  });
}

// The barrier lets nobody out before everyone is in: each rank arrives late by a different
// amount and bumps a counter in memory shared by the forked ranks; after the barrier every rank
// must see the full count.
TEST_P(CollectivesTest, BarrierWaitsForEveryRank) {
  const Param param = GetParam();
  auto* counter = static_cast<std::atomic<int>*>(
      mmap(nullptr, sizeof(std::atomic<int>) * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(counter, MAP_FAILED);
  new (counter) std::atomic<int>(0);
  testing::RanksOptions options;
  options.nranks = param.nranks;
  options.transport = param.transport;
  testing::runRanks(options, [&](int rank, chorusComm_t comm) {
    for (int round = 1; round <= 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * ((rank + round) % param.nranks)));
      counter->fetch_add(1);
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      EXPECT_GE(counter->load(), round * param.nranks) << "rank " << rank << " left barrier " << round << " early";
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
    }
  });
  munmap(counter, sizeof(std::atomic<int>) * 2);
}

std::vector<Param> params() {
  std::vector<Param> all;
  for (const char* transport : {"shm", "tcp"}) {
    for (int n : {1, 2, 3, 4, 5, 8}) all.push_back({transport, n});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(info.param.transport) + "_" + std::to_string(info.param.nranks);
                         });

}  // namespace
}  // namespace chorus
