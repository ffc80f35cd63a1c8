// device.h: whether this machine has a CUDA device, for the gpu tests to skip with the reason.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace chorus::testing {

// True if a CUDA device can be used; otherwise *why says what the runtime reported.
inline bool haveCudaDevice(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = cudaGetErrorString(error);
    return false;
  }
  if (count == 0) *why = "no CUDA device";
  return count > 0;
}

}  // namespace chorus::testing

// Skips the test, naming the reason, on a machine without a CUDA device.
#define CHORUS_REQUIRE_CUDA_DEVICE()                                                     \
  do {                                                                                   \
    std::string chorusWhy;                                                               \
    if (!::chorus::testing::haveCudaDevice(&chorusWhy)) {                                \
      GTEST_SKIP() << "needs a CUDA device (" << chorusWhy << "); run on a GPU machine"; \
    }                                                                                    \
  } while (0)
