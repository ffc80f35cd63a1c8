// matmul.h (CUDA): the linear layer and the GEMM entries of kernels/cpu/matmul.h on device memory,
// through cuBLAS: fp32 products (TF32 tensor cores when allowed by setTf32), and 16-bit products
// (bf16 or fp16 operands, fp32 accumulation and result). Host code includes this header; it holds
// no CUDA runtime types. Each calling thread gets its own cuBLAS handle per device, set to
// `stream` (a cudaStream_t; null: the default stream) for each call; nothing waits for the GPU.
// Returns 0, a cudaError_t, or kCublasError + a cublasStatus_t (errorName names each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu/half.h"

namespace chorus::kernels::cuda {

constexpr int kCublasError = 100000;
// "cudaErrorInvalidValue", "CUBLAS_STATUS_NOT_SUPPORTED", ...
std::string errorName(int code);

// Whether fp32 products may use TF32 tensor cores (10-bit mantissas in the products, fp32 sums), as
// torch.backends.cuda.matmul.allow_tf32. Off by default. Process-wide.
void setTf32(bool allowed);
bool tf32();

// As kernels::gemm: C(m, n) = alpha op(A) op(B) + beta C, row-major with leading dimensions.
int gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
         float beta, float* c, int ldc, void* stream);
// As kernels::gemm16: 16-bit A and B, fp32 C.
int gemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a, int lda,
           const uint16_t* b, int ldb, float beta, float* c, int ldc, void* stream);

// As kernels::matmulForward: out(n, oc) = inp(n, c) weight(oc, c)^T + bias(oc); bias may be null.
int matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc,
                  void* stream);
// As kernels::matmulBackward (each gradient added into; any may be null). dbias's column sums go
// through scratch (matmulBackwardScratchBytes(n, oc)), in a fixed order.
size_t matmulBackwardScratchBytes(int n, int oc);
int matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                   int n, int c, int oc, void* scratch, void* stream);
// The same with 16-bit inputs and weights (kernels::matmulForward16 / matmulBackward16): backward
// rounds dout to the format (in scratch, matmulBackward16ScratchBytes(n, oc)) for its products.
int matmulForward16(Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int n,
                    int c, int oc, void* stream);
size_t matmulBackward16ScratchBytes(int n, int oc);
int matmulBackward16(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                     const uint16_t* weight, int n, int c, int oc, void* scratch, void* stream);
// matmulBackward16's products from dout already rounded to the format (dout16), with no bias.
int matmulBackward16Rounded(Float16 format, float* dinp, float* dweight, const uint16_t* dout16, const uint16_t* inp,
                            const uint16_t* weight, int n, int c, int oc, void* stream);

}  // namespace chorus::kernels::cuda
