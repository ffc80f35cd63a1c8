// matmul.cu: the linear layer's products through cuBLAS. cuBLAS is column-major; a row-major
// (m, n) matrix with leading dimension ld is, read column-major, its (n, m) transpose with the same
// ld, so the row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T:
// the operands swap places and keep their transposition flags.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/nn.h"
#include "kernels/cuda/reduce.h"

namespace chorus::kernels::cuda {
namespace {

std::atomic<bool> allowTf32{false};

int cublasCode(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS ? 0 : kCublasError + status; }

// This thread's handle for the current device, set to the stream and the math mode of the call.
int handleFor(void* stream, cublasHandle_t* handle) {
  // Handles live as long as the thread (cuBLAS frees what they hold when the process ends).
  thread_local std::map<int, cublasHandle_t> handles;
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device)) return static_cast<int>(error);
  auto it = handles.find(device);
  if (it == handles.end()) {
    cublasHandle_t made = nullptr;
    if (const int code = cublasCode(cublasCreate(&made))) return code;
    it = handles.emplace(device, made).first;
  }
  *handle = it->second;
  if (const int code = cublasCode(cublasSetStream(*handle, asStream(stream)))) return code;
  return 0;
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }
cudaDataType_t typeOf(Float16 format) { return format == Float16::kBf16 ? CUDA_R_16BF : CUDA_R_16F; }

// C = alpha op(A) op(B) + beta C, row-major, A and B of `type`, C fp32.
int gemmAny(cudaDataType_t type, cublasComputeType_t compute, bool transA, bool transB, int m, int n, int k,
            float alpha, const void* a, int lda, const void* b, int ldb, float beta, float* c, int ldc, void* stream) {
  if (m == 0 || n == 0) return 0;
  cublasHandle_t handle = nullptr;
  if (const int error = handleFor(stream, &handle)) return error;
  return cublasCode(cublasGemmEx(handle, op(transB), op(transA), n, m, k, &alpha, b, type, ldb, a, type, lda, &beta, c,
                                 CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

// out(n, oc) = bias broadcast over the rows, before a product adds into it.
__global__ void broadcastRowsKernel(float* out, const float* bias, int n, int oc) {
  const size_t count = static_cast<size_t>(n) * oc;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = bias[i % oc];
  }
}

// beta for the product: 1 after the bias was broadcast into out, else 0.
int startWithBias(float* out, const float* bias, int n, int oc, void* stream, float* beta) {
  *beta = 0.0f;
  if (bias == nullptr || n == 0) return 0;
  CHORUS_LAUNCH(broadcastRowsKernel, blocksFor(static_cast<size_t>(n) * oc), kThreads, 0, asStream(stream), out, bias,
                n, oc);
  *beta = 1.0f;
  return launched();
}

// Bytes of dout rounded to 16 bits at the start of matmulBackward16's scratch (256-byte aligned).
size_t halfBytes(int n, int oc) { return (static_cast<size_t>(n) * oc * sizeof(uint16_t) + 255) / 256 * 256; }

}  // namespace

std::string errorName(int code) {
  if (code >= kCublasError) {
    return cublasGetStatusName(static_cast<cublasStatus_t>(code - kCublasError));
  }
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}

void setTf32(bool allowed) { allowTf32.store(allowed); }
bool tf32() { return allowTf32.load(); }

int gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
         float beta, float* c, int ldc, void* stream) {
  return gemmAny(CUDA_R_32F, tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, transA, transB, m, n, k, alpha,
                 a, lda, b, ldb, beta, c, ldc, stream);
}

int gemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a, int lda,
           const uint16_t* b, int ldb, float beta, float* c, int ldc, void* stream) {
  return gemmAny(typeOf(format), CUBLAS_COMPUTE_32F, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                 stream);
}

int matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc,
                  void* stream) {
  float beta = 0.0f;
  if (const int error = startWithBias(out, bias, n, oc, stream, &beta)) return error;
  return gemm(false, true, n, oc, c, 1.0f, inp, c, weight, c, beta, out, oc, stream);
}

size_t matmulBackwardScratchBytes(int n, int oc) { return columnSumsScratchFloats(n, oc) * sizeof(float); }

int matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                   int n, int c, int oc, void* scratch, void* stream) {
  if (dinp) {
    if (const int error = gemm(false, false, n, c, oc, 1.0f, dout, oc, weight, c, 1.0f, dinp, c, stream)) return error;
  }
  if (dweight) {
    if (const int error = gemm(true, false, oc, c, n, 1.0f, dout, oc, inp, c, 1.0f, dweight, c, stream)) return error;
  }
  if (dbias) return columnSums(dbias, dout, n, oc, static_cast<float*>(scratch), stream);
  return 0;
}

int matmulForward16(Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int n,
                    int c, int oc, void* stream) {
  float beta = 0.0f;
  if (const int error = startWithBias(out, bias, n, oc, stream, &beta)) return error;
  return gemm16(format, false, true, n, oc, c, 1.0f, inp, c, weight, c, beta, out, oc, stream);
}

size_t matmulBackward16ScratchBytes(int n, int oc) {
  // dout in 16 bits, then the bias's column sums.
  return halfBytes(n, oc) + matmulBackwardScratchBytes(n, oc);
}

int matmulBackward16Rounded(Float16 format, float* dinp, float* dweight, const uint16_t* dout16, const uint16_t* inp,
                            const uint16_t* weight, int n, int c, int oc, void* stream) {
  if (dinp) {
    if (const int error = gemm16(format, false, false, n, c, oc, 1.0f, dout16, oc, weight, c, 1.0f, dinp, c, stream)) {
      return error;
    }
  }
  if (dweight) {
    return gemm16(format, true, false, oc, c, n, 1.0f, dout16, oc, inp, c, 1.0f, dweight, c, stream);
  }
  return 0;
}

int matmulBackward16(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                     const uint16_t* weight, int n, int c, int oc, void* scratch, void* stream) {
  auto* dout16 = static_cast<uint16_t*>(scratch);
  if (dinp || dweight) {
    const chorusDataType_t type = format == Float16::kBf16 ? chorusBfloat16 : chorusFloat16;
    if (const int error = cast(dout16, type, dout, chorusFloat32, static_cast<size_t>(n) * oc, stream)) return error;
  }
  if (const int error = matmulBackward16Rounded(format, dinp, dweight, dout16, inp, weight, n, c, oc, stream)) {
    return error;
  }
  if (dbias)
    return columnSums(dbias, dout, n, oc, reinterpret_cast<float*>(static_cast<char*>(scratch) + halfBytes(n, oc)),
                      stream);
  return 0;
}

}  // namespace chorus::kernels::cuda
