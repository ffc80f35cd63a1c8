// kernels_test.cc: the CPU reference kernels: fp16 / bf16 conversions at known bit patterns,
// reductions of every type x op against values computed in double precision, and the streaming
// copy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/reduce.h"
#include "tests/support/pattern.h"

namespace chorus::kernels {
namespace {

TEST(HalfTest, KnownValuesConvertExactly) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);          // largest finite
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);          // rounds to infinity
  EXPECT_EQ(floatToHalf(5.9604645e-8f), 0x0001);     // smallest subnormal, 2^-24
  EXPECT_EQ(floatToHalf(6.103515625e-05f), 0x0400);  // smallest normal, 2^-14
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToHalf(std::nanf("")) & 0x7e00, 0x7e00);  // stays a quiet NaN
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0001), 5.9604645e-8f);
  EXPECT_TRUE(std::isinf(halfToFloat(0xfc00)));
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3*2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9 (mantissa 2).
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above halfway rounds up
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBfloat16(1.0f + 0x1p-8f), 0x3f80);      // tie to even
  EXPECT_EQ(floatToBfloat16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie to even, upward
  EXPECT_EQ(bfloat16ToFloat(0x3f80), 1.0f);
}

TEST(HalfTest, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = halfToFloat(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToHalf(f), h) << "bits " << bits;
    ASSERT_EQ(floatToBfloat16(bfloat16ToFloat(h)), h) << "bits " << bits;
  }
}

constexpr chorusDataType_t kTypes[] = {chorusInt8,   chorusUint8,   chorusInt32,   chorusUint32,  chorusInt64,
                                       chorusUint64, chorusFloat16, chorusFloat32, chorusFloat64, chorusBfloat16};

// The bulk conversions (vectorised by the active instruction set, the tail element by element)
// give each element's conversion: every 16-bit pattern widened, and floats around every rounding
// boundary (ties, subnormals, overflow, infinities, NaNs with payloads) narrowed, bit for bit: a
// NaN too (made quiet, its payload kept), as the hardware's conversions and the GPU's kernels do.
TEST(HalfTest, BulkConversionsEqualTheElementConversions) {
  std::vector<uint16_t> all(65536 + 5);  // a tail the vectors leave to the scalar code
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  std::vector<float> floats;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    if (bf16) {
      bfloat16ToFloat(all.data(), wide.data(), all.size());
    } else {
      halfToFloat(all.data(), wide.data(), all.size());
    }
    for (size_t i = 0; i < all.size(); ++i) {
      const float want = bf16 ? bfloat16ToFloat(all[i]) : halfToFloat(all[i]);
      ASSERT_EQ(floatBits(wide[i]), floatBits(want)) << i;
    }
    // Each finite 16-bit value, and the points a quarter, a half and three quarters of the way to
    // the next one (ties round to even).
    for (size_t i = 0; i + 1 < 65536; ++i) {
      const float a = wide[i], b = wide[i + 1];
      if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
      for (float f : {0.0f, 0.25f, 0.5f, 0.75f}) floats.push_back(a + f * (b - a));
    }
  }
  // The special values first, so the vectors (not the scalar tail) convert them.
  const std::vector<float> specials = {1e30f,
                                       -1e30f,
                                       65520.0f,
                                       65519.0f,
                                       std::numeric_limits<float>::infinity(),
                                       1e-30f,
                                       -0.0f,
                                       std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::denorm_min(),
                                       bitsFloat(0x7f800001u),
                                       bitsFloat(0xffa5a5a5u),
                                       bitsFloat(0x7fc00000u),
                                       bitsFloat(0x7fbfe000u),
                                       bitsFloat(0xff812345u)};
  floats.insert(floats.begin(), specials.begin(), specials.end());
  std::vector<uint16_t> narrow(floats.size());
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    if (bf16) {
      floatToBfloat16(floats.data(), narrow.data(), floats.size());
    } else {
      floatToHalf(floats.data(), narrow.data(), floats.size());
    }
    for (size_t i = 0; i < floats.size(); ++i) {
      const uint16_t want = bf16 ? floatToBfloat16(floats[i]) : floatToHalf(floats[i]);
      ASSERT_EQ(narrow[i], want) << floats[i] << " (bits " << floatBits(floats[i]) << ")";
    }
  }
}

