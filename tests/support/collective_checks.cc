// collective_checks.cc: one checked call of each collective (see collective_checks.h).
#include "tests/support/collective_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/pattern.h"

namespace chorus::testing {
namespace {

using pattern::expectedReduce;
using pattern::moveInput;
using pattern::reduceInput;

bool sharedBuffers = false;  // useChorusMemAlloc

// Zeroed bytes (plus 64 spare) from the heap, or from chorusMemAlloc.
struct Buffer {
  explicit Buffer(size_t bytes) : size_(bytes + 64), shared_(sharedBuffers) {
    if (shared_) {
      EXPECT_EQ(chorusMemAlloc(reinterpret_cast<void**>(&base_), size_), chorusSuccess) << chorusGetLastError(nullptr);
    } else {
      base_ = static_cast<char*>(std::calloc(size_, 1));
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (shared_) {
      EXPECT_EQ(chorusMemFree(base_), chorusSuccess) << chorusGetLastError(nullptr);
    } else {
      std::free(base_);
    }
  }
  // NULL when empty, to check that count 0 accepts NULL buffers.
  char* data() { return size_ > 64 ? base_ : nullptr; }
  std::vector<char> bytes() const { return std::vector<char>(base_, base_ + size_); }
  void clear() { std::memset(base_, 0, size_); }
  char* base_ = nullptr;
  size_t size_;
  bool shared_;
};

std::string describe(const char* what, int nranks, size_t count, chorusDataType_t type, const char* op, bool inPlace) {
  return std::string(what) + " nranks=" + std::to_string(nranks) + " count=" + std::to_string(count) +
         " type=" + chorusTypeName(type) + " op=" + op + (inPlace ? " in-place" : " out-of-place");
}

}  // namespace

void useChorusMemAlloc(bool shared) { sharedBuffers = shared; }

void checkAllReduce(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                    bool inPlace) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * size);
  for (size_t i = 0; i < count; ++i) pattern::store(send.data(), i, type, reduceInput(op, type, rank, i));
  const std::vector<char> original = send.bytes();
  char* out = inPlace ? send.data() : recv.data();
  const std::string what = describe("allreduce", n, count, type, chorusOpName(op), inPlace);
  ASSERT_EQ(chorusAllReduce(send.data(), out, count, type, op, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(out, count, type, [&](size_t i) { return expectedReduce(op, type, n, i); }), 0u)
      << what;
  if (!inPlace) {
    EXPECT_TRUE(original == send.bytes()) << what << ": the input changed";
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
    recv.clear();
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

void checkAllToAll(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * n * size), recv(count * n * size);
  for (size_t j = 0; j < count * n; ++j) pattern::store(send.data(), j, type, moveInput(rank, j));
  const std::string what = describe("alltoall", n, count, type, "-", false);
  ASSERT_EQ(chorusAllToAll(send.data(), recv.data(), count, type, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(recv.data(), count * n, type,
                                [&](size_t j) {
                                  return pattern::asStored(
                                      type, moveInput(static_cast<int>(j / count), rank * count + j % count));
                                }),
            0u)
      << what;
}

void checkAllToAllv(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type) {
  const size_t size = chorusTypeSize(type);
  auto amount = [&](int from, int to) { return static_cast<size_t>((from + 2 * to) % 3) + count; };
  std::vector<size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  size_t sendTotal = 0, recvTotal = 0;
  for (int j = 0; j < n; ++j) {
    sendCounts[j] = amount(rank, j);
    sendDispls[j] = sendTotal;
    sendTotal += sendCounts[j] + 1;  // a gap between blocks
    recvCounts[j] = amount(j, rank);
    recvDispls[j] = recvTotal;
    recvTotal += recvCounts[j] + 1;
  }
  Buffer send(sendTotal * size), recv(recvTotal * size);
  for (size_t i = 0; i < sendTotal; ++i) pattern::store(send.data(), i, type, moveInput(rank, i));
  const std::string what = describe("alltoallv", n, count, type, "-", false);
  ASSERT_EQ(chorusAllToAllv(send.data(), sendCounts.data(), sendDispls.data(), recv.data(), recvCounts.data(),
                            recvDispls.data(), type, comm, nullptr),
            chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  for (int from = 0; from < n; ++from) {
    // The sender's displacement of our block: its blocks before ours, each plus the gap.
    size_t theirDispl = 0;
    for (int j = 0; j < rank; ++j) theirDispl += amount(from, j) + 1;
    EXPECT_EQ(pattern::countWrong(recv.data() + recvDispls[from] * size, recvCounts[from], type,
                                  [&](size_t i) { return pattern::asStored(type, moveInput(from, theirDispl + i)); }),
              0u)
        << what << " block from rank " << from;
  }
}

void checkGather(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * size), recv(count * n * size);
  char* in = inPlace && rank == root ? (count ? recv.data() + root * count * size : nullptr) : send.data();
  for (size_t i = 0; i < count; ++i) pattern::store(in, i, type, moveInput(rank, i));
  const std::string what = describe("gather", n, count, type, "-", inPlace) + " root=" + std::to_string(root);
  ASSERT_EQ(chorusGather(in, rank == root ? recv.data() : nullptr, count, type, root, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  if (rank != root) return;
  EXPECT_EQ(pattern::countWrong(
                recv.data(), count * n, type,
                [&](size_t j) { return pattern::asStored(type, moveInput(static_cast<int>(j / count), j % count)); }),
            0u)
      << what;
}

void checkScatter(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root) {
  const size_t size = chorusTypeSize(type);
  Buffer send(count * n * size), recv(count * size);
  if (rank == root) {
    for (size_t j = 0; j < count * n; ++j) pattern::store(send.data(), j, type, moveInput(root, j));
  }
  char* out = inPlace && rank == root ? (count ? send.data() + root * count * size : nullptr) : recv.data();
  const std::string what = describe("scatter", n, count, type, "-", inPlace) + " root=" + std::to_string(root);
  ASSERT_EQ(chorusScatter(rank == root ? send.data() : nullptr, out, count, type, root, comm, nullptr), chorusSuccess)
      << what << ": " << chorusGetLastError(comm);
  EXPECT_EQ(pattern::countWrong(out, count, type,
                                [&](size_t i) { return pattern::asStored(type, moveInput(root, rank * count + i)); }),
            0u)
      << what;
}

void checkEveryCollective(chorusComm_t comm, int rank, int n, std::initializer_list<size_t> counts,
                          std::initializer_list<chorusDataType_t> types, std::initializer_list<chorusRedOp_t> ops,
                          bool withSendRecv) {
  int variant = 0;
  for (size_t count : counts) {
    for (chorusDataType_t type : types) {
      for (bool inPlace : {false, true}) {
        const int root = (variant++) % n;
        for (chorusRedOp_t op : ops) {
          checkAllReduce(comm, rank, n, count, type, op, inPlace);
          checkReduceScatter(comm, rank, n, count, type, op, inPlace);
          checkReduce(comm, rank, n, count, type, op, inPlace, root);
        }
        checkAllGather(comm, rank, n, count, type, inPlace);
        checkBroadcast(comm, rank, n, count, type, inPlace, root);
        checkGather(comm, rank, n, count, type, inPlace, root);
        checkScatter(comm, rank, n, count, type, inPlace, root);
      }
      if (withSendRecv) checkSendRecv(comm, rank, n, count, type);
      checkAllToAll(comm, rank, n, count, type);
      checkAllToAllv(comm, rank, n, count, type);
      ASSERT_EQ(chorusBarrier(comm, nullptr), chorusSuccess) << chorusGetLastError(comm);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

}  // namespace chorus::testing
