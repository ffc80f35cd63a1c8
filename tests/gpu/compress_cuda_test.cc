// compress_cuda_test.cc: the CUDA compression kernels (kernels/cuda/compress.h) against the CPU
// reference (kernels/cpu/compress.h): codecs byte for byte, selections index for index,
// Gram-Schmidt and the Gaussian draws within rounding. Skipped (with the reason) without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/compress.h"
#include "kernels/cuda/compress.h"
#include "tests/gpu/device.h"

namespace chorus::kernels {
namespace {

using chorus::testing::DeviceBuffer;

std::vector<float> gradient(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = randomNormal(seed, i) * (i % 17 == 0 ? 10.0f : 1.0f);
  if (n > 3) x[3] = 0.0f;
  return x;
}

std::vector<CodecParams> codecs() {
  std::vector<CodecParams> all{{Codec::kFp16, 15}, {Codec::kBf16, 15}, {Codec::kSign, 15}};
  for (const int levels : {1, 7, 15, 127}) all.push_back({Codec::kQsgd, levels});
  return all;
}

TEST(CudaCompressTest, CodecsEncodeAndDecodeAsTheReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{5 * kCodecBucket + 17}}) {
    const auto x = gradient(n, n);
    DeviceBuffer<float> dx(x);
    for (const auto& params : codecs()) {
      const size_t bytes = encodedBytes(params, n);
      std::vector<uint8_t> cpu(bytes);
      encode(params, x.data(), n, 99, cpu.data());
      // One byte off alignment: the wire buffers carry no alignment promise.
      DeviceBuffer<uint8_t> encoded(bytes + 1);
      ASSERT_EQ(cuda::encode(params, dx.data, n, 99, encoded.data + 1, nullptr), 0);
      const auto gpu = encoded.read(bytes + 1);
      EXPECT_TRUE(std::equal(cpu.begin(), cpu.end(), gpu.begin() + 1))
          << "codec " << static_cast<int>(params.codec) << " levels " << params.levels << " n " << n;
      std::vector<float> cpuOut(n, 0.5f);
      decodeAdd(params, cpu.data(), n, 3.0f, cpuOut.data());
      DeviceBuffer<float> dout{std::vector<float>(n, 0.5f)};
      ASSERT_EQ(cuda::decodeAdd(params, encoded.data + 1, n, 3.0f, dout.data, nullptr), 0);
      EXPECT_EQ(dout.read(n), cpuOut) << "codec " << static_cast<int>(params.codec) << " n " << n;
    }
  }
}

TEST(CudaCompressTest, TopKPicksTheReferenceIndicesWithTies) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  cuda::Workspace work;
  for (const size_t n : {size_t{10}, size_t{4096}, size_t{300001}}) {
    auto x = gradient(n, 7 + n);
    // Coarse values make many ties in magnitude, with both signs: the lower index must win.
    for (size_t i = 0; i < n; i += 2) x[i] = std::round(x[i] * 4.0f) / 4.0f;
    DeviceBuffer<float> dx(x);
    for (const size_t k : {size_t{1}, n / 100 + 1, n / 3, n}) {
      std::vector<uint32_t> cpu(k);
      std::vector<uint32_t> scratch;
      topKIndices(x.data(), n, k, cpu.data(), scratch);
      DeviceBuffer<uint32_t> out(k);
      ASSERT_EQ(cuda::topKIndices(dx.data, n, k, out.data, work, nullptr), 0);
      EXPECT_EQ(out.read(k), cpu) << "n " << n << " k " << k;
    }
  }
}

TEST(CudaCompressTest, RandomKDrawsTheReferenceIndices) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  cuda::Workspace work;
  for (const size_t n : {size_t{64}, size_t{1000}, size_t{200003}}) {
    for (const size_t k : {size_t{1}, n / 100 + 1, n}) {
      std::vector<uint32_t> cpu(k);
      std::vector<uint64_t> marks;
      randomKIndices(1234 + n, n, k, cpu.data(), marks);
      DeviceBuffer<uint32_t> out(k);
      ASSERT_EQ(cuda::randomKIndices(1234 + n, n, k, out.data, work, nullptr), 0);
      EXPECT_EQ(out.read(k), cpu) << "n " << n << " k " << k;
    }
  }
}

TEST(CudaCompressTest, GramSchmidtMatchesTheReferenceAndIsOrthonormal) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  constexpr size_t kRows = 1000, kCols = 6;
  auto a = gradient(kRows * kCols, 5);
  for (size_t r = 0; r < kRows; ++r) a[r * kCols + 4] = a[r * kCols + 1] * 2.0f - a[r * kCols + 0];  // dependent
  auto cpu = a;
  orthonormalizeColumns(cpu.data(), kRows, kCols);
  DeviceBuffer<float> da(a);
  ASSERT_EQ(cuda::orthonormalizeColumns(da.data, kRows, kCols, nullptr), 0);
  const auto gpu = da.read(a.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(gpu[i], cpu[i], 1e-5) << "element " << i;
  for (size_t c = 0; c < kCols; ++c) {
    for (size_t d = 0; d <= c; ++d) {
      double dot = 0;
      for (size_t r = 0; r < kRows; ++r) dot += static_cast<double>(gpu[r * kCols + c]) * gpu[r * kCols + d];
      const double expected = c == d && c != 4 ? 1.0 : 0.0;
      EXPECT_NEAR(dot, expected, 1e-5) << "columns " << c << ", " << d;
    }
  }
}

TEST(CudaCompressTest, NormalDrawsMatchTheReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  constexpr size_t kCount = 100000;
  DeviceBuffer<float> out(kCount);
  ASSERT_EQ(cuda::fillNormal(out.data, kCount, 42, 1000, nullptr), 0);
  const auto gpu = out.read(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    const float expected = randomNormal(42, 1000 + i);
    ASSERT_NEAR(gpu[i], expected, 1e-6f * (1.0f + std::fabs(expected))) << "draw " << i;
  }
}

}  // namespace
}  // namespace chorus::kernels
