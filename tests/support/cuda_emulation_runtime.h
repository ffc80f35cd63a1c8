// cuda_emulation_runtime.h: the CUDA runtime (and the few driver calls chorus makes) emulated on
// the host, for tests/support/cuda_emulation.h (which includes it; include that one).
//
// Memory: device memory and pinned host memory are pages of host memory the emulation keeps a
// list of (host memory of the program's registered with cudaHostRegister is listed as pinned). A launch whose pointer argument lies in neither, a copy or memset whose kind does not
// match its pointers, a cudaFree of something never allocated: the call fails as on a GPU (the
// launch skipped, cudaGetLastError returning the error, a line on stderr naming the call and the
// pointer). Pointers inside a struct argument are not checked. The bytes past an allocation's end
// up to its page's end are poisoned under AddressSanitizer. One device, 0.
//
// CUDA IPC between processes: cudaIpcGetMemHandle moves an allocation, contents kept, onto a memfd
// mapped at the same address; cudaIpcOpenMemHandle in another process maps that memfd (through
// /proc/PID/fd), so both see the same bytes. An event made with cudaEventInterprocess keeps its
// counts in such a shared page, so another process's streams can wait on it.
//
// Streams: each created stream is a host thread that runs its calls (kernels, copies, memsets,
// host functions, event records and waits, stream memory operations) in order, so a call returns
// before it has run, as on a GPU. The legacy default stream (0, cudaStreamLegacy) runs a call in
// the calling thread once every blocking stream has finished what it was given, and blocking
// streams need not wait for it (it is done when the call returns). A copy from pageable (not
// pinned) host memory takes its source at the call; one to pageable memory waits for its stream and
// is done when it returns, as CUDA's are; cudaFree and cudaFreeHost wait for every stream first, as
// CUDA's do. Kernels of one process run one at a time (one multiprocessor), in their
// streams' order. A capture (cudaStreamBeginCapture) keeps the stream's calls instead of running them; a graph launch
// runs them again in the captured order (one chain: a graph of several branches runs as one). An event counts its
// records: a wait waits for the last record made before it. What it does not model: memory ordering (every access is a
// host access), peer devices, the per-thread default stream, graph nodes edited after capture, and limits but a
// launch's (cuda_emulation.h).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

enum cudaError : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorStreamCaptureUnsupported = 900,
};
using cudaError_t = cudaError;
struct CUstream_st;  // the emulation's Stream, as CUDA names its streams
using cudaStream_t = CUstream_st*;
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2,
                   cudaEventInterprocess = 4;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2;
constexpr unsigned cudaHostRegisterDefault = 0, cudaHostRegisterPortable = 1, cudaHostRegisterMapped = 2;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
struct cudaDeviceProp {
  char name[256];
};
struct cudaFuncAttributes {
  int maxThreadsPerBlock;
};
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive };
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal,
  cudaStreamCaptureModeThreadLocal,
  cudaStreamCaptureModeRelaxed
};
struct cudaIpcMemHandle_t {
  char reserved[64];
};
struct cudaIpcEventHandle_t {
  char reserved[64];
};
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess, cudaDriverEntryPointSymbolNotFound };
constexpr unsigned long long cudaEnableDefault = 0;
#define CUDART_CB

