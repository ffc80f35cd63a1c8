// matmul.cc: the linear layer through OpenBLAS's CBLAS.
#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <string>

namespace chorus::kernels {

void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
}

void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc) {
  // out = inp . weight^T, then the bias on every row.
  gemm(false, true, n, oc, c, 1.0f, inp, c, weight, c, 0.0f, out, oc);
  if (bias == nullptr) return;
  for (int row = 0; row < n; ++row) {
    float* o = out + static_cast<size_t>(row) * oc;
    for (int j = 0; j < oc; ++j) o[j] += bias[j];
  }
}

void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int n, int c, int oc) {
  if (dinp != nullptr) gemm(false, false, n, c, oc, 1.0f, dout, oc, weight, c, 1.0f, dinp, c);
  if (dweight != nullptr) gemm(true, false, oc, c, n, 1.0f, dout, oc, inp, c, 1.0f, dweight, c);
  if (dbias != nullptr) {
    for (int row = 0; row < n; ++row) {
      const float* d = dout + static_cast<size_t>(row) * oc;
      for (int j = 0; j < oc; ++j) dbias[j] += d[j];
    }
  }
}

void setBlasThreads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

int blasThreads() { return openblas_get_num_threads(); }

std::string blasDescription() {
  std::string config = openblas_get_config();
  // The config string starts "OpenBLAS 0.3.21 ..."; keep the name and version, then the core.
  const auto second = config.find(' ', config.find(' ') + 1);
  return config.substr(0, second) + " " + openblas_get_corename();
}

}  // namespace chorus::kernels
