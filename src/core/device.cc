// device.cc: the DeviceEngine (see device.h). CUDA runtime calls only; the kernels are in
// device_kernels.cu and the ring's units (device_ring.h, device_ring.cuh).
#include "src/core/device.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"
#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/base/memory.h"
#include "src/base/process.h"
#include "src/collectives/algorithm.h"
#include "src/collectives/traits.h"
#include "src/core/communicator.h"
#include "src/core/device_kernels.h"
#include "src/core/executor.h"
#include "src/core/growing_areas.h"
#include "src/core/placement.h"
#include "src/topology/search.h"
#include "src/transport/cuda_ipc.h"

namespace chorus {

namespace {

using collectives::Collective;

void check(cudaError_t error, int rank, const char* what) {
  if (error != cudaSuccess) {
    fail(chorusSystemError, "rank {}: device path: {}: {} ({})", rank, what, cudaGetErrorString(error),
         static_cast<int>(error));
  }
}

// Lets this thread make calls CUDA refuses while one of its streams is being captured in the
// default (global) mode: allocations and the setup's own synchronization, none of which touch a
// captured stream. The mode before is restored at scope exit.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Where a ring kernel's collective goes, by chorus collective; -1: staged only.
int ringKind(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return static_cast<int>(ipc::Kind::kAllReduce);
    case Collective::kAllGather:
      return static_cast<int>(ipc::Kind::kAllGather);
    case Collective::kReduceScatter:
      return static_cast<int>(ipc::Kind::kReduceScatter);
    case Collective::kBroadcast:
      return static_cast<int>(ipc::Kind::kBroadcast);
    case Collective::kReduce:
      return static_cast<int>(ipc::Kind::kReduce);
    default:
      return -1;
  }
}

// Elements of this rank's input and output for a call (0 where the rank has none).
void extents(const DeviceCall& call, int rank, int nranks, size_t* in, size_t* out) {
  if (call.collective == Collective::kAllToAllv) {
    // vector: send counts, send displacements, recv counts, recv displacements.
    *in = collectives::vectorExtent(call.vector[0], call.vector[1], nranks);
    *out = collectives::vectorExtent(call.vector[2], call.vector[3], nranks);
    return;
  }
  const bool root = call.rootOrPeer == rank;
  *in = collectives::inputElements(call.collective, call.count, nranks, root);
  *out = collectives::outputElements(call.collective, call.count, nranks, root);
}

// Blocks of the call's count a rank of the direct path publishes: the input the root has (1, or n
// where the input is a block per rank), as extents gives it.
size_t directBlocks(const DeviceCall& call, int nranks) {
  if (call.count == 0) return 1;
  size_t in, out;
  extents(call, call.rootOrPeer, nranks, &in, &out);
  return std::max<size_t>(1, in / call.count);
}

// What the direct path's setup exchanges: the publishing buffer's handle, the flags page's name
// (rank 0's), the process (its pid, and its pid namespace: pids compare only within one), the
// rank's CHORUS_DEVICE_DIRECT_INPLACE_BYTES (the ranks take the least, so all choose alike) and
// CHORUS_DEVICE_DIRECT_REDUCERS (the ranks take rank 0's).
struct DirectInfo {
  cudaIpcMemHandle_t buffer;
  char flagsName[48];
  uint64_t pidNamespace;
  uint64_t inPlaceBytes;
  int32_t pid;
  int32_t ok;
  int32_t oneReducer;
  int32_t pad;
};

// The direct path's flags: one page of host memory every rank maps (POSIX shared memory, made by
// rank 0) and registers with CUDA, so that streams write and wait on its words (the driver's
// stream memory operations) and the hosts read and write them too. Per rank and publishing buffer
// q, the number of the last piece (calls and pieces are numbered 1, 2, ... alike on every rank;
// piece s uses buffer s % 2) for which the rank's stream has published its input or marked it
// final (kReady) and has read what it reads of the peers' (kRead); and per rank a word its
// watcher sets when one of its device calls failed (kFailedWord). Numbers compare cyclically.
enum DirectFlag { kReady = 0, kRead = 1 };
constexpr int kMaxDirectRanks = kernels::cuda::kMaxReduceSources;
constexpr size_t kFlagsBytes = 4096;
constexpr size_t kFailedWord = 4 * kMaxDirectRanks;  // + rank
size_t flagIndex(int flag, int q, int p) {
  return (static_cast<size_t>(flag) * 2 + static_cast<size_t>(q)) * kMaxDirectRanks + static_cast<size_t>(p);
}
static_assert((kFailedWord + kMaxDirectRanks) * sizeof(uint32_t) <= kFlagsBytes);
bool reached(uint32_t word, uint32_t value) { return static_cast<int32_t>(word - value) >= 0; }
const char* flagDoing(int flag) { return flag == kReady ? "publish its input" : "read the published buffers"; }
uint64_t pidNamespace() {
  struct stat info {};
  return stat("/proc/self/ns/pid", &info) == 0 ? static_cast<uint64_t>(info.st_ino) : 0;
}

// What an in-place direct call exchanges: where the rank's input and output lie, or ok = 0 when
// it cannot share them (memory from a pool, or from the virtual memory API): then every rank
// publishes a copy instead.
struct InPlaceInfo {
  cudaipc::ExposedBuffer input;
  cudaipc::ExposedBuffer output;
  int32_t ok;
  int32_t pad;
};

// What the IPC setup exchanges: the inbox's handle and where the rank's GPU is.
struct IpcInfo {
  cudaIpcMemHandle_t inbox;
  char busId[32];
  int32_t ok;  // the handle was made
  int32_t pad;
};

// A buffer of a device call: device (or managed) memory, of the current device.
void checkBuffer(const void* p, size_t bytes, const char* what, const char* name, int rank, int device) {
  if (p == nullptr || bytes == 0) return;
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, p);
  cudaGetLastError();
  if (error != cudaSuccess || (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)) {
    fail(chorusInvalidArgument,
         "rank {}: {}: {} ({} bytes at {}) is not device memory, but a stream was given (host buffers take a NULL "
         "stream)",
         rank, name, what, bytes, p);
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    fail(chorusInvalidArgument, "rank {}: {}: {} lies on GPU {}, but the current device is GPU {}", rank, name, what,
         attributes.device, device);
  }
}

}  // namespace

void checkDeviceCall(const DeviceCall& call, int rank, int nranks, const char* name) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (probe != cudaSuccess || count == 0) {
    fail(chorusInvalidArgument, "rank {}: {}: a stream was given, but CUDA has no usable device here ({})", rank, name,
         probe != cudaSuccess ? cudaGetErrorString(probe) : "no CUDA device");
  }
  int device = -1;
  check(cudaGetDevice(&device), rank, "cudaGetDevice");
  size_t inCount, outCount;
  extents(call, rank, nranks, &inCount, &outCount);
  const size_t size = kernels::typeSize(call.type);
  checkBuffer(call.input, inCount * size, "sendbuff", name, rank, device);
  checkBuffer(call.output, outCount * size, "recvbuff", name, rank, device);
}

int currentCudaDevice() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

void useCudaDevice(int device) {
  if (device >= 0 && device != currentCudaDevice()) cudaSetDevice(device);
}

