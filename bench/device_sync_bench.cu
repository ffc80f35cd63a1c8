// device_sync_bench: what one cross-process exchange costs between ranks that share a GPU, per way
// of ordering their streams. The device path's small calls are bounded by it: without MPS the
// processes take turns on the GPU, and how a stream waits for another process decides whether a
// call pays a context switch or a time slice. Each way runs the same exchange, a call of an
// 8-byte all-reduce's shape: every rank does a little work on its stream, tells the others, waits
// for all of them, and does a little more work. The time per call is the slowest rank's. The work
// is a one-thread kernel (kernel) or an 8-byte copy to pinned host memory and back (copy: the
// copy engines only, so a way with copy work need not switch the compute engine's context).
//
//   alone          one rank's work per call, nobody to wait for (the floor)
//   event          IPC events, ordered by a host handshake (the direct path's way): record,
//                  tell the peers on the host, cudaStreamWaitEvent on each peer's event
//   value-host     stream memory operations on flags in pinned host memory: write this rank's
//                  flag, wait for each peer's (cuStreamWriteValue32 / cuStreamWaitValue32)
//   value-device   the same on flags in device memory each rank maps over CUDA IPC
//   value-proxy    the stream writes a flag in host memory and waits on another; a host thread
//                  of the rank sees the first, meets the peers on the host, and writes the second
//                  (a staged call without a kernel: the host does the exchange)
//   spin-kernel    a one-thread kernel stores this rank's flag and spins on the peers' (the
//                  ipc ring's way; without MPS every call waits for a time slice); kernel only
//   host           the host's way: move 8 bytes to the host and wait for it, tell the peers,
//                  wait for them, move 8 bytes back (a blocking call). With copy work the moves
//                  are copies; with kernel work they are one-thread kernels that store to and load
//                  from mapped pinned memory, so a call without MPS needs no copy engine at all
//
//   build/release/bench/device_sync_bench [-g RANKS] [-n CALLS] [--json FILE]
//
// Ranks are processes forked before CUDA starts, all on device 0. Every wait has a timeout; a way
// that times out (or that this driver lacks) is reported so, and the others still run. Without a
// usable device it says so and exits 77.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kMaxRanks = 8;
// spin-kernel last: without MPS it can time out, and a timeout ends the ways after it.
constexpr const char* kWays[] = {"alone", "event", "value-host", "value-device", "value-proxy", "host", "spin-kernel"};
constexpr int kNumWays = sizeof(kWays) / sizeof(kWays[0]);
constexpr const char* kWorks[] = {"kernel", "copy"};
constexpr int kNumWorks = 2;
enum Way { kAlone, kEvent, kValueHost, kValueDevice, kValueProxy, kHost, kSpinKernel };
constexpr uint64_t kKernelTimeoutNs = 2'000'000'000;
constexpr auto kHostTimeout = std::chrono::seconds(20);

// What the ranks share: mapped before the fork (MAP_SHARED), so every process sees one copy.
struct Shared {
  std::atomic<uint64_t> posted[kMaxRanks];  // host handshake: calls this rank has enqueued
  std::atomic<int> barrier[2];              // arrivals, generation
  cudaIpcEventHandle_t events[kMaxRanks][2];
  cudaIpcMemHandle_t flagsMemory[kMaxRanks];
  double microseconds[kNumWays][kNumWorks][kMaxRanks];  // per call; < 0: failed (see status)
  int status[kNumWays][kNumWorks][kMaxRanks];           // 0 ok, 1 timeout, 2 unsupported, 3 CUDA error, 4 not run
  alignas(4096) uint32_t hostFlags[kMaxRanks][32];      // value-host and spin-kernel (one cache line each)
  uint32_t proxyIn[kMaxRanks][32];                      // value-proxy: stream to host thread
  uint32_t proxyOut[kMaxRanks][32];                     // and back
};

Shared* shared = nullptr;
int nranks = 2;
int calls = 200;