// The driver's types and calls that chorus uses (cuda.h).
enum CUresult : int { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
using CUdeviceptr = unsigned long long;
using CUstream = CUstream_st*;
using cuuint32_t = uint32_t;
enum CUpointer_attribute {
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};
enum CUmemorytype { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
constexpr unsigned CU_STREAM_WAIT_VALUE_GEQ = 0, CU_STREAM_WRITE_VALUE_DEFAULT = 0;

namespace chorus::testing::emulation {

// What an allocation is: device memory, pinned host memory (cudaHostAlloc), a peer's device
// memory mapped by cudaIpcOpenMemHandle, or host memory of the program's registered with
// cudaHostRegister (pinned, but not the emulation's to unmap).
enum class Memory { kDevice, kPinned, kOpened, kRegistered };
struct Allocation {
  size_t bytes;   // asked for
  size_t mapped;  // whole pages
  Memory kind;
  uint64_t id;
  int fd = -1;  // the memfd, once shared
};

// The allocations (start -> allocation), the last error, and the kernel lock, for every thread of
// the process.
struct Device {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> blocks;
  std::atomic<cudaError_t> lastError{cudaSuccess};
  uint64_t nextId = 1;
  std::recursive_mutex kernels;  // one kernel runs at a time
};
inline Device& device() {
  static Device d;
  return d;
}
inline size_t pageBytes() {
  static const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}
// The allocation p lies in (one past its end included: an empty range's start), copied, or false.
inline bool findAllocation(const void* p, uintptr_t* start, Allocation* found) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto it = d.blocks.upper_bound(at);
  if (it == d.blocks.begin()) return false;
  --it;
  if (at > it->first + it->second.bytes) return false;
  if (start != nullptr) *start = it->first;
  if (found != nullptr) *found = it->second;
  return true;
}
// Device memory (this process's or a peer's, mapped).
inline bool onDevice(const void* p) {
  Allocation a;
  return findAllocation(p, nullptr, &a) && a.kind != Memory::kPinned && a.kind != Memory::kRegistered;
}
inline bool pinned(const void* p) {
  Allocation a;
  return findAllocation(p, nullptr, &a) && (a.kind == Memory::kPinned || a.kind == Memory::kRegistered);
}
// What a kernel may touch: device memory and pinned host memory (mapped into the device).
inline bool deviceReachable(const void* p) { return findAllocation(p, nullptr, nullptr); }

// Records the error (kept until cudaGetLastError) and says on stderr what failed.
inline cudaError_t fail(cudaError_t error, const char* what, const void* p) {
  std::fprintf(stderr, "cuda emulation: %s: %p is not %s memory\n", what, p,
               error == cudaErrorIllegalAddress ? "device" : "the right kind of");
  device().lastError = error;
  return error;
}
inline cudaError_t failWith(cudaError_t error, const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  device().lastError = error;
  return error;
}
// A copy's or memset's pointer: device memory where `device` says, else host memory.
inline bool kindMatches(const void* p, bool device) { return onDevice(p) == device; }
inline cudaError_t copyKind(void* to, const void* from, cudaMemcpyKind kind, const char* what) {
  if (kind == cudaMemcpyDefault) return cudaSuccess;
  const bool toDevice = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool fromDevice = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (!kindMatches(to, toDevice)) return fail(cudaErrorInvalidValue, what, to);
  if (!kindMatches(from, fromDevice)) return fail(cudaErrorInvalidValue, what, from);
  return cudaSuccess;
}
inline thread_local int currentDevice = 0;

// Pages for an allocation of `bytes`, listed as `kind`; the slack past its end poisoned.
inline void* allocate(size_t bytes, Memory kind) {
  const size_t mapped = (std::max<size_t>(bytes, 1) + pageBytes() - 1) / pageBytes() * pageBytes();
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
#if defined(__SANITIZE_ADDRESS__)
  ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + bytes, mapped - bytes);
#endif
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.blocks[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, mapped, kind, d.nextId++};
  return p;
}
// Unlists and unmaps the allocation starting at p, if it is of one of the kinds.
inline cudaError_t release(void* p, Memory kind, Memory other, const char* what) {
  if (p == nullptr) return cudaSuccess;
  Allocation a;
  {
    Device& d = device();
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.blocks.end() || (it->second.kind != kind && it->second.kind != other)) {
      std::fprintf(stderr, "cuda emulation: %s: %p is not the start of an allocation of that kind\n", what, p);
      d.lastError = cudaErrorInvalidValue;
      return cudaErrorInvalidValue;
    }
    a = it->second;
    d.blocks.erase(it);
  }
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(p, a.mapped);
#endif
  munmap(p, a.mapped);
  if (a.fd >= 0) close(a.fd);
  return cudaSuccess;
}

// ---- streams ----

// An event's counts: records made (at the call) and records reached (by the stream), and when the
// last was reached. In a shared page for an interprocess event.
struct EventCounts {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> reached{0};
  std::atomic<int64_t> atNs{0};
};

// Polls until done() holds: spins a little, then naps (the other side may be another process). As
// on a GPU the wait has no end of its own; past 30 s it says once on stderr what it waits for, so a
// test that hangs names the stuck wait.
template <typename F>
void waitUntil(F&& done, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  for (unsigned spin = 0; !done(); ++spin) {
    if (spin < 64) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (!told && std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      std::fprintf(stderr, "cuda emulation: pid %d: %s, still waiting after 30 s\n", static_cast<int>(getpid()), what);
      told = true;
    }
  }
}
// Waits until the event's record `target` has been reached.
inline void waitForRecord(const EventCounts& counts, uint64_t target, const char* what) {
  waitUntil([&] { return counts.reached.load() >= target; }, what);
}

