// cublas_v2.h, emulated on the host: the part of cuBLAS that kernels/cuda/matmul.cu calls
// (cublasGemmEx with fp32, bf16 or fp16 operands and an fp32 result), for targets built against
// tests/support/cuda_emulation.h (this folder first on their include path). The product is summed
// in double and rounded once; TF32 compute rounds each operand to TF32's 10-bit mantissa first,
// as the tensor cores read it. The operands' pointers must be device memory, as on a GPU.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "tests/support/cuda_emulation.h"

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
struct EmulatedCublas {
  cudaStream_t stream = nullptr;
};
using cublasHandle_t = EmulatedCublas*;

// Handles are kept for the whole process (matmul.cu keeps one per thread and device, never
// destroyed: cuBLAS frees them at exit), reachable, so a leak check does not count them.
inline cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  static std::mutex mutex;
  static auto* handles = new std::deque<EmulatedCublas>;
  std::lock_guard<std::mutex> lock(mutex);
  *handle = &handles->emplace_back();
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
inline const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
}

namespace chorus::testing::emulation {
// Element i of an operand of `type` at p, as the product reads it.
inline double gemmOperand(cudaDataType_t type, const void* p, size_t i, bool tf32) {
  switch (type) {
    case CUDA_R_16BF:
      return chorus::kernels::bfloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case CUDA_R_16F:
      return chorus::kernels::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    default: {
      float x = static_cast<const float*>(p)[i];
      if (tf32) {  // round to nearest even at the 13 bits TF32 drops
        uint32_t bits = std::bit_cast<uint32_t>(x);
        if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0xfffu + ((bits >> 13) & 1u)) & ~0x1fffu;
        x = std::bit_cast<float>(bits);
      }
      return x;
    }
  }
}
}  // namespace chorus::testing::emulation

// Column-major C(m, n) = alpha op(A)(m, k) op(B)(k, n) + beta C (C not read where beta is 0).
inline cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transA, cublasOperation_t transB, int m,
                                   int n, int k, const void* alpha, const void* a, cudaDataType_t aType, int lda,
                                   const void* b, cudaDataType_t bType, int ldb, const void* beta, void* c,
                                   cudaDataType_t cType, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t) {
  namespace emu = chorus::testing::emulation;
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || cType != CUDA_R_32F || aType != bType) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < std::max(1, transA == CUBLAS_OP_N ? m : k) || ldb < std::max(1, transB == CUBLAS_OP_N ? k : n) ||
      ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  for (const void* p : {a, b, static_cast<const void*>(c)}) {
    if (!emu::onDevice(p)) {
      emu::fail(cudaErrorIllegalAddress, "cublasGemmEx", p);
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  const bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const double al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // op(A) row by row and op(B) column by column, widened, so each element of C is one dot product
  // of two contiguous rows.
  std::vector<double> rowsA(static_cast<size_t>(m) * k), colsB(static_cast<size_t>(n) * k);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      const size_t at = transA == CUBLAS_OP_N ? i + static_cast<size_t>(p) * lda : p + static_cast<size_t>(i) * lda;
      rowsA[static_cast<size_t>(i) * k + p] = emu::gemmOperand(aType, a, at, tf32);
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int p = 0; p < k; ++p) {
      const size_t at = transB == CUBLAS_OP_N ? p + static_cast<size_t>(j) * ldb : j + static_cast<size_t>(p) * ldb;
      colsB[static_cast<size_t>(j) * k + p] = emu::gemmOperand(bType, b, at, tf32);
    }
  }
  auto* out = static_cast<float*>(c);
  // Up to four columns of C at a time: their sums in flight together, each still in order p = 0, 1, ...
  constexpr int kColumns = 4;
  for (int j = 0; j < n; j += kColumns) {
    const int columns = std::min(kColumns, n - j);
    const double* bj = colsB.data() + static_cast<size_t>(j) * k;
    for (int i = 0; i < m; ++i) {
      const double* ai = rowsA.data() + static_cast<size_t>(i) * k;
      double sum[kColumns] = {};
      for (int p = 0; p < k; ++p) {
        for (int q = 0; q < columns; ++q) sum[q] += ai[p] * bj[static_cast<size_t>(q) * k + p];
      }
      for (int q = 0; q < columns; ++q) {
        float& cij = out[i + static_cast<size_t>(j + q) * ldc];
        cij = static_cast<float>(be == 0.0 ? al * sum[q] : al * sum[q] + be * cij);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}
