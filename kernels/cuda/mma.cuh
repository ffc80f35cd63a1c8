// mma.cuh: the warp's tensor-core product on registers (PTX mma.sync m16n8k16: 16-bit a and b,
// fp32 accumulation), its operands' registers loaded from shared memory by ldmatrix, and an fp32
// accumulator turned into the next product's a operand. The layout of a lane's registers is PTX's
// ("Matrix fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4; a word holds two
// 16-bit elements, the lower-numbered in its low half:
//   a (16 x 16): a[0] row g, columns 2t, 2t+1; a[1] row g+8, the same; a[2] and a[3] those rows
//                at columns 2t+8, 2t+9
//   b (16 x 8):  b[0] rows 2t, 2t+1 of column g; b[1] rows 2t+8, 2t+9
//   c (16 x 8, fp32): c[0], c[1] row g, columns 2t, 2t+1; c[2], c[3] row g+8
// ldmatrix (m8n8, .x2 or .x4, 16-bit) loads 8 x 8 matrices whose rows are 16 bytes each, 16-byte
// aligned: lane 8m + r gives the address of row r of matrix m, and register m of lane 4r + w gets
// elements 2w, 2w+1 of that matrix's row r (with .trans: of its column r, elements of rows 2w,
// 2w+1). So one instruction loads a whole a (four matrices) or the b of two pieces, where 4-byte
// loads took one instruction a register, and .trans reads b from a tile stored along n (V in P V)
// as it is, with no transposed copy.
// Under tests/support/cuda_emulation.h (CHORUS_CUDA_EMULATION) the product and the matrix load
// are the emulation's (CHORUS_WARP_MMA_M16N8K16, CHORUS_LOAD_MATRICES, as CHORUS_LAUNCH is): it
// reads every lane's registers and addresses by that same layout.
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

// kCount 8 x 8 matrices of 16-bit elements (kCount 2 or 4; kTrans: each transposed), this lane
// giving the address of one row (16 bytes, 16-byte aligned, in shared memory), into r[0 .. kCount).
template <int kCount, bool kTrans>
__device__ inline void loadMatrices(uint32_t (&r)[kCount], const void* row) {
  static_assert(kCount == 2 || kCount == 4);
#ifdef CHORUS_CUDA_EMULATION
  CHORUS_LOAD_MATRICES(r, row, kTrans);
#else
  const auto at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kCount == 4 && kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  } else if constexpr (kCount == 4) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  } else if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  }
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

// Tiles are row-major with a pitch (in elements) that keeps rows 16-byte aligned (a multiple of 8),
// and every row and column offset below is a multiple of 8.

// a: rows row0 .. row0+15, columns col0 .. col0+15 of a tile (matrices: rows 0-7 then 8-15 of
// columns 0-7, then of columns 8-15).
template <typename T>
__device__ inline void loadA(uint32_t a[4], const T* tile, int pitch, int row0, int col0) {
  const int lane = threadIdx.x % 32;
  uint32_t r[4];
  loadMatrices<4, false>(r, tile + (row0 + (lane & 15)) * pitch + col0 + (lane >> 4) * 8);
  for (int i = 0; i < 4; ++i) a[i] = r[i];
}

// b: the 16 x 8 block whose column n is row n0+n of a tile, from its column k0 on (b is that
// tile's transpose: K for Q K^T).
template <typename T>
__device__ inline void loadB(uint32_t b[2], const T* tile, int pitch, int n0, int k0) {
  const int lane = threadIdx.x % 32;  // lanes 16-31 repeat 0-15's addresses (.x2 reads 0-15's)
  uint32_t r[2];
  loadMatrices<2, false>(r, tile + (n0 + (lane & 7)) * pitch + k0 + ((lane >> 3) & 1) * 8);
  b[0] = r[0];
  b[1] = r[1];
}

// The b of two pieces side by side, columns n0 .. n0+7 (b0) and n0+8 .. n0+15 (b1), rows k0 ..
// k0+15: as loadB at n0 and n0+8 (a tile whose row n is b's column n: K for Q K^T), or, kTrans, of
// a tile that is b itself (row k is b's row k: V for P V), read transposed.
template <bool kTrans, typename T>
__device__ inline void loadBPair(uint32_t b0[2], uint32_t b1[2], const T* tile, int pitch, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  // Lane 8m + i: row i of matrix m, the matrices at (n0, k0), (n0, k0+8), (n0+8, k0), (n0+8, k0+8).
  const int n = n0 + (lane >> 4) * 8, k = k0 + ((lane >> 3) & 1) * 8, i = lane & 7;
  uint32_t r[4];
  loadMatrices<4, kTrans>(r, kTrans ? tile + (k + i) * pitch + n : tile + (n + i) * pitch + k);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
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
