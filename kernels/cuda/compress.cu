// compress.cu: gradient compression's math on device memory (see compress.h). The element math
// (QSGD's rounding, random draws, fp16 / bf16 rounding) is the reference's own CHORUS_HD code, and
// the library is built without fused multiply-add, so results match kernels/cpu/compress.cc.
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstring>
#include <cub/device/device_scan.cuh>

#include "kernels/cpu/half.h"
#include "kernels/cuda/compress.h"
#include "kernels/cuda/grid.cuh"

namespace chorus::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

unsigned gridFor(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

int lastError() { return static_cast<int>(cudaGetLastError()); }

size_t roundUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

// ---- codecs ----

// Unaligned byte buffers: 16-bit codes and fp32 scales are read and written byte by byte.
__device__ uint16_t loadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
__device__ void storeU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
__device__ float loadF32(const uint8_t* p) {
  float f;
  memcpy(&f, p, sizeof(f));
  return f;
}

__global__ void encodeHalves(Float16 format, const float* x, size_t count, uint8_t* out) {
  for (size_t i = threadIndex(); i < count; i += gridThreads()) {
    storeU16(out + 2 * i, toFloat16(format, x[i]));
  }
}

// One block per bucket: the scale, then each thread packs whole bytes of codes.
__global__ void encodeScaled(Codec codec, unsigned levels, int bits, const float* x, size_t count, uint64_t seed,
                             uint8_t* out) {
  __shared__ float magnitudes[kCodecBucket];
  __shared__ float scale;
  const size_t buckets = (count + kCodecBucket - 1) / kCodecBucket;
  const size_t b = blockIdx.x;
  const size_t begin = b * kCodecBucket;
  const size_t length = count - begin < kCodecBucket ? count - begin : kCodecBucket;
  for (size_t j = threadIdx.x; j < length; j += blockDim.x) magnitudes[j] = absf(x[begin + j]);
  __syncthreads();
  if (threadIdx.x == 0) {
    // The reference's order exactly: max is order-free, the mean's sum is not.
    if (codec == Codec::kQsgd) {
      float m = 0;
      for (size_t j = 0; j < length; ++j) m = m < magnitudes[j] ? magnitudes[j] : m;
      scale = m;
    } else {
      double total = 0;
      for (size_t j = 0; j < length; ++j) total += magnitudes[j];
      scale = static_cast<float>(total / static_cast<double>(length));
    }
    memcpy(out + b * sizeof(float), &scale, sizeof(float));
  }
  __syncthreads();
  uint8_t* codes = out + buckets * sizeof(float) + b * (kCodecBucket * bits / 8);
  const unsigned perByte = 8 / bits;
  const size_t bytes = (length * bits + 7) / 8;
  const float toLevels = scale == 0 ? 0.0f : static_cast<float>(levels) / scale;
  for (size_t byte = threadIdx.x; byte < bytes; byte += blockDim.x) {
    unsigned packed = 0;
    for (unsigned j = 0; j < perByte; ++j) {
      const size_t e = byte * perByte + j;
      if (e >= length) break;
      const size_t i = begin + e;
      unsigned code;
      if (codec == Codec::kSign) {
        code = signCode(x[i]);
      } else {
        code = scale == 0 ? 0u : qsgdCode(x[i], toLevels, levels, bits, seed, i);
      }
      packed |= code << (j * bits);
    }
    codes[byte] = static_cast<uint8_t>(packed);
  }
}

__global__ void decodeHalves(Float16 format, const uint8_t* in, size_t count, float factor, float* out) {
  for (size_t i = threadIndex(); i < count; i += gridThreads()) {
    const uint16_t h = loadU16(in + 2 * i);
    out[i] += factor * fromFloat16(format, h);
  }
}

__global__ void decodeScaled(Codec codec, unsigned levels, int bits, const uint8_t* in, size_t count, float factor,
                             float* out) {
  const size_t buckets = (count + kCodecBucket - 1) / kCodecBucket;
  const uint8_t* codes = in + buckets * sizeof(float);
  for (size_t i = threadIndex(); i < count; i += gridThreads()) {
    const float scale = loadF32(in + (i / kCodecBucket) * sizeof(float));
    const size_t bit = i * static_cast<size_t>(bits);
    const unsigned code = (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
    if (codec == Codec::kSign) {
      const float value = factor * scale;
      out[i] += code != 0 ? -value : value;
    } else {
      out[i] += qsgdValue(code, bits, factor * scale / static_cast<float>(levels));
    }
  }
}

// ---- top-k: radix select on the magnitudes' bits, then one prefix sum places the chosen ----

struct SelectState {
  uint32_t prefix;     // the threshold's bits found so far
  uint32_t remaining;  // how many more to take among keys that match prefix on the bits found
  uint32_t histogram[256];
};

__device__ uint32_t magnitudeKey(float x) { return floatBits(x) & 0x7fffffffu; }

__global__ void selectBegin(SelectState* state, uint32_t k) {
  for (unsigned d = threadIdx.x; d < 256; d += blockDim.x) state->histogram[d] = 0;
  if (threadIdx.x == 0) {
    state->prefix = 0;
    state->remaining = k;
  }
}

// Counts the keys that match the prefix on the bits above shift, by their 8 bits at shift.
__global__ void selectHistogram(const float* x, size_t n, int shift, SelectState* state) {
  __shared__ uint32_t local[256];
  for (unsigned d = threadIdx.x; d < 256; d += blockDim.x) local[d] = 0;
  __syncthreads();
  const uint32_t above = shift == 24 ? 0u : ~0u << (shift + 8);
  const uint32_t prefix = state->prefix & above;
  for (size_t i = threadIndex(); i < n; i += gridThreads()) {
    const uint32_t key = magnitudeKey(x[i]);
    if ((key & above) == prefix) atomicAdd(&local[(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (unsigned d = threadIdx.x; d < 256; d += blockDim.x) {
    if (local[d] != 0) atomicAdd(&state->histogram[d], local[d]);
  }
}

// From the largest digit down: the digit where the count reaches what is still to take.
__global__ void selectDigit(int shift, SelectState* state) {
  uint32_t before = 0;
  for (int d = 255; d >= 0; --d) {
    const uint32_t here = state->histogram[d];
    if (before + here >= state->remaining) {
      state->prefix |= static_cast<uint32_t>(d) << shift;
      state->remaining -= before;
      break;
    }
    before += here;
  }
  for (int d = 0; d < 256; ++d) state->histogram[d] = 0;
}

// (above threshold) << 32 | (equal to threshold), summed by the prefix scan.
struct SelectCounts {
  const float* x;
  const SelectState* state;
  __device__ uint64_t operator()(uint32_t i) const {
    const uint32_t key = magnitudeKey(x[i]);
    return key > state->prefix ? uint64_t{1} << 32 : (key == state->prefix ? 1u : 0u);
  }
};

// Element i's place among the chosen is the chosen before it: all above, and the ties before it
// up to the number of ties taken.
__global__ void selectScatter(const float* x, size_t n, const uint64_t* before, const SelectState* state,
                              uint32_t* indices) {
  const uint32_t threshold = state->prefix;
  const uint32_t ties = state->remaining;
  for (size_t i = threadIndex(); i < n; i += gridThreads()) {
    const uint32_t key = magnitudeKey(x[i]);
    const uint32_t above = static_cast<uint32_t>(before[i] >> 32);
    const uint32_t equal = static_cast<uint32_t>(before[i]);
    if (key > threshold) {
      indices[above + (equal < ties ? equal : ties)] = static_cast<uint32_t>(i);
    } else if (key == threshold && equal < ties) {
      indices[above + equal] = static_cast<uint32_t>(i);
    }
  }
}

// ---- random-k: Floyd's draws (sequential, as the reference), then the marks become indices ----

__global__ void floydMarks(uint64_t seed, size_t n, size_t k, unsigned long long* marks) {
  for (size_t j = n - k, draw = 0; j < n; ++j, ++draw) {
    const size_t t = static_cast<size_t>(randomBits(seed, draw) % (j + 1));
    const size_t pick = (marks[t / 64] >> (t % 64)) & 1u ? j : t;
    marks[pick / 64] |= 1ull << (pick % 64);
  }
}

struct WordCount {
  const unsigned long long* marks;
  __device__ uint32_t operator()(uint32_t w) const { return static_cast<uint32_t>(__popcll(marks[w])); }
};

__global__ void marksToIndices(const unsigned long long* marks, size_t words, const uint32_t* before,
                               uint32_t* indices) {
  for (size_t w = threadIndex(); w < words; w += gridThreads()) {
    uint32_t at = before[w];
    for (unsigned long long bits = marks[w]; bits != 0; bits &= bits - 1) {
      indices[at++] = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__ffsll(static_cast<long long>(bits)) - 1));
    }
  }
}

// ---- PowerSGD ----

// The sum of value over the block, by a fixed tree: every thread gets the same, deterministic total.
__device__ double blockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__global__ void gramSchmidt(float* a, size_t rows, size_t cols) {
  __shared__ double shared[kThreads];
  auto norm = [&](size_t c) {
    double part = 0;
    for (size_t r = threadIdx.x; r < rows; r += blockDim.x)
      part += static_cast<double>(a[r * cols + c]) * a[r * cols + c];
    return sqrt(blockSum(part, shared));
  };
  for (size_t c = 0; c < cols; ++c) {
    const double before = norm(c);
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t prev = 0; prev < c; ++prev) {
        double part = 0;
        for (size_t r = threadIdx.x; r < rows; r += blockDim.x) {
          part += static_cast<double>(a[r * cols + c]) * a[r * cols + prev];
        }
        const float d = static_cast<float>(blockSum(part, shared));
        for (size_t r = threadIdx.x; r < rows; r += blockDim.x) a[r * cols + c] -= d * a[r * cols + prev];
        __syncthreads();
      }
    }
    const double after = norm(c);
    const float scale = after > 1e-5 * before && after > 0 ? static_cast<float>(1.0 / after) : 0.0f;
    for (size_t r = threadIdx.x; r < rows; r += blockDim.x) a[r * cols + c] *= scale;
    __syncthreads();
  }
}

__global__ void normalDraws(float* out, size_t count, uint64_t seed, uint64_t first) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = threadIndex(); i < count; i += gridThreads()) {
    double u1, u2;
    kernels::normalDraws(seed, first + i, &u1, &u2);
    out[i] = static_cast<float>(sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2));
  }
}

}  // namespace