bool isDeviceMemory(const void* p) {
  if (p == nullptr) return false;
  const cudaipc::PointerAttributeFn fn = cudaipc::loadedDriver();
  if (fn == nullptr) return false;
  unsigned int type = 0;  // host and unregistered pointers: an error, or a host type
  if (fn(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS) return false;
  return type == CU_MEMORYTYPE_DEVICE;
}

chorusStream_t streamForNull(const void* input, const void* output) {
  if (isDeviceMemory(input) || isDeviceMemory(output)) return reinterpret_cast<chorusStream_t>(cudaStreamLegacy);
  return nullptr;
}

// A staged call as the proxy runs it: on the proxy's communicator, from and to pinned memory.
// Host functions enqueued on streams (and captured in graphs) point at these, so they live as
// long as the engine; equal calls share one.
struct StagedCall {
  DeviceEngine::Impl* engine;
  DeviceCall call;  // input / output: pinned staging memory
  std::vector<size_t> vectorData;
  const size_t* vector[4] = {};
  std::vector<DeviceCall> group;  // a group's sends and receives instead of call, made together
};

struct DeviceEngine::Impl {
  Communicator& comm;
  int rank;
  int nranks;
  int device = -1;
  bool ipc = false;
  size_t llBytes = 0;
  int channels = 1;
  int threads = 512;
  size_t stageBytes = 0;
  uint64_t timeoutNs = 0;

  // Pinned host memory shared with the device: Control, then the proxy's done count.
  void* pinned = nullptr;
  ipc::Control* control = nullptr;  // host view
  ipc::Control* controlDevice = nullptr;
  volatile uint64_t* done = nullptr;
  const volatile uint64_t* doneDevice = nullptr;
  // Device memory: the inboxes of every channel, counters, the wait kernel's count.
  ipc::ChannelInbox* inbox = nullptr;
  ipc::ChannelInbox* nextInbox = nullptr;
  ipc::ChannelInbox* prevInbox = nullptr;
  // The ipc ring: ranks in the order the topology search laid them (position -> rank), this
  // rank's position, its neighbours, and the order in device memory (NULL when it is by number).
  std::vector<int> ringOrder;
  std::vector<int> positionOf;
  int nextRank = 0;
  int prevRank = 0;
  int* rankAtDevice = nullptr;
  std::vector<void*> opened;  // peers' inboxes, mapped
  ipc::ChannelCounters* counters = nullptr;
  uint64_t* waits = nullptr;

  // Ordering across streams: every call waits for the previous one's stream.
  cudaStream_t lastStream = nullptr;
  cudaEvent_t lastDone = nullptr;
  bool anyCall = false;

  // The engine's own stream, for its setup's copies: waiting on it waits for nothing of the
  // caller's (a caller's stream may be held by a host function, or being captured).
  cudaStream_t setupStream = nullptr;

  // The direct path (ranks sharing one GPU): each rank's two publishing buffers (device memory,
  // mapped by every peer), and the flags page (DirectFlag) that orders the ranks' streams.
  // Piece s of the calls (numbered from 1) uses buffer s % 2 on every rank.
  bool direct = false;
  size_t directBytes = 0;  // per buffer
  char* directBuffer = nullptr;
  std::vector<char*> peerDirect;  // by rank (this rank's own too)
  uint64_t directPieces = 0;
  SharedSegment flagsPage;
  uint32_t* flags = nullptr;    // its words
  CUdeviceptr flagsDevice = 0;  // the same, for the streams
  bool flagsRegistered = false;
  uint32_t lastPublished[2] = {};  // the last piece published into buffer q (0: none)
  // The last flag this rank's stream writes, in stream order: a wait enqueued after it starts
  // waiting once the host sees it written (its timeout counts from there).
  int lastOwnFlag = -1;
  int lastOwnQ = 0;
  uint32_t lastOwnValue = 0;
  // The peers' processes (pid 0 where it is not comparable: another pid namespace), each with a
  // pidfd (-1 where the kernel has none), to hear of a death.
  std::vector<pid_t> peerPid;
  std::vector<int> peerPidfd;
  // The watcher: a thread that sees every wait of this rank's streams on a peer's flag answered,
  // and where the peer dies, its wait times out or the communicator is aborted, fails the call
  // (the asynchronous error), sets this rank's failed word and writes the flags the stream waits
  // for, so that it goes on (as the ring kernel and the proxy let theirs go). It also fails a call
  // whose wait a failed peer's stream answered (that stream went on after its failure).
  struct FlagWait {
    int peer, flag, q;
    uint32_t value;
    int arrivalFlag, arrivalQ;  // this rank's own flag written before the wait (-1: none)
    uint32_t arrivalValue;
    int64_t arrivedNs;  // when the host saw the stream reach the wait (0: not yet)
  };
  std::thread watcher;
  std::mutex watchMutex;
  std::condition_variable watchWake;
  std::deque<FlagWait> flagWaits;  // under watchMutex, as the six below
  bool watchStopping = false;
  bool watchFailed = false;
  int64_t watchProgressNs = 0;     // when a wait was last answered
  std::vector<FlagWait> released;  // after a failure: what is written until the stream is past it
  // awaitPeers' registrations so far, and how many of them lastDone's last record covers: a call
  // registers its waits before it records lastDone, and until it has, lastDone's completion says
  // nothing of them.
  uint64_t waitBatches = 0, waitBatchesRecorded = 0;

  // In place: direct all-reduces of directInPlaceBytes or more (0: none) read and write the peers'
  // buffers where they lie instead of a published copy, mapped by CUDA IPC (the transport's).
  size_t directInPlaceBytes = 0;
  // Who reduces an in-place call: every rank its block (false), or rank 0 all of it (true).
  bool directOneReducer = false;
  cudaipc::Mappings mappings;

  // Staging: two slots, each an input and an output area (area slot * 2 + which), pinned. A
  // larger call gets larger areas; the old ones are kept (calls in flight and captured graphs
  // point into them) until the engine goes, as are the StagedCalls that host functions point at.
  GrowingAreas staging{4,
                       [this](size_t bytes) {
                         void* fresh = nullptr;
                         RelaxedCapture relaxed;  // allowed while a stream is being captured
                         check(cudaHostAlloc(&fresh, bytes, cudaHostAllocPortable), rank, "cudaHostAlloc (staging)");
                         return fresh;
                       },
                       [](void* old) { cudaFreeHost(old); }};
  std::deque<StagedCall> stagedCalls;

  // The proxy: its communicator (a split of comm), thread and queue.
  std::unique_ptr<Communicator> proxyComm;
  std::thread proxy;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<const StagedCall*> queue;
  bool stopping = false;

  // Staged calls posted by stream memory operations instead of host functions and wait kernels
  // (CHORUS_DEVICE_STAGED_POST=value; calls being captured keep the host functions): the stream
  // writes the call's number into postedWord once its input is copied out, and waits until the
  // proxy writes it into doneValueWord. Numbers run 1, 2, ... and compare cyclically (32 bits).
  // valuePending (under mutex): the numbered calls, in order, that the proxy has yet to run.
  bool postByValue = false;
  bool byValue = false;  // the call being enqueued posts by value
  using StreamValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  StreamValueFn writeValue = nullptr;
  StreamValueFn waitValue = nullptr;
  volatile uint32_t* postedWord = nullptr;
  volatile uint32_t* doneValueWord = nullptr;
  CUdeviceptr postedDevice = 0;
  CUdeviceptr doneValueDevice = 0;
  std::atomic<uint32_t> valuePosted{0};  // numbers given out (abort reads it)
  uint32_t valueWaited = 0;              // numbers waited for
  std::deque<std::pair<const StagedCall*, uint32_t>> valuePending;
  std::string proxyFailure;  // under mutex
  chorusResult_t proxyResult = chorusSuccess;

  explicit Impl(Communicator& c) : comm(c), rank(c.rank()), nranks(c.nranks()) {}

  void setUp();
  bool setUpIpc();
  bool setUpDirect(bool oneGpu);
  void closeDirect();
  bool directServes(const DeviceCall& call, cudaStream_t stream) const;
  bool enqueueDirect(const DeviceCall& call, cudaStream_t stream);
  bool enqueuePublished(const DeviceCall& call, cudaStream_t stream);
  void directPiece(const DeviceCall& call, size_t first, size_t m, cudaStream_t stream);
  void hostBarrier();
  uint32_t* flagWord(int flag, int q, int p) const { return flags + flagIndex(flag, q, p); }
  void streamWrite(cudaStream_t stream, CUdeviceptr address, uint32_t value, const char* path);
  void streamWait(cudaStream_t stream, CUdeviceptr address, uint32_t value, const char* path);
  void signal(DirectFlag flag, int q, uint32_t value, cudaStream_t stream);
  void awaitPeers(DirectFlag flag, int q, uint32_t value, cudaStream_t stream, int onlyPeer = -1);
  void watchLoop();
  void lookAtWaits(bool answeredOnly = false);
  bool setUpFlags(const std::vector<DirectInfo>& all);
  bool inPlaceServes(const DeviceCall& call) const;
  bool enqueueInPlace(const DeviceCall& call, cudaStream_t stream);
  void layRing(const std::vector<IpcInfo>& all);
  void closeIpc();
  void order(cudaStream_t stream);
  void finish(cudaStream_t stream);
  bool ringServes(const DeviceCall& call, cudaStream_t stream) const;
  bool enqueueRing(const DeviceCall& call, cudaStream_t stream);
  bool stagedServes(const DeviceCall& call, cudaStream_t stream) const;
  bool enqueueStaged(const DeviceCall& call, cudaStream_t stream);
  void enqueueStagedGroup(const std::vector<DeviceCall>& calls, cudaStream_t stream);
  const StagedCall* stagedGroup(const std::vector<DeviceCall>& calls);
  const StagedCall* stagedCall(const DeviceCall& call, const void* input, void* output);
  void post(const StagedCall* staged, cudaStream_t stream);
  void waitForProxy(cudaStream_t stream);
  void proxyLoop();
  bool awaitPosted(uint32_t number);
  bool loadStreamValues();
  void setUpValuePost();
  void failAsync(chorusResult_t code, const std::string& message);
  bool capturing(cudaStream_t stream) const;
  static void CUDART_CB hostPost(void* data);
};

void DeviceEngine::Impl::setUp() {
  RelaxedCapture relaxed;  // the first call may come while a stream of this thread is being captured
  check(cudaGetDevice(&device), rank, "cudaGetDevice");
  check(cudaStreamCreateWithFlags(&setupStream, cudaStreamNonBlocking), rank, "cudaStreamCreate (setup)");
  // Every kernel this engine may launch, loaded now: CUDA loads a kernel at its first launch
  // otherwise, and loading may wait for the whole device, so a later call enqueued behind a
  // blocked stream would wait with it.
  if (const int error = ipc::preload(); error != 0) {
    check(static_cast<cudaError_t>(error), rank, "loading the ipc kernels");
  }
  if (const int error = kernels::cuda::preloadReduceMany(); error != 0) {
    check(static_cast<cudaError_t>(error), rank, "loading the reduction kernels");
  }
  llBytes = static_cast<size_t>(knobInt(Knob::kDeviceLlBytes));
  channels = static_cast<int>(std::clamp<int64_t>(knobInt(Knob::kDeviceChannels), 1, ipc::kMaxChannels));
  threads = static_cast<int>(std::clamp<int64_t>(knobInt(Knob::kDeviceThreads), 32, 1024) / 32 * 32);
  stageBytes = std::max<size_t>(static_cast<size_t>(knobInt(Knob::kDeviceStageBytes)), 4096);
  timeoutNs = static_cast<uint64_t>(comm.settings().timeoutMs) * 1000000ull;

  check(cudaHostAlloc(&pinned, 4096, cudaHostAllocMapped | cudaHostAllocPortable), rank, "cudaHostAlloc (control)");
  std::memset(pinned, 0, 4096);
  control = static_cast<ipc::Control*>(pinned);
  done = reinterpret_cast<volatile uint64_t*>(static_cast<char*>(pinned) + 256);
  void* devicePinned = nullptr;
  check(cudaHostGetDevicePointer(&devicePinned, pinned, 0), rank, "cudaHostGetDevicePointer");
  controlDevice = static_cast<ipc::Control*>(devicePinned);
  doneDevice = reinterpret_cast<const volatile uint64_t*>(static_cast<char*>(devicePinned) + 256);
  postedWord = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(pinned) + 512);
  doneValueWord = reinterpret_cast<volatile uint32_t*>(static_cast<char*>(pinned) + 576);
  postedDevice = reinterpret_cast<CUdeviceptr>(static_cast<char*>(devicePinned) + 512);
  doneValueDevice = reinterpret_cast<CUdeviceptr>(static_cast<char*>(devicePinned) + 576);
  loadStreamValues();
  setUpValuePost();
  check(cudaMalloc(reinterpret_cast<void**>(&counters), sizeof(ipc::ChannelCounters) * ipc::kMaxChannels + 256), rank,
        "cudaMalloc (counters)");
  check(cudaMemsetAsync(counters, 0, sizeof(ipc::ChannelCounters) * ipc::kMaxChannels + 256, setupStream), rank,
        "cudaMemsetAsync (counters)");
  check(cudaStreamSynchronize(setupStream), rank, "cudaStreamSynchronize (setup)");
  waits =
      reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(counters) + sizeof(ipc::ChannelCounters) * ipc::kMaxChannels);
  check(cudaEventCreateWithFlags(&lastDone, cudaEventDisableTiming), rank, "cudaEventCreate");

  const std::string mode = knobString(Knob::kDeviceTransport);
  if (mode != "auto" && mode != "direct" && mode != "ipc" && mode != "staged") {
    fail(chorusInvalidArgument, "rank {}: {}={}: expected auto, direct, ipc or staged", rank,
         knobName(Knob::kDeviceTransport), mode);
  }
  directBytes = std::max<size_t>(static_cast<size_t>(knobInt(Knob::kDeviceDirectBytes)), 4096) / 256 * 256;
  nextRank = (rank + 1) % nranks;
  prevRank = (rank + nranks - 1) % nranks;
  bool oneGpu = false;
  if (mode != "staged") oneGpu = setUpIpc();
  if (mode == "ipc" && !ipc) {
    fail(chorusInvalidUsage, "rank {}: {}=ipc, but {}", rank, knobName(Knob::kDeviceTransport),
         comm.singleHost() ? "a rank could not map its neighbours' GPU memory (CUDA IPC)" : "the ranks span hosts");
  }
  if (mode == "auto" || mode == "direct") direct = setUpDirect(oneGpu);
  if (mode == "direct" && !direct) {
    fail(chorusInvalidUsage, "rank {}: {}=direct, but {}", rank, knobName(Knob::kDeviceTransport),
         !oneGpu ? "the ranks do not all share one GPU"
         : writeValue == nullptr
             ? "this CUDA driver has no stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32)"
             : "a rank could not share its buffers (CUDA IPC) or map the flags page with the others");
  }
  // The proxy's own communicator: it runs calls while the caller's thread keeps using comm.
  CommSettings settings = comm.settings();
  proxyComm = comm.split(0, rank, settings);
  proxy = std::thread([this] { proxyLoop(); });
  const char* path = direct ? "direct" : (ipc ? "ipc" : "staged");
  logAt(LogLevel::kInfo, "rank {}: device path {} on GPU {} ({} channels of {} threads, LL up to {} bytes)", rank, path,
        device, channels, threads, llBytes);
}

