// nccl_api_test: a program written against NCCL's own nccl.h (the CUDA toolkit's), linked to
// chorus's NCCL API library only (built twice: against libchorus_nccl.so and against the same
// library under NCCL's name, libnccl.so.2), run on ranks that are forked processes, and on ranks
// one thread drives (ncclCommInitAll, groups over several communicators). Host buffers (the
// documented extension), closed-form results, NCCL's result codes and ncclGetLastError's text.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Runs body(rank, comm) on n forked ranks of one communicator. A rank's failure is what body
// returns (empty: passed), printed by the rank; every rank must exit 0.
void runRanks(int n, const std::function<std::string(int, ncclComm_t)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(120);  // a hang fails the test instead of holding it
      ncclComm_t comm = nullptr;
      std::string failure;
      if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
        failure = std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr);
      } else {
        failure = body(rank, comm);
        if (ncclCommDestroy(comm) != ncclSuccess && failure.empty()) failure = "ncclCommDestroy failed";
      }
      if (!failure.empty()) std::fprintf(stderr, "rank %d: %s\n", rank, failure.c_str());
      std::fflush(stderr);
      _exit(failure.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (int rank = 0; rank < n; ++rank) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[rank], &status, 0), pids[rank]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " failed (status " << status << ")";
  }
}

// Collects the first failure of a rank's checks, as text.
struct Checks {
  std::ostringstream failure;
  bool ok() const { return failure.str().empty(); }
  void call(const char* what, ncclResult_t result, ncclComm_t comm) {
    if (result != ncclSuccess && ok())
      failure << what << ": " << ncclGetErrorString(result) << ": " << ncclGetLastError(comm);
  }
  template <typename T>
  void equal(const char* what, size_t i, T got, T want) {
    if (!(got == want) && ok()) failure << what << "[" << i << "] = " << got << ", expected " << want;
  }
  std::string text() const { return failure.str(); }
};

TEST(NcclApi, TheProgramIsLinkedToChorusNotToNccl) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&ncclAllReduce), &info), 0);
  EXPECT_NE(std::string(info.dli_fname).find(CHORUS_EXPECTED_LIBRARY), std::string::npos) << info.dli_fname;
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
}

