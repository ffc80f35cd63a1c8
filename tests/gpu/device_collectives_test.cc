// device_collectives_test.cc: collectives on device buffers, on real ranks (forked processes)
// sharing the machine's GPUs (all on GPU 0 where there is one: CUDA IPC within one device), over
// the three device paths (direct, ipc kernels, staged through the host). Checks closed-form results for every
// type and op, every collective, stream order (the call returns before its stream runs it) and
// CUDA graph capture and replay. Skipped, saying why, without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "tests/gpu/device.h"
#include "tests/support/multiprocess.h"
#include "tests/support/pattern.h"

namespace chorus::testing {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Path {
  const char* transport;  // CHORUS_DEVICE_TRANSPORT
  int nranks;
  // A variant of the path: the knobs set for it ("NAME=VALUE", several separated by spaces), and
  // the word its name takes.
  const char* knobs = nullptr;
  const char* variant = nullptr;
  // Algorithms forced for the communicator (chorusCommSetAlgorithms), or null.
  const char* algorithms = nullptr;
};
std::string nameOf(const Path& p) {
  return std::string(p.transport) + (p.variant != nullptr ? std::string("_") + p.variant : "") + "_" +
         std::to_string(p.nranks);
}
// The variants, each set either way whatever the defaults: the direct path's all-reduce published
// or read in place (every all-reduce), by every rank or by rank 0 alone, and staged calls posted
// by host functions or by stream memory operations.
constexpr const char* kPublished = "CHORUS_DEVICE_DIRECT_INPLACE_BYTES=0";
constexpr const char* kInPlace = "CHORUS_DEVICE_DIRECT_INPLACE_BYTES=1 CHORUS_DEVICE_DIRECT_REDUCERS=all";
constexpr const char* kOneReducer = "CHORUS_DEVICE_DIRECT_INPLACE_BYTES=1 CHORUS_DEVICE_DIRECT_REDUCERS=one";
constexpr const char* kPostByHost = "CHORUS_DEVICE_STAGED_POST=host";
constexpr const char* kPostByValue = "CHORUS_DEVICE_STAGED_POST=value";

// Sets each NAME=VALUE of knobs (separated by spaces) in this process's environment.
void setKnobs(const char* knobs) {
  std::istringstream words(knobs != nullptr ? knobs : "");
  for (std::string word; words >> word;) {
    const size_t equals = word.find('=');
    ASSERT_NE(equals, std::string::npos) << word;
    setenv(word.substr(0, equals).c_str(), word.substr(equals + 1).c_str(), 1);
  }
}
// Every device algorithm forced for some collective where all three are set up (auto, ranks on
// one GPU): each runs what the engine would otherwise give another.
constexpr const char* kForced = "allreduce:staged,allgather:ipc,reducescatter:ipc,broadcast:staged,alltoall:staged";
void PrintTo(const Path& p, std::ostream* os) { *os << nameOf(p); }

// AllReduceEveryTypeAndOp's count past several ring rounds and staging chunks. The emulated
// device runs kernels on one host thread: there a third of it, with staging chunks of 1 MiB
// instead of 4 (so every type of at least 2 bytes still goes in several), costs a third.
#if CHORUS_CUDA_EMULATION
constexpr size_t kLargeCount = 1'000'001;
constexpr const char* kEmulatedStageBytes = "1048576";
#else
constexpr size_t kLargeCount = 3'000'001;
#endif

class DeviceCollectivesTest : public ::testing::TestWithParam<Path> {
 protected:
  RanksOptions options() const {
    RanksOptions o;
    o.nranks = GetParam().nranks;
    o.timeoutMs = 60000;
    return o;
  }
  // Runs body on every rank, all on GPU 0, with the path set, before the first device call.
  void run(const std::function<void(int, chorusComm_t, cudaStream_t)>& body) {
    const Path path = GetParam();
    runRanks(options(), [&](int rank, chorusComm_t comm) {
      setenv("CHORUS_DEVICE_TRANSPORT", path.transport, 1);
#if CHORUS_CUDA_EMULATION
      setenv("CHORUS_DEVICE_STAGE_BYTES", kEmulatedStageBytes, 1);
#endif
      setKnobs(path.knobs);
      if (path.algorithms != nullptr) {
        ASSERT_EQ(chorusCommSetAlgorithms(comm, path.algorithms), chorusSuccess) << chorusGetLastError(comm);
      }
      CUDA_OK(cudaSetDevice(0));
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      body(rank, comm, stream);
      CUDA_OK(cudaStreamDestroy(stream));
    });
  }
};

// host -> device, finished when this returns. A plain cudaMemcpy from pageable memory may return
// before its copy has landed (it runs on the legacy stream, which the tests' non-blocking streams
// do not wait for), so a call enqueued next could read the buffer's old contents.
void upload(void* device, const void* host, size_t bytes) {
  EXPECT_EQ(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
}

struct Device {
  explicit Device(size_t bytes) : bytes(bytes) { EXPECT_EQ(cudaMalloc(&p, bytes + 1), cudaSuccess); }
  ~Device() { cudaFree(p); }
  void put(const std::vector<char>& host) const { upload(p, host.data(), host.size()); }
  std::vector<char> get() const {
    std::vector<char> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  void* p = nullptr;
  size_t bytes;
};

TEST_P(DeviceCollectivesTest, AllReduceEveryTypeAndOp) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    for (int t = 0; t < chorusNumTypes; ++t) {
      const auto type = static_cast<chorusDataType_t>(t);
      for (int o = 0; o < chorusNumOps; ++o) {
        const auto op = static_cast<chorusRedOp_t>(o);
        // LL, bulk, and bulk over several rounds and staging chunks.
        for (const size_t count : {size_t{1}, size_t{4099}, kLargeCount}) {
          const size_t bytes = count * kernels::typeSize(type);
          std::vector<char> host(bytes);
          for (size_t i = 0; i < count; ++i)
            pattern::store(host.data(), i, type, pattern::reduceInput(op, type, rank, i));
          Device in(bytes), out(bytes);
          in.put(host);
          ASSERT_EQ(chorusAllReduce(in.p, out.p, count, type, op, comm, stream), chorusSuccess)
              << chorusGetLastError(comm);
          CUDA_OK(cudaStreamSynchronize(stream));
          const auto got = out.get();
          const size_t wrong = pattern::countWrong(got.data(), count, type,
                                                   [&](size_t i) { return pattern::expectedReduce(op, type, n, i); });
          ASSERT_EQ(wrong, 0u) << chorusTypeName(type) << " " << chorusOpName(op) << " count " << count;
        }
      }
    }
    chorusResult_t async = chorusInternalError;
    ASSERT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
    EXPECT_EQ(async, chorusSuccess);
  });
}

