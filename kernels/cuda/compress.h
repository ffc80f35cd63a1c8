// compress.h (CUDA): gradient compression's math on device memory, matching kernels/cpu/compress.h
// (the reference): codec encode / decode-add, top-k and random-k selection, PowerSGD's
// Gram-Schmidt and shared-seed Gaussian draws. Every call is enqueued on `stream` (a cudaStream_t;
// NULL for the default stream) and returns without waiting; returns 0 or the cudaError_t of the
// failing call. Host code includes this header; it holds no CUDA runtime types.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/compress.h"

namespace chorus::kernels::cuda {

// Device scratch memory that grows on demand (the selections' counts and prefix sums). One per
// stream of work: a call may reuse it as soon as the previous call on the same stream is enqueued.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();
  // At least bytes of device memory, 256-byte aligned, or nullptr if allocation failed.
  void* get(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// As kernels::encode / decodeAdd, byte for byte. The sign codec's bucket mean is summed in the
// reference's order (in double, element by element), so scales match too.
int encode(const CodecParams& params, const float* x, size_t count, uint64_t seed, uint8_t* out, void* stream);
int decodeAdd(const CodecParams& params, const uint8_t* in, size_t count, float factor, float* out, void* stream);

// As kernels::topKIndices: the k entries largest in magnitude (ties: lower index), in increasing
// index order, found by a radix select on the magnitudes' bits and one prefix sum (no sort).
int topKIndices(const float* x, size_t n, size_t k, uint32_t* indices, Workspace& work, void* stream);
// As kernels::randomKIndices: the same indices for the same seed.
int randomKIndices(uint64_t seed, size_t n, size_t k, uint32_t* indices, Workspace& work, void* stream);

// As kernels::orthonormalizeColumns (two-pass modified Gram-Schmidt, dependent columns zeroed),
// by one block with its dot products summed in double by a fixed tree: deterministic, and within
// rounding of the reference.
int orthonormalizeColumns(float* a, size_t rows, size_t cols, void* stream);
// out[i] = kernels::randomNormal(seed, first + i) for i < count (within the device's log and cos
// rounding of the reference).
int fillNormal(float* out, size_t count, uint64_t seed, uint64_t first, void* stream);

}  // namespace chorus::kernels::cuda