Workspace::~Workspace() {
  if (data_ != nullptr) cudaFree(data_);
}

void* Workspace::get(size_t bytes) {
  if (bytes <= size_) return data_;
  if (data_ != nullptr) cudaFree(data_);  // waits for the work that used it
  data_ = nullptr;
  size_ = 0;
  if (cudaMalloc(&data_, bytes) != cudaSuccess) {
    data_ = nullptr;
    return nullptr;
  }
  size_ = bytes;
  return data_;
}

int encode(const CodecParams& params, const float* x, size_t count, uint64_t seed, uint8_t* out, void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (!codecScaled(params)) {
    encodeHalves<<<gridFor(count), kThreads, 0, s>>>(float16Of(params.codec), x, count, out);
  } else {
    const size_t buckets = (count + kCodecBucket - 1) / kCodecBucket;
    encodeScaled<<<static_cast<unsigned>(buckets), kThreads, 0, s>>>(params.codec, static_cast<unsigned>(params.levels),
                                                                     codecBits(params), x, count, seed, out);
  }
  return lastError();
}

int decodeAdd(const CodecParams& params, const uint8_t* in, size_t count, float factor, float* out, void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (!codecScaled(params)) {
    decodeHalves<<<gridFor(count), kThreads, 0, s>>>(float16Of(params.codec), in, count, factor, out);
  } else {
    decodeScaled<<<gridFor(count), kThreads, 0, s>>>(params.codec, static_cast<unsigned>(params.levels),
                                                     codecBits(params), in, count, factor, out);
  }
  return lastError();
}