TEST(NcclApi, CollectivesOnHostBuffersMatchClosedForms) {
  for (const int n : {3, 4}) {
    runRanks(n, [n](int rank, ncclComm_t comm) {
      Checks c;
      int count = 0, me = -1, device = 0;
      c.call("ncclCommCount", ncclCommCount(comm, &count), comm);
      c.call("ncclCommUserRank", ncclCommUserRank(comm, &me), comm);
      c.call("ncclCommCuDevice", ncclCommCuDevice(comm, &device), comm);
      c.equal("count", 0, count, n);
      c.equal("rank", 0, me, rank);
      const size_t len = 1000;
      // All-reduce: float sum, int max, double avg, in place.
      std::vector<float> f(len), fr(len);
      for (size_t i = 0; i < len; ++i) f[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
      c.call("ncclAllReduce", ncclAllReduce(f.data(), fr.data(), len, ncclFloat, ncclSum, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i)
        c.equal("allreduce sum", i, fr[i], static_cast<float>(n * (n + 1) / 2 * (i % 7)));
      std::vector<int32_t> v(len);
      for (size_t i = 0; i < len; ++i) v[i] = static_cast<int32_t>((rank * 31 + i) % 97);
      c.call("ncclAllReduce", ncclAllReduce(v.data(), v.data(), len, ncclInt32, ncclMax, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i) {
        int32_t want = 0;
        for (int r = 0; r < n; ++r) want = std::max(want, static_cast<int32_t>((r * 31 + i) % 97));
        c.equal("allreduce max", i, v[i], want);
      }
      std::vector<double> d(len, static_cast<double>(rank));
      c.call("ncclAllReduce", ncclAllReduce(d.data(), d.data(), len, ncclDouble, ncclAvg, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i) c.equal("allreduce avg", i, d[i], (n - 1) / 2.0);
      // Broadcast and ncclBcast from the last rank.
      std::vector<int64_t> b(len, rank == n - 1 ? 0 : -1), br(len, -1);
      if (rank == n - 1) {
        for (size_t i = 0; i < len; ++i) b[i] = static_cast<int64_t>(i) * 1000003;
      }
      c.call("ncclBroadcast", ncclBroadcast(b.data(), br.data(), len, ncclInt64, n - 1, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i) c.equal("broadcast", i, br[i], static_cast<int64_t>(i) * 1000003);
      c.call("ncclBcast", ncclBcast(b.data(), len, ncclInt64, n - 1, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i) c.equal("bcast", i, b[i], static_cast<int64_t>(i) * 1000003);
      // Reduce (product) to rank 1.
      std::vector<uint32_t> p(len, static_cast<uint32_t>(rank + 2)), pr(len, 0);
      c.call("ncclReduce", ncclReduce(p.data(), pr.data(), len, ncclUint32, ncclProd, 1, comm, nullptr), comm);
      if (rank == 1) {
        uint32_t want = 1;
        for (int r = 0; r < n; ++r) want *= static_cast<uint32_t>(r + 2);
        for (size_t i = 0; i < len; ++i) c.equal("reduce prod", i, pr[i], want);
      }
      // All-gather, reduce-scatter, all-to-all, gather, scatter: blocks by rank.
      std::vector<int32_t> mine(len), all(len * n);
      for (size_t i = 0; i < len; ++i) mine[i] = static_cast<int32_t>(rank * 100000 + i);
      c.call("ncclAllGather", ncclAllGather(mine.data(), all.data(), len, ncclInt32, comm, nullptr), comm);
      for (size_t j = 0; j < len * n; ++j)
        c.equal("allgather", j, all[j], static_cast<int32_t>(j / len * 100000 + j % len));
      std::vector<float> rs(len * n), rsOut(len);
      for (size_t j = 0; j < len * n; ++j) rs[j] = static_cast<float>(j % 13 + rank);
      c.call("ncclReduceScatter", ncclReduceScatter(rs.data(), rsOut.data(), len, ncclFloat32, ncclSum, comm, nullptr),
             comm);
      for (size_t i = 0; i < len; ++i) {
        const size_t j = rank * len + i;
        c.equal("reducescatter", i, rsOut[i], static_cast<float>(n * (j % 13) + n * (n - 1) / 2));
      }
      std::vector<int32_t> a2a(len * n), a2aOut(len * n);
      for (size_t j = 0; j < len * n; ++j) a2a[j] = static_cast<int32_t>(rank * 1000000 + j);
      c.call("ncclAlltoAll", ncclAlltoAll(a2a.data(), a2aOut.data(), len, ncclInt32, comm, nullptr), comm);
      for (size_t j = 0; j < len * n; ++j) {
        const size_t from = j / len;
        c.equal("alltoall", j, a2aOut[j], static_cast<int32_t>(from * 1000000 + rank * len + j % len));
      }
      std::vector<int32_t> gathered(len * n, -1);
      c.call("ncclGather", ncclGather(mine.data(), gathered.data(), len, ncclInt32, 0, comm, nullptr), comm);
      if (rank == 0) {
        for (size_t j = 0; j < len * n; ++j) c.equal("gather", j, gathered[j], all[j]);
      }
      std::vector<int32_t> scattered(len, -1);
      c.call("ncclScatter", ncclScatter(all.data(), scattered.data(), len, ncclInt32, 0, comm, nullptr), comm);
      for (size_t i = 0; i < len; ++i) c.equal("scatter", i, scattered[i], mine[i]);
      // bf16 and fp16 sums of small integers are exact.
      std::vector<uint16_t> h(len, 0x3c00);  // fp16 1.0
      c.call("ncclAllReduce", ncclAllReduce(h.data(), h.data(), len, ncclHalf, ncclSum, comm, nullptr), comm);
      const uint16_t halfN = n == 3 ? 0x4200 : 0x4400;  // fp16 3.0 / 4.0
      for (size_t i = 0; i < len; ++i) c.equal("fp16 sum", i, h[i], halfN);
      return c.text();
    });
  }
}

TEST(NcclApi, GroupedSendRecvAndSplit) {
  const int n = 4;
  runRanks(n, [n](int rank, ncclComm_t comm) {
    Checks c;
    const size_t len = 5000;
    // A ring exchange and an all-to-all made of sends and receives, each in one group.
    std::vector<float> out(len, static_cast<float>(rank)), in(len, -1);
    c.call("ncclGroupStart", ncclGroupStart(), comm);
    c.call("ncclSend", ncclSend(out.data(), len, ncclFloat, (rank + 1) % n, comm, nullptr), comm);
    c.call("ncclRecv", ncclRecv(in.data(), len, ncclFloat, (rank + n - 1) % n, comm, nullptr), comm);
    c.call("ncclGroupEnd", ncclGroupEnd(), comm);
    for (size_t i = 0; i < len; ++i) c.equal("ring recv", i, in[i], static_cast<float>((rank + n - 1) % n));
    std::vector<int32_t> blocks(len * n), got(len * n, -1);
    for (size_t j = 0; j < len * n; ++j) blocks[j] = static_cast<int32_t>(rank * 10 + j / len);
    c.call("ncclGroupStart", ncclGroupStart(), comm);
    for (int peer = 0; peer < n; ++peer) {
      c.call("ncclSend", ncclSend(blocks.data() + peer * len, len, ncclInt32, peer, comm, nullptr), comm);
      c.call("ncclRecv", ncclRecv(got.data() + peer * len, len, ncclInt32, peer, comm, nullptr), comm);
    }
    c.call("ncclGroupEnd", ncclGroupEnd(), comm);
    for (size_t j = 0; j < len * n; ++j)
      c.equal("send/recv all-to-all", j, got[j], static_cast<int32_t>(j / len * 10 + rank));
    // Split: even and odd ranks, keyed in reverse; rank 3 joins none.
    ncclComm_t half = nullptr;
    const int color = rank == 3 ? NCCL_SPLIT_NOCOLOR : rank % 2;
    c.call("ncclCommSplit", ncclCommSplit(comm, color, -rank, &half, nullptr), comm);
    if (rank == 3) {
      if (half != nullptr && c.ok()) c.failure << "NCCL_SPLIT_NOCOLOR gave a communicator";
    } else if (c.ok()) {
      int size = 0, me = -1;
      c.call("ncclCommCount", ncclCommCount(half, &size), half);
      c.call("ncclCommUserRank", ncclCommUserRank(half, &me), half);
      c.equal("split size", 0, size, rank % 2 == 0 ? 2 : 1);
      c.equal("split rank (reverse key)", 0, me, rank == 0 ? 1 : 0);
      int64_t value = rank + 1, sum = 0;
      c.call("ncclAllReduce", ncclAllReduce(&value, &sum, 1, ncclInt64, ncclSum, half, nullptr), half);
      c.equal("split sum", 0, sum, static_cast<int64_t>(rank % 2 == 0 ? 1 + 3 : 2));
      c.call("ncclCommDestroy", ncclCommDestroy(half), half);
    }
    return c.text();
  });
}

TEST(NcclApi, ErrorsUseNcclCodesAndNameTheProblem) {
  runRanks(2, [](int rank, ncclComm_t comm) {
    Checks c;
    auto expect = [&](const char* what, ncclResult_t got, ncclResult_t want, const char* text) {
      const std::string message = ncclGetLastError(comm);
      if (got != want && c.ok()) c.failure << what << ": " << got << ", expected " << want << " (" << message << ")";
      if (message.find(text) == std::string::npos && c.ok())
        c.failure << what << ": message '" << message << "' lacks '" << text << "'";
    };
    float x[4] = {1, 2, 3, 4};
    expect("fp8", ncclAllReduce(x, x, 4, ncclFloat8e4m3, ncclSum, comm, nullptr), ncclInvalidArgument, "fp8");
    expect("root", ncclBroadcast(x, x, 4, ncclFloat, 7, comm, nullptr), ncclInvalidArgument, "root");
    expect("op", ncclAllReduce(x, x, 4, ncclFloat, static_cast<ncclRedOp_t>(9), comm, nullptr), ncclInvalidArgument,
           "not a built-in op");
    ncclRedOp_t op;
    float scalar = 2;
    expect("premulsum", ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm),
           ncclInvalidUsage, "not supported");
    expect("group end", ncclGroupEnd(), ncclInvalidUsage, "no group");
    ncclConfig_t config{};  // not from NCCL_CONFIG_INITIALIZER
    ncclComm_t other = nullptr;
    ncclUniqueId id{};
    expect("config", ncclCommInitRankConfig(&other, 2, id, rank, &config), ncclInvalidArgument,
           "NCCL_CONFIG_INITIALIZER");
    // A bad call inside a group is reported by ncclGroupEnd, and the communicator stays usable.
    c.call("ncclGroupStart", ncclGroupStart(), comm);
    ncclAllReduce(x, x, 4, ncclFloat, ncclSum, nullptr, nullptr);
    expect("group with a NULL communicator", ncclGroupEnd(), ncclInvalidUsage, "NULL");
    ncclResult_t async = ncclInternalError;
    c.call("ncclCommGetAsyncError", ncclCommGetAsyncError(comm, &async), comm);
    if (async != ncclSuccess && c.ok()) c.failure << "async error " << async;
    c.call("ncclAllReduce", ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, nullptr), comm);
    c.equal("sum after errors", 0, x[0], 2.0f);
    for (int r = 0; r < ncclNumResults; ++r) {
      if (ncclGetErrorString(static_cast<ncclResult_t>(r)) == nullptr && c.ok()) c.failure << "no string for " << r;
    }
    return c.text();
  });
}

// One thread drives every rank: ncclCommInitAll, then groups over all the communicators, and
// ncclCommInitRank of several ranks inside one group.
TEST(NcclApi, OneThreadDrivesEveryRankThroughGroups) {
  const int n = 3;
  std::vector<ncclComm_t> comms(n, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::vector<double>> bufs(n, std::vector<double>(777));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 777; ++i) bufs[r][i] = r * 0.5 + static_cast<double>(i);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[r].data(), bufs[r].data(), 777, ncclDouble, ncclSum, comms[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    int me = -1;
    ASSERT_EQ(ncclCommUserRank(comms[r], &me), ncclSuccess);
    EXPECT_EQ(me, r);
    for (size_t i = 0; i < 777; ++i) ASSERT_EQ(bufs[r][i], 1.5 + 3.0 * static_cast<double>(i)) << "rank " << r;
  }
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);

  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> pair(2, nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ncclCommInitRank(&pair[r], 2, id, r), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  int values[2] = {5, 7};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(ncclAllReduce(&values[r], &values[r], 1, ncclInt, ncclMin, pair[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(values[0], 5);
  EXPECT_EQ(values[1], 5);
  for (ncclComm_t comm : pair) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

}  // namespace