TEST(ReduceTest, EveryTypeAndOpMatchesDoublePrecisionFold) {
  constexpr size_t kCount = 1000;
  constexpr int kRanks = 6;
  for (chorusDataType_t type : kTypes) {
    for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
      const size_t size = typeSize(type);
      std::vector<char> acc(kCount * size), next(kCount * size);
      for (size_t i = 0; i < kCount; ++i) pattern::store(acc.data(), i, type, pattern::reduceInput(op, type, 0, i));
      for (int r = 1; r < kRanks; ++r) {
        for (size_t i = 0; i < kCount; ++i) pattern::store(next.data(), i, type, pattern::reduceInput(op, type, r, i));
        reduce(acc.data(), acc.data(), next.data(), kCount, type, op);
      }
      if (op == chorusAvg) divide(acc.data(), kCount, type, kRanks);
      EXPECT_EQ(pattern::countWrong(acc.data(), kCount, type,
                                    [&](size_t i) { return pattern::expectedReduce(op, type, kRanks, i); }),
                0u)
          << chorusTypeName(type) << " " << chorusOpName(op);
    }
  }
}

TEST(ReduceTest, IntegerSumAndProdWrapAndAvgTruncates) {
  int8_t a[3] = {120, -128, 7};
  int8_t b[3] = {10, -1, -3};
  int8_t out[3];
  reduce(out, a, b, 3, chorusInt8, chorusSum);
  EXPECT_EQ(out[0], static_cast<int8_t>(-126));  // 130 wraps
  EXPECT_EQ(out[1], static_cast<int8_t>(127));   // -129 wraps
  reduce(out, a, b, 3, chorusInt8, chorusProd);
  EXPECT_EQ(out[2], -21);
  uint8_t c[2] = {16, 200};
  uint8_t d[2] = {16, 2};
  reduce(c, c, d, 2, chorusUint8, chorusProd);
  EXPECT_EQ(c[0], 0);    // 256 wraps to 0
  EXPECT_EQ(c[1], 144);  // 400 - 256
  int32_t e[2] = {-7, 7};
  divide(e, 2, chorusInt32, 2);
  EXPECT_EQ(e[0], -3);  // toward zero
  EXPECT_EQ(e[1], 3);
  int8_t f[1] = {100};
  divide(f, 1, chorusInt8, 300);  // a divisor wider than the type
  EXPECT_EQ(f[0], 0);
}

TEST(ReduceTest, HalfTypesComputeInFloatAndRoundOnce) {
  // 2048 + 1 is not representable in fp16 (spacing 2 there): the sum rounds to even, 2048.
  uint16_t a = floatToHalf(2048.0f), b = floatToHalf(1.0f), out = 0;
  reduce(&out, &a, &b, 1, chorusFloat16, chorusSum);
  EXPECT_EQ(halfToFloat(out), 2048.0f);
  uint16_t c = floatToHalf(3.0f);
  divide(&c, 1, chorusFloat16, 2);
  EXPECT_EQ(halfToFloat(c), 1.5f);
  uint16_t x = floatToBfloat16(3.0f), y = floatToBfloat16(-5.0f);
  reduce(&x, &x, &y, 1, chorusBfloat16, chorusMin);
  EXPECT_EQ(bfloat16ToFloat(x), -5.0f);
}

// Whether element i of two buffers holds the same value: the same bits, or NaN in both (the
// vector conversions may keep a NaN's payload where the reference sets a fixed one).
bool sameElement(const char* x, const char* y, size_t i, chorusDataType_t type) {
  const size_t size = typeSize(type);
  if (std::memcmp(x + i * size, y + i * size, size) == 0) return true;
  auto isNan = [&](const char* p) {
    switch (type) {
      case chorusFloat32: {
        float v;
        std::memcpy(&v, p + i * size, size);
        return std::isnan(v);
      }
      case chorusFloat64: {
        double v;
        std::memcpy(&v, p + i * size, size);
        return std::isnan(v);
      }
      case chorusFloat16:
      case chorusBfloat16: {
        uint16_t v;
        std::memcpy(&v, p + i * size, size);
        return std::isnan(type == chorusFloat16 ? halfToFloat(v) : bfloat16ToFloat(v));
      }
      default:
        return false;
    }
  };
  return isNan(x) && isNan(y);
}