TEST_P(DeviceCollectivesTest, EveryOtherCollective) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    const auto type = chorusFloat32;
    for (const size_t count : {size_t{3}, size_t{70001}}) {
      const size_t bytes = count * 4;
      std::vector<char> mine(bytes), all(bytes * n);
      for (size_t i = 0; i < count; ++i) pattern::store(mine.data(), i, type, pattern::moveInput(rank, i));
      Device in(bytes), out(bytes * n), big(bytes * n);
      in.put(mine);
      // All-gather: block r is rank r's input.
      ASSERT_EQ(chorusAllGather(in.p, out.p, count, type, comm, stream), chorusSuccess) << chorusGetLastError(comm);
      CUDA_OK(cudaStreamSynchronize(stream));
      auto got = out.get();
      EXPECT_EQ(
          pattern::countWrong(got.data(), n * count, type,
                              [&](size_t i) { return pattern::moveInput(static_cast<int>(i / count), i % count); }),
          0u)
          << "all-gather count " << count;
      // Reduce-scatter of reduceInput over n * count: block r to rank r.
      std::vector<char> rs(bytes * n);
      for (size_t i = 0; i < n * count; ++i)
        pattern::store(rs.data(), i, type, pattern::reduceInput(chorusSum, type, rank, i));
      big.put(rs);
      ASSERT_EQ(chorusReduceScatter(big.p, out.p, count, type, chorusSum, comm, stream), chorusSuccess);
      CUDA_OK(cudaStreamSynchronize(stream));
      got = out.get();
      EXPECT_EQ(
          pattern::countWrong(got.data(), count, type,
                              [&](size_t i) { return pattern::expectedReduce(chorusSum, type, n, rank * count + i); }),
          0u)
          << "reduce-scatter count " << count;
      for (int root = 0; root < n; ++root) {
        ASSERT_EQ(chorusBroadcast(in.p, out.p, count, type, root, comm, stream), chorusSuccess);
        CUDA_OK(cudaStreamSynchronize(stream));
        got = out.get();
        EXPECT_EQ(pattern::countWrong(got.data(), count, type, [&](size_t i) { return pattern::moveInput(root, i); }),
                  0u)
            << "broadcast root " << root;
        ASSERT_EQ(chorusReduce(in.p, out.p, count, type, chorusMax, root, comm, stream), chorusSuccess);
        CUDA_OK(cudaStreamSynchronize(stream));
        if (rank == root) {
          got = out.get();
          EXPECT_EQ(pattern::countWrong(got.data(), count, type,
                                        [&](size_t i) {
                                          double m = pattern::moveInput(0, i);
                                          for (int r = 1; r < n; ++r) m = std::max(m, pattern::moveInput(r, i));
                                          return m;
                                        }),
                    0u)
              << "reduce root " << root;
        }
      }
      // All-to-all: block p of rank r's input goes to rank p's block r.
      std::vector<char> a2a(bytes * n);
      for (size_t i = 0; i < n * count; ++i) pattern::store(a2a.data(), i, type, pattern::moveInput(rank, i));
      big.put(a2a);
      ASSERT_EQ(chorusAllToAll(big.p, out.p, count, type, comm, stream), chorusSuccess) << chorusGetLastError(comm);
      CUDA_OK(cudaStreamSynchronize(stream));
      got = out.get();
      EXPECT_EQ(pattern::countWrong(got.data(), n * count, type,
                                    [&](size_t i) {
                                      return pattern::moveInput(static_cast<int>(i / count), rank * count + i % count);
                                    }),
                0u)
          << "all-to-all count " << count;
      // All-to-allv with uneven counts, some zero: rank src sends sent(src, dst) elements to dst,
      // packed in rank order; element j of that block is src's input at its offset there + j.
      auto sent = [&](int src, int dst) -> size_t {
        return (src + 2 * dst) % 3 == 0 ? 0 : count / static_cast<size_t>(dst + 1) + static_cast<size_t>(src);
      };
      auto offsetOf = [&](int src, int dst) {
        size_t at = 0;
        for (int d = 0; d < dst; ++d) at += sent(src, d);
        return at;
      };
      std::vector<size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
      for (int p = 0; p < n; ++p) {
        sendCounts[p] = sent(rank, p);
        sendDispls[p] = offsetOf(rank, p);
        recvCounts[p] = sent(p, rank);
        recvDispls[p] = p == 0 ? 0 : recvDispls[p - 1] + recvCounts[p - 1];
      }
      const size_t sendTotal = offsetOf(rank, n), recvTotal = recvDispls[n - 1] + recvCounts[n - 1];
      ASSERT_LE(std::max(sendTotal, recvTotal), n * count);
      std::vector<char> v(std::max(sendTotal, size_t{1}) * 4);
      for (size_t i = 0; i < sendTotal; ++i) pattern::store(v.data(), i, type, pattern::moveInput(rank, i));
      big.put(v);
      ASSERT_EQ(chorusAllToAllv(big.p, sendCounts.data(), sendDispls.data(), out.p, recvCounts.data(),
                                recvDispls.data(), type, comm, stream),
                chorusSuccess)
          << chorusGetLastError(comm);
      CUDA_OK(cudaStreamSynchronize(stream));
      got = out.get();
      for (int src = 0; src < n; ++src) {
        EXPECT_EQ(pattern::countWrong(got.data() + recvDispls[src] * 4, recvCounts[src], type,
                                      [&](size_t j) { return pattern::moveInput(src, offsetOf(src, rank) + j); }),
                  0u)
            << "all-to-allv count " << count << ", the " << recvCounts[src] << " elements from rank " << src;
      }
      // A ring of sends and receives, outside groups: even ranks send first.
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      for (int phase = 0; phase < 2; ++phase) {
        if ((rank % 2 == 0) == (phase == 0)) {
          ASSERT_EQ(chorusSend(in.p, count, type, next, comm, stream), chorusSuccess) << chorusGetLastError(comm);
        } else {
          ASSERT_EQ(chorusRecv(out.p, count, type, prev, comm, stream), chorusSuccess) << chorusGetLastError(comm);
        }
      }
      ASSERT_EQ(chorusBarrier(comm, stream), chorusSuccess);
      CUDA_OK(cudaStreamSynchronize(stream));
      got = out.get();
      EXPECT_EQ(pattern::countWrong(got.data(), count, type, [&](size_t i) { return pattern::moveInput(prev, i); }), 0u)
          << "send/recv count " << count;
    }
  });
}

