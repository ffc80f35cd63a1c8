// cuda_emulation_test.cc: tests/support/cuda_emulation.h refuses the launches a GPU refuses, so
// that a launcher sizing its grid, its blocks or its shared memory past a GPU's limits fails here
// as it would on the hardware (cudaErrorInvalidConfiguration from cudaGetLastError, the kernel not
// run): a grid or block of no threads, blocks of more than 1024 threads, grids past 2^31 - 1 by
// 65535 by 65535, dynamic shared memory past 48 KiB unless cudaFuncSetAttribute raised the limit,
// and never past 227 KiB (an H100's or H200's most; attention_tc_emulated_test checks that the
// tensor-core attention kernels' fits). And a 16-byte load from an address that is not 16-byte
// aligned ends the process, as it ends a GPU's kernel with cudaErrorMisalignedAddress: the
// emulated kernels are built with UndefinedBehaviorSanitizer's alignment check (tests/CMakeLists.txt).
// And cudaEventElapsedTime refuses what CUDA's refuses, and cudaFree and cudaFreeHost wait for
// the whole device, as a GPU's do (a free made while a stream waits on the freeing thread hangs).
// And asynchronous copies to shared memory (cp.async) land when their thread waits for them, NaNs
// until then, and the races a GPU would run into with them end the process, saying which: an
// ldmatrix of a copy in flight, or one landed by another warp with no barrier since, and a copy
// into what another warp read since the last barrier; so does a block that ends with copies in flight.
#include "tests/support/cuda_emulation.h"
// The emulation first: the kernels' headers are written against it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cuda/copy_async.cuh"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/mma.cuh"

namespace {

// Counts the threads that ran.
__global__ void countThreads(int* ran) {
  if (threadIdx.x == 0) *ran += static_cast<int>(blockDim.x);
}

// The error of launching countThreads in this shape, and how many threads ran.
struct Outcome {
  cudaError_t error;
  int ran;
};
Outcome launch(dim3 grid, int threads, size_t sharedBytes) {
  int* ran = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ran), sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemset(ran, 0, sizeof(int)), cudaSuccess);
  CHORUS_LAUNCH(countThreads, grid, threads, sharedBytes, nullptr, ran);
  Outcome o{cudaGetLastError(), -1};
  EXPECT_EQ(cudaMemcpy(&o.ran, ran, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaFree(ran), cudaSuccess);
  return o;
}

constexpr size_t kKiB = 1024;

