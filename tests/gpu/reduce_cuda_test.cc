// reduce_cuda_test.cc: the CUDA reduction kernels match the CPU reference bit for bit, for every
// type x op. Skipped (with the reason) on machines without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"
#include "tests/gpu/device.h"
#include "tests/support/pattern.h"

namespace chorus::kernels {
namespace {

using chorus::testing::DeviceBuffer;

TEST(CudaReduceTest, MatchesCpuReferenceForEveryTypeAndOp) {
  CHORUS_REQUIRE_CUDA_DEVICE();
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

// reduceMany into several destinations at once, one of them a source (in place), as the direct
// all-reduce on one GPU calls it: every destination equals kernels::reduceMany's on the CPU, for
// every type x op, on whole vectors and, shifted by one element, on the element path.
TEST(CudaReduceTest, ReduceManyIntoEveryDestinationMatchesCpuReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  constexpr size_t kCount = 70001;
  constexpr int kSources = 3;
  for (int t = 0; t < chorusNumTypes; ++t) {
    const auto type = static_cast<chorusDataType_t>(t);
    const size_t size = typeSize(type);
    const size_t bytes = (kCount + 1) * size;
    for (int o = 0; o < chorusNumOps; ++o) {
      const auto op = static_cast<chorusRedOp_t>(o);
      std::vector<std::vector<char>> in(kSources, std::vector<char>(bytes));
      for (int s = 0; s < kSources; ++s) {
        for (size_t i = 0; i < kCount + 1; ++i)
          pattern::store(in[s].data(), i, type, pattern::reduceInput(op, type, s, i));
      }
      for (const size_t shift : {size_t{0}, size_t{1}}) {
        std::vector<char> cpu(kCount * size);
        void* cpuTo[] = {cpu.data()};
        const void* cpuFrom[kSources];
        for (int s = 0; s < kSources; ++s) cpuFrom[s] = in[s].data() + shift * size;
        reduceMany(cpuTo, 1, cpuFrom, kSources, kCount, type, op, nullptr);
        std::vector<std::unique_ptr<DeviceBuffer<char>>> sources;
        for (int s = 0; s < kSources; ++s) sources.push_back(std::make_unique<DeviceBuffer<char>>(in[s]));
        DeviceBuffer<char> other{std::vector<char>(bytes)}, third{std::vector<char>(bytes)};
        // Destinations: a buffer of their own, source 1 itself (in place), another of their own.
        void* to[] = {other.data + shift * size, sources[1]->data + shift * size, third.data + shift * size};
        const void* from[kSources];
        for (int s = 0; s < kSources; ++s) from[s] = sources[s]->data + shift * size;
        ASSERT_EQ(cuda::reduceMany(to, 3, from, kSources, kCount, type, op, kSources, nullptr), 0);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (const DeviceBuffer<char>* d : {&other, sources[1].get(), &third}) {
          const std::vector<char> gpu = d->read();
          EXPECT_EQ(std::memcmp(cpu.data(), gpu.data() + shift * size, kCount * size), 0)
              << chorusTypeName(type) << " " << chorusOpName(op) << " shift " << shift;
        }
      }
    }
  }
  const void* from[1] = {nullptr};
  void* to[cuda::kMaxReduceSources + 1] = {};
  EXPECT_NE(cuda::reduceMany(to, cuda::kMaxReduceSources + 1, from, 1, 1, chorusFloat32, chorusSum, 1, nullptr), 0);
}

// NaN and infinities: a NaN operand keeps its sign and payload (quieted), an invalid operation
// (inf - inf, 0 * inf) gives the reference's default NaN, for every float type and op, bit for bit.
TEST(CudaReduceTest, NanAndInfinitiesMatchCpuReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {
      nan, -nan, bitsFloat(0x7fc01234u), bitsFloat(0xffa00001u) /* signalling */, inf, -inf, 0.0f, -0.0f, 1.5f, -2.0f};
  std::vector<float> a, b;
  for (float x : specials) {
    for (float y : specials) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  const size_t count = a.size();
  for (const chorusDataType_t type : {chorusFloat32, chorusFloat64, chorusFloat16, chorusBfloat16}) {
    const size_t size = typeSize(type);
    std::vector<char> ha(count * size), hb(count * size);
    for (size_t i = 0; i < count; ++i) {
      if (type == chorusFloat32) {
        std::memcpy(ha.data() + i * 4, &a[i], 4);
        std::memcpy(hb.data() + i * 4, &b[i], 4);
      } else if (type == chorusFloat64) {
        const double da = a[i], db = b[i];  // widening keeps NaN's sign and payload
        std::memcpy(ha.data() + i * 8, &da, 8);
        std::memcpy(hb.data() + i * 8, &db, 8);
      } else {
        const uint16_t ea = type == chorusFloat16 ? floatToHalf(a[i]) : floatToBfloat16(a[i]);
        const uint16_t eb = type == chorusFloat16 ? floatToHalf(b[i]) : floatToBfloat16(b[i]);
        std::memcpy(ha.data() + i * 2, &ea, 2);
        std::memcpy(hb.data() + i * 2, &eb, 2);
      }
    }
    for (const chorusRedOp_t op : {chorusSum, chorusProd, chorusMax, chorusMin}) {
      std::vector<char> cpu(count * size);
      reduce(cpu.data(), ha.data(), hb.data(), count, type, op);
      DeviceBuffer<char> da(ha), db(hb), dd{std::vector<char>(count * size)};
      ASSERT_EQ(cuda::reduce(dd.data, da.data, db.data, count, type, op, nullptr), 0);
      const std::vector<char> gpu = dd.read();
      for (size_t i = 0; i < count; ++i) {
        // Two NaN operands: which one x86 returns depends on the order the compiler gave them to
        // the instruction (a sum commutes), so the reference fixes only that the result is NaN.
        if (a[i] != a[i] && b[i] != b[i] && (op == chorusSum || op == chorusProd)) {
          const double got =
              type == chorusFloat32
                  ? static_cast<double>(bitsFloat(*reinterpret_cast<const uint32_t*>(gpu.data() + i * 4)))
              : type == chorusFloat64 ? *reinterpret_cast<const double*>(gpu.data() + i * 8)
              : type == chorusFloat16
                  ? static_cast<double>(halfToFloat(*reinterpret_cast<const uint16_t*>(gpu.data() + i * 2)))
                  : static_cast<double>(bfloat16ToFloat(*reinterpret_cast<const uint16_t*>(gpu.data() + i * 2)));
          EXPECT_NE(got, got) << chorusTypeName(type) << " " << chorusOpName(op) << " of two NaNs is not NaN";
          continue;
        }
        ASSERT_EQ(std::memcmp(cpu.data() + i * size, gpu.data() + i * size, size), 0)
            << chorusTypeName(type) << " " << chorusOpName(op) << " of bits " << std::hex << floatBits(a[i]) << " and "
            << floatBits(b[i]);
      }
    }
  }
}

// The 16-byte vector path and the element tail: offsets that misalign one buffer fall back to
// elements, and counts that are not whole vectors leave a tail; all must match the reference.
TEST(CudaReduceTest, MisalignedBuffersAndTailsMatchCpuReference) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  for (const size_t count : {size_t{1}, size_t{7}, size_t{33}, size_t{4099}}) {
    for (const size_t shift : {size_t{0}, size_t{1}, size_t{3}}) {
      std::vector<float> a(count + 4), b(count + 4);
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<float>(i % 97) * 0.5f - 11.0f;
        b[i] = static_cast<float>(i % 31) * 0.25f + 1.0f;
      }
      std::vector<float> cpu(count);
      reduce(cpu.data(), a.data() + shift, b.data(), count, chorusFloat32, chorusSum);
      DeviceBuffer<float> da(a), db(b), dd{std::vector<float>(count)};
      ASSERT_EQ(cuda::reduce(dd.data, da.data + shift, db.data, count, chorusFloat32, chorusSum, nullptr), 0);
      EXPECT_EQ(dd.read(), cpu) << "count " << count << " shift " << shift;
    }
  }
}

// fp32 <-> fp16 / bf16 casts equal kernels/cpu/half.h's conversions bit for bit, including
// subnormals, ties, overflow to infinity and NaN.
TEST(CudaCastTest, MatchesCpuConversions) {
  CHORUS_REQUIRE_CUDA_DEVICE();
  std::vector<float> values;
  for (int e = -30; e <= 20; ++e) {
    for (const float m : {1.0f, 1.5f, 1.0009765625f, 1.00048828125f, 1.99951171875f}) {
      values.push_back(std::ldexp(m, e));
      values.push_back(-std::ldexp(m, e));
    }
  }
  for (const float special : {0.0f, -0.0f, 65504.0f, 65520.0f, 1e-8f, std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    values.push_back(special);
  }
  for (uint32_t i = 0; i < 100000; ++i) values.push_back(bitsFloat(i * 42947u));
  const size_t n = values.size();
  std::vector<uint16_t> half(n), bf(n);
  floatToHalf(values.data(), half.data(), n);
  floatToBfloat16(values.data(), bf.data(), n);
  DeviceBuffer<float> dv(values);
  DeviceBuffer<uint16_t> dh{std::vector<uint16_t>(n)}, db{std::vector<uint16_t>(n)};
  ASSERT_EQ(cuda::cast(dh.data, chorusFloat16, dv.data, chorusFloat32, n, nullptr), 0);
  ASSERT_EQ(cuda::cast(db.data, chorusBfloat16, dv.data, chorusFloat32, n, nullptr), 0);
  EXPECT_EQ(dh.read(), half);
  EXPECT_EQ(db.read(), bf);
  // And back: every 16-bit pattern widens exactly as the reference widens it.
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> fromHalf(all.size()), fromBf(all.size());
  halfToFloat(all.data(), fromHalf.data(), all.size());
  bfloat16ToFloat(all.data(), fromBf.data(), all.size());
  DeviceBuffer<uint16_t> dall(all);
  DeviceBuffer<float> dfh{std::vector<float>(all.size())}, dfb{std::vector<float>(all.size())};
  ASSERT_EQ(cuda::cast(dfh.data, chorusFloat32, dall.data, chorusFloat16, all.size(), nullptr), 0);
  ASSERT_EQ(cuda::cast(dfb.data, chorusFloat32, dall.data, chorusBfloat16, all.size(), nullptr), 0);
  const auto gotHalf = dfh.read();
  const auto gotBf = dfb.read();
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(floatBits(gotHalf[i]), floatBits(fromHalf[i])) << "fp16 pattern " << i;
    ASSERT_EQ(floatBits(gotBf[i]), floatBits(fromBf[i])) << "bf16 pattern " << i;
  }
  EXPECT_NE(cuda::cast(dh.data, chorusInt32, dv.data, chorusFloat32, n, nullptr), 0);
}

}  // namespace
}  // namespace chorus::kernels