// Every rank makes its inbox and a handle to it; all on one host, each maps its ring neighbours'.
// The ranks agree: ipc only if every rank could. Returns whether every rank is on this rank's GPU.
bool DeviceEngine::Impl::setUpIpc() {
  IpcInfo mine{};
  const size_t inboxBytes = sizeof(ipc::ChannelInbox) * ipc::kMaxChannels;
  if (cudaMalloc(reinterpret_cast<void**>(&inbox), inboxBytes) == cudaSuccess &&
      cudaMemsetAsync(inbox, 0, inboxBytes, setupStream) == cudaSuccess &&
      cudaStreamSynchronize(setupStream) == cudaSuccess && cudaIpcGetMemHandle(&mine.inbox, inbox) == cudaSuccess &&
      cudaDeviceGetPCIBusId(mine.busId, sizeof(mine.busId), device) == cudaSuccess) {
    mine.ok = 1;
  }
  cudaGetLastError();  // a failure above is answered by mine.ok
  std::vector<IpcInfo> all(nranks);
  comm.run({comm.prepare(Collective::kAllGather, &mine, all.data(), sizeof(IpcInfo), chorusUint8, chorusSum, 0)});
  bool everyone = comm.singleHost();
  for (const auto& info : all) everyone = everyone && info.ok != 0;
  int32_t mapped = 0;
  if (everyone) layRing(all);
  if (everyone) {
    mapped = 1;
    const int next = nextRank;
    const int prev = prevRank;
    auto open = [&](int peer) -> ipc::ChannelInbox* {
      if (peer == rank) return inbox;
      int peerDevice = -1;
      if (cudaDeviceGetByPCIBusId(&peerDevice, all[peer].busId) != cudaSuccess) return nullptr;
      if (peerDevice != device) {
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, device, peerDevice) != cudaSuccess || can == 0) return nullptr;
      }
      void* p = nullptr;
      if (cudaIpcOpenMemHandle(&p, all[peer].inbox, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) return nullptr;
      opened.push_back(p);
      return static_cast<ipc::ChannelInbox*>(p);
    };
    nextInbox = open(next);
    prevInbox = next == prev ? nextInbox : open(prev);
    if (nextInbox == nullptr || prevInbox == nullptr) mapped = 0;
    cudaGetLastError();
  }
  std::vector<int32_t> agreed(nranks);
  comm.run({comm.prepare(Collective::kAllGather, &mapped, agreed.data(), 1, chorusInt32, chorusSum, 0)});
  ipc = std::all_of(agreed.begin(), agreed.end(), [](int32_t v) { return v != 0; });
  if (!ipc) closeIpc();
  bool oneGpu = comm.singleHost();
  for (const auto& info : all) oneGpu = oneGpu && std::strncmp(info.busId, all[rank].busId, sizeof info.busId) == 0;
  return oneGpu && all[rank].busId[0] != '\0';
}