bool hostBarrier(int rank) {
  const int generation = shared->barrier[1].load();
  if (shared->barrier[0].fetch_add(1) + 1 == nranks) {
    shared->barrier[0].store(0);
    shared->barrier[1].fetch_add(1);
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + kHostTimeout;
  while (shared->barrier[1].load() == generation) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "device_sync_bench: rank %d: the host barrier timed out\n", rank);
      return false;
    }
    sched_yield();
  }
  return true;
}

// Waits until every peer has posted at least n; false on timeout.
bool waitPosted(int rank, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + kHostTimeout;
  for (int q = 0; q < nranks; ++q) {
    if (q == rank) continue;
    for (unsigned spin = 0; shared->posted[q].load(std::memory_order_acquire) < n; ++spin) {
      if (spin % 64 == 63) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        sched_yield();
      }
    }
  }
  return true;
}

__global__ void touch(uint64_t* word) { *word += 1; }
__global__ void moveWord(uint64_t* to, const uint64_t* from) { *to = *from; }

__device__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Stores flags[rank] = value, then waits until every other flag is at least value.
__global__ void spinExchange(uint32_t* flags, int stride, int rank, int n, uint32_t value, int* timedOut) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flags + rank * stride), "r"(value) : "memory");
  const uint64_t deadline = nowNs() + kKernelTimeoutNs;
  for (int q = 0; q < n; ++q) {
    for (;;) {
      uint32_t seen;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(flags + q * stride) : "memory");
      if (seen >= value) break;
      if (nowNs() > deadline) {
        *timedOut = 1;
        return;
      }
      __nanosleep(64);
    }
  }
}

using WaitValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
using WriteValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);

template <typename F>
bool driverEntry(const char* name, F* f) {
  cudaDriverEntryPointQueryResult found{};
  void* p = nullptr;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    return false;
  }
  *f = reinterpret_cast<F>(p);
  return true;
}

struct Rank {
  int rank = 0;
  cudaStream_t stream = nullptr;
  uint64_t* work = nullptr;  // what the little kernels touch
  cudaEvent_t own[2] = {};
  std::vector<cudaEvent_t> peers[2];
  uint32_t* deviceFlags = nullptr;  // this rank's, in its device memory
  std::vector<uint32_t*> peerDeviceFlags;
  uint32_t* hostFlags = nullptr;  // shared->hostFlags as the device sees it
  uint32_t* proxyIn = nullptr;    // shared->proxyIn[rank], proxyOut[rank] as the device sees them
  uint32_t* proxyOut = nullptr;
  int* timedOut = nullptr;      // mapped host memory
  uint64_t* staging = nullptr;  // pinned and mapped, for the host way
  WaitValue waitValue = nullptr;
  WriteValue writeValue = nullptr;
};

constexpr int kStride = 32;  // words between two ranks' flags

// The value-proxy way's host thread: for each call, waits for the stream's flag, meets the peers
// on the host (as a staged call's proxy runs its host collective), and releases the stream.
void proxyLoop(int rank, int n, std::atomic<bool>* failed) {
  volatile uint32_t* in = &shared->proxyIn[rank][0];
  volatile uint32_t* out = &shared->proxyOut[rank][0];
  for (int i = 0; i < n; ++i) {
    const uint32_t value = static_cast<uint32_t>(i + 1);
    const auto deadline = std::chrono::steady_clock::now() + kHostTimeout;
    for (unsigned spin = 0; *in < value; ++spin) {
      if (spin % 64 == 63) {
        if (std::chrono::steady_clock::now() > deadline) {
          failed->store(true);
          return;
        }
        sched_yield();
      }
    }
    shared->posted[rank].store(value, std::memory_order_release);
    if (!waitPosted(rank, value)) {
      failed->store(true);
      return;
    }
    std::atomic_thread_fence(std::memory_order_release);
    *out = value;
  }
}

