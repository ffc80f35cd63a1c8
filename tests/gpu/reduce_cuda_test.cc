// reduce_cuda_test.cc: the CUDA reduction kernels match the CPU reference bit for bit, for every
// type x op. Skipped (with the reason) on machines without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "bench/pattern.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"

namespace chorus::kernels {
namespace {

bool haveDevice(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *why = cudaGetErrorString(error);
    return false;
  }
  if (count == 0) *why = "no CUDA device";
  return count > 0;
}

TEST(CudaReduceTest, MatchesCpuReferenceForEveryTypeAndOp) {
  std::string why;
  if (!haveDevice(&why)) GTEST_SKIP() << "needs a CUDA device: " << why;
  constexpr size_t kCount = 100003;
  constexpr int kRanks = 5;
  for (int t = 0; t < chorusNumTypes; ++t) {
    const auto type = static_cast<chorusDataType_t>(t);
    const size_t bytes = kCount * typeSize(type);
    for (int o = 0; o < chorusNumOps; ++o) {
      const auto op = static_cast<chorusRedOp_t>(o);
      std::vector<char> a(bytes), b(bytes), cpu(bytes), gpu(bytes);
      for (size_t i = 0; i < kCount; ++i) {
        pattern::store(a.data(), i, type, pattern::reduceInput(op, type, 1, i));
        pattern::store(b.data(), i, type, pattern::reduceInput(op, type, 2, i) * (op == chorusProd ? 1 : 7));
      }
      reduce(cpu.data(), a.data(), b.data(), kCount, type, op);
      if (op == chorusAvg) divide(cpu.data(), kCount, type, kRanks);
      void *da = nullptr, *db = nullptr;
      ASSERT_EQ(cudaMalloc(&da, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&db, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cuda::reduce(da, da, db, kCount, type, op, nullptr), 0);
      if (op == chorusAvg) {
        ASSERT_EQ(cuda::divide(da, kCount, type, kRanks, nullptr), 0);
      }
      ASSERT_EQ(cudaMemcpy(gpu.data(), da, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(da);
      cudaFree(db);
      EXPECT_EQ(std::memcmp(cpu.data(), gpu.data(), bytes), 0) << chorusTypeName(type) << " " << chorusOpName(op);
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