// The call returns with its work still queued behind a host function the test holds; releasing it
// lets the stream run the copy in and the all-reduce, in that order. (The communicator's first
// device call, which sets its device path up with the peers and loads its kernels, is made first:
// loading may wait for the device. Every later call only enqueues.)
TEST_P(DeviceCollectivesTest, CallsAreStreamOrderedAndDoNotBlock) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    const size_t count = 100000;
    std::vector<float> host(count, static_cast<float>(rank + 1));
    Device in(count * 4), out(count * 4);
    ASSERT_EQ(chorusAllReduce(in.p, out.p, 1, chorusFloat32, chorusSum, comm, stream), chorusSuccess);
    CUDA_OK(cudaStreamSynchronize(stream));
    static std::atomic<int> gate{0};
    gate = 0;
    CUDA_OK(cudaLaunchHostFunc(
        stream,
        [](void*) {
          while (gate.load() == 0) usleep(1000);
        },
        nullptr));
    CUDA_OK(cudaMemcpyAsync(in.p, host.data(), count * 4, cudaMemcpyHostToDevice, stream));
    ASSERT_EQ(chorusAllReduce(in.p, out.p, count, chorusFloat32, chorusSum, comm, stream), chorusSuccess);
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
    gate = 1;
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<float> got(count);
    CUDA_OK(cudaMemcpy(got.data(), out.p, count * 4, cudaMemcpyDeviceToHost));
    const float expected = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], expected) << "element " << i;
  });
}

// All-reduces in place (one buffer) and out of place, on buffers inside larger allocations at
// offsets that differ between ranks, with the allocations freed and made again between calls (the
// in-place direct path maps each peer allocation once and must notice a new one at an old
// address). Counts that do not divide by the ranks; each rank's element i is (rank + 1) * (i % 7
// + 1), so every sum is n (n + 1) / 2 * (i % 7 + 1), exact in float.
TEST_P(DeviceCollectivesTest, InPlaceAndOffsetBuffersReallocatedBetweenCalls) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    for (int round = 0; round < 4; ++round) {
      const size_t count = round % 2 == 0 ? 70001 : 1000003;
      const size_t offset = static_cast<size_t>(rank + round);  // elements; unaligned for most ranks
      float* base = nullptr;
      CUDA_OK(cudaMalloc(&base, (count + offset + 64) * sizeof(float)));
      float* buffer = base + offset;
      std::vector<float> host(count);
      for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
      upload(buffer, host.data(), count * sizeof(float));
      const bool inPlace = round != 3;
      float* out = inPlace ? buffer : nullptr;
      if (!inPlace) {
        CUDA_OK(cudaMalloc(&out, count * sizeof(float)));
      }
      ASSERT_EQ(chorusAllReduce(buffer, out, count, chorusFloat32, chorusSum, comm, stream), chorusSuccess)
          << chorusGetLastError(comm);
      CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<float> got(count);
      CUDA_OK(cudaMemcpy(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 7 + 1)))
            << "round " << round << (inPlace ? " in place" : " out of place") << ", element " << i;
      }
      if (!inPlace) {
        // The input is untouched.
        CUDA_OK(cudaMemcpy(got.data(), buffer, count * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i += 997) ASSERT_EQ(got[i], host[i]) << "input element " << i;
        CUDA_OK(cudaFree(out));
      }
      CUDA_OK(cudaFree(base));
    }
  });
}

// A NULL stream with device buffers is CUDA's legacy default stream, as NCCL takes it: the call
// runs after the legacy stream's earlier work (the upload below is enqueued there, not waited
// for), and the host buffers of the next call still take the host path.
TEST_P(DeviceCollectivesTest, NullStreamWithDeviceBuffersRunsOnTheLegacyStream) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t) {
    const int n = GetParam().nranks;
    const size_t count = 300000;
    std::vector<float> host(count, static_cast<float>(rank + 1));
    Device in(count * 4), out(count * 4);
    CUDA_OK(cudaMemcpyAsync(in.p, host.data(), count * 4, cudaMemcpyHostToDevice, cudaStreamLegacy));
    ASSERT_EQ(chorusAllReduce(in.p, out.p, count, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
    std::vector<float> got(count);
    CUDA_OK(cudaMemcpy(got.data(), out.p, count * 4, cudaMemcpyDeviceToHost));
    const float expected = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], expected) << "element " << i;
    std::vector<float> hostIn(5, 1.0f), hostOut(5, 0.0f);
    ASSERT_EQ(chorusAllReduce(hostIn.data(), hostOut.data(), 5, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess)
        << chorusGetLastError(comm);
    EXPECT_EQ(hostOut[4], static_cast<float>(n));
  });
}