// Runs `calls` calls of one way with one work; returns the status (0 ok, 1 timeout, 2
// unsupported, 3 CUDA error).
int runWay(Rank& r, int way, int work, double* microseconds) {
  const char* name = kWays[way];
  const bool values = way == kValueHost || way == kValueDevice || way == kValueProxy;
  if (values && (r.waitValue == nullptr || r.writeValue == nullptr)) return 2;
  if (way == kSpinKernel && work != 0) return 2;
  *r.timedOut = 0;
  for (int q = 0; q < nranks; ++q) shared->hostFlags[q][0] = shared->proxyIn[q][0] = shared->proxyOut[q][0] = 0;
  cudaMemsetAsync(r.deviceFlags, 0, sizeof(uint32_t), r.stream);
  cudaStreamSynchronize(r.stream);
  if (!hostBarrier(r.rank)) return 1;
  shared->posted[r.rank].store(0);
  if (!hostBarrier(r.rank)) return 1;
  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> proxyFailed{false};
  std::thread proxy;
  if (way == kValueProxy) proxy = std::thread(proxyLoop, r.rank, calls, &proxyFailed);
  auto doWork = [&] {
    if (work == 0) {
      touch<<<1, 1, 0, r.stream>>>(r.work);
    } else {
      cudaMemcpyAsync(r.staging, r.work, sizeof(uint64_t), cudaMemcpyDeviceToHost, r.stream);
      cudaMemcpyAsync(r.work, r.staging, sizeof(uint64_t), cudaMemcpyHostToDevice, r.stream);
    }
  };
  auto stream = reinterpret_cast<CUstream>(r.stream);
  bool ok = true;
  for (int i = 0; i < calls && ok; ++i) {
    const uint32_t value = static_cast<uint32_t>(i + 1);
    if (way != kHost) doWork();
    switch (way) {
      case kAlone:
        break;
      case kEvent: {
        const int e = i % 2;
        cudaEventRecord(r.own[e], r.stream);
        shared->posted[r.rank].store(value, std::memory_order_release);
        ok = waitPosted(r.rank, value);
        for (int q = 0; q < nranks && ok; ++q) {
          if (q != r.rank) cudaStreamWaitEvent(r.stream, r.peers[e][q], 0);
        }
        break;
      }
      case kValueHost:
      case kValueDevice: {
        auto flag = [&](int q) {
          return way == kValueHost ? reinterpret_cast<CUdeviceptr>(r.hostFlags + q * kStride)
                                   : reinterpret_cast<CUdeviceptr>(q == r.rank ? r.deviceFlags : r.peerDeviceFlags[q]);
        };
        ok = r.writeValue(stream, flag(r.rank), value, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
        for (int q = 0; q < nranks && ok; ++q) {
          if (q == r.rank) continue;
          ok = r.waitValue(stream, flag(q), value, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
        }
        if (!ok) return 2;
        break;
      }
      case kValueProxy:
        ok = r.writeValue(stream, reinterpret_cast<CUdeviceptr>(r.proxyIn), value, CU_STREAM_WRITE_VALUE_DEFAULT) ==
                 CUDA_SUCCESS &&
             r.waitValue(stream, reinterpret_cast<CUdeviceptr>(r.proxyOut), value, CU_STREAM_WAIT_VALUE_GEQ) ==
                 CUDA_SUCCESS;
        if (!ok) {
          // The thread waits for flags that will not come: it ends at its timeout.
          proxy.join();
          return 2;
        }
        break;
      case kSpinKernel:
        spinExchange<<<1, 1, 0, r.stream>>>(r.hostFlags, kStride, r.rank, nranks, value, r.timedOut);
        break;
      case kHost:
        if (work == 0) {
          moveWord<<<1, 1, 0, r.stream>>>(r.staging, r.work);
        } else {
          cudaMemcpyAsync(r.staging, r.work, sizeof(uint64_t), cudaMemcpyDeviceToHost, r.stream);
        }
        cudaStreamSynchronize(r.stream);
        shared->posted[r.rank].store(value, std::memory_order_release);
        ok = waitPosted(r.rank, value);
        if (work == 0) {
          moveWord<<<1, 1, 0, r.stream>>>(r.work, r.staging);
        } else {
          cudaMemcpyAsync(r.work, r.staging, sizeof(uint64_t), cudaMemcpyHostToDevice, r.stream);
        }
        break;
    }
    if (way != kHost) doWork();
  }
  if (!ok) {
    if (proxy.joinable()) proxy.join();
    std::fprintf(stderr, "device_sync_bench: rank %d: %s: a peer did not come within the timeout\n", r.rank, name);
    cudaStreamSynchronize(r.stream);
    return 1;
  }
  // A wait that never ends would hold the stream: poll it with the host's timeout.
  const auto deadline = std::chrono::steady_clock::now() + kHostTimeout;
  cudaError_t state;
  while ((state = cudaStreamQuery(r.stream)) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "device_sync_bench: rank %d: %s: the stream did not finish within the timeout\n", r.rank,
                   name);
      if (proxy.joinable()) proxy.join();
      return 1;
    }
    sched_yield();
  }
  if (proxy.joinable()) proxy.join();
  if (proxyFailed.load()) return 1;
  if (state != cudaSuccess) {
    std::fprintf(stderr, "device_sync_bench: rank %d: %s: %s\n", r.rank, name, cudaGetErrorString(state));
    return 3;
  }
  if (*r.timedOut != 0) return 1;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *microseconds = seconds * 1e6 / calls;
  // The next run resets the flags: no rank may do so while a peer's stream still waits on one of
  // them (a stream that had not yet read the last value would wait for ever).
  return hostBarrier(r.rank) ? 0 : 1;
}

