// cuda_emulation.h: the small part of CUDA that kernels/cuda/'s kernels are written against
// (attention.cu's attention, tensor-core and scalar; nn.cu's and moe.cu's layers; their launchers),
// emulated on the host, so that the same kernel source runs (slowly) where there is no GPU: every
// CUDA thread of a block is a std::thread, __syncthreads and __syncwarp are barriers, a warp's
// shuffles and ballots go through an exchange between two warp barriers, static shared memory is
// one copy for the whole launch (the blocks run one after another), device memory is host memory
// (cudaMalloc, cudaMemcpy), and a WMMA fragment holds its whole 16 x 16 tile in every lane (loads
// and products computed by each lane, stores written by lane 0 between warp barriers, as the
// hardware's warp-wide operations order them). What it does not model: the hardware's order of
// the sums inside one product, memory ordering beyond the barriers, blocks running at once,
// streams (every launch runs to its end before it returns), and launch limits (shared memory
// size, registers). Include it before the kernels' source.
#pragma once

#define CHORUS_CUDA_EMULATION 1

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/cpu/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __align__(bytes) alignas(bytes)
#define __shared__ static  // one copy for the launch: its blocks run one after another

using std::max;
using std::min;  // as CUDA's device min and max; expf, logf and fmaxf are the C library's

struct EmulatedDim {
  constexpr EmulatedDim(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
  unsigned x, y, z;
};
using dim3 = EmulatedDim;
inline thread_local EmulatedDim threadIdx, blockIdx;
inline EmulatedDim blockDim, gridDim;

struct float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// The runtime: device memory is host memory, launches finish before they return, nothing fails.
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
constexpr cudaError_t cudaErrorInvalidValue = 1;
using cudaStream_t = void*;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  *p = static_cast<T*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));  // cudaMalloc's alignment
  return *p != nullptr ? cudaSuccess : 2;                                    // 2: cudaErrorMemoryAllocation
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) {
  std::memcpy(to, from, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cudaSuccess;  // launch limits are not modelled
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

// Rounded products and sums; kept apart only where the including test compiles with
// -ffp-contract=off (nn_emulated_test does), else a host with FMA may fuse them once inlined.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

inline float atomicAdd(float* p, float value) { return std::atomic_ref<float>(*p).fetch_add(value); }

namespace chorus::testing::emulation {

// One launch's threads: the block barrier, one barrier per warp, the shuffles' exchange and the
// dynamic shared memory (reused block after block).
struct Launch {
  explicit Launch(int threads, size_t sharedBytes)
      : block(threads), exchange(threads), shared(sharedBytes + 128, 0xcd) {
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  }
  std::barrier<> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<std::array<unsigned char, 16>> exchange;  // one value per thread, of up to 16 bytes
  std::vector<unsigned char> shared;
};
inline thread_local Launch* current = nullptr;

inline unsigned char* sharedBytes() {
  // 128-byte aligned, as the kernels declare it.
  const auto at = reinterpret_cast<uintptr_t>(current->shared.data());
  return current->shared.data() + ((128 - at % 128) % 128);
}

// kernel(args...) over the grid, `threads` threads per block with `sharedBytes` of dynamic shared
// memory: the threads are made once and go through the blocks in order, a block barrier between.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, EmulatedDim grid, int threads, size_t sharedBytes, Args... args) {
  Launch state(threads, sharedBytes);
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  gridDim = grid;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      current = &state;
      threadIdx = {static_cast<unsigned>(t), 0, 0};
      for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
          for (unsigned x = 0; x < grid.x; ++x) {
            blockIdx = {x, y, z};
            kernel(args...);
            state.block.arrive_and_wait();  // the block done before the next reuses shared memory
          }
        }
      }
    });
  }
  for (auto& thread : pool) thread.join();
}

}  // namespace chorus::testing::emulation

// kernels/cuda/grid.cuh's launch line, run here: the kernel (a template deduces its arguments from
// the call, as in a CUDA launch) over the grid, on host threads; the stream is only evaluated.
#define CHORUS_LAUNCH(kernel, grid, threads, sharedBytes, stream, ...) \
  (static_cast<void>(stream),                                          \
   ::chorus::testing::emulation::launch([=](auto... a) { kernel(a...); }, grid, threads, sharedBytes, __VA_ARGS__))