// A group of device sends and receives: a ring exchange, then an all-to-all made of sends and
// receives to every rank (itself included), each group one staged step on the stream.
TEST_P(DeviceCollectivesTest, GroupedSendsAndReceivesOfDeviceBuffers) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    const size_t count = 50001;
    std::vector<int32_t> mine(count * n);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int32_t>(rank * 1000000 + i);
    Device in(count * n * 4), out(count * n * 4);
    upload(in.p, mine.data(), count * n * 4);
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    ASSERT_EQ(chorusSend(in.p, count, chorusInt32, (rank + 1) % n, comm, stream), chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(chorusRecv(out.p, count, chorusInt32, (rank + n - 1) % n, comm, stream), chorusSuccess)
        << chorusGetLastError(comm);
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<int32_t> got(count * n);
    CUDA_OK(cudaMemcpy(got.data(), out.p, count * 4, cudaMemcpyDeviceToHost));
    const int prev = (rank + n - 1) % n;
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<int32_t>(prev * 1000000 + i)) << "ring " << i;
    ASSERT_EQ(chorusGroupStart(), chorusSuccess);
    for (int peer = 0; peer < n; ++peer) {
      auto* from = static_cast<int32_t*>(in.p) + peer * count;
      auto* into = static_cast<int32_t*>(out.p) + peer * count;
      ASSERT_EQ(chorusSend(from, count, chorusInt32, peer, comm, stream), chorusSuccess) << chorusGetLastError(comm);
      ASSERT_EQ(chorusRecv(into, count, chorusInt32, peer, comm, stream), chorusSuccess) << chorusGetLastError(comm);
    }
    ASSERT_EQ(chorusGroupEnd(), chorusSuccess) << chorusGetLastError(comm);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(got.data(), out.p, count * n * 4, cudaMemcpyDeviceToHost));
    for (int peer = 0; peer < n; ++peer) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[peer * count + i], static_cast<int32_t>(peer * 1000000 + rank * count + i))
            << "from " << peer << " element " << i;
      }
    }
  });
}

// A captured all-reduce replays as a fresh call each time: the flags and counters it uses live in
// device memory and move on by themselves.
TEST_P(DeviceCollectivesTest, CapturedInAGraphAndReplayed) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const int n = GetParam().nranks;
    for (const size_t count : {size_t{1000}, size_t{2'000'000}}) {
      Device in(count * 4), out(count * 4);
      std::vector<float> host(count, 1.0f);
      in.put(std::vector<char>(reinterpret_cast<char*>(host.data()), reinterpret_cast<char*>(host.data()) + count * 4));
      // Once outside capture: the staged path sizes its pinned memory then.
      ASSERT_EQ(chorusAllReduce(in.p, out.p, count, chorusFloat32, chorusSum, comm, stream), chorusSuccess);
      CUDA_OK(cudaStreamSynchronize(stream));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      ASSERT_EQ(chorusAllReduce(in.p, out.p, count, chorusFloat32, chorusSum, comm, stream), chorusSuccess)
          << chorusGetLastError(comm);
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 3; ++replay) {
        const float value = static_cast<float>(rank + replay);
        std::vector<float> input(count, value);
        upload(in.p, input.data(), count * 4);
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        std::vector<float> got(count);
        CUDA_OK(cudaMemcpy(got.data(), out.p, count * 4, cudaMemcpyDeviceToHost));
        const float expected = static_cast<float>(n * (n - 1) / 2 + n * replay);
        for (size_t i = 0; i < count; i += 997) ASSERT_EQ(got[i], expected) << "replay " << replay << " element " << i;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  });
}

TEST_P(DeviceCollectivesTest, HostBuffersWithAStreamAreRefusedByName) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int, chorusComm_t comm, cudaStream_t stream) {
    float host[4] = {1, 2, 3, 4};
    EXPECT_EQ(chorusAllReduce(host, host, 4, chorusFloat32, chorusSum, comm, stream), chorusInvalidArgument);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("sendbuff"), std::string::npos) << chorusGetLastError(comm);
    EXPECT_NE(std::string(chorusGetLastError(comm)).find("not device memory"), std::string::npos);
    EXPECT_EQ(host[0], 1.0f);
  });
}

