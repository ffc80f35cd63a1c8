// reduce.cc: element-wise reductions for every type x op: the scalar reference, and the dispatch
// to the vector kernels of the best instruction set the CPU has (reduce_vector.h), which do whole
// vectors and leave the tail to the reference.
#include "kernels/cpu/reduce.h"

#if CHORUS_X86_VECTOR_KERNELS
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"

namespace chorus::kernels {
namespace {

struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;  // wrap instead of signed overflow
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};
struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};

template <typename T, typename Op>
void reduceNative(void* dst, const void* a, const void* b, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = Op::apply(x[i], y[i]);
}

// fp16 / bf16: widen to fp32, combine, round once.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), typename Op>
void reduceHalf(void* dst, const void* a, const void* b, size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = Store(Op::apply(Load(x[i]), Load(y[i])));
}

template <typename Op>
void reduceTyped(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type) {
  switch (type) {
    case chorusInt8:
      return reduceNative<int8_t, Op>(dst, a, b, count);
    case chorusUint8:
      return reduceNative<uint8_t, Op>(dst, a, b, count);
    case chorusInt32:
      return reduceNative<int32_t, Op>(dst, a, b, count);
    case chorusUint32:
      return reduceNative<uint32_t, Op>(dst, a, b, count);
    case chorusInt64:
      return reduceNative<int64_t, Op>(dst, a, b, count);
    case chorusUint64:
      return reduceNative<uint64_t, Op>(dst, a, b, count);
    case chorusFloat32:
      return reduceNative<float, Op>(dst, a, b, count);
    case chorusFloat64:
      return reduceNative<double, Op>(dst, a, b, count);
    case chorusFloat16:
      return reduceHalf<halfToFloat, floatToHalf, Op>(dst, a, b, count);
    case chorusBfloat16:
      return reduceHalf<bfloat16ToFloat, floatToBfloat16, Op>(dst, a, b, count);
    default:
      return;
  }
}

template <typename T>
void divideNative(void* buf, size_t count, int divisor) {
  T* p = static_cast<T*>(buf);
  if constexpr (std::is_integral_v<T>) {
    // Divide in 64 bits: a divisor (rank count) may not fit in T.
    using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    const Wide d = static_cast<Wide>(divisor);
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<Wide>(p[i]) / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) p[i] = p[i] / d;
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void divideHalf(void* buf, size_t count, int divisor) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) p[i] = Store(Load(p[i]) / d);
}

void reduceReference(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op) {
  switch (op) {
    case chorusSum:
    case chorusAvg:
      return reduceTyped<SumOp>(dst, a, b, count, type);
    case chorusProd:
      return reduceTyped<ProdOp>(dst, a, b, count, type);
    case chorusMax:
      return reduceTyped<MaxOp>(dst, a, b, count, type);
    case chorusMin:
      return reduceTyped<MinOp>(dst, a, b, count, type);
    default:
      return;
  }
}

void divideReference(void* buf, size_t count, chorusDataType_t type, int divisor) {
  switch (type) {
    case chorusInt8:
      return divideNative<int8_t>(buf, count, divisor);
    case chorusUint8:
      return divideNative<uint8_t>(buf, count, divisor);
    case chorusInt32:
      return divideNative<int32_t>(buf, count, divisor);
    case chorusUint32:
      return divideNative<uint32_t>(buf, count, divisor);
    case chorusInt64:
      return divideNative<int64_t>(buf, count, divisor);
    case chorusUint64:
      return divideNative<uint64_t>(buf, count, divisor);
    case chorusFloat32:
      return divideNative<float>(buf, count, divisor);
    case chorusFloat64:
      return divideNative<double>(buf, count, divisor);
    case chorusFloat16:
      return divideHalf<halfToFloat, floatToHalf>(buf, count, divisor);
    case chorusBfloat16:
      return divideHalf<bfloat16ToFloat, floatToBfloat16>(buf, count, divisor);
    default:
      return;
  }
}

Isa detectIsa() {
  Isa best = Isa::kScalar;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isaSupported(isa)) best = isa;
  }
  if (const char* cap = std::getenv("CHORUS_CPU_ISA"); cap != nullptr && *cap != '\0') {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (std::strcmp(cap, isaName(isa)) == 0 && isa < best) best = isa;
    }
  }
  return best;
}

}  // namespace

const char* isaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    default:
      return "scalar";
  }
}

#if CHORUS_X86_VECTOR_KERNELS
// F16C from CPUID itself: clang's __builtin_cpu_supports does not know the name.
bool cpuHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

bool isaSupported(Isa isa) {
#if CHORUS_X86_VECTOR_KERNELS
  switch (isa) {
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && cpuHasF16c();
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    default:
      return true;
  }
#else
  return isa == Isa::kScalar;
#endif
}