// Random bits, with the special values of each float type mixed in: zeros of both signs,
// infinities, the largest finite values, subnormals.
std::vector<char> randomElements(size_t count, chorusDataType_t type, std::mt19937_64& rng) {
  const size_t size = typeSize(type);
  std::vector<char> out(count * size);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(rng());
  std::vector<uint64_t> specials;
  switch (type) {
    case chorusFloat16:
      specials = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x83ff, 0x3c00, 0x7e00};
      break;
    case chorusBfloat16:
      specials = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x807f, 0x3f80, 0x7fc0};
      break;
    case chorusFloat32:
      specials = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7f7fffff, 0x00000001, 0x3f800000, 0x7fc00000};
      break;
    case chorusFloat64:
      specials = {0, 0x8000000000000000, 0x7ff0000000000000, 0x7fefffffffffffff, 1, 0x3ff0000000000000};
      break;
    default:
      break;
  }
  for (size_t i = 0; i < count && !specials.empty(); i += 3) {
    const uint64_t bits = specials[rng() % specials.size()];
    std::memcpy(out.data() + i * size, &bits, size);  // little-endian: the low bytes
  }
  return out;
}

// Every instruction set this CPU has gives the scalar reference's results bit for bit, for every
// type and op, at lengths around the vector widths (so each loop and the scalar tail run), on
// unaligned buffers, and with the output aliasing an input.
TEST(ReduceTest, VectorKernelsMatchTheScalarReference) {
  std::mt19937_64 rng(12345);
  int isasTried = 0;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    ++isasTried;
    for (chorusDataType_t type : kTypes) {
      const size_t size = typeSize(type);
      for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{31}, size_t{63}, size_t{64},
                             size_t{65}, size_t{129}, size_t{1000}}) {
          // One element in front, so the vectors are not aligned.
          const std::vector<char> a = randomElements(count + 1, type, rng);
          const std::vector<char> b = randomElements(count + 1, type, rng);
          std::vector<char> want(a.size()), got(a.size()), inPlace = a;
          reduceWith(Isa::kScalar, want.data() + size, a.data() + size, b.data() + size, count, type, op);
          reduceWith(isa, got.data() + size, a.data() + size, b.data() + size, count, type, op);
          reduceWith(isa, inPlace.data() + size, inPlace.data() + size, b.data() + size, count, type, op);
          for (size_t i = 1; i <= count; ++i) {
            ASSERT_TRUE(sameElement(want.data(), got.data(), i, type))
                << isaName(isa) << " " << chorusTypeName(type) << " " << chorusOpName(op) << " count " << count
                << " element " << i - 1;
            ASSERT_TRUE(sameElement(want.data(), inPlace.data(), i, type))
                << isaName(isa) << " in place " << chorusTypeName(type) << " " << chorusOpName(op) << " count " << count
                << " element " << i - 1;
          }
          std::vector<char> divided = want;
          divideWith(Isa::kScalar, want.data() + size, count, type, 6);
          divideWith(isa, divided.data() + size, count, type, 6);
          for (size_t i = 1; i <= count; ++i) {
            ASSERT_TRUE(sameElement(want.data(), divided.data(), i, type))
                << isaName(isa) << " divide " << chorusTypeName(type) << " count " << count << " element " << i - 1;
          }
        }
      }
    }
  }
  if (isasTried == 0) GTEST_SKIP() << "this CPU has no vector instruction set the kernels are built for";
}

