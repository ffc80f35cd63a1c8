// cuda_ipc.h: device memory shared between the processes of one host by CUDA IPC, the device
// counterpart of shm's mapped allocations. A rank exposes a device buffer (its allocation's IPC
// handle, made once per allocation, and where the buffer lies in it); a peer maps that allocation
// into its own address space once and keeps the mapping until the peer's allocation is replaced.
// Knows no collective: the device engine (src/core/device.cc) decides what to expose and when the
// ranks have met. Built only with CUDA.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace chorus::cudaipc {

// The driver's cuPointerGetAttribute, once the program has loaded the driver; null until then (a
// program that never loaded it has no device memory, and loading it costs a CUDA start-up).
using PointerAttributeFn = CUresult (*)(void* data, CUpointer_attribute attribute, CUdeviceptr pointer);
PointerAttributeFn loadedDriver();

// Where a device buffer lies, for a peer to map it: its allocation's IPC handle, the allocation's
// id (unique for the process's life, so an allocation freed and made again at the same address is
// told apart), the allocation's address range, and the buffer's offset in it. Plain bytes: ranks
// exchange it as it is.
struct ExposedBuffer {
  cudaIpcMemHandle_t handle;
  uint64_t id;
  uint64_t base;
  uint64_t size;
  uint64_t offset;
};

// One rank's CUDA IPC state towards its peers: the handles of its own allocations it has exposed,
// and the peers' allocations it has mapped.
class Mappings {
 public:
  Mappings() = default;
  ~Mappings() { reset(0, 0); }
  Mappings(const Mappings&) = delete;
  Mappings& operator=(const Mappings&) = delete;

  // Closes every mapping and forgets every handle; then serves `nranks` peers as rank `rank`.
  void reset(int rank, int nranks);
  // Where p lies, for the peers to map; false when CUDA cannot share it (memory from a pool or
  // from the virtual memory API, managed memory).
  bool expose(const void* p, ExposedBuffer* out);
  // This process's address of peer's buffer, mapping its allocation the first time. A new
  // allocation of the peer over the range of one mapped before means the peer freed that one: its
  // mapping goes (the caller guarantees nothing of this process still reads it). Throws
  // chorusSystemError naming the peer where CUDA cannot map it.
  char* map(int peer, const ExposedBuffer& buffer);

 private:
  struct PeerAllocation {
    uint64_t id;
    uint64_t base;
    uint64_t size;
    char* mapped;
  };
  int rank_ = 0;
  std::unordered_map<uint64_t, cudaIpcMemHandle_t> exposed_;  // this rank's allocations, by id
  std::vector<std::vector<PeerAllocation>> peers_;            // mapped, by peer rank
};

}  // namespace chorus::cudaipc
