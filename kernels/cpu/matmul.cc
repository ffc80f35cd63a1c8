// matmul.cc: the linear layer through OpenBLAS's CBLAS, and 16-bit products through oneDNN (when
// built with it) or widened to SGEMM.
#include "kernels/cpu/matmul.h"

#include <cblas.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef CHORUS_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace chorus::kernels {

namespace {

void addBiasRows(float* out, const float* bias, int n, int oc) {
  for (int row = 0; row < n; ++row) {
    float* o = out + static_cast<size_t>(row) * oc;
    for (int j = 0; j < oc; ++j) o[j] += bias[j];
  }
}

void sumRowsInto(float* dbias, const float* dout, int n, int oc) {
  for (int row = 0; row < n; ++row) {
    const float* d = dout + static_cast<size_t>(row) * oc;
    for (int j = 0; j < oc; ++j) dbias[j] += d[j];
  }
}

// The elements of an op(X) of rows x cols stored row-major with leading dimension ld.
size_t storedElements(bool trans, int rows, int cols, int ld) {
  const int storedRows = trans ? cols : rows, storedCols = trans ? rows : cols;
  if (storedRows == 0 || storedCols == 0) return 0;
  return static_cast<size_t>(storedRows - 1) * ld + storedCols;
}

#ifdef CHORUS_HAVE_DNNL
// One oneDNN matmul per (format, shape, layout, alpha, beta), made on first use by each thread (a
// primitive is cheap to run and dear to make); nullopt where oneDNN has no kernel for it.
using DnnlKey = std::tuple<int, bool, bool, int, int, int, int, int, int, float, float>;

dnnl::engine& dnnlEngine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

struct DnnlMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

std::optional<DnnlMatmul>& dnnlMatmul(const DnnlKey& key) {
  thread_local std::map<DnnlKey, std::optional<DnnlMatmul>> made;
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const auto [format, transA, transB, m, n, k, lda, ldb, ldc, alpha, beta] = key;
  using dt = dnnl::memory::data_type;
  const dt half = format == static_cast<int>(Float16::kBf16) ? dt::bf16 : dt::f16;
  // Transposition is a matter of strides: op(A)(i, l) lives at a[i lda + l], or a[l lda + i] transposed.
  const dnnl::memory::desc a({m, k}, half, transA ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b({k, n}, half, transB ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops post;
    post.append_sum(beta);
    attr.set_post_ops(post);
  }
  std::optional<DnnlMatmul> primitive;
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, dnnlEngine());
    primitive.emplace(DnnlMatmul{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error&) {
    // No kernel for this format, shape or layout on this CPU: the caller widens.
  }
  return made.emplace(key, std::move(primitive)).first->second;
}

bool dnnlGemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a, int lda,
                const uint16_t* b, int ldb, float beta, float* c, int ldc) {
  auto& made = dnnlMatmul({static_cast<int>(format), transA, transB, m, n, k, lda, ldb, ldc, alpha, beta});
  if (!made) return false;
  thread_local dnnl::stream stream(dnnlEngine());
  const auto& pd = made->pd;
  // oneDNN takes non-const handles; it only reads the sources.
  dnnl::memory am(pd.src_desc(), dnnlEngine(), const_cast<uint16_t*>(a));
  dnnl::memory bm(pd.weights_desc(), dnnlEngine(), const_cast<uint16_t*>(b));
  dnnl::memory cm(pd.dst_desc(), dnnlEngine(), c);
  made->primitive.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
  return true;
}
#endif

void widenedGemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a,
                   int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc) {
  thread_local std::vector<float> wideA, wideB;
  const size_t na = storedElements(transA, m, k, lda), nb = storedElements(transB, k, n, ldb);
  wideA.resize(na);
  wideB.resize(nb);
  fromFloat16(format, a, wideA.data(), na);
  fromFloat16(format, b, wideB.data(), nb);
  gemm(transA, transB, m, n, k, alpha, wideA.data(), lda, wideB.data(), ldb, beta, c, ldc);
}

}  // namespace

void gemm(bool transA, bool transB, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
          float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
}

void matmulForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c, int oc) {
  // out = inp . weight^T, then the bias on every row.
  gemm(false, true, n, oc, c, 1.0f, inp, c, weight, c, 0.0f, out, oc);
  if (bias != nullptr) addBiasRows(out, bias, n, oc);
}

void matmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight,
                    int n, int c, int oc) {
  if (dinp != nullptr) gemm(false, false, n, c, oc, 1.0f, dout, oc, weight, c, 1.0f, dinp, c);
  if (dweight != nullptr) gemm(true, false, oc, c, n, 1.0f, dout, oc, inp, c, 1.0f, dweight, c);
  if (dbias != nullptr) sumRowsInto(dbias, dout, n, oc);
}

const char* gemm16BackendName(Gemm16Backend backend) {
  return backend == Gemm16Backend::kOneDnn ? "oneDNN" : "widened to SGEMM";
}

bool gemm16Supported(Float16 format, Gemm16Backend backend) {
  if (backend == Gemm16Backend::kWidened) return true;
#ifdef CHORUS_HAVE_DNNL
  // Probed once per format on a small plain product.
  static const bool supported[2] = {
      dnnlMatmul({static_cast<int>(Float16::kBf16), false, false, 16, 16, 16, 16, 16, 16, 1.0f, 0.0f}).has_value(),
      dnnlMatmul({static_cast<int>(Float16::kFp16), false, false, 16, 16, 16, 16, 16, 16, 1.0f, 0.0f}).has_value()};
  return supported[static_cast<int>(format)];
#else
  (void)format;
  return false;
#endif
}

