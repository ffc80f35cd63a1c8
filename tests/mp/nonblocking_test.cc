// nonblocking_test.cc: non-blocking operations on host memory: many in flight on one
// communicator, mixed with blocking calls, completed by test and wait in any order, with
// closed-form results; and the errors of misuse.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <chorus/chorus.hpp>
#include <cstdint>
#include <vector>

#include "tests/support/multiprocess.h"

namespace chorus {
namespace {

using namespace chorus::testing;

class NonBlockingTest : public ::testing::TestWithParam<TransportRanks> {
 protected:
  RanksOptions options() const {
    RanksOptions o;
    o.nranks = GetParam().nranks;
    o.transport = GetParam().transport;
    return o;
  }
};

// Eight all-reduces of different sizes (some many chunks long), an all-gather, a broadcast and a
// reduce-scatter in flight together, completed by polling chorusTest in reverse order.
TEST_P(NonBlockingTest, ManyCollectivesInFlightCompleteByTest) {
  runRanks(options(), [&](int rank, chorusComm_t comm) {
    int n = 0;
    ASSERT_EQ(chorusCommCount(comm, &n), chorusSuccess);
    const size_t sizes[8] = {1, 7, 1000, 65536, 300001, 3, 1 << 20, 12345};
    std::vector<std::vector<float>> in(8), out(8);
    std::vector<chorusRequest_t> requests;
    for (int k = 0; k < 8; ++k) {
      in[k].resize(sizes[k]);
      out[k].assign(sizes[k], -1);
      for (size_t i = 0; i < sizes[k]; ++i) in[k][i] = static_cast<float>((rank + 1) * (k + 1) + i % 5);
      chorusRequest_t request = nullptr;
      ASSERT_EQ(chorusIAllReduce(in[k].data(), out[k].data(), sizes[k], chorusFloat32, chorusSum, comm, &request),
                chorusSuccess)
          << chorusGetLastError(comm);
      ASSERT_NE(request, nullptr);
      requests.push_back(request);
    }
    const size_t gatherCount = 40000;
    std::vector<int32_t> mine(gatherCount, rank), gathered(gatherCount * n, -1);
    std::vector<int64_t> bcast(100000, rank == n - 1 ? 42 : 0);
    std::vector<int32_t> scatterIn(static_cast<size_t>(n) * 5000, rank + 1), scatterOut(5000, 0);
    chorusRequest_t extra[3] = {};
    ASSERT_EQ(chorusIAllGather(mine.data(), gathered.data(), gatherCount, chorusInt32, comm, &extra[0]), chorusSuccess);
    ASSERT_EQ(chorusIBroadcast(bcast.data(), bcast.data(), bcast.size(), chorusInt64, n - 1, comm, &extra[1]),
              chorusSuccess);
    ASSERT_EQ(chorusIReduceScatter(scatterIn.data(), scatterOut.data(), 5000, chorusInt32, chorusSum, comm, &extra[2]),
              chorusSuccess);
    for (chorusRequest_t r : extra) requests.push_back(r);

    size_t remaining = requests.size();
    for (int spins = 0; remaining > 0; ++spins) {
      ASSERT_LT(spins, 100000000) << "requests never completed";
      for (size_t k = requests.size(); k-- > 0;) {
        if (requests[k] == nullptr) continue;
        int done = -1;
        ASSERT_EQ(chorusTest(&requests[k], &done), chorusSuccess) << chorusGetLastError(comm);
        if (done == 1) {
          EXPECT_EQ(requests[k], nullptr) << "a completed request is freed and cleared";
          --remaining;
        }
      }
    }
    const float ranksSum = static_cast<float>(n) * (n + 1) / 2;
    for (int k = 0; k < 8; ++k) {
      for (size_t i : {size_t{0}, sizes[k] / 2, sizes[k] - 1}) {
        ASSERT_EQ(out[k][i], ranksSum * (k + 1) + static_cast<float>(n * (i % 5)))
            << "all-reduce " << k << " [" << i << "]";
      }
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(gathered[r * gatherCount], r);
      EXPECT_EQ(gathered[(r + 1) * gatherCount - 1], r);
    }
    EXPECT_EQ(bcast.front(), 42);
    EXPECT_EQ(bcast.back(), 42);
    EXPECT_EQ(scatterOut.front(), n * (n + 1) / 2);
    EXPECT_EQ(scatterOut.back(), n * (n + 1) / 2);
  });
}

// A blocking call made while non-blocking ones run completes in its turn; two in-flight
// all-reduces on the same buffer run one after the other (the second sees the first's result).
TEST_P(NonBlockingTest, BlockingCallsAndSameBufferOperationsKeepTheirOrder) {
  runRanks(options(), [&](int rank, chorusComm_t comm) {
    int n = 0;
    ASSERT_EQ(chorusCommCount(comm, &n), chorusSuccess);
    std::vector<int64_t> shared(200000, rank + 1);
    chorusRequest_t first = nullptr, second = nullptr;
    ASSERT_EQ(chorusIAllReduce(shared.data(), shared.data(), shared.size(), chorusInt64, chorusSum, comm, &first),
              chorusSuccess);
    ASSERT_EQ(chorusIAllReduce(shared.data(), shared.data(), shared.size(), chorusInt64, chorusSum, comm, &second),
              chorusSuccess);
    int32_t small = rank, smallOut = -1;
    ASSERT_EQ(chorusAllReduce(&small, &smallOut, 1, chorusInt32, chorusMax, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    EXPECT_EQ(smallOut, n - 1);
    chorusRequest_t both[2] = {second, first};
    ASSERT_EQ(chorusWaitAll(2, both), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(both[0], nullptr);
    EXPECT_EQ(both[1], nullptr);
    const int64_t once = static_cast<int64_t>(n) * (n + 1) / 2;
    EXPECT_EQ(shared.front(), once * n);
    EXPECT_EQ(shared.back(), once * n);
  });
}

// Point to point without a group: every rank starts its receive and its send to the ring
// neighbours (and to itself), and waits afterwards.
TEST_P(NonBlockingTest, SendsAndReceivesWithoutAGroup) {
  runRanks(options(), [&](int rank, chorusComm_t comm) {
    int n = 0;
    ASSERT_EQ(chorusCommCount(comm, &n), chorusSuccess);
    const size_t count = 250000;  // larger than any transport buffers
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<int32_t> out(count, 10 * rank), in(count, -1), self(count, -1);
    chorusRequest_t requests[4] = {};
    ASSERT_EQ(chorusISend(out.data(), count, chorusInt32, next, comm, &requests[0]), chorusSuccess);
    ASSERT_EQ(chorusIRecv(in.data(), count, chorusInt32, prev, comm, &requests[1]), chorusSuccess);
    ASSERT_EQ(chorusIRecv(self.data(), count, chorusInt32, rank, comm, &requests[2]), chorusSuccess);
    ASSERT_EQ(chorusISend(out.data(), count, chorusInt32, rank, comm, &requests[3]), chorusSuccess);
    for (chorusRequest_t& r : requests) ASSERT_EQ(chorusWait(&r), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(in.front(), 10 * prev);
    EXPECT_EQ(in.back(), 10 * prev);
    EXPECT_EQ(self.back(), 10 * rank);
  });
}

// The C++ API: Request objects, waited explicitly or by their destructor.
TEST_P(NonBlockingTest, CppRequests) {
  const TransportRanks param = GetParam();
  CHORUS_REQUIRE_TRANSPORT(param.transport);
  const auto codes = runProcesses(param.nranks, [&](int rank, const chorusUniqueId& id) {
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    config.transport = param.transport;
    config.timeoutMs = 60000;
    Communicator comm(UniqueId(id), param.nranks, rank, &config);
    const int n = comm.size();
    std::vector<double> a(5000, rank), b(3, 1.0), gathered(static_cast<size_t>(n) * 2);
    const std::vector<double> mine{double(rank), double(-rank)};
    {
      Request ra = comm.iallReduce(std::span<double>(a), ReduceOp::kMax);
      Request rb = comm.iallReduce(std::span<double>(b));
      Request rg = comm.iallGather(std::span<const double>(mine), std::span<double>(gathered));
      EXPECT_NO_THROW(comm.checkAsyncError());  // progresses; nothing has failed
      rb.wait();
      EXPECT_TRUE(rb.done());
      EXPECT_EQ(b[2], n);
    }  // ra and rg wait here
    EXPECT_EQ(a[4999], n - 1);
    EXPECT_EQ(gathered[2 * (n - 1) + 1], -(n - 1));
  });
  for (int code : codes) EXPECT_EQ(code, 0);
}

TEST(NonBlocking, MisuseIsAnErrorThatNamesTheCall) {
  RanksOptions options;
  options.nranks = 2;
  runRanks(options, [&](int rank, chorusComm_t comm) {
    float x = 1;
    EXPECT_EQ(chorusIAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, nullptr), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("chorusIAllReduce: request"), std::string::npos);
    chorusRequest_t request = reinterpret_cast<chorusRequest_t>(&x);
    EXPECT_EQ(chorusIAllReduce(&x, &x, 1, static_cast<chorusDataType_t>(99), chorusSum, comm, &request),
              chorusInvalidArgument);
    EXPECT_EQ(request, nullptr) << "no request after an argument error";
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    EXPECT_EQ(chorusIBarrier(comm, &request), chorusInvalidUsage);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("inside a group"), std::string::npos);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess);
    // The collectives are still in step after the rejected calls.
    ASSERT_EQ(chorusIAllReduce(&x, &x, 1, chorusFloat32, chorusSum, comm, &request), chorusSuccess);
    chorusRequest_t copy = request;
    ASSERT_EQ(chorusWait(&request), chorusSuccess) << chorusGetLastError(comm);
    EXPECT_EQ(x, 2.0f);
    EXPECT_EQ(chorusWait(&request), chorusSuccess) << "a NULL request is complete";
    EXPECT_EQ(chorusWait(&copy), chorusInvalidUsage) << "a freed handle";
    int done = 0;
    EXPECT_EQ(chorusTest(&request, &done), chorusSuccess);
    EXPECT_EQ(done, 1);
    EXPECT_EQ(chorusTest(&request, nullptr), chorusInvalidArgument);
    EXPECT_EQ(chorusWaitAll(-1, nullptr), chorusInvalidArgument);
    (void)rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, NonBlockingTest, ::testing::ValuesIn(transportRankMatrix()), transportRanksName);

}  // namespace
}  // namespace chorus