// A compressed all-reduce of device buffers gives what the same compressor gives on host buffers,
// call after call (the error feedback and PowerSGD's warm start carried by the device
// compressor's own state): two compressors of one spec, one fed device buffers on the stream,
// the other the same values on the host. The host calls' internal sums may take other algorithms
// (other orders), hence a bound of a few roundings instead of the bits.
TEST_P(DeviceCollectivesTest, CompressedAllReduceFollowsTheHostOne) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  run([&](int rank, chorusComm_t comm, cudaStream_t stream) {
    const std::array<size_t, 2> counts = {6000, 3001};
    const std::array<size_t, 2> rows = {60, 1};
    const size_t total = counts[0] + counts[1];
    for (const char* spec : {"topk:0.05", "powersgd:2", "bf16", "qsgd:15"}) {
      chorusCompressor_t onDevice = nullptr, onHost = nullptr;
      ASSERT_EQ(chorusCompressorCreate(comm, spec, 2, counts.data(), rows.data(), &onDevice), chorusSuccess)
          << chorusGetLastError(comm);
      ASSERT_EQ(chorusCompressorCreate(comm, spec, 2, counts.data(), rows.data(), &onHost), chorusSuccess);
      Device buffer(total * 4);
      for (int call = 0; call < 3; ++call) {
        std::vector<float> mine(total), host(total), got(total);
        for (size_t i = 0; i < total; ++i) {
          mine[i] = std::sin(0.001f * static_cast<float>(i * (rank + 2) + 7 * call)) * static_cast<float>(1 + i % 5);
        }
        upload(buffer.p, mine.data(), total * 4);
        chorusTraffic_t before{}, after{};
        ASSERT_EQ(chorusCommGetTraffic(comm, &before), chorusSuccess);
        ASSERT_EQ(
            chorusCompressedAllReduce(buffer.p, buffer.p, total, chorusFloat32, chorusAvg, onDevice, comm, stream),
            chorusSuccess)
            << spec << ": " << chorusGetLastError(comm);
        CUDA_OK(cudaStreamSynchronize(stream));
        ASSERT_EQ(chorusCommGetTraffic(comm, &after), chorusSuccess);
        // What the staged call sent counts as the communicator's (the first call also sets the
        // device path up, whose messages count too).
        chorusCompressorInfo_t sent{};
        ASSERT_EQ(chorusCompressorGetInfo(onDevice, &sent), chorusSuccess);
        if (call > 0) {
          EXPECT_GE(after.bytesSent - before.bytesSent, sent.payloadBytes) << spec << ", call " << call;
        }
        ASSERT_EQ(
            chorusCompressedAllReduce(mine.data(), host.data(), total, chorusFloat32, chorusAvg, onHost, comm, nullptr),
            chorusSuccess)
            << spec << ": " << chorusGetLastError(comm);
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaMemcpy(got.data(), buffer.p, total * 4, cudaMemcpyDeviceToHost));
        float scale = 0.0f;
        for (float v : host) scale = std::max(scale, std::fabs(v));
        size_t wrong = 0, first = 0;
        for (size_t i = total; i-- > 0;) {
          if (std::fabs(got[i] - host[i]) > 1e-5f * scale) {
            ++wrong;
            first = i;
          }
        }
        EXPECT_EQ(wrong, 0u) << spec << ", call " << call << ": element " << first << " " << got[first]
                             << " on the device, " << host[first] << " on the host";
      }
      chorusCompressorInfo_t info{};
      ASSERT_EQ(chorusCompressorGetInfo(onDevice, &info), chorusSuccess);
      EXPECT_EQ(info.calls, 3u) << spec;
      chorusCompressorDestroy(onDevice);
      chorusCompressorDestroy(onHost);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Paths, DeviceCollectivesTest,
    ::testing::Values(Path{"direct", 2, kPublished}, Path{"direct", 4, kPublished},
                      Path{"direct", 2, kInPlace, "inplace"}, Path{"direct", 4, kInPlace, "inplace"},
                      Path{"direct", 2, kOneReducer, "onereducer"}, Path{"direct", 4, kOneReducer, "onereducer"},
                      Path{"ipc", 2}, Path{"ipc", 4}, Path{"staged", 2, kPostByHost}, Path{"staged", 4, kPostByHost},
                      Path{"staged", 2, kPostByValue, "value"}, Path{"staged", 4, kPostByValue, "value"},
                      Path{"auto", 2, nullptr, "forced", kForced}),
    [](const ::testing::TestParamInfo<Path>& info) { return nameOf(info.param); });

// ---- failures: a peer that never calls, an abort, a peer that dies ----
//
// Two ranks set their device path up with a first all-reduce; then rank 0 makes a call its peer
// never joins. Rank 0's call must end (an error from the call, or its stream going on with the
// failure in chorusCommGetAsyncError), say which rank it waited for, and leave the communicator
// refusing device calls by name. Nothing here may hang: the parent's deadline kills a rank that
// does.

// Rank 0's timeout where it is to time out: short, but past what setting the path up may take
// one rank more than the other on a GPU (loading kernels, the first CUDA IPC mappings).
#if CHORUS_CUDA_EMULATION
constexpr int kShortTimeoutMs = 1000;
#else
constexpr int kShortTimeoutMs = 3000;
#endif

// What the ranks tell each other (the test's memory, shared with the ranks it forks).
struct FailureShared {
  std::atomic<int> rank0Done{0};
  std::atomic<int> rank0Enqueued{0};
  std::atomic<int> rank1Done{0};
  std::atomic<int64_t> abortNs{0};
  std::atomic<int64_t> releasedNs{0};
};

class DeviceFailureTest : public ::testing::TestWithParam<Path> {
 protected:
  // Runs body(rank, comm, stream) on two ranks on GPU 0 with the path set, once a first all-reduce
  // has set it up; rank r's timeout is timeoutMs[r]. Rank 1 runs rank1(comm) instead. rank0
  // returns whether the communicator is still there to destroy (an abort frees it).
  void run(const std::array<int, 2>& timeoutMs, const std::function<bool(chorusComm_t, cudaStream_t)>& rank0,
           const std::function<void(chorusComm_t)>& rank1) {
    const Path path = GetParam();
    const auto codes = runProcesses(
        2,
        [&](int rank, const chorusUniqueId& id) {
          setenv("CHORUS_DEVICE_TRANSPORT", path.transport, 1);
          setKnobs(path.knobs);
          chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
          config.timeoutMs = timeoutMs[rank];
          chorusComm_t comm = nullptr;
          ASSERT_EQ(chorusCommInitRankConfig(&comm, 2, id, rank, &config), chorusSuccess)
              << chorusGetLastError(nullptr);
          CUDA_OK(cudaSetDevice(0));
          cudaStream_t stream;
          CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
          {
            Device first(1024 * 4);
            CUDA_OK(cudaMemset(first.p, 0, 1024 * 4));
            ASSERT_EQ(chorusAllReduce(first.p, first.p, 1024, chorusFloat32, chorusSum, comm, stream), chorusSuccess)
                << chorusGetLastError(comm);
            CUDA_OK(cudaStreamSynchronize(stream));
          }
          const bool live = rank == 0 ? rank0(comm, stream) : (rank1(comm), true);
          CUDA_OK(cudaStreamDestroy(stream));
          if (live) chorusCommDestroy(comm);
        },
        120);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(codes[r], 0) << "rank " << r << (codes[r] == 124 ? ": killed at the deadline (hang)" : "");
    }
  }

  // Rank 0's call that rank 1 never joins: its result, and once its stream is done, the
  // communicator's asynchronous error (the call's own where it failed at once; not asked where
  // async is null). Returns the failure's message.
  static std::string callAlone(chorusComm_t comm, cudaStream_t stream, chorusResult_t* called, chorusResult_t* async) {
    constexpr size_t kCount = 70001;
    Device buffer(kCount * 4);
    *called = chorusAllReduce(buffer.p, buffer.p, kCount, chorusFloat32, chorusSum, comm, stream);
    std::string message = *called != chorusSuccess ? chorusGetLastError(comm) : "";
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (async == nullptr) return message;
    *async = chorusInternalError;
    EXPECT_EQ(chorusCommGetAsyncError(comm, async), chorusSuccess);
    if (*async != chorusSuccess && *called == chorusSuccess) message = chorusGetLastError(comm);
    std::printf("rank 0's failure: %s\n", message.c_str());
    return message;
  }

  // A device call after the failure is refused, saying why.
  static void refusedAfter(chorusComm_t comm, cudaStream_t stream, const char* why) {
    Device buffer(64 * 4);
    EXPECT_NE(chorusAllReduce(buffer.p, buffer.p, 64, chorusFloat32, chorusSum, comm, stream), chorusSuccess);
    const std::string message = chorusGetLastError(comm);
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "a refused call leaves its stream untouched";
  }

  // Rank 1: waits (bounded) until rank 0 has checked what it checks.
  static void awaitRank0(const FailureShared& shared) {
    for (int i = 0; i < 60000 && shared.rank0Done.load() == 0; ++i) usleep(1000);
  }

  // Rank 1 makes rank 0's call (callAlone's), but its stream never gets to it: a host function
  // holds the stream until rank 0 is done. So rank 1 has met rank 0 on the host wherever the path
  // does (the direct path's barrier), and rank 0's stream waits for what rank 1's never does.
  // Returns once rank 0 has enqueued its call too (a peer that goes away before then is heard of
  // by the enqueueing thread: APeerThatDiesIsNamed).
  static void callWithStreamHeld(chorusComm_t comm, cudaStream_t stream, FailureShared* shared) {
    constexpr size_t kCount = 70001;
    static Device* buffer = new Device(kCount * 4);  // kept: rank 1 leaves by _exit
    auto hold = [](void* data) {
      const auto* s = static_cast<const FailureShared*>(data);
      for (int i = 0; i < 120000 && s->rank0Done.load() == 0; ++i) usleep(1000);
    };
    ASSERT_EQ(cudaLaunchHostFunc(stream, hold, shared), cudaSuccess);
    ASSERT_EQ(chorusAllReduce(buffer->p, buffer->p, kCount, chorusFloat32, chorusSum, comm, stream), chorusSuccess)
        << chorusGetLastError(comm);
    for (int i = 0; i < 60000 && shared->rank0Enqueued.load() == 0; ++i) usleep(1000);
  }

  // A thread that aborts comm 300 ms after rank 0 has enqueued its call (after its start, where
  // afterEnqueue is false), noting when.
  static std::thread abortSoon(chorusComm_t comm, FailureShared* shared, bool afterEnqueue) {
    return std::thread([comm, shared, afterEnqueue] {
      for (int i = 0; i < 60000 && afterEnqueue && shared->rank0Enqueued.load() == 0; ++i) usleep(1000);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      shared->abortNs = monotonicNs();
      EXPECT_EQ(chorusCommAbort(comm), chorusSuccess) << chorusGetLastError(nullptr);
    });
  }

  // Rank 1 of the tests below: makes the call with its stream held, then (once rank 0 is done,
  // where it outlives rank 0's check) leaves by _exit, its stream still held.
  static std::function<void(chorusComm_t)> heldThenExit(FailureShared* shared, bool outlive) {
    return [shared, outlive](chorusComm_t comm) {
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      callWithStreamHeld(comm, stream, shared);
      if (outlive) awaitRank0(*shared);
      _exit(0);
    };
  }

  // Rank 0 of the tests below where its call fails: enqueued, its stream gone on, the failure
  // `expected` naming rank 1, and a device call after it refused.
  static bool failsNamingRank1(chorusComm_t comm, cudaStream_t stream, FailureShared* shared, chorusResult_t expected) {
    chorusResult_t async;
    const std::string message = callEnqueued(comm, stream, shared, &async);
    EXPECT_EQ(async, expected) << message;
    EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
    refusedAfter(comm, stream, "failed");
    shared->rank0Done = 1;
    return true;
  }

  // Rank 0's half: callAlone's call, enqueued (on every path it returns at once: rank 1 took part
  // on the host), then its stream synchronized; the asynchronous error and its message.
  static std::string callEnqueued(chorusComm_t comm, cudaStream_t stream, FailureShared* shared,
                                  chorusResult_t* async) {
    constexpr size_t kCount = 70001;
    Device buffer(kCount * 4);
    EXPECT_EQ(chorusAllReduce(buffer.p, buffer.p, kCount, chorusFloat32, chorusSum, comm, stream), chorusSuccess)
        << chorusGetLastError(comm);
    shared->rank0Enqueued = 1;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    if (async == nullptr) return "";
    *async = chorusInternalError;
    EXPECT_EQ(chorusCommGetAsyncError(comm, async), chorusSuccess);
    const std::string message = *async != chorusSuccess ? chorusGetLastError(comm) : "";
    std::printf("rank 0's failure: %s\n", message.c_str());
    return message;
  }
};

