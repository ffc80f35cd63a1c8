// reduce_bench: Google Benchmark of the host reduction kernels, per instruction set, type, op and
// size (from L1-resident to DRAM), in bytes moved per second (two inputs read, one output
// written), beside memcpy's bytes per second (one read, one write) at the same size, measured in
// the same run. `copy_ratio` is the kernel's bytes per second over memcpy's, each counting every
// byte read and written: about 1 where both are bound by memory bandwidth (at 64 MiB), below 1
// where the kernel's arithmetic is the bound. `copy_streaming` is kernels::copyStreaming (non-temporal
// stores, no read of the destination first), with the same copy_ratio. `reduce_many` is
// kernels::reduceMany as the direct all-reduce calls it, n sources into n destinations (streamed),
// beside `reduce_blocked`: the same result through a 64 KiB block reduced in the cache and then
// copied into each destination with copyStreaming; both count n reads and n writes per element.
//
//   build/release/bench/reduce_bench [--benchmark_filter=float32]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/reduce.h"

namespace {

using chorus::kernels::Isa;

constexpr size_t kSizes[] = {16 << 10, 256 << 10, 4 << 20, 64 << 20};  // bytes per buffer

// memcpy's bytes (read + written) per second for buffers of this size: the best of 5 runs of at
// least 20 ms each, measured once per size.
double copyBytesPerSecond(size_t bytes) {
  static std::map<size_t, double> measured;
  if (auto it = measured.find(bytes); it != measured.end()) return it->second;
  std::vector<char> from(bytes, 1), to(bytes, 2);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    size_t copies = 0;
    double seconds = 0;
    do {
      std::memcpy(to.data(), from.data(), bytes);
      benchmark::ClobberMemory();
      ++copies;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 0.02);
    best = std::max(best, 2.0 * static_cast<double>(bytes * copies) / seconds);
  }
  return measured[bytes] = best;
}

void reduceKernel(benchmark::State& state, Isa isa, chorusDataType_t type, chorusRedOp_t op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / chorus::kernels::typeSize(type);
  std::vector<char> a(bytes, 0), b(bytes, 0), dst(bytes, 0);
  // Small positive values in every type (bytes of 0x01): no NaN or subnormal slows the float kinds.
  std::memset(a.data(), 1, bytes);
  std::memset(b.data(), 1, bytes);
  for (auto _ : state) {
    chorus::kernels::reduceWith(isa, dst.data(), a.data(), b.data(), count, type, op);
    benchmark::ClobberMemory();
  }
  const double moved = 3.0 * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(moved * static_cast<double>(state.iterations())));
  state.counters["copy_ratio"] =
      benchmark::Counter(moved / copyBytesPerSecond(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

// n buffers of bytes each, filled with bytes of 0x01, and n more for the results.
struct Fan {
  std::vector<std::vector<char>> inputs, outputs;
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  Fan(size_t bytes, int n) : inputs(n, std::vector<char>(bytes + 64, 1)), outputs(n, std::vector<char>(bytes + 64, 0)) {
    auto aligned = [](char* p) { return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64; };
    for (int k = 0; k < n; ++k) {
      srcs.push_back(aligned(inputs[k].data()));
      dsts.push_back(aligned(outputs[k].data()));
    }
  }
};

void reduceMany(benchmark::State& state, Isa isa, chorusDataType_t type, chorusRedOp_t op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  Fan fan(bytes, n);
  const size_t count = bytes / chorus::kernels::typeSize(type);
  const std::unique_ptr<bool[]> stream(new bool[n]);
  std::fill_n(stream.get(), n, true);
  for (auto _ : state) {
    chorus::kernels::reduceManyWith(isa, fan.dsts.data(), n, fan.srcs.data(), n, count, type, op, stream.get());
    benchmark::ClobberMemory();
  }
  const double moved = 2.0 * n * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(moved * static_cast<double>(state.iterations())));
  state.counters["copy_ratio"] =
      benchmark::Counter(moved / copyBytesPerSecond(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void reduceBlocked(benchmark::State& state, Isa isa, chorusDataType_t type, chorusRedOp_t op) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  Fan fan(bytes, n);
  const size_t size = chorus::kernels::typeSize(type);
  std::vector<char> block(64 << 10);
  for (auto _ : state) {
    for (size_t at = 0; at < bytes; at += block.size()) {
      const size_t chunk = std::min(block.size(), bytes - at);
      auto in = [&](int k) { return static_cast<const char*>(fan.srcs[k]) + at; };
      chorus::kernels::reduceWith(isa, block.data(), in(0), in(1), chunk / size, type, op);
      for (int k = 2; k < n; ++k)
        chorus::kernels::reduceWith(isa, block.data(), block.data(), in(k), chunk / size, type, op);
      for (int k = 0; k < n; ++k)
        chorus::kernels::copyStreaming(static_cast<char*>(fan.dsts[k]) + at, block.data(), chunk);
    }
    benchmark::ClobberMemory();
  }
  const double moved = 2.0 * n * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(moved * static_cast<double>(state.iterations())));
  state.counters["copy_ratio"] =
      benchmark::Counter(moved / copyBytesPerSecond(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void copy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> from(bytes, 1), to(bytes, 2);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(2.0 * static_cast<double>(bytes) * static_cast<double>(state.iterations())));
}

void copyStreaming(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<char> from(bytes, 1), to(bytes, 2);
  for (auto _ : state) {
    chorus::kernels::copyStreaming(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
  }
  const double moved = 2.0 * static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(moved * static_cast<double>(state.iterations())));
  state.counters["copy_ratio"] =
      benchmark::Counter(moved / copyBytesPerSecond(bytes), benchmark::Counter::kIsIterationInvariantRate);
}

void registerAll() {
  for (size_t bytes : kSizes) benchmark::RegisterBenchmark("memcpy", copy)->Arg(static_cast<int64_t>(bytes));
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark("copy_streaming", copyStreaming)->Arg(static_cast<int64_t>(bytes));
  }
  const std::pair<chorusDataType_t, chorusRedOp_t> cases[] = {
      {chorusFloat32, chorusSum},  {chorusFloat32, chorusMax}, {chorusFloat64, chorusSum}, {chorusFloat16, chorusSum},
      {chorusBfloat16, chorusSum}, {chorusInt32, chorusSum},   {chorusInt8, chorusProd},   {chorusInt64, chorusProd}};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!chorus::kernels::isaSupported(isa)) continue;
    for (auto [type, op] : cases) {
      const std::string name =
          std::string("reduce/") + chorus::kernels::isaName(isa) + "/" + chorusTypeName(type) + "/" + chorusOpName(op);
      for (size_t bytes : kSizes) {
        benchmark::RegisterBenchmark(name.c_str(), reduceKernel, isa, type, op)->Arg(static_cast<int64_t>(bytes));
      }
    }
    for (auto [type, op] : {std::pair{chorusFloat32, chorusSum}, std::pair{chorusBfloat16, chorusSum}}) {
      const std::string suffix =
          std::string("/") + chorus::kernels::isaName(isa) + "/" + chorusTypeName(type) + "/" + chorusOpName(op);
      for (int n : {2, 4}) {
        for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
          benchmark::RegisterBenchmark(("reduce_many" + suffix).c_str(), reduceMany, isa, type, op)
              ->Args({static_cast<int64_t>(bytes), n});
          benchmark::RegisterBenchmark(("reduce_blocked" + suffix).c_str(), reduceBlocked, isa, type, op)
              ->Args({static_cast<int64_t>(bytes), n});
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
