// cuda_ipc.cu: the cuda_ipc transport's wait kernel, and the ring launch that picks a protocol
// (each protocol's kernels are their own translation unit, cuda_ipc_ll.cu and cuda_ipc_bulk.cu,
// so the build compiles them in parallel).
#include <cuda_runtime.h>

#include "src/transport/cuda_ipc_device.cuh"

namespace chorus::ipc {
namespace {

__global__ void waitKernel(uint64_t* waits, const volatile uint64_t* done, Control* control, uint64_t timeoutNs) {
  const uint64_t target = ++*waits;
  const uint64_t deadline = DeviceSync::nowNs() + timeoutNs;
  for (unsigned spin = 0; *done < target; ++spin) {
    if (spin % kControlPoll != 0) {
      DeviceSync::pause();
      continue;
    }
    if (DeviceSync::loadStatus(control) != kStatusOk) return;
    if (DeviceSync::loadAbort(control) != 0) {
      DeviceSync::fail(control, kStatusAborted, 0, kWaitData, target - 1);
      return;
    }
    if (DeviceSync::nowNs() > deadline) {
      DeviceSync::fail(control, kStatusTimeout, 0, kWaitData, target - 1);
      return;
    }
    DeviceSync::pause();
  }
}

}  // namespace

int launchRing(const RingArgs& args, chorusDataType_t type, chorusRedOp_t op, bool ll, int threads, void* stream) {
  return ll ? launchRingLl(args, type, op, threads, stream) : launchRingBulk(args, type, op, threads, stream);
}

int launchWait(uint64_t* waits, const volatile uint64_t* done, Control* control, uint64_t timeoutNs, void* stream) {
  waitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(waits, done, control, timeoutNs);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace chorus::ipc
