// device_ring.cuh: the device's primitives for the ring (the S of device_ring.h), shared by the
// kernels' translation units.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/load.cuh"
#include "src/core/device_kernels.h"

namespace chorus::ipc {

// Control words are read every kControlPoll spins: they live in host memory, a bus read away.
constexpr unsigned kControlPoll = 64;

// Under tests/support/cuda_emulation.h the memory operations are device_ring.h's host ones (the
// inboxes shared between processes by the emulation's CUDA IPC) in place of the PTX below.
#if defined(CHORUS_CUDA_EMULATION)
struct DeviceSync : HostPrimitives {
#else
struct DeviceSync {
#endif
  static constexpr unsigned kPollEvery = kControlPoll;
  __device__ static int thread() { return static_cast<int>(threadIdx.x); }
  __device__ static int threads() { return static_cast<int>(blockDim.x); }
  __device__ static void barrier() { __syncthreads(); }
  __device__ static bool uniform(bool value) {
    __shared__ int decided;
    if (threadIdx.x == 0) decided = value ? 1 : 0;
    __syncthreads();
    const bool result = decided != 0;
    __syncthreads();
    return result;
  }
#if !defined(CHORUS_CUDA_EMULATION)  // the device's own; the emulation's are HostPrimitives'
  __device__ static void acquire() { __threadfence_system(); }
  __device__ static void release() { __threadfence_system(); }
  // Flag words another process's kernel writes and reads (mapped with CUDA IPC): an acquire load
  // and a release store at system scope, so the data a flag publishes is seen by the thread that
  // sees the flag, and through the block barrier that follows, by every thread of the block.
  __device__ static uint64_t loadWord(uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
  __device__ static void storeWord(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
  __device__ static LlLine loadLine(const LlLine* p) {
    LlLine v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.data0), "=r"(v.flag0), "=r"(v.data1), "=r"(v.flag1)
                 : "l"(p));
    return v;
  }
  __device__ static void storeLine(LlLine* p, LlLine v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.data0), "r"(v.flag0), "r"(v.data1),
                 "r"(v.flag1)
                 : "memory");
  }
  // Slot data written by a peer: read past the L1 cache, which may hold the slot's last message.
  template <typename T>
  __device__ static T loadData(const T* p) {
    if constexpr (sizeof(T) == 1) {
      return static_cast<T>(__ldcv(reinterpret_cast<const unsigned char*>(p)));
    } else if constexpr (sizeof(T) == 2) {
      return static_cast<T>(__ldcv(reinterpret_cast<const unsigned short*>(p)));
    } else if constexpr (sizeof(T) == 4) {
      const unsigned bits = __ldcv(reinterpret_cast<const unsigned*>(p));
      T v;
      memcpy(&v, &bits, sizeof(v));
      return v;
    } else {
      const unsigned long long bits = __ldcv(reinterpret_cast<const unsigned long long*>(p));
      T v;
      memcpy(&v, &bits, sizeof(v));
      return v;
    }
  }
  __device__ static uint32_t loadStatus(Control* c) { return *reinterpret_cast<volatile uint32_t*>(&c->status); }
  __device__ static uint32_t loadAbort(Control* c) { return *reinterpret_cast<volatile uint32_t*>(&c->abort); }
  __device__ static void fail(Control* c, uint32_t why, uint32_t channel, uint32_t what, uint64_t message) {
    // System scope: the host reads this word, and writes it too when the proxy fails.
    if (atomicCAS_system(&c->status, kStatusOk, why) == kStatusOk) {
      c->channel = channel;
      c->what = what;
      c->message = message;
      __threadfence_system();
    }
  }
  __device__ static uint64_t nowNs() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ static void pause() { __nanosleep(32); }
#endif
};

// The ring kernel of one element type E and protocol: one block per channel, the op chosen inside.
template <class E, bool Ll>
__global__ void __launch_bounds__(1024) ringKernel(RingArgs args, chorusRedOp_t op) {
  runTyped<DeviceSync, E, Ll>(args, static_cast<int>(blockIdx.x), op);
}

template <class E, bool Ll>
int launchRingOf(const RingArgs& args, chorusRedOp_t op, int threads, void* stream) {
  CHORUS_LAUNCH((ringKernel<E, Ll>), dim3(static_cast<unsigned>(args.channels)), static_cast<int>(threads), 0,
                static_cast<cudaStream_t>(stream), args, op);
  return static_cast<int>(cudaGetLastError());
}

// Loads the kernel's module now (no launch): kernels/cuda/load.cuh says why.
template <class E, bool Ll>
int loadRingOf() {
  return kernels::cuda::loadKernel(ringKernel<E, Ll>);
}

// Each (type, protocol) is compiled in a translation unit of its own (the build generates them
// from device_ring_kernel.cu.in), so the kernels compile in parallel; elsewhere they are only named.
// clang-format off
#define CHORUS_IPC_KERNELS(X)                                                                              \
  X(Plain<int8_t>) X(Plain<uint8_t>) X(Plain<int32_t>) X(Plain<uint32_t>) X(Plain<int64_t>) X(Plain<uint64_t>) \
  X(Plain<float>) X(Plain<double>) X(Fp16) X(Bf16)
// clang-format on
#define CHORUS_IPC_EXTERN(E)                                                              \
  extern template int launchRingOf<E, true>(const RingArgs&, chorusRedOp_t, int, void*);  \
  extern template int launchRingOf<E, false>(const RingArgs&, chorusRedOp_t, int, void*); \
  extern template int loadRingOf<E, true>();                                              \
  extern template int loadRingOf<E, false>();
#if !defined(CHORUS_IPC_KERNEL_UNIT)
CHORUS_IPC_KERNELS(CHORUS_IPC_EXTERN)
#endif

}  // namespace chorus::ipc