int topKIndices(const float* x, size_t n, size_t k, uint32_t* indices, Workspace& work, void* stream) {
  k = k < n ? k : n;
  if (k == 0) return 0;
  if (n > UINT32_MAX) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  auto counts = thrust::make_transform_iterator(thrust::counting_iterator<uint32_t>(0), SelectCounts{x, nullptr});
  size_t scanBytes = 0;
  cudaError_t error = cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, counts, static_cast<uint64_t*>(nullptr),
                                                    static_cast<int64_t>(n), s);
  if (error != cudaSuccess) return static_cast<int>(error);
  const size_t stateBytes = roundUp(sizeof(SelectState));
  const size_t beforeBytes = roundUp(n * sizeof(uint64_t));
  auto* base = static_cast<uint8_t*>(work.get(stateBytes + beforeBytes + scanBytes));
  if (base == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  auto* state = reinterpret_cast<SelectState*>(base);
  auto* before = reinterpret_cast<uint64_t*>(base + stateBytes);
  selectBegin<<<1, kThreads, 0, s>>>(state, static_cast<uint32_t>(k));
  for (int shift = 24; shift >= 0; shift -= 8) {
    selectHistogram<<<gridFor(n), kThreads, 0, s>>>(x, n, shift, state);
    selectDigit<<<1, 1, 0, s>>>(shift, state);
  }
  counts = thrust::make_transform_iterator(thrust::counting_iterator<uint32_t>(0), SelectCounts{x, state});
  error = cub::DeviceScan::ExclusiveSum(base + stateBytes + beforeBytes, scanBytes, counts, before,
                                        static_cast<int64_t>(n), s);
  if (error != cudaSuccess) return static_cast<int>(error);
  selectScatter<<<gridFor(n), kThreads, 0, s>>>(x, n, before, state, indices);
  return lastError();
}