// A stream's captured calls, in order.
struct Graph {
  std::vector<std::function<void()>> calls;
};

struct Stream {
  explicit Stream(bool blocking) : blocking(blocking), worker([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    worker.join();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || !calls.empty(); });
      if (calls.empty()) return;  // stopping, every call run
      std::function<void()> call = std::move(calls.front());
      calls.pop_front();
      lock.unlock();
      call();
      lock.lock();
      ++finished;
      idle.notify_all();
    }
  }
  void add(std::function<void()> call) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back(std::move(call));
      ++given;
    }
    wake.notify_one();
  }
  // Waits until every call given so far has run.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex);
    const uint64_t target = given;
    idle.wait(lock, [&] { return finished >= target; });
  }
  bool busy() {
    std::lock_guard<std::mutex> lock(mutex);
    return finished < given;
  }

  const bool blocking;
  std::mutex mutex;
  std::condition_variable wake, idle;
  std::deque<std::function<void()>> calls;
  uint64_t given = 0, finished = 0;
  bool stopping = false;
  Graph* capture = nullptr;  // being captured into
  std::thread worker;
};

// The process's streams, for the legacy stream and cudaDeviceSynchronize to wait on.
struct Streams {
  std::mutex mutex;
  std::set<Stream*> all;
};
inline Streams& streams() {
  static Streams s;
  return s;
}
// The stream a cudaStream_t names; null for the legacy default stream.
inline Stream* streamOf(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return nullptr;
  return reinterpret_cast<Stream*>(s);
}
// Waits until every stream (blocking ones only, where `blockingOnly`) has run what it was given.
inline void drainStreams(bool blockingOnly) {
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> lock(streams().mutex);
    all.assign(streams().all.begin(), streams().all.end());
  }
  for (Stream* s : all) {
    if (!blockingOnly || s->blocking) s->drain();
  }
}
// Runs call in stream order: captured where the stream is being captured, on the stream's thread,
// or (the legacy stream) here, once the blocking streams are done.
inline void enqueue(cudaStream_t s, std::function<void()> call) {
  Stream* stream = streamOf(s);
  if (stream == nullptr) {
    drainStreams(true);
    call();
    return;
  }
  if (stream->capture != nullptr) {
    stream->capture->calls.push_back(std::move(call));
    return;
  }
  stream->add(std::move(call));
}
// Waits until the stream has run what it was given (the legacy stream: the blocking streams).
inline void synchronize(cudaStream_t s) {
  if (Stream* stream = streamOf(s)) {
    stream->drain();
  } else {
    drainStreams(true);
  }
}

// A memfd of `bytes` holding what lies at p now; -1 on failure.
inline int sharedCopy(const void* p, size_t bytes, const char* name) {
  const int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || pwrite(fd, p, bytes, 0) != static_cast<ssize_t>(bytes)) {
    close(fd);
    return -1;
  }
  return fd;
}
// The file descriptor fd of process pid, opened here (-1 on failure).
inline int openPeerFd(int32_t pid, int32_t fd) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  return open(path.c_str(), O_RDWR | O_CLOEXEC);
}
// What an IPC handle carries.
struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t bytes;
  uint64_t mapped;
};
constexpr uint32_t kMemMagic = 0x6d656d31, kEventMagic = 0x65766e31;
// Counts in a mapped shared page, unmapped with the last owner.
inline std::shared_ptr<EventCounts> mappedCounts(EventCounts* page) {
  return std::shared_ptr<EventCounts>(page, [](EventCounts* p) { munmap(p, pageBytes()); });
}

}  // namespace chorus::testing::emulation

// An event: its counts, shared with the records and waits still queued on streams (an event may
// be destroyed while a stream has yet to reach them, as on a GPU), in a mapped shared page for an
// interprocess event.
struct EmulatedEvent {
  std::shared_ptr<chorus::testing::emulation::EventCounts> counts;
  int fd = -1;        // the shared page's memfd (an interprocess event made here)
  bool timed = true;  // made without cudaEventDisableTiming
};
using cudaEvent_t = EmulatedEvent*;
using cudaGraph_t = chorus::testing::emulation::Graph*;
using cudaGraphExec_t = chorus::testing::emulation::Graph*;

