// device_memory.cc: collbench's device buffers (device_memory.h).
#include "bench/device_memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#if defined(CHORUS_COLLBENCH_CUDA)
#include <cuda_runtime.h>
#endif

namespace chorus::bench {

#if defined(CHORUS_COLLBENCH_CUDA)

struct DeviceMemory::Impl {
  int rank = 0;
  int device = -1;
  std::string name;
  cudaStream_t stream = nullptr;
  char* buffers[2] = {};
  size_t capacity[2] = {};

  void check(cudaError_t result, const char* what) const {
    if (result == cudaSuccess) return;
    std::fprintf(stderr, "collbench rank %d: --mem device: %s failed: %s\n", rank, what, cudaGetErrorString(result));
    std::exit(2);
  }
};

DeviceMemory::DeviceMemory(int rank) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = rank;
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    std::fprintf(stderr, "collbench rank %d: --mem device: no usable CUDA device here (%s)\n", rank,
                 probe != cudaSuccess ? cudaGetErrorString(probe) : "none found");
    std::exit(2);
  }
  m.device = rank % count;
  m.check(cudaSetDevice(m.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  m.check(cudaGetDeviceProperties(&prop, m.device), "cudaGetDeviceProperties");
  m.name = prop.name;
  m.check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

DeviceMemory::~DeviceMemory() {
  Impl& m = *impl_;
  cudaStreamSynchronize(m.stream);
  for (char* buffer : m.buffers) cudaFree(buffer);
  cudaStreamDestroy(m.stream);
}

std::string DeviceMemory::describe() const {
  return "device " + std::to_string(impl_->device) + " (" + impl_->name + ")";
}

std::string DeviceMemory::identity() const {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  char busId[32] = {};
  impl_->check(cudaDeviceGetPCIBusId(busId, sizeof(busId), impl_->device), "cudaDeviceGetPCIBusId");
  return std::string(host) + "/" + busId;
}

chorusStream_t DeviceMemory::stream() const { return reinterpret_cast<chorusStream_t>(impl_->stream); }

char* DeviceMemory::reserve(int slot, size_t bytes) {
  Impl& m = *impl_;
  if (bytes > m.capacity[slot]) {
    m.check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
    m.check(cudaFree(m.buffers[slot]), "cudaFree");
    m.buffers[slot] = nullptr;
    m.capacity[slot] = 0;
    if (cudaMalloc(reinterpret_cast<void**>(&m.buffers[slot]), bytes) != cudaSuccess) {
      std::fprintf(stderr, "collbench rank %d: --mem device: cudaMalloc of %zu bytes failed: %s\n", m.rank, bytes,
                   cudaGetErrorString(cudaGetLastError()));
      std::exit(2);
    }
    m.capacity[slot] = bytes;
  }
  return m.buffers[slot];
}

void DeviceMemory::upload(char* device, const char* host, size_t bytes) {
  impl_->check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, impl_->stream), "upload (cudaMemcpyAsync)");
  synchronize();
}

void DeviceMemory::download(char* host, const char* device, size_t bytes) {
  impl_->check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, impl_->stream),
               "download (cudaMemcpyAsync)");
  synchronize();
}

void DeviceMemory::synchronize() { impl_->check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize"); }

double DeviceMemory::copyBytesPerSecond(size_t bytes, int copies) {
  Impl& m = *impl_;
  char* from = reserve(0, bytes);
  char* to = reserve(1, bytes);
  cudaEvent_t start = nullptr, stop = nullptr;
  m.check(cudaEventCreate(&start), "cudaEventCreate");
  m.check(cudaEventCreate(&stop), "cudaEventCreate");
  m.check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, m.stream), "cudaMemcpyAsync");  // warm
  m.check(cudaEventRecord(start, m.stream), "cudaEventRecord");
  for (int i = 0; i < copies; ++i) {
    m.check(cudaMemcpyAsync(i % 2 == 0 ? to : from, i % 2 == 0 ? from : to, bytes, cudaMemcpyDeviceToDevice, m.stream),
            "cudaMemcpyAsync");
  }
  m.check(cudaEventRecord(stop, m.stream), "cudaEventRecord");
  m.check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  m.check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms > 0 ? static_cast<double>(bytes) * copies / (ms * 1e-3) : 0;
}

#else  // no CUDA in this build

struct DeviceMemory::Impl {};

DeviceMemory::DeviceMemory(int rank) {
  std::fprintf(stderr, "collbench rank %d: --mem device: this build of collbench has no CUDA\n", rank);
  std::exit(2);
}
DeviceMemory::~DeviceMemory() = default;
std::string DeviceMemory::describe() const { return {}; }
std::string DeviceMemory::identity() const { return {}; }
chorusStream_t DeviceMemory::stream() const { return nullptr; }
char* DeviceMemory::reserve(int, size_t) { return nullptr; }
void DeviceMemory::upload(char*, const char*, size_t) {}
void DeviceMemory::download(char*, const char*, size_t) {}
void DeviceMemory::synchronize() {}
double DeviceMemory::copyBytesPerSecond(size_t, int) { return 0; }

#endif

}  // namespace chorus::bench