// Rank 0 times out (kShortTimeoutMs; rank 1 would wait 10 min) and names rank 1 as the one it
// waited for.
TEST_P(DeviceFailureTest, APeerThatNeverCallsTimesOutNamingIt) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {kShortTimeoutMs, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        chorusResult_t called, async;
        const std::string message = callAlone(comm, stream, &called, &async);
        EXPECT_EQ(called == chorusSuccess ? async : called, chorusTimeout) << message;
        EXPECT_NE(async, chorusSuccess) << "the failure is the communicator's";
        EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
        // Where the path waits on the host, the host's timeout tells (it knows who has not arrived).
        if (std::string(GetParam().transport) != "ipc") {
          EXPECT_NE(message.find("rank 1 has not arrived"), std::string::npos) << message;
        }
        refusedAfter(comm, stream, "failed");
        shared->rank0Done = 1;
        return true;
      },
      [&](chorusComm_t) { awaitRank0(*shared); });
}

// A host call fails (rank 1 never joins; rank 0 times out): the communicator is broken,
// and a device call after it is refused at once, saying so, whatever its path would have done.
TEST_P(DeviceFailureTest, AFailedCommunicatorRefusesDeviceCallsByName) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {kShortTimeoutMs, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        std::vector<float> host(1000, 1.0f);
        EXPECT_EQ(chorusAllReduce(host.data(), host.data(), host.size(), chorusFloat32, chorusSum, comm, nullptr),
                  chorusTimeout)
            << chorusGetLastError(comm);
        refusedAfter(comm, stream, "failed earlier");
        shared->rank0Done = 1;
        return true;
      },
      [&](chorusComm_t) { awaitRank0(*shared); });
}