// The direct path: every rank shares one GPU, and the driver has stream memory operations. Each
// rank makes its publishing buffers and maps the others'; rank 0 makes the flags page, which all
// map; the ranks agree, direct only if every rank could.
bool DeviceEngine::Impl::setUpDirect(bool oneGpu) {
  static std::atomic<uint64_t> pages{0};  // this process's flags pages, for unique names
  int32_t mine = 0;
  DirectInfo info{};
  if (oneGpu && nranks <= kMaxDirectRanks && writeValue != nullptr) {
    bool ok = cudaMalloc(reinterpret_cast<void**>(&directBuffer), directBytes * 2) == cudaSuccess &&
              cudaIpcGetMemHandle(&info.buffer, directBuffer) == cudaSuccess;
    if (ok && rank == 0) {
      std::snprintf(info.flagsName, sizeof(info.flagsName), "/chorus-direct-%d-%llu-%llx", static_cast<int>(getpid()),
                    static_cast<unsigned long long>(pages++),
                    static_cast<unsigned long long>(steadyNs() & 0xffffffffull));
      try {
        flagsPage = SharedSegment::create(info.flagsName, kFlagsBytes);
        flags = reinterpret_cast<uint32_t*>(flagsPage.base());
      } catch (const Error& e) {  // the ranks still meet below, and agree on another path
        logAt(LogLevel::kInfo, "rank 0: no direct device path: {}", e.what());
        ok = false;
      }
    }
    info.inPlaceBytes = static_cast<uint64_t>(std::max<int64_t>(knobInt(Knob::kDeviceDirectInPlaceBytes), 0));
    const std::string reducers = knobString(Knob::kDeviceDirectReducers);
    if (reducers != "all" && reducers != "one") {
      fail(chorusInvalidArgument, "rank {}: {}={}: expected all or one", rank, knobName(Knob::kDeviceDirectReducers),
           reducers);
    }
    info.oneReducer = reducers == "one" ? 1 : 0;
    info.pid = static_cast<int32_t>(getpid());
    info.pidNamespace = pidNamespace();
    info.ok = ok ? 1 : 0;
    cudaGetLastError();
  }
  // Every rank takes part in the exchanges, whatever it found (they are collective).
  std::vector<DirectInfo> all(nranks);
  comm.run({comm.prepare(Collective::kAllGather, &info, all.data(), sizeof(DirectInfo), chorusUint8, chorusSum, 0)});
  bool everyone = true;
  for (const auto& i : all) everyone = everyone && i.ok != 0;
  if (everyone) {
    peerDirect.assign(nranks, nullptr);
    mappings.reset(rank, nranks);
    directInPlaceBytes = static_cast<size_t>(all[0].inPlaceBytes);
    for (const auto& i : all) directInPlaceBytes = std::min(directInPlaceBytes, static_cast<size_t>(i.inPlaceBytes));
    directOneReducer = all[0].oneReducer != 0;
    mine = setUpFlags(all) ? 1 : 0;
    for (int p = 0; p < nranks && mine != 0; ++p) {
      if (p == rank) {
        peerDirect[p] = directBuffer;
        continue;
      }
      void* mapped = nullptr;
      if (cudaIpcOpenMemHandle(&mapped, all[p].buffer, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
        mine = 0;
        break;
      }
      peerDirect[p] = static_cast<char*>(mapped);
    }
    cudaGetLastError();
  }
  std::vector<int32_t> agreed(nranks);
  comm.run({comm.prepare(Collective::kAllGather, &mine, agreed.data(), 1, chorusInt32, chorusSum, 0)});
  flagsPage.unlink();  // every rank has mapped the page, or given up: its name may go (rank 0's)
  const bool ok = std::all_of(agreed.begin(), agreed.end(), [](int32_t v) { return v != 0; });
  if (!ok) {
    closeDirect();
    return false;
  }
  watcher = std::thread([this] { watchLoop(); });
  return true;
}

// Maps rank 0's flags page (rank 0 made it), registers it with CUDA, checks that a stream can
// write and wait on it, and opens a pidfd for each peer in this pid namespace.
bool DeviceEngine::Impl::setUpFlags(const std::vector<DirectInfo>& all) {
  if (rank != 0) {
    try {
      flagsPage = SharedSegment::open(all[0].flagsName, kFlagsBytes);
    } catch (const Error& e) {
      logAt(LogLevel::kInfo, "rank {}: no direct device path: {}", rank, e.what());
      return false;
    }
    flags = reinterpret_cast<uint32_t*>(flagsPage.base());
  }
  if (cudaHostRegister(flags, kFlagsBytes, cudaHostRegisterPortable | cudaHostRegisterMapped) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  flagsRegistered = true;
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, flags, 0) != cudaSuccess) return false;
  flagsDevice = reinterpret_cast<CUdeviceptr>(device);
  // A stream writes and waits on this rank's failed word (0: it is 0 and stays so).
  const CUdeviceptr probe = flagsDevice + (kFailedWord + rank) * sizeof(uint32_t);
  const auto s = reinterpret_cast<CUstream>(setupStream);
  if (writeValue(s, probe, 0, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS ||
      waitValue(s, probe, 0, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS ||
      cudaStreamSynchronize(setupStream) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  peerPid.assign(nranks, 0);
  peerPidfd.assign(nranks, -1);
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || all[p].pidNamespace == 0 || all[p].pidNamespace != all[rank].pidNamespace) continue;
    peerPid[p] = all[p].pid;
    peerPidfd[p] = pidfdOpen(all[p].pid);
  }
  return true;
}

void DeviceEngine::Impl::closeDirect() {
  if (watcher.joinable()) {
    {
      std::lock_guard<std::mutex> lock(watchMutex);
      watchStopping = true;
    }
    watchWake.notify_all();
    watcher.join();
  }
  for (int p = 0; p < static_cast<int>(peerDirect.size()); ++p) {
    if (p != rank && peerDirect[p] != nullptr) cudaIpcCloseMemHandle(peerDirect[p]);
  }
  peerDirect.clear();
  mappings.reset(rank, 0);
  for (int fd : peerPidfd) {
    if (fd >= 0) ::close(fd);
  }
  peerPidfd.clear();
  peerPid.clear();
  if (flagsRegistered) cudaHostUnregister(flags);
  flagsRegistered = false;
  flagsPage = SharedSegment();
  flags = nullptr;
  if (directBuffer != nullptr) cudaFree(directBuffer);
  directBuffer = nullptr;
  cudaGetLastError();
}

// The direct path serves where it was set up, out of graph capture (its order across processes is
// set when each call is enqueued, which a replay would not repeat), and not compressed all-reduces
// (their compressors work on the host: staging serves them).
bool DeviceEngine::Impl::directServes(const DeviceCall& call, cudaStream_t stream) const {
  if (!direct || call.compressor != nullptr) return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), rank, "cudaStreamIsCapturing");
  return capturing == cudaStreamCaptureStatusNone;
}

// The direct algorithm: large all-reduces in place where every rank's buffers can be mapped, the
// rest through the published buffers.
bool DeviceEngine::Impl::enqueueDirect(const DeviceCall& call, cudaStream_t stream) {
  if (inPlaceServes(call) && enqueueInPlace(call, stream)) return true;
  return enqueuePublished(call, stream);
}

// A call in pieces of at most directBytes of published input per rank.
bool DeviceEngine::Impl::enqueuePublished(const DeviceCall& call, cudaStream_t stream) {
  const size_t size = kernels::typeSize(call.type);
  const size_t per = std::max<size_t>(1, directBytes / (size * directBlocks(call, nranks)) / 16 * 16);
  for (size_t first = 0; first < call.count || first == 0; first += per) {
    directPiece(call, first, std::min(per, call.count - first), stream);
    if (call.count == 0) break;
  }
  return true;
}

// One piece: elements [first, first + m) of the call (of every block, for the collectives whose
// input is n blocks). On this rank's stream, with s = the piece's number and q = s % 2, its buffer:
//   1. wait until every peer has read this rank's buffer q (its read flag at the piece that last
//      published into q);
//   2. publish: copy the input's piece into buffer q; set the ready flag of q to s;
//   3. host barrier (a peer that died or never calls is heard of here, by the enqueueing thread);
//   4. wait for every peer's ready flag of q to reach s;
//   5. compute the output's piece from the published buffers (this rank's own too, so an in-place
//      call reads every input before any output is written);
//   6. set the read flag of q to s.
// A stream's write of a flag follows its copies and kernels before it (the stream memory
// operation's fence), and the waits compare numbers, so no wait can be answered by an older
// piece. No kernel waits on another process: the streams do.
void DeviceEngine::Impl::directPiece(const DeviceCall& call, size_t first, size_t m, cudaStream_t stream) {
  const size_t size = kernels::typeSize(call.type);
  const size_t n = static_cast<size_t>(nranks);
  const size_t blocks = directBlocks(call, nranks);
  const auto s = static_cast<uint32_t>(++directPieces);
  const int q = static_cast<int>(s % 2);
  const bool root = call.rootOrPeer == rank;
  const auto* in = static_cast<const char*>(call.input);
  auto* out = static_cast<char*>(call.output);
  char* mine = directBuffer + static_cast<size_t>(q) * directBytes;
  auto slot = [&](int p) { return peerDirect[p] + static_cast<size_t>(q) * directBytes; };
  if (lastPublished[q] != 0) awaitPeers(kRead, q, lastPublished[q], stream);
  lastPublished[q] = s;
  // Publish: only what the peers read (the root's input of a broadcast or scatter).
  const bool publishes = !collectives::traitsOf(call.collective).inputAtRootOnly || root;
  if (publishes && m > 0) {
    if (blocks == 1) {
      check(cudaMemcpyAsync(mine, in + first * size, m * size, cudaMemcpyDeviceToDevice, stream), rank,
            "cudaMemcpyAsync (direct publish)");
    } else if (call.count * size < (size_t{1} << 31)) {
      // n blocks of the call's count: the piece of each, packed (one strided copy).
      check(cudaMemcpy2DAsync(mine, m * size, in + first * size, call.count * size, m * size, n,
                              cudaMemcpyDeviceToDevice, stream),
            rank, "cudaMemcpy2DAsync (direct publish)");
    } else {  // a stride past what a strided copy takes: a copy per block
      for (size_t b = 0; b < n; ++b) {
        check(cudaMemcpyAsync(mine + b * m * size, in + (b * call.count + first) * size, m * size,
                              cudaMemcpyDeviceToDevice, stream),
              rank, "cudaMemcpyAsync (direct publish)");
      }
    }
  }
  signal(kReady, q, s, stream);
  hostBarrier();
  awaitPeers(kReady, q, s, stream);
  auto copy = [&](void* to, const void* from, size_t elements) {
    if (elements == 0 || to == from) return;
    check(cudaMemcpyAsync(to, from, elements * size, cudaMemcpyDeviceToDevice, stream), rank,
          "cudaMemcpyAsync (direct)");
  };
  auto reduceAll = [&](void* to, size_t offset) {
    std::vector<const void*> sources(n);
    for (int p = 0; p < nranks; ++p) sources[p] = slot(p) + offset * size;
    const int error = kernels::cuda::reduceMany(&to, 1, sources.data(), nranks, m, call.type, call.op, nranks,
                                                reinterpret_cast<void*>(stream));
    if (error != 0) check(static_cast<cudaError_t>(error), rank, "launching the direct reduction");
  };
  if (m > 0) {
    switch (call.collective) {
      case Collective::kAllReduce:
        reduceAll(out + first * size, 0);
        break;
      case Collective::kReduce:
        if (root) reduceAll(out + first * size, 0);
        break;
      case Collective::kReduceScatter:
        reduceAll(out + first * size, static_cast<size_t>(rank) * m);
        break;
      case Collective::kBroadcast:
        copy(out + first * size, slot(call.rootOrPeer), m);
        break;
      case Collective::kAllGather:
      case Collective::kGather:
        if (call.collective == Collective::kAllGather || root) {
          for (int p = 0; p < nranks; ++p) copy(out + (static_cast<size_t>(p) * call.count + first) * size, slot(p), m);
        }
        break;
      case Collective::kAllToAll:
        for (int p = 0; p < nranks; ++p) {
          copy(out + (static_cast<size_t>(p) * call.count + first) * size,
               slot(p) + static_cast<size_t>(rank) * m * size, m);
        }
        break;
      case Collective::kScatter:
        copy(out + first * size, slot(call.rootOrPeer) + static_cast<size_t>(rank) * m * size, m);
        break;
      default:
        break;
    }
  }
  signal(kRead, q, s, stream);
}

