// compress_kernels_test.cc: the compression math of kernels/cpu/compress.h against references
// computed another way: sorting for top-k, counting for random-k, Q^T Q = I for Gram-Schmidt,
// closed forms and averages over many draws for the codecs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/compress.h"
#include "kernels/cpu/half.h"

namespace chorus::kernels {
namespace {

std::vector<float> normals(size_t n, unsigned seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (float& v : out) v = normal(engine);
  return out;
}

TEST(CompressKernels, TopKMatchesAFullSort) {
  std::vector<float> x = normals(5000, 1);
  x[17] = x[4000] = 9.0f;  // a tie: both are kept, lower index first
  std::vector<uint32_t> scratch;
  for (size_t k : {size_t{1}, size_t{2}, size_t{50}, size_t{4999}, size_t{5000}}) {
    std::vector<uint32_t> got(k);
    topKIndices(x.data(), x.size(), k, got.data(), scratch);
    std::vector<uint32_t> order(x.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    std::vector<uint32_t> want(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << "k = " << k;
  }
}

TEST(CompressKernels, RandomKIsDistinctSortedSharedAndUniform) {
  std::vector<uint64_t> marks;
  const size_t n = 1000, k = 100;
  std::vector<uint32_t> a(k), b(k), c(k);
  randomKIndices(42, n, k, a.data(), marks);
  randomKIndices(42, n, k, b.data(), marks);
  randomKIndices(43, n, k, c.data(), marks);
  EXPECT_EQ(a, b) << "the same seed draws the same indices (on every rank)";
  EXPECT_NE(a, c);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<uint32_t>(a.begin(), a.end()).size(), k);
  EXPECT_LT(a.back(), n);
  // Over many seeds every index is drawn about k/n of the time (chi-square-like bound).
  std::vector<int> hits(n, 0);
  const int draws = 2000;
  for (int s = 0; s < draws; ++s) {
    randomKIndices(mixSeed(7, s), n, k, a.data(), marks);
    for (uint32_t i : a) ++hits[i];
  }
  const double expected = draws * double(k) / n;  // 200
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(hits[i], expected, 6 * std::sqrt(expected)) << "index " << i;
  std::vector<uint32_t> all(n);
  randomKIndices(1, n, n, all.data(), marks);  // k = n: every index
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(all[i], i);
}

TEST(CompressKernels, GramSchmidtGivesOrthonormalColumnsSpanningTheInput) {
  const size_t rows = 300, cols = 6;
  std::vector<float> a = normals(rows * cols, 3);
  // Column 5 is a combination of columns 0 and 2: it must become zero, not noise.
  for (size_t r = 0; r < rows; ++r) a[r * cols + 5] = 2 * a[r * cols + 0] - a[r * cols + 2];
  const std::vector<float> original = a;
  orthonormalizeColumns(a.data(), rows, cols);
  for (size_t i = 0; i < cols; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      double dot = 0;
      for (size_t r = 0; r < rows; ++r) dot += double(a[r * cols + i]) * a[r * cols + j];
      const double want = i == j && i != 5 ? 1.0 : 0.0;
      EXPECT_NEAR(dot, want, 1e-5) << "columns " << i << ", " << j;
    }
  }
  // Each original column lies in the span: projecting it loses nothing.
  for (size_t c = 0; c < cols; ++c) {
    std::vector<double> projected(rows, 0.0);
    for (size_t q = 0; q < cols; ++q) {
      double dot = 0;
      for (size_t r = 0; r < rows; ++r) dot += double(original[r * cols + c]) * a[r * cols + q];
      for (size_t r = 0; r < rows; ++r) projected[r] += dot * a[r * cols + q];
    }
    for (size_t r = 0; r < rows; ++r) ASSERT_NEAR(projected[r], original[r * cols + c], 1e-4);
  }
}

TEST(CompressKernels, SixteenBitCodecsRoundEachElementOnce) {
  const std::vector<float> x = normals(3000, 5);
  for (Codec codec : {Codec::kBf16, Codec::kFp16}) {
    CodecParams params;
    params.codec = codec;
    std::vector<uint8_t> bytes(encodedBytes(params, x.size()));
    EXPECT_EQ(bytes.size(), x.size() * 2);
    encode(params, x.data(), x.size(), 0, bytes.data());
    std::vector<float> back(x.size(), 1.0f);
    decodeAdd(params, bytes.data(), x.size(), 2.0f, back.data());
    const double unit = codec == Codec::kBf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    for (size_t i = 0; i < x.size(); ++i) {
      const double decoded = (back[i] - 1.0) / 2.0;
      ASSERT_LE(std::fabs(decoded - x[i]), unit * std::fabs(x[i]) + 1e-7) << "element " << i;
    }
  }
}

TEST(CompressKernels, QsgdIsUnbiasedAndOnItsLevels) {
  std::vector<float> x = normals(2500, 9);  // three buckets, the last partial
  x[100] = 0.0f;
  for (int levels : {1, 3, 15, 127}) {
    CodecParams params;
    params.codec = Codec::kQsgd;
    params.levels = levels;
    const int bits = params.qsgdBits();
    EXPECT_EQ(encodedBytes(params, x.size()), 3 * 4 + (x.size() * bits + 7) / 8);
    std::vector<uint8_t> bytes(encodedBytes(params, x.size()));
    std::vector<double> mean(x.size(), 0.0);
    const int draws = 400;
    for (int d = 0; d < draws; ++d) {
      encode(params, x.data(), x.size(), mixSeed(1, d), bytes.data());
      std::vector<float> back(x.size(), 0.0f);
      decodeAdd(params, bytes.data(), x.size(), 1.0f, back.data());
      for (size_t i = 0; i < x.size(); ++i) mean[i] += back[i] / draws;
      if (d == 0) {
        // Each value is a level of its bucket's scale (max |x|) and brackets x.
        for (size_t i = 0; i < x.size(); ++i) {
          const size_t b = i / kCodecBucket;
          float scale = 0;
          for (size_t j = b * kCodecBucket; j < std::min(x.size(), (b + 1) * kCodecBucket); ++j)
            scale = std::max(scale, std::fabs(x[j]));
          const double step = scale / levels;
          const double level = std::fabs(back[i]) / step;
          ASSERT_NEAR(level, std::round(level), 1e-3) << "levels " << levels << " element " << i;
          ASSERT_LE(std::fabs(back[i] - x[i]), step * 1.0001) << "element " << i;
        }
        EXPECT_EQ(back[100], 0.0f);
      }
    }
    // Unbiased: the mean over draws approaches x (variance <= step^2 / 4 per draw).
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(mean[i] - x[i]));
    const double step = 4.5 / levels;  // the largest bucket scale here is below 4.5
    EXPECT_LE(worst, 6 * step / 2 / std::sqrt(double(draws))) << "levels " << levels;
  }
}

TEST(CompressKernels, ScaledSignKeepsSignsAndTheMeanMagnitude) {
  const std::vector<float> x = normals(2048 + 10, 11);
  CodecParams params;
  params.codec = Codec::kSign;
  std::vector<uint8_t> bytes(encodedBytes(params, x.size()));
  EXPECT_EQ(bytes.size(), 3 * 4 + (x.size() + 7) / 8);
  encode(params, x.data(), x.size(), 0, bytes.data());
  std::vector<float> back(x.size(), 0.0f);
  decodeAdd(params, bytes.data(), x.size(), 1.0f, back.data());
  for (size_t b = 0; b < 3; ++b) {
    const size_t begin = b * kCodecBucket, end = std::min(x.size(), begin + kCodecBucket);
    double l1 = 0;
    for (size_t i = begin; i < end; ++i) l1 += std::fabs(x[i]);
    for (size_t i = begin; i < end; ++i) {
      ASSERT_NEAR(std::fabs(back[i]), l1 / double(end - begin), 1e-5);
      ASSERT_EQ(back[i] < 0, x[i] < 0) << "element " << i;
    }
  }
}

TEST(CompressKernels, RandomDrawsAreSharedAndDistributed) {
  EXPECT_EQ(randomBits(1, 2), randomBits(1, 2));
  EXPECT_NE(randomBits(1, 2), randomBits(1, 3));
  EXPECT_NE(mixSeed(1, 2, 3), mixSeed(1, 3, 2));
  double sum = 0, squares = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double v = randomNormal(5, i);
    sum += v;
    squares += v * v;
    const float u = randomUniform(5, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(squares / n, 1.0, 0.02);
}

}  // namespace
}  // namespace chorus::kernels
