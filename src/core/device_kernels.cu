// device_kernels.cu: the device engine's wait kernel (the staged path), and the ring launch that
// picks the kernel of the call's type and protocol (each compiled in a translation unit of its own,
// generated from device_ring_kernel.cu.in, so the build compiles them in parallel).
#include <cuda_runtime.h>

#include "src/core/device_ring.cuh"

namespace chorus::ipc {
namespace {

// No deadline of its own: the proxy's host call is bounded by the communicator's timeout, and the
// proxy answers every call it is given, by the done count or, where the call failed, by
// control's status. Counting from the launch instead would also cut a large staged call that is
// still moving.
__global__ void waitKernel(uint64_t* waits, const volatile uint64_t* done, Control* control) {
  const uint64_t target = ++*waits;
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
    DeviceSync::pause();
  }
}

// f(E{}) for the ring's element type of type (an unknown type: cudaErrorInvalidValue).
template <class F>
int withElement(chorusDataType_t type, F&& f) {
  switch (type) {
    case chorusInt8:
      return f(Plain<int8_t>{});
    case chorusUint8:
      return f(Plain<uint8_t>{});
    case chorusInt32:
      return f(Plain<int32_t>{});
    case chorusUint32:
      return f(Plain<uint32_t>{});
    case chorusInt64:
      return f(Plain<int64_t>{});
    case chorusUint64:
      return f(Plain<uint64_t>{});
    case chorusFloat32:
      return f(Plain<float>{});
    case chorusFloat64:
      return f(Plain<double>{});
    case chorusFloat16:
      return f(Fp16{});
    case chorusBfloat16:
      return f(Bf16{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int launchRing(const RingArgs& args, chorusDataType_t type, chorusRedOp_t op, bool ll, int threads, void* stream) {
  return withElement(type, [&](auto element) {
    using E = decltype(element);
    return ll ? launchRingOf<E, true>(args, op, threads, stream) : launchRingOf<E, false>(args, op, threads, stream);
  });
}

int preload() {
  if (const int error = kernels::cuda::loadKernel(waitKernel); error != 0) return error;
  for (int t = 0; t < chorusNumTypes; ++t) {
    const int error = withElement(static_cast<chorusDataType_t>(t), [](auto element) {
      using E = decltype(element);
      const int ll = loadRingOf<E, true>();
      return ll != 0 ? ll : loadRingOf<E, false>();
    });
    if (error != 0) return error;
  }
  return 0;
}

int launchWait(uint64_t* waits, const volatile uint64_t* done, Control* control, void* stream) {
  CHORUS_LAUNCH(waitKernel, 1, 1, 0, static_cast<cudaStream_t>(stream), waits, done, control);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace chorus::ipc
