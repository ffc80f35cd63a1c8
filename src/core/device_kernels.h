// device_kernels.h: the device engine's kernels (device_kernels.cu) as host-callable functions,
// with no CUDA runtime types: the ring kernel of one collective over inboxes mapped with CUDA IPC,
// and the wait kernel that holds a stream until the host's staging proxy has done its part.
#pragma once

#include <cstdint>

#include "src/core/device_ring.h"

namespace chorus::ipc {

// Enqueues one collective on `stream` (a cudaStream_t): one block of `threads` per channel, each
// running RingChannel for the type and op. Returns 0 or the launch's cudaError_t.
int launchRing(const RingArgs& args, chorusDataType_t type, chorusRedOp_t op, bool ll, int threads, void* stream);

// Loads every kernel above now (threads == 0 in launchRing does the same for one): CUDA loads
// kernels lazily, at first launch, which may wait for the whole device. 0 or the cudaError_t.
int preload();

// Enqueues a one-thread kernel that counts itself in *waits (device memory) and spins until
// *done (host memory mapped to the device) reaches that count, or control reports a failure (the
// proxy's call failed, or timed out on the host), or the abort word is raised.
int launchWait(uint64_t* waits, const volatile uint64_t* done, Control* control, void* stream);

}  // namespace chorus::ipc