// ---- memory ----

template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  void* block = chorus::testing::emulation::allocate(bytes, chorus::testing::emulation::Memory::kDevice);
  *p = static_cast<T*>(block);
  return block != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
// Freeing device or pinned memory waits for the whole device first (every stream's work), as a
// GPU's cudaFree and cudaFreeHost do: a free made while a stream waits on the freeing thread
// hangs here as it would there.
inline cudaError_t cudaFree(void* p) {
  using chorus::testing::emulation::Memory;
  if (p != nullptr) chorus::testing::emulation::drainStreams(false);
  return chorus::testing::emulation::release(p, Memory::kDevice, Memory::kDevice, "cudaFree");
}
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned = 0) {
  *p = chorus::testing::emulation::allocate(bytes, chorus::testing::emulation::Memory::kPinned);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes); }
inline cudaError_t cudaFreeHost(void* p) {
  using chorus::testing::emulation::Memory;
  if (p != nullptr) chorus::testing::emulation::drainStreams(false);
  return chorus::testing::emulation::release(p, Memory::kPinned, Memory::kPinned, "cudaFreeHost");
}
// Lists the program's host memory as pinned (it stays the program's: cudaHostUnregister unlists it).
inline cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  using namespace chorus::testing::emulation;
  if (p == nullptr || bytes == 0 || findAllocation(p, nullptr, nullptr)) {
    return failWith(cudaErrorInvalidValue, "cudaHostRegister: a null, empty or already listed range");
  }
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.blocks[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, bytes, Memory::kRegistered, d.nextId++};
  return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void* p) {
  using namespace chorus::testing::emulation;
  drainStreams(false);  // as cudaFreeHost: what the streams were given may still use it
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto it = d.blocks.find(reinterpret_cast<uintptr_t>(p));
  if (it == d.blocks.end() || it->second.kind != Memory::kRegistered) {
    d.lastError = cudaErrorInvalidValue;
    std::fprintf(stderr, "cuda emulation: cudaHostUnregister: %p was not registered\n", p);
    return cudaErrorInvalidValue;
  }
  d.blocks.erase(it);
  return cudaSuccess;
}
inline cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  if (!chorus::testing::emulation::pinned(host)) return cudaErrorInvalidValue;
  *device = host;  // one address space, as with unified addressing
  return cudaSuccess;
}
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  using namespace chorus::testing::emulation;
  *attributes = {};
  Allocation a;
  if (!findAllocation(p, nullptr, &a)) return cudaSuccess;  // unregistered host memory
  const bool host = a.kind == Memory::kPinned || a.kind == Memory::kRegistered;
  attributes->type = host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  attributes->device = 0;
  attributes->devicePointer = const_cast<void*>(p);
  attributes->hostPointer = host ? const_cast<void*>(p) : nullptr;
  return cudaSuccess;
}
// The driver's attribute call, for what src/transport/cuda_ipc.cc asks.
inline CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer) {
  using namespace chorus::testing::emulation;
  uintptr_t start = 0;
  Allocation a;
  if (!findAllocation(reinterpret_cast<const void*>(pointer), &start, &a)) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) =
          a.kind == Memory::kPinned || a.kind == Memory::kRegistered ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = a.id;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = start;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a.bytes;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// A copy in stream order. From pageable (not pinned) host memory the source is taken at the call
// and lands in the stream's turn; to pageable host memory the call waits for the stream and is done
// when it returns (as CUDA's pageable copies are); between device and pinned memory it runs in its
// turn.
inline cudaError_t cudaMemcpy2DAsync(void* to, size_t toPitch, const void* from, size_t fromPitch, size_t width,
                                     size_t rows, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  using namespace chorus::testing::emulation;
  if (width == 0 || rows == 0) return cudaSuccess;
  if (width > toPitch || width > fromPitch) return cudaErrorInvalidValue;
  if (const cudaError_t error = copyKind(to, from, kind, "cudaMemcpy")) return error;
  auto copy = [=](const char* source, size_t sourcePitch) {
    for (size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(to) + r * toPitch, source + r * sourcePitch, width);
  };
  Stream* s = streamOf(stream);
  if (!deviceReachable(to)) {
    if (s != nullptr && s->capture != nullptr) {
      return failWith(cudaErrorStreamCaptureUnsupported, "cudaMemcpy: to pageable host memory while capturing");
    }
    synchronize(stream);
    copy(static_cast<const char*>(from), fromPitch);
    return cudaSuccess;
  }
  if (!deviceReachable(from)) {
    auto taken = std::make_shared<std::vector<char>>(rows * width);
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(taken->data() + r * width, static_cast<const char*>(from) + r * fromPitch, width);
    }
    enqueue(stream, [copy, taken, width] { copy(taken->data(), width); });
    return cudaSuccess;
  }
  enqueue(stream, [copy, from, fromPitch] { copy(static_cast<const char*>(from), fromPitch); });
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
  return cudaMemcpy2DAsync(to, bytes, from, bytes, bytes, 1, kind, stream);
}
inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(to, from, bytes, kind, nullptr);
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr) {
  if (bytes == 0) return cudaSuccess;
  if (!chorus::testing::emulation::onDevice(p)) {
    return chorus::testing::emulation::fail(cudaErrorInvalidValue, "cudaMemset", p);
  }
  chorus::testing::emulation::enqueue(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes); }

