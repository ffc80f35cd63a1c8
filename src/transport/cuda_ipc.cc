// cuda_ipc.cc: device memory shared by CUDA IPC (see cuda_ipc.h).
#include "src/transport/cuda_ipc.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>

#include "src/base/error.h"

namespace chorus::cudaipc {
namespace {

std::atomic<PointerAttributeFn> driverPointerAttribute{nullptr};
std::atomic<unsigned long long> objectsSeen{~0ull};  // the loader's dlpi_adds at the last look

}  // namespace

PointerAttributeFn loadedDriver() {
#if defined(CHORUS_CUDA_EMULATION)
  return &cuPointerGetAttribute;  // tests/support/cuda_emulation.h's: the emulation is the driver
#else
  if (PointerAttributeFn fn = driverPointerAttribute.load(std::memory_order_acquire)) return fn;
  // dlopen with RTLD_NOLOAD costs about 17 us when the library is absent; the loader's count of
  // objects added costs a lock, so the library is looked for only when that count moved.
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<unsigned long long*>(data) = info->dlpi_adds;
        return 1;
      },
      &adds);
  if (objectsSeen.exchange(adds) == adds) return nullptr;
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return nullptr;
  auto fn = reinterpret_cast<PointerAttributeFn>(dlsym(driver, "cuPointerGetAttribute"));
  dlclose(driver);  // the program's own handle keeps it loaded
  if (fn != nullptr) driverPointerAttribute.store(fn, std::memory_order_release);
  return fn;
#endif
}

void Mappings::reset(int rank, int nranks) {
  for (auto& mapped : peers_) {
    for (const PeerAllocation& a : mapped) cudaIpcCloseMemHandle(a.mapped);
  }
  cudaGetLastError();
  rank_ = rank;
  exposed_.clear();
  peers_.assign(static_cast<size_t>(nranks), {});
}

bool Mappings::expose(const void* p, ExposedBuffer* out) {
  const PointerAttributeFn attribute = loadedDriver();
  if (attribute == nullptr) return false;
  const auto address = reinterpret_cast<CUdeviceptr>(p);
  unsigned long long id = 0;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, address) != CUDA_SUCCESS ||
      attribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, address) != CUDA_SUCCESS ||
      attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, address) != CUDA_SUCCESS) {
    return false;
  }
  auto found = exposed_.find(id);
  if (found == exposed_.end()) {
    cudaIpcMemHandle_t handle;
    if (cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (exposed_.size() >= 4096) exposed_.clear();  // ids of allocations long freed
    found = exposed_.emplace(id, handle).first;
  }
  out->handle = found->second;
  out->id = id;
  out->base = static_cast<uint64_t>(base);
  out->size = size;
  out->offset = static_cast<uint64_t>(address - base);
  return true;
}

char* Mappings::map(int peer, const ExposedBuffer& buffer) {
  if (peer < 0 || static_cast<size_t>(peer) >= peers_.size()) {
    fail(chorusInternalError, "rank {}: CUDA IPC: no peer {} among {} ranks", rank_, peer, peers_.size());
  }
  std::vector<PeerAllocation>& mapped = peers_[peer];
  for (const PeerAllocation& a : mapped) {
    if (a.id == buffer.id) return a.mapped + buffer.offset;
  }
  for (auto it = mapped.begin(); it != mapped.end();) {
    if (it->base < buffer.base + buffer.size && buffer.base < it->base + it->size) {
      cudaIpcCloseMemHandle(it->mapped);
      it = mapped.erase(it);
    } else {
      ++it;
    }
  }
  void* address = nullptr;
  const cudaError_t error = cudaIpcOpenMemHandle(&address, buffer.handle, cudaIpcMemLazyEnablePeerAccess);
  if (error != cudaSuccess) {
    cudaGetLastError();
    fail(chorusSystemError, "rank {}: device path: cudaIpcOpenMemHandle (rank {}'s buffer of {} bytes): {} ({})", rank_,
         peer, buffer.size, cudaGetErrorString(error), static_cast<int>(error));
  }
  mapped.push_back({buffer.id, buffer.base, buffer.size, static_cast<char*>(address)});
  return static_cast<char*>(address) + buffer.offset;
}

}  // namespace chorus::cudaipc
