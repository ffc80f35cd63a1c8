// cuda_emulation.h: the small part of CUDA that kernels/cuda/attention_tc.cuh's kernels are
// written against, emulated on the host, so that the same kernel source runs (slowly) where there
// is no GPU: every CUDA thread of a block is a std::thread, __syncthreads and __syncwarp are
// barriers, a warp's shuffles go through an exchange between two warp barriers, and a WMMA fragment
// holds its whole 16 x 16 tile in every lane (loads and products computed by each lane, stores
// written by lane 0 between warp barriers, as the hardware's warp-wide operations order them).
// What it does not model: the hardware's order of the sums inside one product, memory ordering
// beyond the barriers, and launch limits (shared memory size, registers). Include it before the
// kernels' header.
#pragma once

#define CHORUS_CUDA_EMULATION 1

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/cpu/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __align__(bytes) alignas(bytes)

using std::max;
using std::min;  // as CUDA's device min and max; expf, logf and fmaxf are the C library's

struct EmulatedDim {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmulatedDim threadIdx, blockIdx;
inline EmulatedDim blockDim, gridDim;

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
  std::vector<float> exchange;
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

#define CHORUS_DYNAMIC_SHARED(name) unsigned char* name = ::chorus::testing::emulation::sharedBytes()

inline void __syncthreads() { chorus::testing::emulation::current->block.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  chorus::testing::emulation::current->warps[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float x, int laneMask) {
  auto& exchange = chorus::testing::emulation::current->exchange;
  exchange[threadIdx.x] = x;
  __syncwarp();
  const unsigned lane = threadIdx.x % 32;
  const float other = exchange[threadIdx.x - lane + (lane ^ static_cast<unsigned>(laneMask))];
  __syncwarp();
  return other;
}

// The 16-bit types, converted as the hardware's round-to-nearest-even conversions (half.h's).
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {chorus::kernels::floatToBfloat16(x)}; }
inline __half __float2half_rn(float x) { return {chorus::kernels::floatToHalf(x)}; }

// block.cuh's warp and block pieces.
namespace chorus::kernels::cuda {
constexpr int kWarp = 32;
inline float warpSum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
inline float warpMax(float x) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
}  // namespace chorus::kernels::cuda

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