int randomKIndices(uint64_t seed, size_t n, size_t k, uint32_t* indices, Workspace& work, void* stream) {
  k = k < n ? k : n;
  if (k == 0) return 0;
  if (n > UINT32_MAX) return static_cast<int>(cudaErrorInvalidValue);
  const auto s = static_cast<cudaStream_t>(stream);
  const size_t words = (n + 63) / 64;
  auto counts = thrust::make_transform_iterator(thrust::counting_iterator<uint32_t>(0), WordCount{nullptr});
  size_t scanBytes = 0;
  cudaError_t error = cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, counts, static_cast<uint32_t*>(nullptr),
                                                    static_cast<int64_t>(words), s);
  if (error != cudaSuccess) return static_cast<int>(error);
  const size_t marksBytes = roundUp(words * sizeof(unsigned long long));
  const size_t beforeBytes = roundUp(words * sizeof(uint32_t));
  auto* base = static_cast<uint8_t*>(work.get(marksBytes + beforeBytes + scanBytes));
  if (base == nullptr) return static_cast<int>(cudaErrorMemoryAllocation);
  auto* marks = reinterpret_cast<unsigned long long*>(base);
  auto* before = reinterpret_cast<uint32_t*>(base + marksBytes);
  error = cudaMemsetAsync(marks, 0, words * sizeof(unsigned long long), s);
  if (error != cudaSuccess) return static_cast<int>(error);
  floydMarks<<<1, 1, 0, s>>>(seed, n, k, marks);
  counts = thrust::make_transform_iterator(thrust::counting_iterator<uint32_t>(0), WordCount{marks});
  error = cub::DeviceScan::ExclusiveSum(base + marksBytes + beforeBytes, scanBytes, counts, before,
                                        static_cast<int64_t>(words), s);
  if (error != cudaSuccess) return static_cast<int>(error);
  marksToIndices<<<gridFor(words), kThreads, 0, s>>>(marks, words, before, indices);
  return lastError();
}

int orthonormalizeColumns(float* a, size_t rows, size_t cols, void* stream) {
  if (rows == 0 || cols == 0) return 0;
  gramSchmidt<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, rows, cols);
  return lastError();
}

int fillNormal(float* out, size_t count, uint64_t seed, uint64_t first, void* stream) {
  if (count == 0) return 0;
  normalDraws<<<gridFor(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, count, seed, first);
  return lastError();
}

}  // namespace chorus::kernels::cuda
