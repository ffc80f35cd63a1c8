// gemm_bench: Google Benchmark of the 16-bit products mixed-precision training uses (kernels::gemm16,
// bf16 and fp16, on whatever backend this build and CPU give it) beside SGEMM on the same shapes,
// measured in the same run. Shapes are the linear layers' (rows x out features x in features) of
// the tiny job (256 rows, width 128) and of GPT-2 124M (1024 rows, width 768), forward (inp .
// W^T). `sgemm_ratio` is the 16-bit product's flops per second over SGEMM's: above 1 where a 16-bit
// kernel pays; the widened backend sits below 1 by its conversions.
//
//   build/release/bench/gemm_bench [--benchmark_filter=bf16]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/matmul.h"

namespace {

using chorus::kernels::Float16;

struct Shape {
  int m, n, k;
};
constexpr Shape kShapes[] = {{256, 384, 128},   {256, 512, 128},   {256, 128, 512},
                             {1024, 2304, 768}, {1024, 3072, 768}, {1024, 768, 3072}};

double flops(const Shape& s) { return 2.0 * s.m * s.n * s.k; }

// SGEMM's flops per second on the shape: the best of 5 runs of at least 50 ms, once per shape.
double sgemmFlopsPerSecond(const Shape& s) {
  static std::map<std::tuple<int, int, int>, double> measured;
  const auto key = std::make_tuple(s.m, s.n, s.k);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f), b(static_cast<size_t>(s.n) * s.k, 0.25f),
      c(static_cast<size_t>(s.m) * s.n);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    int iterations = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < 0.05) {
      chorus::kernels::gemm(false, true, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.k, 0.0f, c.data(), s.n);
      ++iterations;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    best = std::max(best, flops(s) * iterations / elapsed);
  }
  return measured[key] = best;
}

void sixteenBit(benchmark::State& state, Float16 format, Shape s) {
  std::vector<float> a(static_cast<size_t>(s.m) * s.k, 0.5f), b(static_cast<size_t>(s.n) * s.k, 0.25f),
      c(static_cast<size_t>(s.m) * s.n);
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  chorus::kernels::toFloat16(format, a.data(), a16.data(), a.size());
  chorus::kernels::toFloat16(format, b.data(), b16.data(), b.size());
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    chorus::kernels::gemm16(format, false, true, s.m, s.n, s.k, 1.0f, a16.data(), s.k, b16.data(), s.k, 0.0f, c.data(),
                            s.n);
    benchmark::DoNotOptimize(c.data());
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate = flops(s) * static_cast<double>(state.iterations()) / elapsed;
  const double sgemm = sgemmFlopsPerSecond(s);
  state.counters["gflops"] = rate / 1e9;
  state.counters["sgemm_gflops"] = sgemm / 1e9;
  state.counters["sgemm_ratio"] = rate / sgemm;
  state.SetLabel(chorus::kernels::gemm16Description(format));
}

}  // namespace

int main(int argc, char** argv) {
  // SGEMM as chorus-train runs it: where OpenBLAS took this CPU for an older one, with the kernels
  // the CPU allows (OPENBLAS_CORETYPE, where set, is kept).
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr)
    chorus::kernels::runWithBlasCore(chorus::kernels::betterBlasCore(), argv);
  benchmark::AddCustomContext("blas", chorus::kernels::blasDescription());
  chorus::kernels::setBlasThreads(std::max(1u, std::thread::hardware_concurrency()));
  for (Float16 format : {Float16::kBf16, Float16::kFp16}) {
    for (const Shape& s : kShapes) {
      const std::string name = std::string(chorus::kernels::float16Name(format)) + "/" + std::to_string(s.m) + "x" +
                               std::to_string(s.n) + "x" + std::to_string(s.k);
      benchmark::RegisterBenchmark(name.c_str(), sixteenBit, format, s)->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