#define CHORUS_DYNAMIC_SHARED(name) unsigned char* name = ::chorus::testing::emulation::sharedBytes()

inline void __syncthreads() { chorus::testing::emulation::current->block.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  chorus::testing::emulation::current->warps[threadIdx.x / 32]->arrive_and_wait();
}
namespace chorus::testing::emulation {
// Lane `lane` of this thread's warp's x, once every lane of the warp has put its own x in the
// exchange (a warp barrier before the read, and one after it before the exchange is reused).
template <typename T>
T fromLane(T x, unsigned lane) {
  static_assert(sizeof(T) <= 16 && std::is_trivially_copyable_v<T>);
  std::memcpy(current->exchange[threadIdx.x].data(), &x, sizeof(T));
  __syncwarp();
  T other;
  std::memcpy(&other, current->exchange[threadIdx.x - threadIdx.x % 32 + lane % 32].data(), sizeof(T));
  __syncwarp();
  return other;
}
}  // namespace chorus::testing::emulation

template <typename T>
T __shfl_xor_sync(unsigned, T x, int laneMask) {
  return chorus::testing::emulation::fromLane(x, (threadIdx.x % 32) ^ static_cast<unsigned>(laneMask));
}
template <typename T>
T __shfl_sync(unsigned, T x, int srcLane) {
  return chorus::testing::emulation::fromLane(x, static_cast<unsigned>(srcLane));
}
// Bit l set where lane l of this thread's warp passed a true predicate.
inline unsigned __ballot_sync(unsigned, int predicate) {
  auto& exchange = chorus::testing::emulation::current->exchange;
  exchange[threadIdx.x][0] = predicate != 0;
  __syncwarp();
  const unsigned first = threadIdx.x - threadIdx.x % 32;
  unsigned ballot = 0;
  for (unsigned lane = 0; lane < 32; ++lane) ballot |= static_cast<unsigned>(exchange[first + lane][0]) << lane;
  __syncwarp();
  return ballot;
}
inline int __popc(unsigned x) { return std::popcount(x); }

// The 16-bit types, converted as the hardware's round-to-nearest-even conversions (half.h's).
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {chorus::kernels::floatToBfloat16(x)}; }
inline __half __float2half_rn(float x) { return {chorus::kernels::floatToHalf(x)}; }
inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t bits) { return {bits}; }
inline __half __ushort_as_half(uint16_t bits) { return {bits}; }
inline float __bfloat162float(__nv_bfloat16 x) { return chorus::kernels::bfloat16ToFloat(x.bits); }
inline float __half2float(__half x) { return chorus::kernels::halfToFloat(x.bits); }

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float widen(__nv_bfloat16 x) { return chorus::kernels::bfloat16ToFloat(x.bits); }
inline float widen(__half x) { return chorus::kernels::halfToFloat(x.bits); }

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only the 16 x 16 x 16 shape is emulated");
  float x[16][16];
};
using Accumulator = fragment<accumulator, 16, 16, 16, float>;

template <typename F>
void fill_fragment(F& f, float value) {
  for (auto& row : f.x) std::fill(std::begin(row), std::end(row), value);
}
template <typename Use, typename T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major>& f, const T* p, unsigned ld) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) f.x[i][j] = widen(p[i * ld + j]);
  }
}
template <typename Use, typename T>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major>& f, const T* p, unsigned ld) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) f.x[i][j] = widen(p[j * ld + i]);
  }
}
inline void load_matrix_sync(Accumulator& f, const float* p, unsigned ld, layout_t) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) f.x[i][j] = p[i * ld + j];
  }
}
inline void store_matrix_sync(float* p, const Accumulator& f, unsigned ld, layout_t) {
  __syncwarp();  // every lane has read what this overwrites
  if (threadIdx.x % 32 == 0) {
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) p[i * ld + j] = f.x[i][j];
    }
  }
  __syncwarp();
}
template <typename A, typename B>
void mma_sync(Accumulator& d, const A& a, const B& b, const Accumulator& c) {
  Accumulator r;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      float sum = c.x[i][j];
      for (int k = 0; k < 16; ++k) sum += a.x[i][k] * b.x[k][j];
      r.x[i][j] = sum;
    }
  }
  d = r;
}
}  // namespace nvcuda::wmma