TEST(CudaEmulationTest, RefusesTheShapesAGpuRefuses) {
  EXPECT_EQ(launch(dim3(3), 64, 0).ran, 3 * 64);
  EXPECT_EQ(launch(dim3(3), 64, 0).error, cudaSuccess);
  EXPECT_EQ(launch(dim3(1, 65535, 1), 1, 0).error, cudaSuccess);
  EXPECT_EQ(launch(dim3(1), 1024, 48 * kKiB).error, cudaSuccess);
  const struct {
    dim3 grid;
    int threads;
    size_t shared;
    const char* what;
  } refused[] = {
      {dim3(0), 64, 0, "no blocks (a launch over no elements)"},
      {dim3(4, 0, 1), 64, 0, "no blocks in y"},
      {dim3(1, 1, 0), 64, 0, "no blocks in z"},
      {dim3(1), 0, 0, "no threads"},
      {dim3(1), 1025, 0, "1025 threads"},
      {dim3(1, 65536, 1), 64, 0, "65536 blocks in y"},
      {dim3(1, 1, 65536), 64, 0, "65536 blocks in z"},
      {dim3(0x80000000u), 64, 0, "2^31 blocks in x"},
      {dim3(1), 64, 48 * kKiB + 1, "shared memory past 48 KiB, not raised"},
  };
  for (const auto& r : refused) {
    const Outcome o = launch(r.grid, r.threads, r.shared);
    EXPECT_EQ(o.error, cudaErrorInvalidConfiguration) << r.what;
    EXPECT_EQ(o.ran, 0) << r.what;
  }
  // The error was the launch's, and cudaGetLastError cleared it.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaEmulationTest, SharedMemoryPast48KiBOnceRaisedUpTo227KiB) {
  ASSERT_EQ(cudaFuncSetAttribute(countThreads, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * kKiB), cudaSuccess);
  EXPECT_EQ(launch(dim3(2), 32, 100 * kKiB).ran, 64);
  EXPECT_EQ(launch(dim3(2), 32, 100 * kKiB + 1).error, cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaFuncSetAttribute(countThreads, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * kKiB + 1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(countThreads, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * kKiB), cudaSuccess);
  EXPECT_EQ(launch(dim3(1), 32, 227 * kKiB).ran, 32);
  ASSERT_EQ(cudaFuncSetAttribute(countThreads, cudaFuncAttributeMaxDynamicSharedMemorySize, 0), cudaSuccess);
  EXPECT_EQ(launch(dim3(1), 32, 48 * kKiB + 1).error, cudaErrorInvalidConfiguration);
}

// cudaEventElapsedTime as CUDA's: refused for an event made with cudaEventDisableTiming or never
// recorded, not ready before both are reached, the time between the two once they are.
TEST(CudaEmulationTest, ElapsedTimeOnlyBetweenTimedEventsBothReached) {
  cudaEvent_t a = nullptr, b = nullptr, untimed = nullptr;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);  // never recorded
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t gate = nullptr;  // recorded on a stream held until the test lets it go
  ASSERT_EQ(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming), cudaSuccess);
  cudaStream_t held = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> go{false};
  ASSERT_EQ(cudaLaunchHostFunc(
                held,
                [](void* flag) {
                  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
                },
                &go),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(gate, held), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s, gate, 0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, s), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorNotReady);
  go = true;
  ASSERT_EQ(cudaEventSynchronize(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, untimed), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t e : {a, b, untimed, gate}) cudaEventDestroy(e);
  cudaStreamDestroy(s);
  cudaStreamDestroy(held);
}

// What a held stream's host function saw of an allocation once let go.
struct Held {
  std::atomic<bool> go{false}, ran{false}, stillAllocated{false};
  const void* p = nullptr;
  bool device = true;
};

TEST(CudaEmulationTest, FreeWaitsForEveryStream) {
  for (const bool device : {true, false}) {
    SCOPED_TRACE(device ? "cudaFree" : "cudaFreeHost");
    void* p = nullptr;
    ASSERT_EQ(device ? cudaMalloc(&p, 256) : cudaHostAlloc(&p, 256), cudaSuccess);
    cudaStream_t held = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking), cudaSuccess);
    Held h;
    h.p = p;
    h.device = device;
    ASSERT_EQ(cudaLaunchHostFunc(
                  held,
                  [](void* state) {
                    auto* h = static_cast<Held*>(state);
                    while (!h->go.load()) std::this_thread::yield();
                    namespace em = chorus::testing::emulation;
                    h->stillAllocated = h->device ? em::onDevice(h->p) : em::pinned(h->p);
                    h->ran = true;
                  },
                  &h),
              cudaSuccess);
    // The stream is let go a while after the free is called: a free that did not wait for it
    // would have returned by then, before the host function ran.
    std::thread release([&h] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      h.go = true;
    });
    EXPECT_EQ(device ? cudaFree(p) : cudaFreeHost(p), cudaSuccess);
    EXPECT_TRUE(h.ran.load()) << "the free returned while a stream had work left";
    release.join();
    cudaStreamSynchronize(held);
    EXPECT_TRUE(h.stillAllocated.load()) << "the stream's work ran after its memory was freed";
    cudaStreamDestroy(held);
  }
}

// Loads 16 bytes from p into out.
__global__ void loadQuad(float4* out, const float* p) { *out = *reinterpret_cast<const float4*>(p); }

TEST(CudaEmulationTest, AMisalignedVectorLoadEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the emulation's stream threads are running
  float* p = nullptr;
  float4* out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), 8 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(float4)), cudaSuccess);
  CHORUS_LAUNCH(loadQuad, 1, 1, 0, nullptr, out, p + 4);  // aligned: runs
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(
      {
        CHORUS_LAUNCH(loadQuad, 1, 1, 0, nullptr, out, p + 1);
        cudaDeviceSynchronize();
      },
      "misaligned address");
  cudaFree(out);
  cudaFree(p);
}

