// mma.cuh: the warp's tensor-core product on registers (PTX mma.sync m16n8k16: 16-bit a and b,
// fp32 accumulation), its operands' registers loaded from shared memory, and an fp32 accumulator
// turned into the next product's a operand. The layout of a lane's registers is PTX's ("Matrix
// fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4; a word holds two 16-bit
// elements, the lower-numbered in its low half:
//   a (16 x 16): a[0] row g, columns 2t, 2t+1; a[1] row g+8, the same; a[2] and a[3] those rows
//                at columns 2t+8, 2t+9
//   b (16 x 8):  b[0] rows 2t, 2t+1 of column g; b[1] rows 2t+8, 2t+9
//   c (16 x 8, fp32): c[0], c[1] row g, columns 2t, 2t+1; c[2], c[3] row g+8
// Under tests/support/cuda_emulation.h (CHORUS_CUDA_EMULATION) the product and the word load are
// the emulation's (CHORUS_WARP_MMA_M16N8K16, CHORUS_SHARED_WORD, as CHORUS_LAUNCH is): it reads
// every lane's registers by that same layout.
#pragma once

#ifndef CHORUS_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <type_traits>

namespace chorus::kernels::cuda::mma {

// d += a b over the warp (every lane calls it, with the same T). T: __nv_bfloat16 or __half.
template <typename T>
__device__ inline void product(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
#ifdef CHORUS_CUDA_EMULATION
  CHORUS_WARP_MMA_M16N8K16(d, a, b, (std::is_same_v<T, __nv_bfloat16>));
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// The two 16-bit elements at p (4-byte aligned) as one word.
template <typename T>
__device__ inline uint32_t wordAt(const T* p) {
#ifdef CHORUS_CUDA_EMULATION
  return CHORUS_SHARED_WORD(p);
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

__device__ inline uint16_t bitsOf(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ inline uint16_t bitsOf(__half x) { return __half_as_ushort(x); }

// lo and hi rounded to T (to nearest even), as one word.
template <typename T>
__device__ inline uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return bitsOf(__float2bfloat16_rn(lo)) | static_cast<uint32_t>(bitsOf(__float2bfloat16_rn(hi))) << 16;
  } else {
    return bitsOf(__float2half_rn(lo)) | static_cast<uint32_t>(bitsOf(__float2half_rn(hi))) << 16;
  }
}

// a: rows row0 .. row0+15, columns col0 .. col0+15 of a row-major tile (pitch even, col0 even).
template <typename T>
__device__ inline void loadA(uint32_t a[4], const T* tile, int pitch, int row0, int col0) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const T* at = tile + (row0 + g) * pitch + col0 + 2 * t;
  a[0] = wordAt(at);
  a[1] = wordAt(at + 8 * pitch);
  a[2] = wordAt(at + 8);
  a[3] = wordAt(at + 8 * pitch + 8);
}

// b: the 16 x 8 block whose column n is row n0+n of a row-major tile, from its column k0 on (b is
// that tile's transpose: rows of k consecutive in memory).
template <typename T>
__device__ inline void loadB(uint32_t b[2], const T* tile, int pitch, int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const T* at = tile + (n0 + g) * pitch + k0 + 2 * t;
  b[0] = wordAt(at);
  b[1] = wordAt(at + 8);
}

// The a operand (16 x 16, rounded to T) of two accumulators side by side: left columns 0-7,
// right 8-15 (a product's result feeding the next product, as the probabilities do P V).
template <typename T>
__device__ inline void accumulatorsAsA(uint32_t a[4], const float left[4], const float right[4]) {
  a[0] = pack<T>(left[0], left[1]);
  a[1] = pack<T>(left[2], left[3]);
  a[2] = pack<T>(right[0], right[1]);
  a[3] = pack<T>(right[2], right[3]);
}

}  // namespace chorus::kernels::cuda::mma
