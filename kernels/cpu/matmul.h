// matmul.h: the linear layer (y = x W^T + b) forward and backward through BLAS (OpenBLAS here), and
// the BLAS thread count. Weights are laid out as PyTorch's nn.Linear: (out_features, in_features),
// row-major. Safe from any thread; BLAS itself may use the threads setBlasThreads allows.
#pragma once

#include <string>

namespace chorus::kernels {

// out(n, oc) = inp(n, c) . weight(oc, c)^T + bias(oc). bias may be null (no bias). out must not
// overlap inp or weight.
void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc);

// The gradients of matmulForward, accumulated (+=) into what the caller passes:
//   dinp(n, c) += dout(n, oc) . weight(oc, c)
//   dweight(oc, c) += dout^T . inp(n, c)
//   dbias(oc) += sum over rows of dout
// Any of dinp, dweight, dbias may be null (not wanted).
void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int n, int c, int oc);

// C(m, n) = alpha * op(A) . op(B) + beta * C, row-major, with leading dimensions: the one GEMM entry
// the other kernels (attention) use, so that BLAS is named in one file.
void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc);

// Threads BLAS may use for one call (OpenBLAS: openblas_set_num_threads), and what it reports.
void setBlasThreads(int threads);
int blasThreads();
// The BLAS library and the kernels it chose for this CPU, e.g. "OpenBLAS 0.3.21 SkylakeX".
std::string blasDescription();

}  // namespace chorus::kernels