namespace cuda = chorus::kernels::cuda;

// Each thread copies its 16 bytes of src (8 halves) into shared memory asynchronously; waitFirst:
// waits and meets the block at a barrier, then writes its right neighbour's 16 bytes to out; else
// writes its own before waiting (what is there while the copy is in flight), then waits.
__global__ void copyThenRead(uint16_t* out, const uint16_t* src, bool waitFirst) {
  CHORUS_DYNAMIC_SHARED(shared);
  auto* rows = reinterpret_cast<uint16_t*>(shared);
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  cuda::copyAsync16(rows + 8 * t, src + 8 * t);
  cuda::commitCopies();
  if (waitFirst) {
    cuda::waitCopies<0>();
    __syncthreads();
    std::memcpy(out + 8 * t, rows + 8 * ((t + 1) % n), 16);
  } else {
    std::memcpy(out + 8 * t, rows + 8 * t, 16);
    cuda::waitCopies<0>();
  }
}

TEST(CudaEmulationTest, AsynchronousCopiesLandWhenWaitedForAndAreNaNsUntilThen) {
  constexpr int kThreads = 64;
  std::vector<uint16_t> host(8 * kThreads);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint16_t>(i * 37 + 5);
  uint16_t *src = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint16_t> got(host.size());
  CHORUS_LAUNCH(copyThenRead, 1, kThreads, 16 * kThreads, nullptr, out, src, true);
  ASSERT_EQ(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int t = 0; t < kThreads; ++t) {
    for (int e = 0; e < 8; ++e) ASSERT_EQ(got[8 * t + e], host[8 * ((t + 1) % kThreads) + e]) << t << " " << e;
  }
  CHORUS_LAUNCH(copyThenRead, 1, kThreads, 16 * kThreads, nullptr, out, src, false);
  ASSERT_EQ(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (const uint16_t bits : got) ASSERT_EQ(bits, 0xffffu);  // NaN in bf16 and fp16
  cudaFree(out);
  cudaFree(src);
}

// The races, one per `race`, in a block of two warps, each copying 32 rows of 16 bytes (four 8 x 8
// matrices of halves) into its own region of shared memory and reading them by ldmatrix:
// 0: reads its copies before waiting for them; 1: waits, then reads the other warp's region with
// no barrier between; 2: reads its own region, then warp 1 copies into warp 0's with no barrier
// between; 3: ends with its copies in flight.
__global__ void copyRace(const uint16_t* src, int race) {
  CHORUS_DYNAMIC_SHARED(shared);
  auto* rows = reinterpret_cast<uint16_t*>(shared);
  const int t = static_cast<int>(threadIdx.x), warp = t / 32, lane = t % 32;
  uint32_t r[4];
  cuda::copyAsync16(rows + 8 * t, src + 8 * t);
  cuda::commitCopies();
  if (race == 3) return;
  if (race != 0) cuda::waitCopies<0>();
  const int region = race == 1 ? 1 - warp : warp;
  cuda::mma::loadMatrices<4, false>(r, rows + 8 * (32 * region + lane));
  if (race == 2 && warp == 1) {
    cuda::copyAsync16(rows + 8 * lane, src);
    cuda::commitCopies();
  }
  cuda::waitCopies<0>();
}

TEST(CudaEmulationTest, RacesWithAsynchronousCopiesEndTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the emulation's stream threads are running
  uint16_t* src = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), 8 * 64 * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0, 8 * 64 * 2), cudaSuccess);
  const char* says[] = {"ldmatrix reads shared memory at .* while a cp.async to it is in flight",
                        "ldmatrix reads shared memory at .* that another warp's cp.async landed in",
                        "a cp.async by thread .* that warp 0 read since the last __syncthreads",
                        "ended with cp.async copies not waited for"};
  for (int race = 0; race < 4; ++race) {
    SCOPED_TRACE(race);
    EXPECT_DEATH(
        {
          CHORUS_LAUNCH(copyRace, 1, 64, 16 * 64, nullptr, src, race);
          cudaDeviceSynchronize();
        },
        says[race]);
  }
  cudaFree(src);
}

}  // namespace