// reduceMany gives, in every destination, what folding reduceWith over the sources in order gives
// (then divideWith for Avg), for every instruction set, type and op: with 1 to 4 sources and 1 to
// 3 destinations, streamed or not, destinations aligned (streamed) and not (plain stores), a
// destination that is a source, and lengths that leave a tail; bytes around the destinations
// stay as they were.
TEST(ReduceTest, ReduceManyMatchesAFoldOfReduce) {
  std::mt19937_64 rng(2024);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isaSupported(isa)) continue;
    for (chorusDataType_t type : kTypes) {
      const size_t size = typeSize(type);
      for (chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin, chorusAvg}) {
        for (int nsrc : {1, 2, 3, 4}) {
          for (size_t count : {size_t{1}, size_t{63}, size_t{64}, size_t{3000}}) {
            for (bool stream : {false, true}) {
              for (size_t shift : {size_t{0}, size_t{1}}) {  // elements past a 64-byte boundary
                const size_t bytes = count * size;
                std::vector<std::vector<char>> inputs;
                for (int k = 0; k < nsrc; ++k) inputs.push_back(randomElements(count, type, rng));
                std::vector<char> want = inputs[0];
                for (int k = 1; k < nsrc; ++k) {
                  reduceWith(Isa::kScalar, want.data(), want.data(), inputs[k].data(), count, type, op);
                }
                if (op == chorusAvg) divideWith(Isa::kScalar, want.data(), count, type, nsrc);

                // Three destinations in one arena, each 64-byte aligned plus shift elements, with
                // guard bytes around them; the last source doubles as a fourth destination.
                const size_t stride = (bytes + 64 + shift * size + 63) / 64 * 64;
                std::vector<char> arena(64 + 3 * stride + 64, 0x5a);
                char* base = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
                std::vector<char> last = inputs[nsrc - 1];
                std::vector<void*> dsts;
                for (int j = 0; j < 3; ++j) dsts.push_back(base + 64 + j * stride + shift * size);
                dsts.push_back(last.data());
                std::vector<const void*> srcs;
                for (int k = 0; k + 1 < nsrc; ++k) srcs.push_back(inputs[k].data());
                srcs.push_back(last.data());
                // Streamed: every destination but the second, which keeps plain stores beside them.
                const bool streams[4] = {stream, false, stream, stream};
                reduceManyWith(isa, dsts.data(), static_cast<int>(dsts.size()), srcs.data(), nsrc, count, type, op,
                               streams);
                for (size_t j = 0; j < dsts.size(); ++j) {
                  const char* got = static_cast<const char*>(dsts[j]);
                  for (size_t i = 0; i < count; ++i) {
                    ASSERT_TRUE(sameElement(want.data(), got, i, type))
                        << isaName(isa) << " " << chorusTypeName(type) << " " << chorusOpName(op) << " " << nsrc
                        << " sources, count " << count << (stream ? ", streamed" : "") << ", shift " << shift
                        << ": destination " << j << " element " << i;
                  }
                }
                for (int j = 0; j < 3; ++j) {
                  const char* at = static_cast<const char*>(dsts[j]);
                  const char* from = j == 0 ? arena.data() : static_cast<const char*>(dsts[j - 1]) + bytes;
                  for (const char* p = from; p < at; ++p) ASSERT_EQ(*p, 0x5a) << "before destination " << j;
                }
                for (const char* p = static_cast<const char*>(dsts[2]) + bytes; p < arena.data() + arena.size(); ++p) {
                  ASSERT_EQ(*p, 0x5a) << "after the last destination";
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(ReduceTest, ActiveIsaIsTheBestSupported) {
  const Isa active = activeIsa();
  EXPECT_TRUE(isaSupported(active)) << isaName(active);
  if (std::getenv("CHORUS_CPU_ISA") == nullptr) {
    for (Isa better : {Isa::kAvx2, Isa::kAvx512}) {
      if (better > active) {
        EXPECT_FALSE(isaSupported(better)) << isaName(better) << " is supported but not used";
      }
    }
  }
}

TEST(CopyTest, StreamingCopyWritesExactlyTheRange) {
  // Every size around the 16-byte head and the 64-byte lines, at every destination alignment
  // within a line, and a large one; the bytes either side of the destination stay as they were.
  std::mt19937 random(7);
  std::vector<unsigned char> src((1 << 20) + 200);
  for (unsigned char& b : src) b = static_cast<unsigned char>(random());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{63}, size_t{64}, size_t{65},
                       size_t{127}, size_t{129}, size_t{1000}, size_t{(1 << 20) + 7}}) {
    for (size_t dstShift : {0, 1, 8, 15, 16, 33, 63}) {
      const size_t srcShift = (dstShift * 7 + 3) % 64;
      std::vector<unsigned char> dst(bytes + 256, 0xa5);
      copyStreaming(dst.data() + 64 + dstShift, src.data() + srcShift, bytes);
      SCOPED_TRACE(testing::Message() << bytes << " bytes, destination +" << dstShift << ", source +" << srcShift);
      EXPECT_EQ(std::memcmp(dst.data() + 64 + dstShift, src.data() + srcShift, bytes), 0);
      for (size_t i = 0; i < 64 + dstShift; ++i) ASSERT_EQ(dst[i], 0xa5) << "byte " << i << " before the range";
      for (size_t i = 64 + dstShift + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xa5) << "byte " << i;
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
