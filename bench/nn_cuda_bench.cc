// nn_cuda_bench: Google Benchmark of the transformer's CUDA kernels (kernels/cuda/nn.h, matmul.h,
// moe.h) at GPT-2 124M's shapes (B 8, T 1024, C 768, 12 heads, vocabulary 50257, 124M parameters;
// an MoE layer of 8 experts, 2 choices per token), timed by CUDA events (manual time). The
// memory-bound kernels report the bytes they must move at least (each input read once, each output
// written once, an accumulated output read and written) per second, and peak_ratio, that over the
// memory's peak bandwidth (2 x memory clock x bus width, as CUDA reports them; the goal is at least
// 0.7). Attention and the products report FLOP/s (counter flops_per_second; causal attention
// counts the half of the scores it computes). Correctness is nn_cuda_test's; this measures (a
// launch that fails exits 1). Without a usable device it says so and exits 77.
//
//   build/release/bench/nn_cuda_bench [--benchmark_filter=layernorm]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/cuda_bench.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nn.h"

namespace {

using chorus::bench::timeLaunches;
namespace cuda = chorus::kernels::cuda;

constexpr int B = 8, T = 1024, C = 768, NH = 12, V = 50257;
constexpr int kRows = B * T;
constexpr int kExperts = 8, kChoices = 2;  // an MoE layer's router
constexpr size_t kParams = 124439808;      // GPT-2 124M with the tied head

double peakBytesPerSecond = 0;
bool anyFailed = false;  // a launch failed: exit 1

// One device allocation of n elements of T, kept for the whole run, zeroed.
template <typename T>
T* deviceArray(size_t n, const char* what) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
    std::fprintf(stderr, "nn_cuda_bench: cudaMalloc of %zu bytes for %s failed\n", n * sizeof(T), what);
    std::exit(2);
  }
  cudaMemset(p, 0, n * sizeof(T));
  return static_cast<T*>(p);
}

// Every array the benchmarks use, made once.
struct Arrays {
  float* x = deviceArray<float>(size_t{kRows} * 4 * C, "x");  // up to the MLP's width
  float* y = deviceArray<float>(size_t{kRows} * 4 * C, "y");
  float* z = deviceArray<float>(size_t{kRows} * 4 * C, "z");
  float* qkv = deviceArray<float>(size_t{kRows} * 3 * C, "qkv");
  uint16_t* qkv16 = deviceArray<uint16_t>(size_t{kRows} * 3 * C, "qkv16");
  float* dqkv = deviceArray<float>(size_t{kRows} * 3 * C, "dqkv");
  float* logits = deviceArray<float>(size_t{kRows} * V, "logits");
  float* dlogits = deviceArray<float>(size_t{kRows} * V, "dlogits");
  float* wte = deviceArray<float>(size_t{V} * C, "wte");
  float* wpe = deviceArray<float>(size_t{T} * C, "wpe");
  float* stats = deviceArray<float>(size_t{kRows} * NH * 4, "stats");
  float* weight = deviceArray<float>(size_t{4} * C * C, "weight");
  uint16_t* weight16 = deviceArray<uint16_t>(size_t{4} * C * C, "weight16");
  uint16_t* x16 = deviceArray<uint16_t>(size_t{kRows} * 4 * C, "x16");
  float* scratch = deviceArray<float>(size_t{kRows} * 4 * C, "scratch");
  int* tokens = deviceArray<int>(kRows, "tokens");
  int* textTokens = deviceArray<int>(kRows, "text-like tokens");
  int textDistinct = 0;  // tokens in textTokens
  void* embeddingScratch = deviceArray<char>(cuda::embeddingBackwardScratchBytes(kRows, V), "embedding scratch");
  int* rows = deviceArray<int>(size_t{kRows} * kChoices, "rows");
  float* gates = deviceArray<float>(size_t{kRows} * kChoices, "gates");
  float* experts = deviceArray<float>(size_t{kRows} * kChoices * C, "experts");
  float* param = deviceArray<float>(kParams, "param");
  float* grad = deviceArray<float>(kParams, "grad");
  float* m = deviceArray<float>(kParams, "m");
  float* v = deviceArray<float>(kParams, "v");
  double* sums = deviceArray<double>(cuda::sumScratchDoubles() + 1, "sums");
};