// Rank 0's device call fails after it was enqueued (rank 1 never joins: the ring's kernel or the
// staged call's proxy gives up, and the stream goes on), and nobody asks for the asynchronous
// error: a host call made next is refused at once, naming the device call's failure and the peer
// it waited for, its buffer untouched. Without that it would start on a communicator whose peers'
// messages are out of step (here: wait for rank 1 and time out). The direct path fails the call
// itself, which breaks the communicator for the host call the same way.
TEST_P(DeviceFailureTest, AHostCallAfterAFailedDeviceCallIsRefused) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {kShortTimeoutMs, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        chorusResult_t called;
        const std::string failure = callAlone(comm, stream, &called, nullptr);
        std::vector<float> host(1000, 1.0f);
        EXPECT_EQ(chorusAllReduce(host.data(), host.data(), host.size(), chorusFloat32, chorusSum, comm, nullptr),
                  chorusInvalidUsage)
            << chorusGetLastError(comm);
        const std::string message = chorusGetLastError(comm);
        std::printf("rank 0's host call: %s\n", message.c_str());
        EXPECT_NE(message.find(called == chorusSuccess ? "an earlier device call failed" : "failed earlier"),
                  std::string::npos)
            << message << " (the device call: " << failure << ")";
        EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
        EXPECT_EQ(std::count(host.begin(), host.end(), 1.0f), 1000) << "the refused call wrote its buffer";
        shared->rank0Done = 1;
        return true;
      },
      [&](chorusComm_t) { awaitRank0(*shared); });
}

// Rank 0's call waits for a peer that never comes (10-minute timeouts); another thread aborts the
// communicator (which frees it): the call fails with chorusAborted where it waited on the host
// (direct), and its stream goes on, long before the timeout, on every path.
TEST_P(DeviceFailureTest, AbortReleasesACallThatWaitsForAPeer) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {600000, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        std::thread aborter = abortSoon(comm, &*shared, false);
        chorusResult_t called;
        const std::string message = callAlone(comm, stream, &called, nullptr);
        shared->releasedNs = monotonicNs();
        aborter.join();
        if (std::string(GetParam().transport) == "direct") {
          EXPECT_EQ(called, chorusAborted) << message;
        } else {
          EXPECT_EQ(called, chorusSuccess) << message;  // enqueued; its stream waited for the peer
        }
        refusedAfter(comm, stream, "aborted");  // the handle the abort freed: refused as not live
        shared->rank0Done = 1;
        return false;
      },
      [&](chorusComm_t) { awaitRank0(*shared); });
  ASSERT_GT(shared->abortNs.load(), 0);
  // Far inside the 600 s timeout: only the abort can have ended the call.
  EXPECT_LT(static_cast<double>(shared->releasedNs.load() - shared->abortNs.load()) * 1e-9, 30.0);
}

// Rank 1 dies once the path is set up. Where the path's wait goes through the host (direct and
// staged), rank 0 hears of the death long before its 10-minute timeout; the ipc ring's kernel
// waits on device memory alone and times out (kShortTimeoutMs here). Either way rank 0 names rank 1.
TEST_P(DeviceFailureTest, APeerThatDiesIsNamed) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const bool kernelWaits = std::string(GetParam().transport) == "ipc";
  run(
      {kernelWaits ? kShortTimeoutMs : 600000, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        chorusResult_t called, async;
        const std::string message = callAlone(comm, stream, &called, &async);
        EXPECT_EQ(called == chorusSuccess ? async : called, kernelWaits ? chorusTimeout : chorusRemoteError) << message;
        EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
        refusedAfter(comm, stream, "failed");
        return true;
      },
      [&](chorusComm_t) { _exit(0); });
}

// Rank 1 enqueues the call, then dies before its stream gets to it. Rank 0's call was enqueued
// (the paths that meet on the host met), so only its stream can wait: it must go on, with the
// failure naming rank 1 in chorusCommGetAsyncError. The direct path's watcher sees rank 1's
// process exit, the staged call's proxy hears of it on the host, the ring kernel times out.
TEST_P(DeviceFailureTest, APeerThatDiesWithItsCallEnqueuedIsNamed) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const bool kernelWaits = std::string(GetParam().transport) == "ipc";
  SharedWithRanks<FailureShared> shared;
  run(
      {kernelWaits ? kShortTimeoutMs : 600000, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        return failsNamingRank1(comm, stream, &*shared, kernelWaits ? chorusTimeout : chorusRemoteError);
      },
      heldThenExit(&*shared, false));
}

// Rank 1 enqueues the call and lives, but its stream does not get to it within rank 0's timeout:
// rank 0's stream goes on at the timeout, the failure naming rank 1.
TEST_P(DeviceFailureTest, APeerWhoseStreamNeverGetsThereTimesOutNamingIt) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {kShortTimeoutMs, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) { return failsNamingRank1(comm, stream, &*shared, chorusTimeout); },
      heldThenExit(&*shared, true));
}

// As AbortReleasesACallThatWaitsForAPeer, with rank 1's call enqueued (its stream held): rank 0's
// call was enqueued, and the abort lets rank 0's waiting stream go, long before the timeout.
TEST_P(DeviceFailureTest, AbortReleasesAStreamThatWaitsForAPeersStream) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {600000, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        std::thread aborter = abortSoon(comm, &*shared, true);
        callEnqueued(comm, stream, &*shared, nullptr);
        shared->releasedNs = monotonicNs();
        aborter.join();
        refusedAfter(comm, stream, "aborted");
        shared->rank0Done = 1;
        return false;
      },
      heldThenExit(&*shared, true));
  ASSERT_GT(shared->abortNs.load(), 0);
  EXPECT_LT(static_cast<double>(shared->releasedNs.load() - shared->abortNs.load()) * 1e-9, 30.0);
}

INSTANTIATE_TEST_SUITE_P(Paths, DeviceFailureTest,
                         ::testing::Values(Path{"direct", 2, kPublished}, Path{"ipc", 2},
                                           Path{"staged", 2, kPostByHost}, Path{"staged", 2, kPostByValue, "value"}),
                         [](const ::testing::TestParamInfo<Path>& info) { return nameOf(info.param); });

// The direct path in place: a rank whose stream goes on after its call failed lets its peers'
// waits on it be answered, but they fail their calls too: they took what it wrote after the
// failure (here rank 0's reduction, which read rank 1's input before it was final). Rank 0 times
// out waiting for rank 1's held stream; then rank 1's stream goes on, its wait for rank 0's
// reduction answered, and its call fails naming rank 0: every rank reducing, and rank 0 alone
// (where rank 1 waits for rank 0's stream only). (Published, rank 1 takes only what rank 0
// published before its failure, which is right.)
class DirectFailureTest : public DeviceFailureTest {};

