// compress.h: the math of gradient compression, with no communication: sparsification (top-k,
// random-k), quantization codecs (fp16, bf16, QSGD, scaled sign) whose encoded bytes are what
// goes on the wire, and the PowerSGD helpers (Gram-Schmidt, shared-seed Gaussian init). The
// compressed all-reduce built from them lives in src/collectives/compression.h. Pure functions of
// their arguments (random draws come from a seed, so every rank draws alike where it must); safe
// from any thread. The element math (random draws, QSGD's rounding, code packing) is CHORUS_HD:
// kernels/cuda/compress.cu calls these same functions, so both sides draw and round alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/hd.h"

namespace chorus::kernels {

// A counter-based random number: the same (seed, index) gives the same value on every rank.
CHORUS_HD inline uint64_t randomBits(uint64_t seed, uint64_t index) {
  // splitmix64 of the pair: a bijective mix, so distinct indices of one seed never collide.
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1), and standard normal, drawn from (seed, index).
CHORUS_HD inline float randomUniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(randomBits(seed, index) >> 40) * 0x1.0p-24f;  // 24 bits: exact in fp32
}
float randomNormal(uint64_t seed, uint64_t index);
// A seed derived from a seed and a few numbers (call, tensor, rank, ...): distinct inputs give
// unrelated streams.
CHORUS_HD inline uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return randomBits(randomBits(randomBits(seed, a), b), c);
}
// The two uniform draws (0, 1] and [0, 1) that randomNormal's Box-Muller takes for index.
CHORUS_HD inline void normalDraws(uint64_t seed, uint64_t index, double* u1, double* u2) {
  const uint64_t stream = mixSeed(seed, index);
  *u1 = (static_cast<double>(randomBits(stream, 0) >> 11) + 1.0) * 0x1.0p-53;
  *u2 = static_cast<double>(randomBits(stream, 1) >> 11) * 0x1.0p-53;
}

// The k (<= n) entries of x largest in magnitude, as indices in increasing order (ties: the
// lower index wins). scratch is reused between calls.
void topKIndices(const float* x, size_t n, size_t k, uint32_t* indices, std::vector<uint32_t>& scratch);
// k (<= n) distinct indices of [0, n) drawn uniformly from the seed, in increasing order; the same
// seed gives the same indices on every rank. marks (n bits) is reused between calls.
void randomKIndices(uint64_t seed, size_t n, size_t k, uint32_t* indices, std::vector<uint64_t>& marks);

// Orthonormalizes the columns of a (rows x cols, row-major) in place by modified Gram-Schmidt
// (two passes), left to right. A column (nearly) in the span of those before it, whose remainder
// is below 1e-5 of its norm, becomes zero: the columns then span exactly what the input spans.
// Deterministic: equal inputs give bit-identical outputs.
void orthonormalizeColumns(float* a, size_t rows, size_t cols);

// A lossy encoding of float blocks into bytes (the wire format of a compressed all-reduce).
// Elements are grouped in buckets of kCodecBucket; quantizers keep one fp32 scale per bucket,
// written before the packed codes.
enum class Codec { kFp16, kBf16, kQsgd, kSign };
constexpr size_t kCodecBucket = 1024;

struct CodecParams {
  Codec codec = Codec::kBf16;
  int levels = 15;  // QSGD: levels per sign, 1..127
  // QSGD's bits per element (sign + level), rounded up to 2, 4 or 8 so codes pack whole in bytes.
  int qsgdBits() const;
};

// The 16-bit format the fp16 and bf16 codecs send.
CHORUS_HD inline Float16 float16Of(Codec codec) { return codec == Codec::kFp16 ? Float16::kFp16 : Float16::kBf16; }

// Bits per element of a codec's codes (16 for fp16 and bf16, 1 for sign).
int codecBits(const CodecParams& params);
// Whether a codec writes one fp32 scale per bucket before its codes (QSGD, sign).
inline bool codecScaled(const CodecParams& params) {
  return params.codec == Codec::kQsgd || params.codec == Codec::kSign;
}

// QSGD's code for element x (index i of the encoded block): the sign in the top bit of bits, and
// floor(|x| toLevels) rounded up with probability equal to its fraction, capped at levels.
CHORUS_HD inline unsigned qsgdCode(float x, float toLevels, unsigned levels, int bits, uint64_t seed, uint64_t i) {
  const float r = absf(x) * toLevels;
  unsigned level = static_cast<unsigned>(r);
  if (randomUniform(seed, i) < r - static_cast<float>(level)) ++level;
  if (level > levels) level = levels;
  const unsigned sign = x < 0 ? 1u : 0u;
  return (sign << (bits - 1)) | level;
}
// The value a QSGD code decodes to, in units of step (= factor * scale / levels).
CHORUS_HD inline float qsgdValue(unsigned code, int bits, float step) {
  const float magnitude = static_cast<float>(code & ((1u << (bits - 1)) - 1u)) * step;
  return (code >> (bits - 1)) != 0 ? -magnitude : magnitude;
}
// Sign's code: 1 for a negative element (zero counts as +).
CHORUS_HD inline unsigned signCode(float x) { return x < 0 ? 1u : 0u; }

// Bytes that count elements encode into (scales included).
size_t encodedBytes(const CodecParams& params, size_t count);
// Encodes count floats of x into out (encodedBytes bytes). QSGD rounds stochastically with draws
// from (seed, element), so that its decoding is unbiased; the others ignore seed.
//   fp16, bf16: the value rounded to nearest even (per-element relative error <= 2^-11 / 2^-8).
//   QSGD: bucket scale s = max |x|; element -> sign, level l in [0, levels] with E[l] = |x| levels / s.
//   sign: bucket scale = mean |x|; element -> its sign (0 counts as +): decodes to +-scale.
void encode(const CodecParams& params, const float* x, size_t count, uint64_t seed, uint8_t* out);
// out[i] += factor * decoded element i, for count elements encoded at in.
void decodeAdd(const CodecParams& params, const uint8_t* in, size_t count, float factor, float* out);

}  // namespace chorus::kernels
