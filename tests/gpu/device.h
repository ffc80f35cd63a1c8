// device.h: whether this machine has a CUDA device, for the gpu tests to skip with the reason.
// The probe runs in a forked child, so the test process itself never initializes CUDA: tests that
// fork ranks afterwards (device_collectives_test) need CUDA untouched in the parent.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace chorus::testing {

// True if a CUDA device can be used; otherwise *why says what the runtime reported. Under
// tests/support/cuda_emulation.h the emulation is the device.
inline bool haveCudaDevice(std::string* why) {
#if CHORUS_CUDA_EMULATION
  (void)why;
  return true;
#else
  int pipeFds[2];
  if (pipe(pipeFds) != 0) {
    *why = "pipe() failed";
    return false;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipeFds[0]);
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    const char* text = error != cudaSuccess ? cudaGetErrorString(error) : (count == 0 ? "no CUDA device" : "");
    const ssize_t written = write(pipeFds[1], text, std::strlen(text));
    (void)written;
    _exit(error == cudaSuccess && count > 0 ? 0 : 1);
  }
  close(pipeFds[1]);
  char buffer[256] = {};
  const ssize_t got = read(pipeFds[0], buffer, sizeof(buffer) - 1);
  close(pipeFds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  *why = got > 0 ? std::string(buffer, static_cast<size_t>(got)) : "the probe process failed";
  return false;
#endif
}

// A device copy of a host vector (or n zeroed elements), with 16 bytes of slack past its end;
// freed at scope exit.
template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(&data, n * sizeof(T) + 16), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0, n * sizeof(T) + 16), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(data, host.data(), count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data); }
  // The first n elements (all by default), after the device is done with what was enqueued.
  std::vector<T> read(size_t n) const {
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  std::vector<T> read() const { return read(count); }
  T* data = nullptr;
  size_t count;
};

}  // namespace chorus::testing

// Skips the test, naming the reason, on a machine without a CUDA device.
#define CHORUS_REQUIRE_CUDA_DEVICE()                                                     \
  do {                                                                                   \
    std::string chorusWhy;                                                               \
    if (!::chorus::testing::haveCudaDevice(&chorusWhy)) {                                \
      GTEST_SKIP() << "needs a CUDA device (" << chorusWhy << "); run on a GPU machine"; \
    }                                                                                    \
  } while (0)