TEST_P(DirectFailureTest, APeerWhoseCallFailedFailsTheCallsThatWaitedOnIt) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  SharedWithRanks<FailureShared> shared;
  run(
      {kShortTimeoutMs, 600000},
      [&](chorusComm_t comm, cudaStream_t stream) {
        callEnqueued(comm, stream, &*shared, nullptr);
        shared->rank0Done = 1;
        // Rank 1's stream reads this rank's buffers: they stay until it is done. Nor is the
        // failure asked for before (a communicator broken on the host tells its peers).
        for (int i = 0; i < 60000 && shared->rank1Done.load() == 0; ++i) usleep(1000);
        chorusResult_t async = chorusInternalError;
        EXPECT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
        // Its own timeout, or rank 1's failure, which rank 1's communicator told it of first.
        EXPECT_NE(async, chorusSuccess);
        return true;
      },
      [&](chorusComm_t comm) {
        cudaStream_t stream;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        callWithStreamHeld(comm, stream, &*shared);
        awaitRank0(*shared);  // the hold ends with it
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        chorusResult_t async = chorusInternalError;
        EXPECT_EQ(chorusCommGetAsyncError(comm, &async), chorusSuccess);
        const std::string message = async != chorusSuccess ? chorusGetLastError(comm) : "";
        std::printf("rank 1's failure: %s\n", message.c_str());
        EXPECT_EQ(async, chorusRemoteError) << message;
        EXPECT_NE(message.find("rank 0's stream wrote after its own device call failed"), std::string::npos) << message;
        shared->rank1Done = 1;
        EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
      });
}

INSTANTIATE_TEST_SUITE_P(Paths, DirectFailureTest,
                         ::testing::Values(Path{"direct", 2, kInPlace, "inplace"},
                                           Path{"direct", 2, kOneReducer, "onereducer"}),
                         [](const ::testing::TestParamInfo<Path>& info) { return nameOf(info.param); });

// One thread drives every rank (one communicator each, all on GPU 0) through one group of device
// calls: an all-reduce and a ring of sends and receives per rank. Each communicator's first device
// call sets its path up with its peers, which one thread cannot do for all of them in turn:
// chorusGroupEnd enqueues each communicator's calls on a thread of its own. Without that the
// first call waits for its peers until the timeout. Run in a child process: the test process
// keeps CUDA untouched for the tests that fork ranks.
int oneThreadDrivesEveryRank() {
  constexpr int n = 3;
  constexpr size_t count = 40000;
  auto failed = [](const char* what, chorusComm_t comm) {
    std::fprintf(stderr, "%s: %s\n", what, chorusGetLastError(comm));
    return 1;
  };
  chorusUniqueId id;
  if (chorusGetUniqueId(&id) != chorusSuccess) return failed("chorusGetUniqueId", nullptr);
  std::vector<chorusComm_t> comms(n, nullptr);
  std::vector<chorusResult_t> made(n, chorusSuccess);
  {
    std::vector<std::thread> inits;
    for (int r = 0; r < n; ++r) inits.emplace_back([&, r] { made[r] = chorusCommInitRank(&comms[r], n, id, r); });
    for (std::thread& t : inits) t.join();
  }
  for (int r = 0; r < n; ++r) {
    if (made[r] != chorusSuccess) return failed("chorusCommInitRank", nullptr);
  }
  if (cudaSetDevice(0) != cudaSuccess) return failed("cudaSetDevice", nullptr);
  std::vector<float*> in(n), sum(n), got(n);
  std::vector<cudaStream_t> streams(n);
  for (int r = 0; r < n; ++r) {
    std::vector<float> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((r + 1) * 100 + static_cast<int>(i % 97));
    if (cudaMalloc(&in[r], count * 4) != cudaSuccess || cudaMalloc(&sum[r], count * 4) != cudaSuccess ||
        cudaMalloc(&got[r], count * 4) != cudaSuccess ||
        cudaMemcpy(in[r], mine.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) != cudaSuccess) {
      return failed("cudaMalloc, cudaMemcpy or cudaStreamCreate", nullptr);
    }
  }
  if (cudaDeviceSynchronize() != cudaSuccess) return failed("cudaDeviceSynchronize", nullptr);
  if (chorusGroupStart() != chorusSuccess) return failed("chorusGroupStart", nullptr);
  for (int r = 0; r < n; ++r) {
    if (chorusAllReduce(in[r], sum[r], count, chorusFloat32, chorusSum, comms[r], streams[r]) != chorusSuccess ||
        chorusSend(in[r], count, chorusFloat32, (r + 1) % n, comms[r], streams[r]) != chorusSuccess ||
        chorusRecv(got[r], count, chorusFloat32, (r + n - 1) % n, comms[r], streams[r]) != chorusSuccess) {
      return failed("a call inside the group", comms[r]);
    }
  }
  if (chorusGroupEnd() != chorusSuccess) return failed("chorusGroupEnd", comms[0]);
  for (int r = 0; r < n; ++r) {
    if (cudaStreamSynchronize(streams[r]) != cudaSuccess) return failed("cudaStreamSynchronize", nullptr);
    std::vector<float> total(count), from(count);
    cudaMemcpy(total.data(), sum[r], count * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(from.data(), got[r], count * 4, cudaMemcpyDeviceToHost);
    const int prev = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i) {
      const float expected = static_cast<float>((1 + 2 + 3) * 100 + n * static_cast<int>(i % 97));
      const float sent = static_cast<float>((prev + 1) * 100 + static_cast<int>(i % 97));
      if (total[i] != expected || from[i] != sent) {
        std::fprintf(stderr, "rank %d element %zu: sum %g (expected %g), received %g (expected %g)\n", r, i, total[i],
                     expected, from[i], sent);
        return 1;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    chorusResult_t async = chorusSuccess;
    if (chorusCommGetAsyncError(comms[r], &async) != chorusSuccess || async != chorusSuccess) {
      return failed("chorusCommGetAsyncError", comms[r]);
    }
  }
  std::vector<std::thread> ends;
  for (int r = 0; r < n; ++r) ends.emplace_back([&, r] { chorusCommDestroy(comms[r]); });
  for (std::thread& t : ends) t.join();
  return 0;
}

TEST(DeviceGroupTest, OneThreadDrivesEveryRankThroughOneGroup) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("CHORUS_TIMEOUT_MS", "30000", 1);
    _exit(oneThreadDrivesEveryRank());
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message above";
}

}  // namespace
}  // namespace chorus::testing
