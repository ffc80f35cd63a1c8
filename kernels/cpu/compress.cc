// compress.cc: sparsification, quantization codecs and PowerSGD helpers (see compress.h).
#include "kernels/cpu/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "kernels/cpu/half.h"

namespace chorus::kernels {

float randomNormal(uint64_t seed, uint64_t index) {
  // Box-Muller on two draws of the index's own stream.
  double u1, u2;
  normalDraws(seed, index, &u1, &u2);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

void topKIndices(const float* x, size_t n, size_t k, uint32_t* indices, std::vector<uint32_t>& scratch) {
  k = std::min(k, n);
  if (k == 0) return;
  scratch.resize(n);
  for (size_t i = 0; i < n; ++i) scratch[i] = static_cast<uint32_t>(i);
  // Larger magnitude first, then the lower index: a strict order, so the choice is unique.
  auto before = [x](uint32_t a, uint32_t b) {
    const float ma = std::fabs(x[a]);
    const float mb = std::fabs(x[b]);
    return ma > mb || (ma == mb && a < b);
  };
  if (k < n)
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch.end(), before);
  std::copy(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k), indices);
  std::sort(indices, indices + k);
}

void randomKIndices(uint64_t seed, size_t n, size_t k, uint32_t* indices, std::vector<uint64_t>& marks) {
  k = std::min(k, n);
  marks.assign((n + 63) / 64, 0);
  // Floyd's algorithm: k draws, each adding exactly one new index, uniform over k-subsets.
  for (size_t j = n - k, draw = 0; j < n; ++j, ++draw) {
    const size_t t = static_cast<size_t>(randomBits(seed, draw) % (j + 1));
    const size_t pick = (marks[t / 64] >> (t % 64)) & 1u ? j : t;
    marks[pick / 64] |= uint64_t{1} << (pick % 64);
  }
  size_t out = 0;
  for (size_t word = 0; word < marks.size(); ++word) {
    for (uint64_t bits = marks[word]; bits != 0; bits &= bits - 1) {
      indices[out++] = static_cast<uint32_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
    }
  }
}

void orthonormalizeColumns(float* a, size_t rows, size_t cols) {
  auto norm = [&](size_t c) {
    double total = 0;
    for (size_t r = 0; r < rows; ++r) total += static_cast<double>(a[r * cols + c]) * a[r * cols + c];
    return std::sqrt(total);
  };
  for (size_t c = 0; c < cols; ++c) {
    const double before = norm(c);
    // Two passes ("twice is enough"): one pass leaves a remainder whose rounding may still lean
    // on the earlier columns when the column nearly lies in their span.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t prev = 0; prev < c; ++prev) {
        double dot = 0;
        for (size_t r = 0; r < rows; ++r) dot += static_cast<double>(a[r * cols + c]) * a[r * cols + prev];
        const float d = static_cast<float>(dot);
        for (size_t r = 0; r < rows; ++r) a[r * cols + c] -= d * a[r * cols + prev];
      }
    }
    const double after = norm(c);
    // What is left of a dependent column is rounding noise: it becomes zero, not a direction.
    const float scale = after > 1e-5 * before && after > 0 ? static_cast<float>(1.0 / after) : 0.0f;
    for (size_t r = 0; r < rows; ++r) a[r * cols + c] *= scale;
  }
}

int CodecParams::qsgdBits() const {
  if (levels <= 1) return 2;
  if (levels <= 7) return 4;
  return 8;
}

namespace {

size_t buckets(size_t count) { return (count + kCodecBucket - 1) / kCodecBucket; }

// Packs code (bits wide) as element i of the code area.
inline void putCode(uint8_t* codes, size_t i, int bits, unsigned code) {
  const size_t bit = i * static_cast<size_t>(bits);
  codes[bit / 8] |= static_cast<uint8_t>(code << (bit % 8));
}
inline unsigned getCode(const uint8_t* codes, size_t i, int bits) {
  const size_t bit = i * static_cast<size_t>(bits);
  return (codes[bit / 8] >> (bit % 8)) & ((1u << bits) - 1u);
}

}  // namespace

int codecBits(const CodecParams& params) {
  switch (params.codec) {
    case Codec::kFp16:
    case Codec::kBf16:
      return 16;
    case Codec::kQsgd:
      return params.qsgdBits();
    case Codec::kSign:
      return 1;
  }
  return 16;
}

size_t encodedBytes(const CodecParams& params, size_t count) {
  const size_t codes = (count * static_cast<size_t>(codecBits(params)) + 7) / 8;
  return codes + (codecScaled(params) ? buckets(count) * sizeof(float) : 0);
}

void encode(const CodecParams& params, const float* x, size_t count, uint64_t seed, uint8_t* out) {
  if (params.codec == Codec::kFp16 || params.codec == Codec::kBf16) {
    std::vector<uint16_t> halves(count);
    toFloat16(float16Of(params.codec), x, halves.data(), count);
    std::memcpy(out, halves.data(), count * sizeof(uint16_t));
    return;
  }
  const int bits = codecBits(params);
  const size_t nb = buckets(count);
  uint8_t* codes = out + nb * sizeof(float);
  std::memset(codes, 0, encodedBytes(params, count) - nb * sizeof(float));
  for (size_t b = 0; b < nb; ++b) {
    const size_t begin = b * kCodecBucket;
    const size_t end = std::min(count, begin + kCodecBucket);
    float scale = 0;
    if (params.codec == Codec::kQsgd) {
      for (size_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(x[i]));
    } else {
      double total = 0;
      for (size_t i = begin; i < end; ++i) total += std::fabs(x[i]);
      scale = static_cast<float>(total / static_cast<double>(end - begin));
    }
    std::memcpy(out + b * sizeof(float), &scale, sizeof(float));
    if (params.codec == Codec::kSign) {
      for (size_t i = begin; i < end; ++i) putCode(codes, i, 1, signCode(x[i]));
      continue;
    }
    if (scale == 0) continue;  // every level 0
    const float toLevels = static_cast<float>(params.levels) / scale;
    for (size_t i = begin; i < end; ++i) {
      putCode(codes, i, bits, qsgdCode(x[i], toLevels, static_cast<unsigned>(params.levels), bits, seed, i));
    }
  }
}

void decodeAdd(const CodecParams& params, const uint8_t* in, size_t count, float factor, float* out) {
  if (params.codec == Codec::kFp16 || params.codec == Codec::kBf16) {
    const Float16 format = float16Of(params.codec);
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, in + i * sizeof(uint16_t), sizeof(h));
      out[i] += factor * fromFloat16(format, h);
    }
    return;
  }
  const int bits = codecBits(params);
  const size_t nb = buckets(count);
  const uint8_t* codes = in + nb * sizeof(float);
  for (size_t b = 0; b < nb; ++b) {
    const size_t begin = b * kCodecBucket;
    const size_t end = std::min(count, begin + kCodecBucket);
    float scale;
    std::memcpy(&scale, in + b * sizeof(float), sizeof(float));
    if (params.codec == Codec::kSign) {
      const float value = factor * scale;
      for (size_t i = begin; i < end; ++i) out[i] += getCode(codes, i, 1) != 0 ? -value : value;
      continue;
    }
    const float step = factor * scale / static_cast<float>(params.levels);
    for (size_t i = begin; i < end; ++i) out[i] += qsgdValue(getCode(codes, i, bits), bits, step);
  }
}

}  // namespace chorus::kernels
