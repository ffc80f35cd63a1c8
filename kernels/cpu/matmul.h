// matmul.h: the linear layer (y = x W^T + b) forward and backward through BLAS (OpenBLAS here), and
// the BLAS thread count. Weights are laid out as PyTorch's nn.Linear: (out_features, in_features),
// row-major. Safe from any thread; BLAS itself may use the threads setBlasThreads allows.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/half.h"

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

// 16-bit products (mixed precision): operands in bf16 or fp16, every product and sum in fp32, the
// result in fp32 (a product of two 16-bit values is exact in fp32, so backends differ only in the
// order of the sums). Two backends:
//   kOneDnn: oneDNN's matmul, where the build has oneDNN and it has a kernel for the format on this
//     CPU (bf16 wants AVX-512; AVX-512 BF16 runs it natively);
//   kWidened: the operands widened to fp32 and multiplied by SGEMM: right everywhere, and slower
//     than SGEMM by the widening, so 16-bit compute pays off only where a 16-bit kernel exists.
enum class Gemm16Backend { kOneDnn, kWidened };
const char* gemm16BackendName(Gemm16Backend backend);  // "oneDNN", "widened to SGEMM"
// Whether the backend can multiply this format here (kWidened: always).
bool gemm16Supported(Float16 format, Gemm16Backend backend);
// The backend gemm16 picks for the format: oneDNN where supported, else widened.
Gemm16Backend gemm16Backend(Float16 format);
// e.g. "bf16 products: oneDNN 2.6.3 (avx512_core_bf16)" or "... widened to SGEMM (oneDNN has no bf16 kernel
// for this CPU)".
std::string gemm16Description(Float16 format);

// gemm with 16-bit A and B (row-major, leading dimensions in elements), fp32 C. A shape the
// oneDNN backend refuses is done widened.
void gemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a, int lda,
            const uint16_t* b, int ldb, float beta, float* c, int ldc);
void gemm16With(Gemm16Backend backend, Float16 format, bool transA, bool transB, int m, int n, int k, float alpha,
                const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc);

// matmulForward / matmulBackward with 16-bit inputs and weights; out, the bias and every gradient
// are fp32. Backward casts dout to the format for the two products (dbias sums the fp32 dout).
void matmulForward16(Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int n,
                     int c, int oc);
void matmulBackward16(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                      const uint16_t* weight, int n, int c, int oc);

// The same products from fp32 operands, cast to the format on the way in: for layers that keep
// their activations in fp32 yet compute in 16 bits (the MoE experts).
void matmulForwardAs(Float16 format, float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                     int oc);
void matmulBackwardAs(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int n, int c, int oc);

// Threads BLAS (and oneDNN) may use for one call (OpenBLAS: openblas_set_num_threads; oneDNN:
// its OpenMP threads), and what BLAS reports.
void setBlasThreads(int threads);
int blasThreads();
// Subnormal floats flushed to zero (x86: MXCSR's FTZ and DAZ) in the calling thread's arithmetic,
// and in the threads it starts afterwards, or not (the IEEE default). On x86, SGEMM and the
// other kernels run many times slower on subnormal operands (microcode assists): a run whose
// softmax underflows into the subnormal range (logits pushed far apart) slows down step by step.
// Values that small change no result that matters in training (PyTorch: torch.set_flush_denormal).
// A no-op elsewhere.
void setFlushDenormals(bool on);
// The BLAS library and the kernels it chose for this CPU, e.g. "OpenBLAS 0.3.21 SkylakeX".
std::string blasDescription();
// The kernel set OpenBLAS runs here, as it names it ("SkylakeX", "Prescott", ...).
std::string blasCore();

// OpenBLAS picks its kernels by the CPU's model number and takes a CPU it does not know (a virtual
// machine's "Intel Xeon Processor" with AVX-512, a newer model) for a pre-AVX2 one: 0.3.21 runs
// "Prescott", its SSE3 kernels, where SkylakeX's are 4-5x faster at SGEMM. The kernel set such a
// CPU should run (an OPENBLAS_CORETYPE name) given the one OpenBLAS chose and what the CPU has:
// "SkylakeX" with AVX-512 F, BW, DQ and VL, else "Haswell" with AVX2 and FMA; "" where OpenBLAS's
// choice already uses AVX2 or the CPU has neither.
std::string betterBlasCoreFor(const std::string& chosen, bool avx2Fma, bool avx512);
// The same for this process's OpenBLAS and CPU.
std::string betterBlasCore();
// OpenBLAS reads OPENBLAS_CORETYPE once, as it loads: makes this program run `core` by setting the
// variable and executing itself again with `argv` (the same arguments) where the environment does
// not already say `core`. Returns when nothing had to change; throws if the program cannot be
// executed again.
void runWithBlasCore(const std::string& core, char** argv);

}  // namespace chorus::kernels