bool cudaOk(cudaError_t e, int rank, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "device_sync_bench: rank %d: %s: %s\n", rank, what, cudaGetErrorString(e));
  return false;
}

int rankMain(int rank) {
  Rank r;
  r.rank = rank;
  if (!cudaOk(cudaSetDevice(0), rank, "cudaSetDevice")) return 3;
  if (!cudaOk(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), rank, "cudaStreamCreate")) return 3;
  if (!cudaOk(cudaMalloc(&r.work, sizeof(uint64_t)), rank, "cudaMalloc")) return 3;
  if (!cudaOk(cudaMalloc(&r.deviceFlags, 256), rank, "cudaMalloc")) return 3;
  cudaMemset(r.work, 0, sizeof(uint64_t));
  cudaMemset(r.deviceFlags, 0, 256);
  const size_t flagBytes = sizeof(shared->hostFlags) + sizeof(shared->proxyIn) + sizeof(shared->proxyOut);
  if (!cudaOk(cudaHostRegister(shared->hostFlags, flagBytes, cudaHostRegisterMapped | cudaHostRegisterPortable), rank,
              "cudaHostRegister (the shared flags)")) {
    return 3;
  }
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&r.hostFlags), shared->hostFlags, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&r.proxyIn), &shared->proxyIn[rank][0], 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&r.proxyOut), &shared->proxyOut[rank][0], 0);
  if (!cudaOk(cudaHostAlloc(&r.timedOut, sizeof(int), cudaHostAllocMapped), rank, "cudaHostAlloc")) return 3;
  if (!cudaOk(cudaHostAlloc(&r.staging, sizeof(uint64_t), cudaHostAllocMapped), rank, "cudaHostAlloc")) return 3;
  for (auto& e : r.own) {
    if (!cudaOk(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess), rank,
                "cudaEventCreate")) {
      return 3;
    }
  }
  cudaIpcGetEventHandle(&shared->events[rank][0], r.own[0]);
  cudaIpcGetEventHandle(&shared->events[rank][1], r.own[1]);
  cudaIpcGetMemHandle(&shared->flagsMemory[rank], r.deviceFlags);
  driverEntry("cuStreamWaitValue32", &r.waitValue);
  driverEntry("cuStreamWriteValue32", &r.writeValue);
  cudaDeviceSynchronize();
  if (!hostBarrier(rank)) return 1;
  r.peerDeviceFlags.assign(nranks, nullptr);
  for (int e = 0; e < 2; ++e) r.peers[e].assign(nranks, nullptr);
  for (int q = 0; q < nranks; ++q) {
    if (q == rank) continue;
    for (int e = 0; e < 2; ++e) {
      if (!cudaOk(cudaIpcOpenEventHandle(&r.peers[e][q], shared->events[q][e]), rank, "cudaIpcOpenEventHandle"))
        return 3;
    }
    if (!cudaOk(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&r.peerDeviceFlags[q]), shared->flagsMemory[q],
                                     cudaIpcMemLazyEnablePeerAccess),
                rank, "cudaIpcOpenMemHandle")) {
      return 3;
    }
  }
  // The flags each rank waits on start at 0 (value-device resets its own before each way).
  for (int way = 0; way < kNumWays; ++way) {
    for (int work = 0; work < kNumWorks; ++work) {
      double us = -1;
      // Warm up (kernels loaded, the first switch paid), then time.
      const int saved = calls;
      calls = std::min(calls, 10);
      int status = runWay(r, way, work, &us);
      calls = saved;
      if (status == 0) status = runWay(r, way, work, &us);
      shared->microseconds[way][work][rank] = us;
      shared->status[way][work][rank] = status;
      if (status == 1) return 0;  // a stuck stream would spoil the ways after it
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-g" && i + 1 < argc) {
      nranks = std::atoi(argv[++i]);
    } else if (a == "-n" && i + 1 < argc) {
      calls = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: device_sync_bench [-g RANKS (2-%d)] [-n CALLS] [--json FILE]\n", kMaxRanks);
      return 2;
    }
  }
  if (nranks < 2 || nranks > kMaxRanks || calls < 1) {
    std::fprintf(stderr, "device_sync_bench: -g takes 2 to %d ranks and -n at least 1 call\n", kMaxRanks);
    return 2;
  }
  // The device probe runs in a child, so the ranks fork from a process that never started CUDA.
  const pid_t probe = fork();
  if (probe == 0) {
    int devices = 0;
    _exit(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 ? 0 : 77);
  }
  int probeStatus = 0;
  waitpid(probe, &probeStatus, 0);
  if (!WIFEXITED(probeStatus) || WEXITSTATUS(probeStatus) != 0) {
    std::printf("device_sync_bench: no usable CUDA device here\n");
    return 77;
  }
  void* memory = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    std::perror("device_sync_bench: mmap");
    return 2;
  }
  shared = new (memory) Shared();
  for (auto& way : shared->status) {
    for (auto& row : way) std::fill(row, row + kMaxRanks, 4);
  }
  std::vector<pid_t> children;
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rankMain(rank));
    children.push_back(pid);
  }
  int failed = 0;
  for (const pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  const char* statusNames[] = {"ok", "timeout", "unsupported", "CUDA error", "not run"};
  std::printf("# device_sync_bench: %d ranks on device 0, %d calls per way; time per call (the slowest rank)\n", nranks,
              calls);
  std::printf("%-14s %-7s %12s  %s\n", "way", "work", "us per call", "status");
  std::string rows;
  for (int way = 0; way < kNumWays; ++way) {
    for (int work = 0; work < kNumWorks; ++work) {
      if (way == kSpinKernel && work != 0) continue;
      double worst = 0;
      int status = 0;
      for (int q = 0; q < nranks; ++q) {
        status = std::max(status, shared->status[way][work][q]);
        worst = std::max(worst, shared->microseconds[way][work][q]);
      }
      if (status == 0) {
        std::printf("%-14s %-7s %12.1f  ok\n", kWays[way], kWorks[work], worst);
      } else {
        std::printf("%-14s %-7s %12s  %s\n", kWays[way], kWorks[work], "-", statusNames[status]);
      }
      char row[256];
      std::snprintf(
          row, sizeof(row), "%s{\"way\": \"%s\", \"work\": \"%s\", \"us_per_call\": %.3f, \"status\": \"%s\"}",
          rows.empty() ? "" : ", ", kWays[way], kWorks[work], status == 0 ? worst : -1.0, statusNames[status]);
      rows += row;
    }
  }
  if (json != nullptr) {
    FILE* f = std::fopen(json, "w");
    if (f == nullptr) {
      std::perror(json);
      return 2;
    }
    std::fprintf(f, "{\"ranks\": %d, \"calls\": %d, \"rows\": [%s]}\n", nranks, calls, rows.c_str());
    std::fclose(f);
  }
  if (failed > 0) std::fprintf(stderr, "device_sync_bench: %d rank(s) failed to start (see above)\n", failed);
  return failed > 0 ? 1 : 0;
}