// ---- the device ----

inline cudaError_t cudaDeviceSynchronize() {
  chorus::testing::emulation::drainStreams(false);
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = chorus::testing::emulation::currentDevice;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  chorus::testing::emulation::currentDevice = device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = {};
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulated on the host");
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetPCIBusId(char* busId, int length, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::snprintf(busId, static_cast<size_t>(length), "0000:00:00.0");
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* busId) {
  if (std::strcmp(busId, "0000:00:00.0") != 0) return cudaErrorInvalidDevice;
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 0;  // one device: no peers
  return cudaSuccess;
}

// ---- streams and events ----

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  auto* s = new chorus::testing::emulation::Stream((flags & cudaStreamNonBlocking) == 0);
  {
    auto& all = chorus::testing::emulation::streams();
    std::lock_guard<std::mutex> lock(all.mutex);
    all.all.insert(s);
  }
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
// Waits for what the stream was given (CUDA returns at once and finishes it later).
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  using namespace chorus::testing::emulation;
  Stream* s = streamOf(stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard<std::mutex> lock(streams().mutex);
    streams().all.erase(s);
  }
  delete s;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  chorus::testing::emulation::synchronize(stream);
  return cudaSuccess;
}
inline cudaError_t cudaStreamQuery(cudaStream_t stream) {
  chorus::testing::emulation::Stream* s = chorus::testing::emulation::streamOf(stream);
  return s != nullptr && s->busy() ? cudaErrorNotReady : cudaSuccess;
}
inline cudaError_t cudaLaunchHostFunc(cudaStream_t stream, void (*fn)(void*), void* data) {
  chorus::testing::emulation::enqueue(stream, [=] { fn(data); });
  return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  using namespace chorus::testing::emulation;
  auto* e = new EmulatedEvent;
  e->counts = std::make_shared<EventCounts>();
  e->timed = (flags & cudaEventDisableTiming) == 0;
  if ((flags & cudaEventInterprocess) != 0) {
    const EventCounts zero;
    e->fd = sharedCopy(&zero, pageBytes(), "chorus-emulated-event");
    void* page = e->fd < 0 ? MAP_FAILED : mmap(nullptr, pageBytes(), PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
    if (page == MAP_FAILED) {
      if (e->fd >= 0) close(e->fd);
      delete e;
      return failWith(cudaErrorMemoryAllocation, "cudaEventCreate: no shared page for an interprocess event");
    }
    e->counts = mappedCounts(new (page) EventCounts);
  }
  *event = e;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  if (event->fd >= 0) close(event->fd);
  delete event;
  return cudaSuccess;
}
// A record: counted now, reached when the stream gets to it (in a capture: counted and reached at
// each replay).
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  using namespace chorus::testing::emulation;
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventCounts> counts = event->counts;
  auto reach = [counts](uint64_t record) {
    counts->atNs = std::chrono::steady_clock::now().time_since_epoch().count();
    uint64_t seen = counts->reached.load();
    while (seen < record && !counts->reached.compare_exchange_weak(seen, record)) {
    }
  };
  Stream* s = streamOf(stream);
  if (s != nullptr && s->capture != nullptr) {
    s->capture->calls.push_back([counts, reach] { reach(++counts->recorded); });
    return cudaSuccess;
  }
  const uint64_t record = ++counts->recorded;
  enqueue(stream, [reach, record] { reach(record); });
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  return event->counts->reached.load() >= event->counts->recorded.load() ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  const auto& counts = event->counts;
  const uint64_t target = counts->recorded.load();
  chorus::testing::emulation::waitForRecord(*counts, target, "cudaEventSynchronize");
  return cudaSuccess;
}
// As CUDA's: refused for an event made with cudaEventDisableTiming or never recorded, not ready
// until both have been reached.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (start == nullptr || end == nullptr) return cudaErrorInvalidResourceHandle;
  if (!start->timed || !end->timed) {
    return chorus::testing::emulation::failWith(cudaErrorInvalidResourceHandle,
                                                "cudaEventElapsedTime: an event made with cudaEventDisableTiming");
  }
  if (start->counts->recorded.load() == 0 || end->counts->recorded.load() == 0) {
    return chorus::testing::emulation::failWith(cudaErrorInvalidResourceHandle,
                                                "cudaEventElapsedTime: an event never recorded");
  }
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) return cudaErrorNotReady;
  *ms = static_cast<float>(end->counts->atNs.load() - start->counts->atNs.load()) / 1e6f;
  return cudaSuccess;
}
// The stream waits for the event's last record made before this call (in a capture: before the
// wait's turn at each replay).
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned = 0) {
  using namespace chorus::testing::emulation;
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventCounts> counts = event->counts;
  Stream* s = streamOf(stream);
  if (s != nullptr && s->capture != nullptr) {
    s->capture->calls.push_back([counts] {
      const uint64_t target = counts->recorded.load();
      waitForRecord(*counts, target, "cudaStreamWaitEvent (captured)");
    });
    return cudaSuccess;
  }
  const uint64_t target = counts->recorded.load();
  enqueue(stream, [counts, target] { waitForRecord(*counts, target, "cudaStreamWaitEvent"); });
  return cudaSuccess;
}

