// reduce_cuda_bench: Google Benchmark of the CUDA reduction kernel (kernels/cuda/reduce.h) per
// type, op and size, timed by CUDA events (manual time), in bytes moved per second (two inputs
// read, one output written), beside the device's own copy (cudaMemcpyAsync device to device, one
// read and one write per byte) at the same size, measured in the same run. Counters:
//   copy_ratio: the kernel's bytes per second over the copy's;
//   peak_ratio: over the memory's peak bandwidth, 2 * memory clock * bus width, as CUDA reports
//     them (the ">= 90% of memory bandwidth" goal is this ratio at sizes beyond the L2 cache).
// Each benchmark checks one result against the CPU reference (kernels/cpu/reduce.h) and reports
// an error when they differ (and exits 1). Without a usable device it says so and exits 77.
//
//   build/release/bench/reduce_cuda_bench [--benchmark_filter=float32]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/cuda_bench.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace {

using chorus::bench::timeLaunches;

constexpr size_t kSizes[] = {1 << 20, 16 << 20, 256 << 20, size_t{1} << 30};  // bytes per buffer

double peakBytesPerSecond = 0;  // of the current device's memory, from its attributes
bool anyWrong = false;          // a kernel's result differed from the reference: exit 1

// Device buffers of one size, reused by every benchmark of that size: a, b and dst.
struct Buffers {
  char* a = nullptr;
  char* b = nullptr;
  char* dst = nullptr;
};

Buffers& buffersOf(size_t bytes) {
  static std::map<size_t, Buffers> all;
  Buffers& buffers = all[bytes];
  if (buffers.a == nullptr) {
    for (char** p : {&buffers.a, &buffers.b, &buffers.dst}) {
      if (cudaMalloc(reinterpret_cast<void**>(p), bytes) != cudaSuccess) {
        std::fprintf(stderr, "reduce_cuda_bench: cudaMalloc of %zu bytes failed\n", bytes);
        std::exit(2);
      }
    }
    // Bytes of 0x01: a small positive normal value in every type, no NaN or subnormal.
    cudaMemset(buffers.a, 1, bytes);
    cudaMemset(buffers.b, 1, bytes);
    cudaMemset(buffers.dst, 0, bytes);
    cudaDeviceSynchronize();
  }
  return buffers;
}

// The device copy's bytes (read + written) per second at this size: the best of 5 timings of 5
// copies each, measured once per size.
double copyBytesPerSecond(size_t bytes) {
  static std::map<size_t, double> measured;
  if (auto it = measured.find(bytes); it != measured.end()) return it->second;
  Buffers& buffers = buffersOf(bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    cudaEventRecord(start);
    for (int i = 0; i < 5; ++i) cudaMemcpyAsync(buffers.dst, buffers.a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (ms > 0) best = std::max(best, 2.0 * 5 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return measured[bytes] = best;
}

void setRates(benchmark::State& state, double moved) {
  state.SetBytesProcessed(static_cast<int64_t>(moved * static_cast<double>(state.iterations())));
  state.counters["copy_ratio"] = benchmark::Counter(moved / copyBytesPerSecond(static_cast<size_t>(state.range(0))),
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_ratio"] =
      benchmark::Counter(moved / peakBytesPerSecond, benchmark::Counter::kIsIterationInvariantRate);
}

void deviceCopy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffers& buffers = buffersOf(bytes);
  timeLaunches(state, [&] { cudaMemcpyAsync(buffers.dst, buffers.a, bytes, cudaMemcpyDeviceToDevice); });
  setRates(state, 2.0 * static_cast<double>(bytes));
}

void reduceKernel(benchmark::State& state, chorusDataType_t type, chorusRedOp_t op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / chorus::kernels::typeSize(type);
  Buffers& buffers = buffersOf(bytes);
  int launched = 0;
  timeLaunches(state, [&] {
    launched = chorus::kernels::cuda::reduce(buffers.dst, buffers.a, buffers.b, count, type, op, nullptr);
  });
  if (launched != 0) {
    state.SkipWithError(cudaGetErrorString(static_cast<cudaError_t>(launched)));
    return;
  }
  // The first and last 4 KiB against the CPU reference on the same inputs.
  constexpr size_t kProbe = 4096;
  const size_t probe = std::min(bytes, kProbe) / chorus::kernels::typeSize(type) * chorus::kernels::typeSize(type);
  std::vector<char> a(probe, 1), b(probe, 1), want(probe), got(probe);
  chorus::kernels::reduce(want.data(), a.data(), b.data(), probe / chorus::kernels::typeSize(type), type, op);
  for (size_t offset : {size_t{0}, bytes - probe}) {
    cudaMemcpy(got.data(), buffers.dst + offset, probe, cudaMemcpyDeviceToHost);
    if (std::memcmp(got.data(), want.data(), probe) != 0) {
      anyWrong = true;
      state.SkipWithError("the kernel's result differs from the CPU reference");
      return;
    }
  }
  setRates(state, 3.0 * static_cast<double>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const int skip = chorus::bench::probeDevice("reduce_cuda_bench", &peakBytesPerSecond)) return skip;
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark("device_copy", deviceCopy)->Arg(static_cast<int64_t>(bytes))->UseManualTime();
  }
  const std::pair<chorusDataType_t, chorusRedOp_t> cases[] = {
      {chorusFloat32, chorusSum},  {chorusFloat32, chorusMax}, {chorusFloat64, chorusSum}, {chorusFloat16, chorusSum},
      {chorusBfloat16, chorusSum}, {chorusInt32, chorusSum},   {chorusInt8, chorusProd},   {chorusInt64, chorusProd}};
  for (auto [type, op] : cases) {
    const std::string name = std::string("reduce/") + chorusTypeName(type) + "/" + chorusOpName(op);
    for (size_t bytes : kSizes) {
      benchmark::RegisterBenchmark(name.c_str(), reduceKernel, type, op)
          ->Arg(static_cast<int64_t>(bytes))
          ->UseManualTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return anyWrong ? 1 : 0;
}