Arrays& arrays() {
  static Arrays a = [] {
    Arrays made;
    // Tokens spread over the vocabulary, as text's are (all on one row, the embedding's gradient
    // would measure contention on it).
    std::vector<int> tokens(kRows);
    for (int i = 0; i < kRows; ++i) tokens[i] = static_cast<int>((i * 7919L) % V);
    cudaMemcpy(made.tokens, tokens.data(), tokens.size() * sizeof(int), cudaMemcpyHostToDevice);
    // Tokens that repeat as text's do: the r-th most frequent drawn with weight 1 / (r + 1) (Zipf's
    // law), so the most frequent takes about 9% of the rows and most of the vocabulary none.
    std::vector<double> weights(V);
    for (int r = 0; r < V; ++r) weights[r] = 1.0 / (r + 1);
    std::mt19937 gen(7);
    std::discrete_distribution<int> rank(weights.begin(), weights.end());
    for (int& t : tokens) t = static_cast<int>((rank(gen) * 7919L) % V);
    cudaMemcpy(made.textTokens, tokens.data(), tokens.size() * sizeof(int), cudaMemcpyHostToDevice);
    std::sort(tokens.begin(), tokens.end());
    made.textDistinct = static_cast<int>(std::unique(tokens.begin(), tokens.end()) - tokens.begin());
    // Every choice kept, the experts' rows in choice order.
    std::vector<int> rows(size_t{kRows} * kChoices);
    for (size_t c = 0; c < rows.size(); ++c) rows[c] = static_cast<int>(c);
    cudaMemcpy(made.rows, rows.data(), rows.size() * sizeof(int), cudaMemcpyHostToDevice);
    return made;
  }();
  return a;
}

void bandwidth(benchmark::State& state, double bytes) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes * static_cast<double>(state.iterations())));
  state.counters["peak_ratio"] =
      benchmark::Counter(bytes / peakBytesPerSecond, benchmark::Counter::kIsIterationInvariantRate);
}

void flops(benchmark::State& state, double count) {
  state.counters["flops_per_second"] = benchmark::Counter(count, benchmark::Counter::kIsIterationInvariantRate);
}

// A failed launch skips the benchmark with the error's name.
template <typename Launch>
void run(benchmark::State& state, Launch launch) {
  int code = 0;
  timeLaunches(state, [&] { code = code ? code : launch(); });
  if (code != 0) {
    anyFailed = true;
    state.SkipWithError(cuda::errorName(code).c_str());
  }
}

constexpr double kF = sizeof(float);
const double rowsC = static_cast<double>(kRows) * C;

void embeddingForward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::embeddingForward(a.x, a.tokens, a.wte, a.wpe, B, T, C, 0, V, nullptr, nullptr); });
  bandwidth(state, 3 * rowsC * kF);  // a token row and a position row read, one row written
}

// textLike: tokens that repeat (textTokens), else every row a token of its own.
void embeddingBackward(benchmark::State& state, bool textLike) {
  Arrays& a = arrays();
  const int* tokens = textLike ? a.textTokens : a.tokens;
  run(state, [&] {
    return cuda::embeddingBackward(a.wte, a.wpe, a.x, tokens, B, T, C, 0, V, nullptr, a.embeddingScratch, nullptr);
  });
  // dout read; each token's gradient row (rows of them) read and written once; dwpe read and written.
  const double rows = textLike ? a.textDistinct : kRows;
  bandwidth(state, (rowsC + 2.0 * rows * C) * kF + 2.0 * T * C * kF);
}

void layernormForward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] {
    return cuda::layernormForward(a.y, a.stats, a.stats + kRows, a.x, a.weight, a.weight + C, kRows, C, nullptr);
  });
  bandwidth(state, 2 * rowsC * kF);
}

void layernormBackward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] {
    return cuda::layernormBackward(a.z, a.weight + 2 * C, a.weight + 3 * C, a.y, a.x, a.weight, a.stats,
                                   a.stats + kRows, kRows, C, a.scratch, nullptr);
  });
  bandwidth(state, 4 * rowsC * kF);  // dout and inp read, dinp read and written
}

void geluForward(benchmark::State& state) {
  Arrays& a = arrays();
  const size_t n = size_t{kRows} * 4 * C;
  run(state, [&] { return cuda::geluForward(a.y, a.x, n, nullptr); });
  bandwidth(state, 2.0 * n * kF);
}