// The direct path's host barrier: every rank has enqueued the call up to here (a peer that died
// or never calls is heard of at once, or at the timeout).
void DeviceEngine::Impl::hostBarrier() {
  comm.run({comm.prepare(Collective::kBarrier, nullptr, nullptr, 0, chorusUint8, chorusSum, 0)});
}

// The stream memory operations as the paths use them: stream writes value to the word at address
// once its work before is done (with a fence), or waits until the word is at or past value
// (cyclically). `path` names the caller in the error.
void DeviceEngine::Impl::streamWrite(cudaStream_t stream, CUdeviceptr address, uint32_t value, const char* path) {
  const CUresult error = writeValue(reinterpret_cast<CUstream>(stream), address, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (error != CUDA_SUCCESS) {
    fail(chorusUnhandledCudaError, "rank {}: device path: cuStreamWriteValue32 ({}) failed ({})", rank, path,
         static_cast<int>(error));
  }
}
void DeviceEngine::Impl::streamWait(cudaStream_t stream, CUdeviceptr address, uint32_t value, const char* path) {
  const CUresult error = waitValue(reinterpret_cast<CUstream>(stream), address, value, CU_STREAM_WAIT_VALUE_GEQ);
  if (error != CUDA_SUCCESS) {
    fail(chorusUnhandledCudaError, "rank {}: device path: cuStreamWaitValue32 ({}) failed ({})", rank, path,
         static_cast<int>(error));
  }
}

// stream sets this rank's flag (flag, q) to value once its work before is done.
void DeviceEngine::Impl::signal(DirectFlag flag, int q, uint32_t value, cudaStream_t stream) {
  streamWrite(stream, flagsDevice + flagIndex(flag, q, rank) * 4, value, "direct");
  lastOwnFlag = flag;
  lastOwnQ = q;
  lastOwnValue = value;
}

// stream waits until every peer's flag (flag, q) (onlyPeer's alone, where given) reaches value;
// the watcher sees each wait answered, or fails the call and lets the stream go.
void DeviceEngine::Impl::awaitPeers(DirectFlag flag, int q, uint32_t value, cudaStream_t stream, int onlyPeer) {
  std::vector<FlagWait> added;
  for (int p = 0; p < nranks; ++p) {
    if (p == rank || (onlyPeer >= 0 && p != onlyPeer)) continue;
    streamWait(stream, flagsDevice + flagIndex(flag, q, p) * 4, value, "direct");
    added.push_back(FlagWait{p, flag, q, value, lastOwnFlag, lastOwnQ, lastOwnValue, 0});
  }
  bool idle;  // the watcher sleeps until told (it looks every millisecond while waits are left)
  {
    std::lock_guard<std::mutex> lock(watchMutex);
    idle = flagWaits.empty();
    flagWaits.insert(flagWaits.end(), added.begin(), added.end());
    ++waitBatches;
  }
  if (idle) watchWake.notify_one();
}

// Records the first failure of an enqueued call: chorusCommGetAsyncError reports it, and the
// communicator refuses calls from then on.
void DeviceEngine::Impl::failAsync(chorusResult_t code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex);
  if (proxyResult != chorusSuccess) return;
  proxyResult = code;
  proxyFailure = message;
}

// One look at the waits of this rank's streams on the peers' flags (watchMutex held; answeredOnly:
// only the first of what follows, for chorusCommGetAsyncError, which the watcher's loop need not
// have looked for yet). A wait is
// answered when its flag reaches its number; it then fails the call where the peer's failed word
// is set (that peer's stream went on after a failure). A peer whose process exited, a wait that
// has lasted past the timeout since the stream reached it, or an abort fails the call: this
// rank's failed word is set (so the peers that take from its stream learn it), and the flags the
// stream waits for are written to their numbers, again at every look until the stream is past its
// last call (a live peer's stream may write an older number over one), so that it goes on.
void DeviceEngine::Impl::lookAtWaits(bool answeredOnly) {
  const int64_t now = steadyNs();
  auto word = [&](int flag, int q, int p) {
    return std::atomic_ref<uint32_t>(*flagWord(flag, q, p)).load(std::memory_order_acquire);
  };
  auto peerFailed = [&](int p) {
    return std::atomic_ref<uint32_t>(flags[kFailedWord + p]).load(std::memory_order_acquire) != 0;
  };
  std::vector<int8_t> exited(nranks, -1);  // asked once a look: -1 not yet, 0 alive, 1 exited
  auto hasExited = [&](int p) {
    if (exited[p] < 0) exited[p] = peerPid[p] > 0 && processExited(peerPidfd[p], peerPid[p]) ? 1 : 0;
    return exited[p] == 1;
  };
  std::string failure;
  chorusResult_t code = chorusSuccess;
  for (auto it = flagWaits.begin(); it != flagWaits.end();) {
    if (reached(word(it->flag, it->q, it->peer), it->value)) {
      if (!watchFailed && code == chorusSuccess && peerFailed(it->peer)) {
        code = chorusRemoteError;
        failure = fmt::format(
            "rank {}: a device call on the direct path took what rank {}'s stream wrote after its own device call "
            "failed",
            rank, it->peer);
      }
      it = flagWaits.erase(it);
      watchProgressNs = now;
      continue;
    }
    if (it->arrivedNs == 0 &&
        (it->arrivalFlag < 0 || reached(word(it->arrivalFlag, it->arrivalQ, rank), it->arrivalValue))) {
      it->arrivedNs = now;
    }
    if (!watchFailed && code == chorusSuccess && !answeredOnly) {
      const int p = it->peer;
      if (hasExited(p)) {
        code = chorusRemoteError;
        failure = fmt::format(
            "rank {}: a device call on the direct path waited for rank {}, whose process exited before its stream "
            "could {}",
            rank, p, flagDoing(it->flag));
      } else if (it->arrivedNs != 0 &&
                 now - std::max(it->arrivedNs, watchProgressNs) > static_cast<int64_t>(timeoutNs)) {
        code = chorusTimeout;
        failure = fmt::format(
            "rank {}: a device call on the direct path timed out after {} ms waiting for rank {}'s stream to {}", rank,
            timeoutNs / 1000000, p, flagDoing(it->flag));
      }
    }
    ++it;
  }
  if (!watchFailed && code == chorusSuccess && !answeredOnly && !flagWaits.empty() &&
      std::atomic_ref<uint32_t>(control->abort).load() != 0) {
    code = chorusAborted;
    failure = fmt::format("rank {}: a device call was aborted", rank);
  }
  if (!watchFailed && code != chorusSuccess) {
    watchFailed = true;
    std::atomic_ref<uint32_t>(flags[kFailedWord + rank]).store(1, std::memory_order_release);
    failAsync(code, failure);
    logAt(LogLevel::kWarn, "{}", failure);
  }
  if (watchFailed) {
    released.insert(released.end(), flagWaits.begin(), flagWaits.end());
    flagWaits.clear();
    for (const FlagWait& w : released) {
      uint32_t& at = *flagWord(w.flag, w.q, w.peer);
      if (!reached(std::atomic_ref<uint32_t>(at).load(std::memory_order_acquire), w.value)) {
        std::atomic_ref<uint32_t>(at).store(w.value, std::memory_order_release);
      }
    }
    // Past its last call (no call is enqueued after a failure), the stream waits for nothing; a
    // call that registered waits but has not recorded lastDone yet is not past.
    if (!released.empty() && waitBatchesRecorded == waitBatches && cudaEventQuery(lastDone) == cudaSuccess) {
      released.clear();
    }
    cudaGetLastError();
  }
}

// The watcher's loop: a look every millisecond while this rank's streams wait on peers' flags.
void DeviceEngine::Impl::watchLoop() {
  std::unique_lock<std::mutex> lock(watchMutex);
  for (;;) {
    if (flagWaits.empty() && released.empty()) {
      watchWake.wait(lock, [&] { return watchStopping || !flagWaits.empty(); });
    }
    if (watchStopping) return;
    lookAtWaits();
    watchWake.wait_for(lock, std::chrono::milliseconds(1), [&] { return watchStopping; });
  }
}

// Whether an all-reduce goes in place: large enough (every rank decides alike: the count, type and
// threshold agree) and with a block per rank.
bool DeviceEngine::Impl::inPlaceServes(const DeviceCall& call) const {
  return call.collective == Collective::kAllReduce && directInPlaceBytes > 0 &&
         call.count * kernels::typeSize(call.type) >= directInPlaceBytes && call.count >= static_cast<size_t>(nranks);
}

