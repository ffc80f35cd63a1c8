// reduce_vector.h: the vectorised reductions, written once with GCC vector extensions and compiled
// once per instruction set: reduce_avx2.cc and reduce_avx512.cc each include this file after
// defining CHORUS_VECTOR_BYTES (32 or 64) and CHORUS_VECTOR_NAMESPACE, under their own compiler
// flags. The kernels have internal linkage and the two entry points live in the per-set
// namespace, so the copies built for different instruction sets never meet at link time (an
// AVX-512 instance of a shared inline function could otherwise be picked for every caller, and
// fault on a CPU without AVX-512). No standard-library function is called here for that reason.
//
// Each kernel does whole vectors and returns how many elements it did; the caller finishes the
// tail with the scalar reference. Results are bit for bit the reference's: integer sums and
// products wrap, max and min pick as std::max and std::min do, fp16 and bf16 are widened to fp32,
// combined, and rounded to nearest even once (as kernels/cpu/half.h does; only the payload bits of
// a NaN may differ).
#ifndef CHORUS_VECTOR_BYTES
#error "define CHORUS_VECTOR_BYTES and CHORUS_VECTOR_NAMESPACE before including reduce_vector.h"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "chorus/chorus.h"
#include "kernels/cpu/isa.h"

namespace chorus::kernels::CHORUS_VECTOR_NAMESPACE {
namespace {

constexpr size_t kBytes = CHORUS_VECTOR_BYTES;

template <typename T, size_t N = kBytes>
struct VectorOf {
  typedef T type __attribute__((vector_size(N)));
};
template <typename T>
using Vec = typename VectorOf<T>::type;
using HalfVec = VectorOf<uint16_t, kBytes / 2>::type;  // as many 16-bit lanes as Vec<float> has

template <typename V>
inline V load(const void* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
inline void store(void* p, V v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// A non-temporal store of one vector (p aligned to its size): the line goes to memory without
// being read into the cache first.
template <typename V>
inline void streamStore(void* p, V v) {
  if constexpr (sizeof(V) == 64) {
#if CHORUS_VECTOR_BYTES == 64
    _mm512_stream_si512(static_cast<__m512i*>(p), reinterpret_cast<__m512i>(v));
#endif
  } else if constexpr (sizeof(V) == 32) {
    _mm256_stream_si256(static_cast<__m256i*>(p), reinterpret_cast<__m256i>(v));
  } else {
    static_assert(sizeof(V) == 16);
    _mm_stream_si128(static_cast<__m128i*>(p), reinterpret_cast<__m128i>(v));
  }
}

struct Sum {
  template <typename V>
  static V apply(V a, V b) {
    return a + b;
  }
};
struct Prod {
  template <typename V>
  static V apply(V a, V b) {
    return a * b;
  }
};
struct Max {
  template <typename V>
  static V apply(V a, V b) {
    return a < b ? b : a;  // std::max(a, b): a unless a < b, so a NaN picks as the reference does
  }
};
struct Min {
  template <typename V>
  static V apply(V a, V b) {
    return b < a ? b : a;  // std::min(a, b)
  }
};

// Integer sums and products on the unsigned type of the same width: the same bits as the
// reference's wrapping arithmetic, without signed overflow.
template <typename T, typename Op,
          bool Wraps = std::is_integral_v<T> && (std::is_same_v<Op, Sum> || std::is_same_v<Op, Prod>)>
struct LaneOf {
  using type = T;
};
template <typename T, typename Op>
struct LaneOf<T, Op, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T, typename Op>
using Lane = typename LaneOf<T, Op>::type;

template <typename T, typename Op>
size_t native(void* dst, const void* a, const void* b, size_t count) {
  using V = Vec<Lane<T, Op>>;
  constexpr size_t lanes = kBytes / sizeof(T);
  char* d = static_cast<char*>(dst);
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  size_t i = 0;
  for (; i + 2 * lanes <= count; i += 2 * lanes) {
    const size_t at = i * sizeof(T);
    const V r0 = Op::apply(load<V>(x + at), load<V>(y + at));
    const V r1 = Op::apply(load<V>(x + at + kBytes), load<V>(y + at + kBytes));
    store(d + at, r0);
    store(d + at + kBytes, r1);
  }
  for (; i + lanes <= count; i += lanes) {
    store(d + i * sizeof(T), Op::apply(load<V>(x + i * sizeof(T)), load<V>(y + i * sizeof(T))));
  }
  return i;
}

// fp16 <-> fp32 by the F16C / AVX-512F conversion instructions (round to nearest even).
inline Vec<float> fromHalf(HalfVec h) {
#if CHORUS_VECTOR_BYTES == 64
  return reinterpret_cast<Vec<float>>(_mm512_cvtph_ps(reinterpret_cast<__m256i>(h)));
#else
  return reinterpret_cast<Vec<float>>(_mm256_cvtph_ps(reinterpret_cast<__m128i>(h)));
#endif
}
inline HalfVec toHalf(Vec<float> v) {
#if CHORUS_VECTOR_BYTES == 64
  return reinterpret_cast<HalfVec>(
      _mm512_cvtps_ph(reinterpret_cast<__m512>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  return reinterpret_cast<HalfVec>(
      _mm256_cvtps_ph(reinterpret_cast<__m256>(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
}

// bf16 <-> fp32 in integer lanes, as floatToBfloat16 does: round to nearest even, NaN kept quiet.
inline Vec<float> fromBfloat16(HalfVec h) {
  const Vec<uint32_t> wide = __builtin_convertvector(h, Vec<uint32_t>);
  return reinterpret_cast<Vec<float>>(wide << 16);
}
inline HalfVec toBfloat16(Vec<float> v) {
  const Vec<uint32_t> x = reinterpret_cast<Vec<uint32_t>>(v);
  const Vec<uint32_t> rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const Vec<uint32_t> quiet = (x >> 16) | 0x40u;
  const Vec<uint32_t> out = (x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
  return __builtin_convertvector(out, HalfVec);
}

template <Vec<float> (*Widen)(HalfVec), HalfVec (*Narrow)(Vec<float>), typename Op>
size_t half(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t lanes = kBytes / sizeof(float);
  char* d = static_cast<char*>(dst);
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    store(d + 2 * i, Narrow(Op::apply(Widen(load<HalfVec>(x + 2 * i)), Widen(load<HalfVec>(y + 2 * i)))));
  }
  return i;
}

// The kernel of one type and op, for every kernel family: native(T) names a kernel over lanes of
// T, half(Widen, Narrow) one that works on fp16 or bf16 in fp32 lanes; byOp(op) the Op.
// Returns 0 for a type or op without a vector kernel.
template <typename Native, typename Half>
size_t byType(chorusDataType_t type, Native native, Half half) {
  switch (type) {
    case chorusInt8:
      return native.template operator()<int8_t>();
    case chorusUint8:
      return native.template operator()<uint8_t>();
    case chorusInt32:
      return native.template operator()<int32_t>();
    case chorusUint32:
      return native.template operator()<uint32_t>();
    case chorusInt64:
      return native.template operator()<int64_t>();
    case chorusUint64:
      return native.template operator()<uint64_t>();
    case chorusFloat32:
      return native.template operator()<float>();
    case chorusFloat64:
      return native.template operator()<double>();
    case chorusFloat16:
      return half.template operator()<fromHalf, toHalf>();
    case chorusBfloat16:
      return half.template operator()<fromBfloat16, toBfloat16>();
    default:
      return 0;
  }
}

template <typename Kernel>
size_t byOp(chorusRedOp_t op, Kernel kernel) {
  switch (op) {
    case chorusSum:
    case chorusAvg:  // sums; the caller divides
      return kernel.template operator()<Sum>();
    case chorusProd:
      return kernel.template operator()<Prod>();
    case chorusMax:
      return kernel.template operator()<Max>();
    case chorusMin:
      return kernel.template operator()<Min>();
    default:
      return 0;
  }
}

template <typename T>
size_t divideFloat(void* buf, size_t count, int divisor) {
  using V = Vec<T>;
  constexpr size_t lanes = kBytes / sizeof(T);
  char* p = static_cast<char*>(buf);
  const T by = static_cast<T>(divisor);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) store(p + i * sizeof(T), load<V>(p + i * sizeof(T)) / by);
  return i;
}

template <Vec<float> (*Widen)(HalfVec), HalfVec (*Narrow)(Vec<float>)>
size_t divideHalf(void* buf, size_t count, int divisor) {
  constexpr size_t lanes = kBytes / sizeof(float);
  char* p = static_cast<char*>(buf);
  const float by = static_cast<float>(divisor);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) store(p + 2 * i, Narrow(Widen(load<HalfVec>(p + 2 * i)) / by));
  return i;
}

// The fan-out reduction (reduceMany): vector by vector, every source folded in order, then the
// result stored to every destination, non-temporally where stream[j] is set (the caller checked
// the alignment). The same bits as reduce() folded over the sources: fp16 and bf16 round after
// each fold, as a fold through memory does; Avg divides the final sum.
struct Fan {
  void* const* dsts;
  const uint8_t* stream;
  int ndst;
  const void* const* srcs;
  int nsrc;
  bool average;
};

template <typename V>
inline void fanOut(const Fan& f, size_t at, V v) {
  for (int j = 0; j < f.ndst; ++j) {
    char* p = static_cast<char*>(f.dsts[j]) + at;
    if (f.stream[j]) {
      streamStore(p, v);
    } else {
      store(p, v);
    }
  }
}

template <typename T, typename Op>
size_t nativeMany(const Fan& f, size_t count) {
  using V = Vec<Lane<T, Op>>;
  constexpr size_t lanes = kBytes / sizeof(T);
  if (f.average && !std::is_floating_point_v<T>) return 0;  // integer division: the reference does it
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const size_t at = i * sizeof(T);
    V acc = load<V>(static_cast<const char*>(f.srcs[0]) + at);
    for (int k = 1; k < f.nsrc; ++k) acc = Op::apply(acc, load<V>(static_cast<const char*>(f.srcs[k]) + at));
    if constexpr (std::is_floating_point_v<T>) {
      if (f.average) acc = acc / static_cast<T>(f.nsrc);
    }
    fanOut(f, at, acc);
  }
  return i;
}

template <Vec<float> (*Widen)(HalfVec), HalfVec (*Narrow)(Vec<float>), typename Op>
size_t halfMany(const Fan& f, size_t count) {
  constexpr size_t lanes = kBytes / sizeof(float);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) {
    const size_t at = 2 * i;
    HalfVec acc = load<HalfVec>(static_cast<const char*>(f.srcs[0]) + at);
    for (int k = 1; k < f.nsrc; ++k) {
      acc = Narrow(Op::apply(Widen(acc), Widen(load<HalfVec>(static_cast<const char*>(f.srcs[k]) + at))));
    }
    if (f.average) acc = Narrow(Widen(acc) / static_cast<float>(f.nsrc));
    fanOut(f, at, acc);
  }
  return i;
}

}  // namespace

size_t reducePrefix(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op) {
  return byOp(op, [&]<typename Op>() {
    return byType(
        type, [&]<typename T>() { return native<T, Op>(dst, a, b, count); },
        [&]<Vec<float> (*Widen)(HalfVec), HalfVec (*Narrow)(Vec<float>)>() {
          return half<Widen, Narrow, Op>(dst, a, b, count);
        });
  });
}

size_t dividePrefix(void* buf, size_t count, chorusDataType_t type, int divisor) {
  switch (type) {
    case chorusFloat32:
      return divideFloat<float>(buf, count, divisor);
    case chorusFloat64:
      return divideFloat<double>(buf, count, divisor);
    case chorusFloat16:
      return divideHalf<fromHalf, toHalf>(buf, count, divisor);
    case chorusBfloat16:
      return divideHalf<fromBfloat16, toBfloat16>(buf, count, divisor);
    default:
      return 0;  // integer division has no vector instruction: the reference does it
  }
}

size_t reduceManyPrefix(void* const* dsts, const uint8_t* stream, int ndst, const void* const* srcs, int nsrc,
                        size_t count, chorusDataType_t type, chorusRedOp_t op) {
  const Fan f{dsts, stream, ndst, srcs, nsrc, op == chorusAvg};
  const size_t done = byOp(op, [&]<typename Op>() {
    return byType(
        type, [&]<typename T>() { return nativeMany<T, Op>(f, count); },
        [&]<Vec<float> (*Widen)(HalfVec), HalfVec (*Narrow)(Vec<float>)>() {
          return halfMany<Widen, Narrow, Op>(f, count);
        });
  });
  _mm_sfence();  // streamed lines are visible before whatever the caller publishes next
  return done;
}

size_t widenPrefix(const uint16_t* in, float* out, size_t count, chorusDataType_t type) {
  constexpr size_t lanes = kBytes / sizeof(float);
  const char* x = reinterpret_cast<const char*>(in);
  char* d = reinterpret_cast<char*>(out);
  size_t i = 0;
  if (type == chorusFloat16) {
    for (; i + lanes <= count; i += lanes) store(d + 4 * i, fromHalf(load<HalfVec>(x + 2 * i)));
  } else if (type == chorusBfloat16) {
    for (; i + lanes <= count; i += lanes) store(d + 4 * i, fromBfloat16(load<HalfVec>(x + 2 * i)));
  }
  return i;
}

size_t narrowPrefix(const float* in, uint16_t* out, size_t count, chorusDataType_t type) {
  constexpr size_t lanes = kBytes / sizeof(float);
  const char* x = reinterpret_cast<const char*>(in);
  char* d = reinterpret_cast<char*>(out);
  size_t i = 0;
  if (type == chorusFloat16) {
    for (; i + lanes <= count; i += lanes) store(d + 2 * i, toHalf(load<Vec<float>>(x + 4 * i)));
  } else if (type == chorusBfloat16) {
    for (; i + lanes <= count; i += lanes) store(d + 2 * i, toBfloat16(load<Vec<float>>(x + 4 * i)));
  }
  return i;
}

}  // namespace chorus::kernels::CHORUS_VECTOR_NAMESPACE