void geluBackward(benchmark::State& state) {
  Arrays& a = arrays();
  const size_t n = size_t{kRows} * 4 * C;
  run(state, [&] { return cuda::geluBackward(a.z, a.x, a.y, n, nullptr); });
  bandwidth(state, 4.0 * n * kF);
}

void residualForward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::residualForward(a.z, a.x, a.y, kRows * C, nullptr); });
  bandwidth(state, 3 * rowsC * kF);
}

void residualBackward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::residualBackward(a.y, a.z, a.x, kRows * C, nullptr); });
  bandwidth(state, 5 * rowsC * kF);
}

// The logits read once; each row's maximum, exponential sum and loss written (in stats).
void crossEntropyForward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] {
    return cuda::crossEntropyForward(a.stats, a.stats + kRows, a.stats + 2 * kRows, a.logits, a.tokens, kRows, V,
                                     nullptr);
  });
  bandwidth(state, 1.0 * kRows * V * kF);
}

// The logits read, the gradient written (the probabilities recomputed from the forward's statistics).
void crossEntropyBackward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] {
    return cuda::crossEntropyBackward(a.dlogits, a.logits, a.stats, a.stats + kRows, a.tokens, kRows, V, 1.0f / kRows,
                                      0, nullptr);
  });
  bandwidth(state, 2.0 * kRows * V * kF);
}

// The gradient rounded to bf16 as it is made (the 16-bit head's operand): fp32 read, 16 bits written.
void crossEntropyBackward16(benchmark::State& state) {
  Arrays& a = arrays();
  auto* out = reinterpret_cast<uint16_t*>(a.dlogits);
  run(state, [&] {
    return cuda::crossEntropyBackward16(chorus::kernels::Float16::kBf16, out, a.logits, a.stats, a.stats + kRows,
                                        a.tokens, kRows, V, 1.0f / kRows, 0, nullptr);
  });
  bandwidth(state, (kF + 2.0) * kRows * V);
}

void adamw(benchmark::State& state) {
  Arrays& a = arrays();
  chorus::kernels::OptimizerSettings s;
  long step = 0;
  run(state, [&] { return cuda::adamwStep(a.param, a.grad, a.m, a.v, kParams, ++step, s, nullptr); });
  bandwidth(state, 7.0 * kParams * kF);  // param, m, v read and written, grad read
}

void sumOfSquares(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::sumOfSquares(a.sums, a.grad, kParams, a.sums + 1, nullptr); });
  bandwidth(state, 1.0 * kParams * kF);
}

void routerSoftmax(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::routerSoftmax(a.y, a.stats, a.x, kRows, kExperts, nullptr); });
  bandwidth(state, 2.0 * kRows * kExperts * kF);
}

void moeDispatch(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::moeDispatch(a.experts, a.x, a.rows, kRows, kChoices, C, nullptr); });
  bandwidth(state, (1.0 + kChoices) * rowsC * kF);  // each token read once (cached), written k times
}

void moeCombine(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::moeCombine(a.y, a.experts, a.rows, a.gates, kRows, kChoices, C, nullptr); });
  bandwidth(state, (1.0 + kChoices) * rowsC * kF);
}

// A warp per token: dx read and written, its choices' rows of dbuffer read.
void moeDispatchBackward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] { return cuda::moeDispatchBackward(a.y, a.experts, a.rows, kRows, kChoices, C, nullptr); });
  bandwidth(state, (2.0 + kChoices) * rowsC * kF);
}

// A warp per choice: its token's row of dout read (once, cached for the token's other choices),
// the choice's row of y read and of dy written.
void moeCombineBackward(benchmark::State& state) {
  Arrays& a = arrays();
  run(state, [&] {
    return cuda::moeCombineBackward(a.z, a.stats, a.y, a.experts, a.rows, a.gates, kRows, kChoices, C, nullptr);
  });
  bandwidth(state, (1.0 + 2.0 * kChoices) * rowsC * kF);
}

void swigluForward(benchmark::State& state) {
  Arrays& a = arrays();
  const int h = 2 * C;
  run(state, [&] { return cuda::swigluForward(a.y, a.x, kRows, h, nullptr); });
  bandwidth(state, 3.0 * kRows * h * kF);
}

// a and b and dout read; da and db read and written (the gradients are added).
void swigluBackward(benchmark::State& state) {
  Arrays& a = arrays();
  const int h = 2 * C;
  run(state, [&] { return cuda::swigluBackward(a.z, a.x, a.y, kRows, h, nullptr); });
  bandwidth(state, 7.0 * kRows * h * kF);
}