Isa activeIsa() {
  static const Isa isa = detectIsa();
  return isa;
}

void reduceWith(Isa isa, void* dst, const void* a, const void* b, size_t count, chorusDataType_t type,
                chorusRedOp_t op) {
  size_t done = 0;
#if CHORUS_X86_VECTOR_KERNELS
  if (isa == Isa::kAvx512) done = avx512::reducePrefix(dst, a, b, count, type, op);
  if (isa == Isa::kAvx2) done = avx2::reducePrefix(dst, a, b, count, type, op);
#endif
  if (done == count) return;
  const size_t offset = done * typeSize(type);
  reduceReference(static_cast<char*>(dst) + offset, static_cast<const char*>(a) + offset,
                  static_cast<const char*>(b) + offset, count - done, type, op);
}

void divideWith(Isa isa, void* buf, size_t count, chorusDataType_t type, int divisor) {
  size_t done = 0;
#if CHORUS_X86_VECTOR_KERNELS
  if (isa == Isa::kAvx512) done = avx512::dividePrefix(buf, count, type, divisor);
  if (isa == Isa::kAvx2) done = avx2::dividePrefix(buf, count, type, divisor);
#endif
  if (done == count) return;
  divideReference(static_cast<char*>(buf) + done * typeSize(type), count - done, type, divisor);
}

void reduceManyWith(Isa isa, void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t count,
                    chorusDataType_t type, chorusRedOp_t op, const bool* stream) {
  if (ndst <= 0 || nsrc <= 0 || count == 0) return;
  // Per destination (on the stack for the few of a fused receive; the heap for many ranks).
  uint8_t few[8] = {};
  std::vector<uint8_t> many(ndst > 8 ? ndst : 0);
  uint8_t* streamed = ndst > 8 ? many.data() : few;
  for (int j = 0; j < ndst; ++j) {
    const bool source = std::find(srcs, srcs + nsrc, dsts[j]) != srcs + nsrc;
    streamed[j] = stream != nullptr && stream[j] && !source && reinterpret_cast<uintptr_t>(dsts[j]) % 64 == 0;
  }
  size_t done = 0;
#if CHORUS_X86_VECTOR_KERNELS
  if (isa == Isa::kAvx512) done = avx512::reduceManyPrefix(dsts, streamed, ndst, srcs, nsrc, count, type, op);
  if (isa == Isa::kAvx2) done = avx2::reduceManyPrefix(dsts, streamed, ndst, srcs, nsrc, count, type, op);
#endif
  // The rest (the tail, a scalar CPU, integer Avg) by reduce() and divide() through a buffer on the
  // stack, a page at a time.
  const size_t size = typeSize(type);
  alignas(64) char folded[4096];
  const size_t per = sizeof(folded) / size;
  for (size_t first = done; first < count; first += per) {
    const size_t k = std::min(per, count - first);
    const size_t at = first * size;
    if (nsrc == 1) {
      std::memcpy(folded, static_cast<const char*>(srcs[0]) + at, k * size);
    } else {
      reduceWith(isa, folded, static_cast<const char*>(srcs[0]) + at, static_cast<const char*>(srcs[1]) + at, k, type,
                 op);
    }
    for (int s = 2; s < nsrc; ++s) reduceWith(isa, folded, folded, static_cast<const char*>(srcs[s]) + at, k, type, op);
    if (op == chorusAvg) divideWith(isa, folded, k, type, nsrc);
    for (int j = 0; j < ndst; ++j) std::memcpy(static_cast<char*>(dsts[j]) + at, folded, k * size);
  }
}

void reduce(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op) {
  reduceWith(activeIsa(), dst, a, b, count, type, op);
}

void divide(void* buf, size_t count, chorusDataType_t type, int divisor) {
  divideWith(activeIsa(), buf, count, type, divisor);
}

void reduceMany(void* const* dsts, int ndst, const void* const* srcs, int nsrc, size_t count, chorusDataType_t type,
                chorusRedOp_t op, const bool* stream) {
  reduceManyWith(activeIsa(), dsts, ndst, srcs, nsrc, count, type, op, stream);
}

size_t typeSize(chorusDataType_t type) {
  switch (type) {
    case chorusInt8:
    case chorusUint8:
      return 1;
    case chorusFloat16:
    case chorusBfloat16:
      return 2;
    case chorusInt32:
    case chorusUint32:
    case chorusFloat32:
      return 4;
    case chorusInt64:
    case chorusUint64:
    case chorusFloat64:
      return 8;
    default:
      return 0;
  }
}

}  // namespace chorus::kernels
