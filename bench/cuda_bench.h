// cuda_bench.h: what the CUDA Google Benchmarks share: the device's memory peak from its
// attributes, and timing one enqueue per iteration with CUDA events (manual time).
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

namespace chorus::bench {

// 0 when a device is usable; otherwise says why on stderr (as `tool`) and returns 77, the exit
// status ctest reads as skipped. Adds the device's name and memory peak to the benchmark context.
inline int probeDevice(const char* tool, double* peakBytesPerSecond) {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "%s: no usable CUDA device here (%s)\n", tool,
                 probe != cudaSuccess ? cudaGetErrorString(probe) : "none found");
    return 77;
  }
  // The memory's peak: 2 (double data rate) x memory clock x bus width, as CUDA reports them.
  int device = 0, clockKHz = 0, busBits = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&clockKHz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, device);
  *peakBytesPerSecond = 2.0 * clockKHz * 1e3 * busBits / 8;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("memory_peak_GBps", std::to_string(*peakBytesPerSecond / 1e9));
  return 0;
}

// Times `launch` (enqueues on the NULL stream) per iteration with CUDA events, after one launch
// that warms up (the first launch loads the module). An error of the runtime skips the benchmark.
template <typename Launch>
void timeLaunches(benchmark::State& state, Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch();
  for (auto _ : state) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    state.SkipWithError(cudaGetErrorString(error));
  }
}

}  // namespace chorus::bench
