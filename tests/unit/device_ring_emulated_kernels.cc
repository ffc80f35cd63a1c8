// device_ring_emulated_kernels.cc: the device ring's kernels (src/core/device_ring.cuh), every
// element type and protocol, compiled for the host against tests/support/cuda_emulation.h in one
// unit, for chorus_emulated (the CUDA build makes a unit per kernel from
// src/core/device_ring_kernel.cu.in).
#define CHORUS_IPC_KERNEL_UNIT 1
#include "src/core/device_ring.cuh"

namespace chorus::ipc {

#define CHORUS_IPC_INSTANTIATE(E)                                                  \
  template int launchRingOf<E, true>(const RingArgs&, chorusRedOp_t, int, void*);  \
  template int launchRingOf<E, false>(const RingArgs&, chorusRedOp_t, int, void*); \
  template int loadRingOf<E, true>();                                              \
  template int loadRingOf<E, false>();
CHORUS_IPC_KERNELS(CHORUS_IPC_INSTANTIATE)

}  // namespace chorus::ipc