// Causal attention: q k^T and P v over the half of the scores at or below the diagonal, forward
// 2 products, backward 5 (the scores again, dP, dv, dq, dk).
const double attentionProductFlops = 2.0 * B * T * T * C / 2;

void attentionForward(benchmark::State& state, bool sixteen) {
  Arrays& a = arrays();
  run(state, [&] {
    return sixteen ? cuda::attentionForward16(chorus::kernels::Float16::kBf16, a.x, a.stats, a.stats + B * NH * T,
                                              a.qkv16, B, T, C, NH, nullptr)
                   : cuda::attentionForward(a.x, a.stats, a.stats + B * NH * T, a.qkv, B, T, C, NH, nullptr);
  });
  flops(state, 2 * attentionProductFlops);
}

void attentionBackward(benchmark::State& state, bool sixteen) {
  Arrays& a = arrays();
  run(state, [&] {
    return sixteen ? cuda::attentionBackward16(chorus::kernels::Float16::kBf16, a.dqkv, a.stats + 2 * B * NH * T, a.y,
                                               a.x, a.qkv16, a.stats, B, T, C, NH, nullptr)
                   : cuda::attentionBackward(a.dqkv, a.stats + 2 * B * NH * T, a.y, a.x, a.qkv, a.stats, B, T, C, NH,
                                             nullptr);
  });
  flops(state, 5 * attentionProductFlops);
}

// The MLP's up projection (rows x C) . (4C x C)^T.
void matmulForward(benchmark::State& state, int kind) {  // 0 fp32, 1 TF32, 2 bf16
  Arrays& a = arrays();
  cuda::setTf32(kind == 1);
  run(state, [&] {
    return kind == 2 ? cuda::matmulForward16(chorus::kernels::Float16::kBf16, a.y, a.x16, a.weight16, nullptr, kRows, C,
                                             4 * C, nullptr)
                     : cuda::matmulForward(a.y, a.x, a.weight, nullptr, kRows, C, 4 * C, nullptr);
  });
  cuda::setTf32(false);
  flops(state, 2.0 * kRows * C * 4 * C);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const int skip = chorus::bench::probeDevice("nn_cuda_bench", &peakBytesPerSecond)) return skip;
  for (const auto& [name, f] : std::vector<std::pair<const char*, void (*)(benchmark::State&)>>{
           {"embedding/forward", embeddingForward},
           {"layernorm/forward", layernormForward},
           {"layernorm/backward", layernormBackward},
           {"gelu/forward", geluForward},
           {"gelu/backward", geluBackward},
           {"residual/forward", residualForward},
           {"residual/backward", residualBackward},
           {"cross_entropy/forward", crossEntropyForward},
           {"cross_entropy/backward", crossEntropyBackward},
           {"cross_entropy/backward/bf16", crossEntropyBackward16},
           {"adamw", adamw},
           {"sum_of_squares", sumOfSquares},
           {"moe/router_softmax", routerSoftmax},
           {"moe/dispatch", moeDispatch},
           {"moe/combine", moeCombine},
           {"moe/dispatch/backward", moeDispatchBackward},
           {"moe/combine/backward", moeCombineBackward},
           {"swiglu/forward", swigluForward},
           {"swiglu/backward", swigluBackward}}) {
    benchmark::RegisterBenchmark(name, f)->UseManualTime();
  }
  benchmark::RegisterBenchmark("embedding/backward", embeddingBackward, false)->UseManualTime();
  benchmark::RegisterBenchmark("embedding/backward/text", embeddingBackward, true)->UseManualTime();
  benchmark::RegisterBenchmark("attention/forward/fp32", attentionForward, false)->UseManualTime();
  benchmark::RegisterBenchmark("attention/forward/bf16", attentionForward, true)->UseManualTime();
  benchmark::RegisterBenchmark("attention/backward/fp32", attentionBackward, false)->UseManualTime();
  benchmark::RegisterBenchmark("attention/backward/bf16", attentionBackward, true)->UseManualTime();
  benchmark::RegisterBenchmark("matmul/forward/fp32", matmulForward, 0)->UseManualTime();
  benchmark::RegisterBenchmark("matmul/forward/tf32", matmulForward, 1)->UseManualTime();
  benchmark::RegisterBenchmark("matmul/forward/bf16", matmulForward, 2)->UseManualTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return anyFailed ? 1 : 0;
}
