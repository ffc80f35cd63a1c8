// device.h: collectives on device (CUDA) buffers, in stream order. A communicator makes its
// DeviceEngine at its first call with a stream (every rank makes it in the same call, so its
// setup may talk to the peers), and from then on such calls are enqueued on the caller's stream
// and return without waiting:
//  - direct: every rank on one GPU (several ranks sharing a device). Each rank publishes its input
//    in a device buffer every peer maps with CUDA IPC; the ranks' streams are ordered by flags in
//    a page of host memory every rank maps (stream memory operations write and wait on them; a
//    watcher thread lets a stream go where its peer dies or times out), and each rank's own
//    kernels and copies read what it needs from the published buffers: no kernel waits on another
//    process, so ranks that take turns on the GPU (no MPS) pay no time slice per step. All-reduce,
//    reduce, reduce-scatter, broadcast, all-gather, gather, all-to-all, scatter; not in graph
//    capture (the order is set at enqueue time).
//  - ipc: every rank on one host, each inbox mapped by its ring neighbours with CUDA IPC: one
//    kernel launch per call (src/core/device_ring.h), for all-reduce, all-gather,
//    reduce-scatter, broadcast and reduce;
//  - staged: anything else (ranks on several hosts, the other collectives, send and receive, a
//    group's sends and receives, made together, and compressed all-reduces):
//    the stream copies the input to pinned host memory, a host function hands the call to the
//    engine's proxy thread, which runs it with the host transports on its own communicator, and
//    a one-thread kernel holds the stream until the proxy is done; then the stream copies the
//    result back. All-reduces go in chunks, so one chunk's copy overlaps the transfer of the
//    one before.
// The paths are the device algorithms of the one algorithm table (src/collectives/
// device_algorithms.cc: which collectives each takes, in this order of preference); device.cc
// runs them. A call goes to the algorithm CHORUS_ALGO forces for its collective where that one
// is set up and serves it, else to the first in the order above that does.
// ipc and staged are captured in CUDA graphs as they are: kernels, copies and host nodes, with flags and
// counters kept in device memory so each replay is a fresh call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/collectives/schedule.h"

namespace chorus {

class Communicator;
struct Traffic;
namespace collectives {
class CompressedAllReduce;
}

// One call on device buffers, its arguments already checked as for host buffers. count is as the
// C call's; rootOrPeer is the root or the peer; vector holds all-to-allv's counts; compressor,
// where set, makes an all-reduce (float32, sum or average) a compressed one.
struct DeviceCall {
  collectives::Collective collective;
  const void* input;
  void* output;
  size_t count;
  chorusDataType_t type;
  chorusRedOp_t op;
  int rootOrPeer;
  const size_t* const* vector = nullptr;
  collectives::CompressedAllReduce* compressor = nullptr;
};

class DeviceEngine {
 public:
  // Collective over every rank of comm (after checkDeviceCall passed on this rank); uses the
  // current device.
  explicit DeviceEngine(Communicator& comm);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // Enqueues the call on stream (a cudaStream_t) and returns; a compressed all-reduce
  // (call.compressor set) is staged, its compressor run by the proxy with the host transports
  // (and the proxy's until the stream has run the call). Throws as checkDeviceCall, and
  // chorusInvalidUsage when an earlier call failed or the current device is not the engine's.
  void enqueue(const DeviceCall& call, chorusStream_t stream, const char* name);
  // Enqueues a group's device sends and receives (kSend / kRecv calls) on stream, as one staged
  // step: every send's input goes to pinned memory, the proxy makes them all as one group with
  // the host transports, and every receive's output comes back. Throws as enqueue.
  void enqueueGroup(const std::vector<DeviceCall>& calls, chorusStream_t stream, const char* name);
  // chorusSuccess, or the first failure of an enqueued call (timeout, abort, a peer's failure),
  // with its message.
  chorusResult_t asyncError(std::string* message) const;
  // Raises the abort word: every waiting kernel and the proxy give up. Safe from any thread.
  void abort();
  // "direct", "ipc" or "staged", for logs and tests.
  const char* path() const;
  // What the staged calls' proxy has sent on its transports (the direct and ipc paths move bytes
  // within the GPUs' memory, on no link).
  Traffic traffic() const;

  struct Impl;  // device.cc

 private:
  void admit(const char* name) const;
  std::unique_ptr<Impl> impl_;
};

// Checks a device call before any rank's engine exists (making one is collective): CUDA has a
// device here, and the call's buffers are device memory of the current device. Throws
// chorusInvalidArgument naming what is wrong.
void checkDeviceCall(const DeviceCall& call, int rank, int nranks, const char* name);

// The calling thread's current CUDA device (-1 where CUDA has none), and making one current (a
// negative device: nothing changes). A group's device calls are enqueued on the device current
// when each was made.
int currentCudaDevice();
void useCudaDevice(int device);

// Whether p points into CUDA device memory (cudaMalloc, cudaMallocManaged, ...), asked of the
// CUDA driver once the program has loaded it; false until then, and for host memory.
bool isDeviceMemory(const void* p);

// The stream a call given a NULL stream runs on: NULL (host buffers), or CUDA's legacy default
// stream when one of its buffers is device memory, as NCCL takes NULL. Until the program loads
// the CUDA driver this costs one look at the loader's count of loaded objects.
chorusStream_t streamForNull(const void* input, const void* output);

}  // namespace chorus