// An all-reduce that reads and writes the ranks' buffers where they lie (no published copy).
// With every rank reducing (directOneReducer false), block b of the count is rank b's. On this
// rank's stream, with s = the call's number and q = s % 2:
//   1. set the ready flag of q to s: the input is final, and the output free to write, once the
//      stream gets here;
//   2. host: every rank says where its input and output lie (an all-gather); if one cannot share
//      them, all publish instead;
//   3. wait for every peer's ready flag of q to reach s; reduce block r (this rank's) of every
//      input into block r of every output, in one kernel; set the read flag of q to s;
//   4. host barrier; wait for every peer's read flag of q to reach s: every block of this rank's
//      output is final, and no peer reads this rank's input any more, so what follows on its
//      stream may touch them.
// Every input byte is read once and every output byte written once over the ranks together (the
// bound of an all-reduce on one GPU), with two waits across processes per call. In place (output ==
// input), a thread reads element i of every input before it writes element i of any output, and
// ranks touch disjoint blocks, so no block is written before every rank has read it.
//
// With one reducer, rank 0 does step 3 for the whole count and every rank's output, and then
// waits for nothing: its kernel was the last to read its input and the only one to write the
// outputs. The others skip step 3 and in step 4 wait for rank 0's read flag alone. The same bytes
// move, in one kernel of one process, and each rank waits on another process once per call, not
// twice: without MPS, where the ranks take turns on the GPU, a wait on another process costs a
// turn.
bool DeviceEngine::Impl::enqueueInPlace(const DeviceCall& call, cudaStream_t stream) {
  const size_t size = kernels::typeSize(call.type);
  const size_t n = static_cast<size_t>(nranks);
  InPlaceInfo mine{};
  mine.ok = mappings.expose(call.input, &mine.input) && mappings.expose(call.output, &mine.output) ? 1 : 0;
  std::vector<InPlaceInfo> all(n);
  comm.run({comm.prepare(Collective::kAllGather, &mine, all.data(), sizeof(InPlaceInfo), chorusUint8, chorusSum, 0)});
  for (const InPlaceInfo& info : all) {
    if (info.ok == 0) return false;
  }
  const auto s = static_cast<uint32_t>(++directPieces);
  const int q = static_cast<int>(s % 2);
  signal(kReady, q, s, stream);
  const bool reduces = !directOneReducer || rank == 0;
  if (reduces) {
    // This rank's block of every input and output (the whole count for the one reducer): blocks
    // start on 16-byte boundaries of the buffers, so the reduction's vector loads apply.
    const collectives::Slice block = directOneReducer ? collectives::Slice{0, call.count}
                                                      : collectives::alignedSlice(call.count, nranks, rank, size, 16);
    const size_t first = block.begin;
    const size_t length = block.end - block.begin;
    std::vector<const void*> inputs(n);
    std::vector<void*> outputs(n);
    for (int p = 0; p < nranks; ++p) {
      // A peer's allocation mapped before and since freed was last read here before step 4 of the
      // call that read it, which the peer's stream waited for before it could free it.
      const char* in = p == rank ? static_cast<const char*>(call.input) : mappings.map(p, all[p].input);
      char* out = p == rank ? static_cast<char*>(call.output) : mappings.map(p, all[p].output);
      inputs[p] = in + first * size;
      outputs[p] = out + first * size;
    }
    awaitPeers(kReady, q, s, stream);
    if (length > 0) {
      const int error = kernels::cuda::reduceMany(outputs.data(), nranks, inputs.data(), nranks, length, call.type,
                                                  call.op, nranks, reinterpret_cast<void*>(stream));
      if (error != 0) check(static_cast<cudaError_t>(error), rank, "launching the direct reduction");
    }
    signal(kRead, q, s, stream);
  }
  hostBarrier();
  if (!directOneReducer) {
    awaitPeers(kRead, q, s, stream);
  } else if (rank != 0) {
    awaitPeers(kRead, q, s, stream, 0);
  }
  return true;
}

// The ring over the GPUs: rank 0 searches it on this host's topology (NVLink before PCIe) from
// every rank's bus id, and sends it to all; rank order where the search cannot place a GPU.
void DeviceEngine::Impl::layRing(const std::vector<IpcInfo>& all) {
  std::vector<int32_t> order(nranks);
  std::iota(order.begin(), order.end(), 0);
  if (rank == 0 && nranks > 2) {
    std::vector<std::string> busIds;
    for (const IpcInfo& info : all) busIds.emplace_back(info.busId);
    try {
      const std::vector<int> searched = topology::gpuRingOrder(thisHostTopology(), busIds);
      std::copy(searched.begin(), searched.end(), order.begin());
    } catch (const std::invalid_argument& e) {
      logAt(LogLevel::kInfo, "rank 0: device ring in rank order ({})", e.what());
    }
  }
  comm.run({comm.prepare(Collective::kBroadcast, order.data(), order.data(), order.size(), chorusInt32, chorusSum, 0)});
  ringOrder.assign(order.begin(), order.end());
  positionOf.assign(nranks, 0);
  for (int p = 0; p < nranks; ++p) positionOf[ringOrder[p]] = p;
  const int position = positionOf[rank];
  nextRank = ringOrder[(position + 1) % nranks];
  prevRank = ringOrder[(position + nranks - 1) % nranks];
  bool byNumber = true;
  for (int p = 0; p < nranks; ++p) byNumber = byNumber && ringOrder[p] == p;
  if (!byNumber) {
    check(cudaMalloc(reinterpret_cast<void**>(&rankAtDevice), sizeof(int) * nranks), rank, "cudaMalloc (ring order)");
    check(cudaMemcpyAsync(rankAtDevice, ringOrder.data(), sizeof(int) * nranks, cudaMemcpyHostToDevice, setupStream),
          rank, "cudaMemcpyAsync (ring order)");
    check(cudaStreamSynchronize(setupStream), rank, "cudaStreamSynchronize (ring order)");
    if (rank == 0) logAt(LogLevel::kInfo, "rank 0: device ring {}", fmt::join(ringOrder, " "));
  }
}

void DeviceEngine::Impl::closeIpc() {
  for (void* p : opened) cudaIpcCloseMemHandle(p);
  opened.clear();
  nextInbox = prevInbox = nullptr;
}

// Calls of this communicator run one after another whatever streams they come on: each waits for
// the previous call's stream, since they share the inboxes, counters and staging.
void DeviceEngine::Impl::order(cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), rank, "cudaStreamIsCapturing");
  if (anyCall && stream != lastStream && capturing == cudaStreamCaptureStatusNone) {
    check(cudaStreamWaitEvent(stream, lastDone, 0), rank, "cudaStreamWaitEvent");
  }
}

// A call being captured into a graph runs only when the graph is launched: it leaves the order
// of direct calls as it was.
void DeviceEngine::Impl::finish(cudaStream_t stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), rank, "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return;
  check(cudaEventRecord(lastDone, stream), rank, "cudaEventRecord");
  lastStream = stream;
  anyCall = true;
  std::lock_guard<std::mutex> lock(watchMutex);
  waitBatchesRecorded = waitBatches;
}

// The ring serves where every rank mapped its neighbours' inboxes (the table says which collectives
// it takes; ringKind's check only keeps a row the kernel lacks from reaching it), but not the
// reductions of a deterministic communicator: it reduces on the way, in an order that depends on
// where each block starts (the direct path and the staged one's host schedules fold in rank order).
bool DeviceEngine::Impl::ringServes(const DeviceCall& call, cudaStream_t) const {
  return ipc && call.compressor == nullptr && ringKind(call.collective) >= 0 &&
         !(collectives::traitsOf(call.collective).reduces && comm.settings().deterministic);
}

bool DeviceEngine::Impl::enqueueRing(const DeviceCall& call, cudaStream_t stream) {
  const size_t bytes = call.count * kernels::typeSize(call.type);
  const bool ll = bytes <= llBytes;
  ipc::RingArgs args{};
  args.kind = static_cast<ipc::Kind>(ringKind(call.collective));
  args.input = call.input;
  args.output = call.output;
  args.count = call.count;
  args.rank = positionOf[rank];
  args.nranks = nranks;
  args.root = positionOf[call.rootOrPeer];
  // Small calls: one channel per 8 KiB, up to the bulk count.
  args.channels = ll ? static_cast<int>(std::clamp<size_t>(bytes / 8192, 1, static_cast<size_t>(channels))) : channels;
  args.average = call.op == chorusAvg;
  args.own = inbox;
  args.next = nextInbox;
  args.prev = prevInbox;
  args.counters = counters;
  args.control = controlDevice;
  args.timeoutNs = timeoutNs;
  args.rankAt = rankAtDevice;
  const int error = ipc::launchRing(args, call.type, call.op, ll, threads, stream);
  if (error != 0) check(static_cast<cudaError_t>(error), rank, "launching the ring kernel");
  return true;
}

const StagedCall* DeviceEngine::Impl::stagedCall(const DeviceCall& call, const void* input, void* output) {
  StagedCall want;
  want.engine = this;
  want.call = call;
  want.call.input = input;
  want.call.output = output;
  if (call.vector != nullptr) {
    for (int k = 0; k < 4; ++k) want.vectorData.insert(want.vectorData.end(), call.vector[k], call.vector[k] + nranks);
  }
  for (const auto& s : stagedCalls) {
    if (s.call.collective == want.call.collective && s.call.input == input && s.call.output == output &&
        s.call.count == call.count && s.call.type == call.type && s.call.op == call.op &&
        s.call.rootOrPeer == call.rootOrPeer && s.call.compressor == call.compressor &&
        s.vectorData == want.vectorData) {
      return &s;
    }
  }
  stagedCalls.push_back(std::move(want));
  StagedCall& kept = stagedCalls.back();
  if (!kept.vectorData.empty()) {
    for (int k = 0; k < 4; ++k) kept.vector[k] = kept.vectorData.data() + static_cast<size_t>(k) * nranks;
    kept.call.vector = kept.vector;
  }
  return &kept;
}

// The kept StagedCall of a group whose buffers are already the staging areas'.
const StagedCall* DeviceEngine::Impl::stagedGroup(const std::vector<DeviceCall>& calls) {
  auto same = [](const DeviceCall& a, const DeviceCall& b) {
    return a.collective == b.collective && a.input == b.input && a.output == b.output && a.count == b.count &&
           a.type == b.type && a.rootOrPeer == b.rootOrPeer;
  };
  for (const auto& s : stagedCalls) {
    if (s.group.size() == calls.size() && std::equal(calls.begin(), calls.end(), s.group.begin(), same)) return &s;
  }
  StagedCall kept;
  kept.engine = this;
  kept.group = calls;
  stagedCalls.push_back(std::move(kept));
  return &stagedCalls.back();
}

void CUDART_CB DeviceEngine::Impl::hostPost(void* data) {
  const auto* staged = static_cast<const StagedCall*>(data);
  Impl* self = staged->engine;
  {
    std::lock_guard<std::mutex> lock(self->mutex);
    self->queue.push_back(staged);
  }
  self->wake.notify_one();
}

// Holds the stream until the proxy has done the earliest call posted and not yet waited for (the
// one-thread wait kernel, or a stream wait on the call's number).
void DeviceEngine::Impl::waitForProxy(cudaStream_t stream) {
  if (byValue) {
    streamWait(stream, doneValueDevice, ++valueWaited, "staged");
    return;
  }
  const int error = ipc::launchWait(waits, doneDevice, controlDevice, stream);
  if (error != 0) check(static_cast<cudaError_t>(error), rank, "launching the wait kernel");
}

void DeviceEngine::Impl::post(const StagedCall* staged, cudaStream_t stream) {
  if (byValue) {
    const uint32_t number = ++valuePosted;
    {
      std::lock_guard<std::mutex> lock(mutex);
      valuePending.emplace_back(staged, number);
    }
    wake.notify_one();
    streamWrite(stream, postedDevice, number, "staged");
    return;
  }
  check(cudaLaunchHostFunc(stream, &Impl::hostPost, const_cast<StagedCall*>(staged)), rank, "cudaLaunchHostFunc");
}

bool DeviceEngine::Impl::capturing(cudaStream_t stream) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), rank, "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// The driver's stream memory operations (cuStreamWriteValue32, cuStreamWaitValue32), which the
// direct path orders its streams with and staged calls may be posted by: false where this driver
// lacks them.
bool DeviceEngine::Impl::loadStreamValues() {
  auto entry = [&](const char* name, StreamValueFn* fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      return false;
    }
    *fn = reinterpret_cast<StreamValueFn>(p);
    return true;
  };
  if (entry("cuStreamWriteValue32", &writeValue) && entry("cuStreamWaitValue32", &waitValue)) return true;
  writeValue = waitValue = nullptr;
  return false;
}

// CHORUS_DEVICE_STAGED_POST: host (host functions and a wait kernel) or value (stream memory
// operations; the default, measured faster for small calls on an H100, falls back to host where
// the driver lacks them).
void DeviceEngine::Impl::setUpValuePost() {
  const std::string mode = knobString(Knob::kDeviceStagedPost);
  if (mode != "host" && mode != "value") {
    fail(chorusInvalidArgument, "rank {}: {}={}: expected host or value", rank, knobName(Knob::kDeviceStagedPost),
         mode);
  }
  if (mode != "value") return;
  if (writeValue == nullptr) {
    // Asked for by name, their absence is an error; as the default, the host functions serve.
    if (knobSet(Knob::kDeviceStagedPost)) {
      fail(chorusInvalidUsage,
           "rank {}: {}=value, but this CUDA driver has no cuStreamWriteValue32 / "
           "cuStreamWaitValue32",
           rank, knobName(Knob::kDeviceStagedPost));
    }
    logAt(LogLevel::kInfo,
          "rank {}: this CUDA driver has no stream memory operations: staged device calls are posted by host "
          "functions",
          rank);
    return;
  }
  postByValue = true;
}

// Waits until the stream has posted call `number` (cyclically at or past it). False when a call
// posted by a host function arrives meanwhile: that one is earlier on the streams (a later one
// could not run before this call is done) and goes first. An abort ends the wait: the call then
// fails on the aborted communicator, and its stream is let go.
bool DeviceEngine::Impl::awaitPosted(uint32_t number) {
  for (unsigned spin = 0;; ++spin) {
    if (static_cast<int32_t>(
            std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(postedWord)).load(std::memory_order_acquire) - number) >=
        0) {
      return true;
    }
    if (std::atomic_ref<uint32_t>(control->abort).load() != 0) return true;
    if (spin % 64 == 63) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!queue.empty()) return false;
    }
    // Spin while the call is likely near (a small call's copy is microseconds), then nap.
    if (spin < 4096) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

// Staging serves every call.
bool DeviceEngine::Impl::stagedServes(const DeviceCall&, cudaStream_t) const { return true; }

bool DeviceEngine::Impl::enqueueStaged(const DeviceCall& call, cudaStream_t stream) {
  byValue = postByValue && !capturing(stream);
  const size_t size = kernels::typeSize(call.type);
  size_t inCount, outCount;
  extents(call, rank, nranks, &inCount, &outCount);
  // Staging is sized before anything is enqueued, so a refusal leaves the stream untouched.
  auto area = [&](int slot, int which) {
    return staging.area(static_cast<size_t>(slot) * 2 + static_cast<size_t>(which));
  };
  auto wait = [&] { waitForProxy(stream); };
  if (call.collective == Collective::kAllReduce && call.compressor == nullptr && call.count * size > stageBytes) {
    // In chunks through two slots: chunk c's copy in overlaps the proxy's work on chunk c - 1.
    staging.ensure(stageBytes);
    const size_t per = stageBytes / size;
    const size_t chunks = (call.count + per - 1) / per;
    auto chunkCall = [&](size_t c, int slot) {
      DeviceCall part = call;
      part.count = std::min(per, call.count - c * per);
      return stagedCall(part, area(slot, 0), area(slot, 1));
    };
    auto copyOut = [&](size_t c) {
      const int slot = static_cast<int>(c % 2);
      const size_t n = std::min(per, call.count - c * per);
      check(cudaMemcpyAsync(static_cast<char*>(call.output) + c * per * size, area(slot, 1), n * size,
                            cudaMemcpyHostToDevice, stream),
            rank, "cudaMemcpyAsync (staged result)");
    };
    for (size_t c = 0; c < chunks; ++c) {
      const int slot = static_cast<int>(c % 2);
      const size_t n = std::min(per, call.count - c * per);
      check(cudaMemcpyAsync(area(slot, 0), static_cast<const char*>(call.input) + c * per * size, n * size,
                            cudaMemcpyDeviceToHost, stream),
            rank, "cudaMemcpyAsync (staged input)");
      post(chunkCall(c, slot), stream);
      if (c > 0) {
        wait();
        copyOut(c - 1);
      }
    }
    wait();
    copyOut(chunks - 1);
    return true;
  }
  staging.ensure(std::max({inCount * size, outCount * size, size_t{64}}));
  if (inCount > 0) {
    check(cudaMemcpyAsync(area(0, 0), call.input, inCount * size, cudaMemcpyDeviceToHost, stream), rank,
          "cudaMemcpyAsync (staged input)");
  }
  post(stagedCall(call, area(0, 0), area(0, 1)), stream);
  wait();
  if (outCount > 0) {
    check(cudaMemcpyAsync(call.output, area(0, 1), outCount * size, cudaMemcpyHostToDevice, stream), rank,
          "cudaMemcpyAsync (staged result)");
  }
  return true;
}

void DeviceEngine::Impl::enqueueStagedGroup(const std::vector<DeviceCall>& calls, cudaStream_t stream) {
  byValue = postByValue && !capturing(stream);
  // Sends packed into the input area, receives into the output area, each 64-byte aligned.
  std::vector<size_t> offsets(calls.size());
  size_t sent = 0, received = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    size_t& end = calls[i].collective == Collective::kSend ? sent : received;
    offsets[i] = end;
    end += (calls[i].count * kernels::typeSize(calls[i].type) + 63) / 64 * 64;
  }
  staging.ensure(std::max({sent, received, size_t{64}}));  // before anything is enqueued
  char* in = staging.area(0);
  char* out = staging.area(1);
  std::vector<DeviceCall> staged = calls;
  for (size_t i = 0; i < calls.size(); ++i) {
    const size_t bytes = calls[i].count * kernels::typeSize(calls[i].type);
    if (calls[i].collective == Collective::kSend) {
      staged[i].input = in + offsets[i];
      if (bytes > 0) {
        check(cudaMemcpyAsync(in + offsets[i], calls[i].input, bytes, cudaMemcpyDeviceToHost, stream), rank,
              "cudaMemcpyAsync (staged send)");
      }
    } else {
      staged[i].output = out + offsets[i];
    }
  }
  post(stagedGroup(staged), stream);
  waitForProxy(stream);
  for (size_t i = 0; i < calls.size(); ++i) {
    const size_t bytes = calls[i].count * kernels::typeSize(calls[i].type);
    if (calls[i].collective == Collective::kRecv && bytes > 0) {
      check(cudaMemcpyAsync(calls[i].output, out + offsets[i], bytes, cudaMemcpyHostToDevice, stream), rank,
            "cudaMemcpyAsync (staged receive)");
    }
  }
}

void DeviceEngine::Impl::proxyLoop() {
  while (true) {
    const StagedCall* staged = nullptr;
    uint32_t number = 0;  // a call posted by value: its number
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [&] { return stopping || !queue.empty() || !valuePending.empty(); });
      if (!queue.empty()) {
        staged = queue.front();
        queue.pop_front();
      } else if (!valuePending.empty()) {
        std::tie(staged, number) = valuePending.front();
      } else {
        return;
      }
    }
    if (number != 0) {
      if (!awaitPosted(number)) continue;
      std::lock_guard<std::mutex> lock(mutex);
      valuePending.pop_front();
    }
    bool failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      failed = proxyResult != chorusSuccess;
    }
    if (!failed) {
      try {
        if (const DeviceCall& c = staged->call; staged->group.empty() && c.compressor != nullptr) {
          proxyComm->compressedAllReduce(*c.compressor, static_cast<const float*>(c.input),
                                         static_cast<float*>(c.output), c.count, c.op == chorusAvg);
        } else {
          std::vector<PreparedOp> ops;
          for (const DeviceCall& d : staged->group.empty() ? std::vector<DeviceCall>{c} : staged->group) {
            ops.push_back(
                proxyComm->prepare(d.collective, d.input, d.output, d.count, d.type, d.op, d.rootOrPeer, d.vector));
          }
          proxyComm->run(std::move(ops));
        }
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        proxyFailure = fmt::format("rank {}: a device call staged through the host failed: {}", rank, e.what());
        proxyResult = e.code();
        // The waiting kernels see a failure and let their streams go on.
        std::atomic_ref<uint32_t>(control->status).store(ipc::kStatusAborted);
      }
    }
    if (number != 0) {
      std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(doneValueWord)).store(number, std::memory_order_release);
    } else {
      std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(done)).fetch_add(1, std::memory_order_release);
    }
  }
}

namespace {

// How the engine runs each device algorithm of the algorithm table (src/collectives/
// device_algorithms.cc, which says which collectives each takes, in order of preference). Every
// rank answers serves() alike (from what the ranks agreed at set-up and the call's arguments);
// enqueue() returns false where the ranks found together at enqueue time that it cannot run the
// call, and the next is tried.
struct DeviceAlgorithm {
  collectives::Algorithm algorithm;
  bool (DeviceEngine::Impl::*serves)(const DeviceCall&, cudaStream_t) const;
  bool (DeviceEngine::Impl::*enqueue)(const DeviceCall&, cudaStream_t);
};
const DeviceAlgorithm kDeviceAlgorithms[] = {
    {collectives::Algorithm::kDirect, &DeviceEngine::Impl::directServes, &DeviceEngine::Impl::enqueueDirect},
    {collectives::Algorithm::kIpc, &DeviceEngine::Impl::ringServes, &DeviceEngine::Impl::enqueueRing},
    {collectives::Algorithm::kStaged, &DeviceEngine::Impl::stagedServes, &DeviceEngine::Impl::enqueueStaged},
};

// Whether the algorithm ran the call (enqueued it on the stream).
bool ranOn(DeviceEngine::Impl& m, collectives::Algorithm algorithm, const DeviceCall& call, cudaStream_t stream) {
  for (const DeviceAlgorithm& d : kDeviceAlgorithms) {
    if (d.algorithm == algorithm) return (m.*d.serves)(call, stream) && (m.*d.enqueue)(call, stream);
  }
  return false;
}

}  // namespace

DeviceEngine::DeviceEngine(Communicator& comm) : impl_(std::make_unique<Impl>(comm)) { impl_->setUp(); }

DeviceEngine::~DeviceEngine() {
  Impl& m = *impl_;
  // Calls in flight still reach the proxy's queue and the peers' inboxes: let them finish (their
  // waits are bounded by the timeout) before anything they use goes away.
  if (m.anyCall) cudaEventSynchronize(m.lastDone);
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.stopping = true;
  }
  m.wake.notify_all();
  if (m.proxy.joinable()) m.proxy.join();
  m.proxyComm.reset();
  m.closeIpc();
  m.closeDirect();
  if (m.lastDone != nullptr) cudaEventDestroy(m.lastDone);
  if (m.setupStream != nullptr) cudaStreamDestroy(m.setupStream);
  if (m.inbox != nullptr) cudaFree(m.inbox);
  if (m.counters != nullptr) cudaFree(m.counters);
  if (m.rankAtDevice != nullptr) cudaFree(m.rankAtDevice);
  if (m.pinned != nullptr) cudaFreeHost(m.pinned);
  cudaGetLastError();
}

// A new call may be enqueued: the communicator is neither aborted nor failed, no earlier device call
// failed, and the current device is the engine's.
void DeviceEngine::admit(const char* name) const {
  const Impl& m = *impl_;
  m.comm.checkUsable(name);  // before anything is enqueued: aborted, failed, or an earlier device call failed
  int current = -1;
  check(cudaGetDevice(&current), m.rank, "cudaGetDevice");
  if (current != m.device) {
    fail(chorusInvalidUsage,
         "rank {}: {}: the current device is GPU {}, but this communicator's device calls use GPU {}", m.rank, name,
         current, m.device);
  }
}

void DeviceEngine::enqueue(const DeviceCall& call, chorusStream_t stream, const char* name) {
  Impl& m = *impl_;
  admit(name);
  checkDeviceCall(call, m.rank, m.nranks, name);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  m.order(s);
  // The algorithm CHORUS_ALGO forces for the collective where it is a device one that serves the
  // call, else the table's first that does (staged serves every call).
  const collectives::Algorithm forced = m.comm.forcedAlgorithm(call.collective);
  collectives::Algorithm ran = collectives::Algorithm::kDefault;
  try {
    if (collectives::runsOnDevice(forced, call.collective) && ranOn(m, forced, call, s)) ran = forced;
    for (collectives::Algorithm a : collectives::deviceAlgorithmsFor(call.collective)) {
      if (ran != collectives::Algorithm::kDefault) break;
      if (a != forced && ranOn(m, a, call, s)) ran = a;
    }
  } catch (const Error& e) {
    // What was enqueued before the failure (waits on peers' flags among it) is covered by lastDone
    // too, so the watcher knows when the stream is past it.
    try {
      m.finish(s);
    } catch (const Error&) {  // the enqueue's own failure is the one to report
    }
    // The direct path meets its peers on the host while it enqueues: say which call that was.
    fail(e.code(), "rank {}: {} of {} {} on device buffers: {}", m.rank, name, call.count, chorusTypeName(call.type),
         e.what());
  }
  if (ran == collectives::Algorithm::kDefault) {
    fail(chorusInternalError, "rank {}: {}: no device algorithm took the call", m.rank, name);
  }
  logAt(LogLevel::kTrace, "rank {}: {} (count {}) on the device: {}", m.rank, name, call.count,
        collectives::algorithmName(ran));
  m.finish(s);
}

void DeviceEngine::enqueueGroup(const std::vector<DeviceCall>& calls, chorusStream_t stream, const char* name) {
  Impl& m = *impl_;
  admit(name);
  for (const DeviceCall& call : calls) checkDeviceCall(call, m.rank, m.nranks, name);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  m.order(s);
  m.enqueueStagedGroup(calls, s);
  m.finish(s);
}

chorusResult_t DeviceEngine::asyncError(std::string* message) const {
  const Impl& m = *impl_;
  if (m.direct) {
    // A look now at the answered waits: what the caller's streams have run is seen (a wait
    // answered by a failed peer's stream) whether or not the watcher has looked since.
    Impl& w = *impl_;
    std::lock_guard<std::mutex> lock(w.watchMutex);
    w.lookAtWaits(true);
  }
  {
    std::lock_guard<std::mutex> lock(const_cast<Impl&>(m).mutex);
    if (m.proxyResult != chorusSuccess) {
      *message = m.proxyFailure;
      return m.proxyResult;
    }
  }
  const uint32_t status = std::atomic_ref<uint32_t>(m.control->status).load();
  if (status == ipc::kStatusOk) return chorusSuccess;
  const int peer = m.control->what == ipc::kWaitData ? m.prevRank : m.nextRank;
  if (status == ipc::kStatusAborted) {
    *message = fmt::format("rank {}: a device call was aborted", m.rank);
    return chorusAborted;
  }
  *message = fmt::format(
      "rank {}: a device call timed out after {} ms waiting for {} from rank {} (channel {}, message {} of that link)",
      m.rank, m.timeoutNs / 1000000, m.control->what == ipc::kWaitData ? "data" : "room to send", peer,
      m.control->channel, m.control->message);
  return chorusTimeout;
}

void DeviceEngine::abort() {
  std::atomic_ref<uint32_t>(impl_->control->abort).store(1);
  impl_->watchWake.notify_all();  // the direct path's waits go on (the watcher fails their calls)
  // Streams waiting on calls posted by value go on (the proxy fails what it has not run).
  std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(impl_->doneValueWord)).store(impl_->valuePosted.load());
  if (impl_->proxyComm != nullptr) impl_->proxyComm->abort();
}

Traffic DeviceEngine::traffic() const { return impl_->proxyComm != nullptr ? impl_->proxyComm->traffic() : Traffic{}; }

const char* DeviceEngine::path() const { return impl_->direct ? "direct" : impl_->ipc ? "ipc" : "staged"; }

}  // namespace chorus