Gemm16Backend gemm16Backend(Float16 format) {
  return gemm16Supported(format, Gemm16Backend::kOneDnn) ? Gemm16Backend::kOneDnn : Gemm16Backend::kWidened;
}

std::string gemm16Description(Float16 format) {
  std::string text = std::string(float16Name(format)) + " products: ";
#ifdef CHORUS_HAVE_DNNL
  const dnnl_version_t* v = dnnl_version();
  const std::string onednn =
      "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  if (gemm16Backend(format) == Gemm16Backend::kOneDnn) return text + onednn;
  return text + "widened to SGEMM (" + onednn + " has no " + float16Name(format) + " kernel for this CPU)";
#else
  return text + "widened to SGEMM (built without oneDNN)";
#endif
}

void gemm16With(Gemm16Backend backend, Float16 format, bool transA, bool transB, int m, int n, int k, float alpha,
                const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
#ifdef CHORUS_HAVE_DNNL
  if (backend == Gemm16Backend::kOneDnn && k > 0 &&
      dnnlGemm16(format, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
    return;
  }
#else
  (void)backend;
#endif
  widenedGemm16(format, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm16(Float16 format, bool transA, bool transB, int m, int n, int k, float alpha, const uint16_t* a, int lda,
            const uint16_t* b, int ldb, float beta, float* c, int ldc) {
  static const Gemm16Backend backend[2] = {gemm16Backend(Float16::kBf16), gemm16Backend(Float16::kFp16)};
  gemm16With(backend[static_cast<int>(format)], format, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void matmulForward16(Float16 format, float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int n,
                     int c, int oc) {
  gemm16(format, false, true, n, oc, c, 1.0f, inp, c, weight, c, 0.0f, out, oc);
  if (bias != nullptr) addBiasRows(out, bias, n, oc);
}

void matmulBackward16(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const uint16_t* inp,
                      const uint16_t* weight, int n, int c, int oc) {
  if (dinp != nullptr || dweight != nullptr) {
    thread_local std::vector<uint16_t> dout16;
    dout16.resize(static_cast<size_t>(n) * oc);
    toFloat16(format, dout, dout16.data(), dout16.size());
    if (dinp != nullptr) gemm16(format, false, false, n, c, oc, 1.0f, dout16.data(), oc, weight, c, 1.0f, dinp, c);
    if (dweight != nullptr) gemm16(format, true, false, oc, c, n, 1.0f, dout16.data(), oc, inp, c, 1.0f, dweight, c);
  }
  if (dbias != nullptr) sumRowsInto(dbias, dout, n, oc);
}

namespace {

// fp32 operands cast for a 16-bit product, in per-thread scratch.
struct CastOperands {
  std::vector<uint16_t> inp, weight;
  void cast(Float16 format, const float* in, size_t inCount, const float* w, size_t wCount) {
    inp.resize(inCount);
    weight.resize(wCount);
    toFloat16(format, in, inp.data(), inCount);
    toFloat16(format, w, weight.data(), wCount);
  }
};

}  // namespace

void matmulForwardAs(Float16 format, float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                     int oc) {
  thread_local CastOperands cast;
  cast.cast(format, inp, static_cast<size_t>(n) * c, weight, static_cast<size_t>(oc) * c);
  matmulForward16(format, out, cast.inp.data(), cast.weight.data(), bias, n, c, oc);
}

void matmulBackwardAs(Float16 format, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                      const float* weight, int n, int c, int oc) {
  thread_local CastOperands cast;
  cast.cast(format, inp, static_cast<size_t>(n) * c, weight, static_cast<size_t>(oc) * c);
  matmulBackward16(format, dinp, dweight, dbias, dout, cast.inp.data(), cast.weight.data(), n, c, oc);
}

void setBlasThreads(int threads) {
  openblas_set_num_threads(threads < 1 ? 1 : threads);
#ifdef CHORUS_HAVE_DNNL
  omp_set_num_threads(threads < 1 ? 1 : threads);
#endif
}

int blasThreads() { return openblas_get_num_threads(); }

void setFlushDenormals(bool on) {
#if defined(__SSE__)
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? csr | kFlushToZero | kDenormalsAreZero : csr & ~(kFlushToZero | kDenormalsAreZero));
#else
  (void)on;
#endif
}

std::string blasDescription() {
  std::string config = openblas_get_config();
  // The config string starts "OpenBLAS 0.3.21 ..."; keep the name and version, then the core.
  const auto second = config.find(' ', config.find(' ') + 1);
  return config.substr(0, second) + " " + blasCore();
}

std::string blasCore() { return openblas_get_corename(); }

std::string betterBlasCoreFor(const std::string& chosen, bool avx2Fma, bool avx512) {
  std::string name = chosen;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  // OpenBLAS's x86-64 kernel sets that use AVX2 (and FMA) or AVX-512.
  static const std::set<std::string> modern = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"};
  if (modern.count(name) != 0 || !avx2Fma) return "";
  return avx512 ? "SkylakeX" : "Haswell";
}

std::string betterBlasCore() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // libgcc's answers count only what the operating system enables (XCR0), as OpenBLAS's do.
  const bool avx2Fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return betterBlasCoreFor(blasCore(), avx2Fma, avx512);
#else
  return "";
#endif
}

void runWithBlasCore(const std::string& core, char** argv) {
  const char* now = std::getenv("OPENBLAS_CORETYPE");
  if (core.empty() || (now != nullptr && core == now)) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);
  throw std::runtime_error(std::string("cannot execute this program again with OPENBLAS_CORETYPE=") + core + ": " +
                           std::strerror(errno));
}

}  // namespace chorus::kernels