// ---- CUDA IPC ----

// Moves the allocation at p (its start) onto a memfd, in place, and hands out the memfd's name.
inline cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  using namespace chorus::testing::emulation;
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  auto it = d.blocks.find(reinterpret_cast<uintptr_t>(p));
  if (it == d.blocks.end() || it->second.kind != Memory::kDevice) {
    std::fprintf(stderr, "cuda emulation: cudaIpcGetMemHandle: %p is not the start of a device allocation\n", p);
    return cudaErrorInvalidValue;
  }
  Allocation& a = it->second;
  if (a.fd < 0) {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(p, a.mapped);
#endif
    const int fd = sharedCopy(p, a.mapped, "chorus-emulated-device");
    if (fd < 0 || mmap(p, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      if (fd >= 0) close(fd);
      return cudaErrorMemoryAllocation;
    }
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(p) + a.bytes, a.mapped - a.bytes);
#endif
    a.fd = fd;
  }
  IpcHandle h{kMemMagic, static_cast<int32_t>(getpid()), a.fd, 0, a.bytes, a.mapped};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}
inline cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned) {
  using namespace chorus::testing::emulation;
  IpcHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  if (h.magic != kMemMagic) return failWith(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: not a memory handle");
  if (h.pid == getpid()) return failWith(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: a handle of this process");
  const int fd = openPeerFd(h.pid, h.fd);
  if (fd < 0) return failWith(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: the owner's memory is gone");
  void* at = mmap(nullptr, h.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (at == MAP_FAILED) return cudaErrorMemoryAllocation;
  Device& d = device();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.blocks[reinterpret_cast<uintptr_t>(at)] = Allocation{h.bytes, h.mapped, Memory::kOpened, d.nextId++};
  *p = at;
  return cudaSuccess;
}
inline cudaError_t cudaIpcCloseMemHandle(void* p) {
  using chorus::testing::emulation::Memory;
  return chorus::testing::emulation::release(p, Memory::kOpened, Memory::kOpened, "cudaIpcCloseMemHandle");
}
inline cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  using namespace chorus::testing::emulation;
  if (event == nullptr || event->fd < 0)
    return failWith(cudaErrorInvalidResourceHandle, "cudaIpcGetEventHandle: not an interprocess event");
  IpcHandle h{kEventMagic, static_cast<int32_t>(getpid()), event->fd, 0, pageBytes(), pageBytes()};
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}
inline cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  using namespace chorus::testing::emulation;
  IpcHandle h;
  std::memcpy(&h, &handle, sizeof(h));
  if (h.magic != kEventMagic) return failWith(cudaErrorInvalidValue, "cudaIpcOpenEventHandle: not an event handle");
  const int fd = openPeerFd(h.pid, h.fd);
  if (fd < 0) return failWith(cudaErrorInvalidValue, "cudaIpcOpenEventHandle: the owner's event is gone");
  void* page = mmap(nullptr, h.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (page == MAP_FAILED) return cudaErrorMemoryAllocation;
  auto* e = new EmulatedEvent;
  e->counts = mappedCounts(static_cast<EventCounts*>(page));
  *event = e;
  return cudaSuccess;
}

// ---- capture and graphs ----

inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  using namespace chorus::testing::emulation;
  Stream* s = streamOf(stream);
  if (s == nullptr || s->capture != nullptr) {
    return failWith(cudaErrorStreamCaptureUnsupported,
                    "cudaStreamBeginCapture: the legacy stream, or already capturing");
  }
  s->capture = new Graph;
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  using namespace chorus::testing::emulation;
  Stream* s = streamOf(stream);
  if (s == nullptr || s->capture == nullptr) return cudaErrorInvalidValue;
  *graph = s->capture;
  s->capture = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  chorus::testing::emulation::Stream* s = chorus::testing::emulation::streamOf(stream);
  *status = s != nullptr && s->capture != nullptr ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
inline cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
  std::swap(current, *mode);
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long = 0) {
  *exec = new chorus::testing::emulation::Graph(*graph);
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  for (const auto& call : exec->calls) chorus::testing::emulation::enqueue(stream, call);
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

// ---- the driver's stream memory operations, by cudaGetDriverEntryPointByVersion ----

namespace chorus::testing::emulation {
inline CUresult streamWriteValue(CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned) {
  auto* word = reinterpret_cast<uint32_t*>(address);
  if (!deviceReachable(word)) return CUDA_ERROR_INVALID_VALUE;
  enqueue(stream, [word, value] { std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release); });
  return CUDA_SUCCESS;
}
// Waits until the word is at or past value, cyclically (CU_STREAM_WAIT_VALUE_GEQ).
inline CUresult streamWaitValue(CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned) {
  auto* word = reinterpret_cast<uint32_t*>(address);
  if (!deviceReachable(word)) return CUDA_ERROR_INVALID_VALUE;
  enqueue(stream, [word, value] {
    waitUntil(
        [&] {
          return static_cast<int32_t>(std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire) - value) >= 0;
        },
        "cuStreamWaitValue32");
  });
  return CUDA_SUCCESS;
}
}  // namespace chorus::testing::emulation

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* name, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* found) {
  *fn = nullptr;
  if (std::strcmp(name, "cuStreamWriteValue32") == 0) {
    *fn = reinterpret_cast<void*>(&chorus::testing::emulation::streamWriteValue);
  } else if (std::strcmp(name, "cuStreamWaitValue32") == 0) {
    *fn = reinterpret_cast<void*>(&chorus::testing::emulation::streamWaitValue);
  }
  *found = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

// ---- kernels' attributes ----
// A kernel's dynamic shared memory may go above 48 KiB once cudaFuncSetAttribute raised its limit,
// to at most an H100's or H200's 227 KiB. The emulation keeps the limit the calling thread set
// last, whichever kernel it was for (a launch does not say which function it runs: see
// checkedLaunch in cuda_emulation.h).

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
namespace chorus::testing::emulation {
constexpr size_t kDefaultSharedBytes = 48 * 1024, kMostSharedBytes = 227 * 1024;
inline thread_local size_t raisedSharedBytes = 0;
}  // namespace chorus::testing::emulation
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int value) {
  namespace e = chorus::testing::emulation;
  if (value < 0 || static_cast<size_t>(value) > e::kMostSharedBytes) {
    char what[160];
    std::snprintf(what, sizeof what, "cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most %zu)", value,
                  e::kMostSharedBytes);
    return e::failWith(cudaErrorInvalidValue, what);
  }
  e::raisedSharedBytes = static_cast<size_t>(value);
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Kernel) {
  attributes->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

// ---- errors ----

// The last error (a launch's or a call's), cleared.
inline cudaError_t cudaGetLastError() { return chorus::testing::emulation::device().lastError.exchange(cudaSuccess); }
inline cudaError_t cudaPeekAtLastError() { return chorus::testing::emulation::device().lastError.load(); }
inline const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }
