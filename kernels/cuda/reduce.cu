// reduce.cu: element-wise reductions on device memory for every type x op, and casts between the
// float types; must match the CPU reference (kernels/cpu/reduce.cc, kernels/cpu/half.h) bit for
// bit: integer Sum and Prod wrap, fp16 / bf16 compute in fp32 and round to nearest even once (NaN
// as the reference writes it), Avg combines as Sum and divides once at the end. Loads and stores
// are 16 bytes wide where the three buffers allow it; a grid-stride loop covers any count.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/half.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/load.cuh"
#include "kernels/cuda/reduce.h"
#include "kernels/reduce_ops.h"

namespace chorus::kernels::cuda {
namespace {

using SumOp = OpSum;
using ProdOp = OpProd;
using MaxOp = OpMax;
using MinOp = OpMin;

// Storage type, compute type and conversions per chorus type.
template <typename T>
struct Native {
  using Compute = T;
  __device__ static Compute load(T v) { return v; }
  __device__ static T store(Compute v) { return v; }
};
// The hardware conversions round to nearest even as the reference does; only NaN differs (the
// hardware's cvt reads and writes one canonical NaN, dropping sign and payload), so NaN goes
// through the reference's own functions both ways. Widening bf16 is a shift: the reference's.
struct Half {
  using Compute = float;
  __device__ static float load(__half v) {
    const uint16_t bits = __half_as_ushort(v);
    return (bits & 0x7fffu) > 0x7c00u ? halfToFloat(bits) : __half2float(v);
  }
  __device__ static __half store(float v) { return v != v ? __ushort_as_half(floatToHalf(v)) : __float2half_rn(v); }
};
struct Bfloat {
  using Compute = float;
  __device__ static float load(__nv_bfloat16 v) { return bfloat16ToFloat(__bfloat16_as_ushort(v)); }
  __device__ static __nv_bfloat16 store(float v) {
    return v != v ? __ushort_as_bfloat16(floatToBfloat16(v)) : __float2bfloat16_rn(v);
  }
};

// A chorus type's storage type T and conversions Conv, as a tag for withType.
template <typename T, typename C>
struct Typed {
  using Storage = T;
  using Conv = C;
};
using Fp32 = Typed<float, Native<float>>;
using Fp64 = Typed<double, Native<double>>;
using Fp16 = Typed<__half, Half>;
using Bf16 = Typed<__nv_bfloat16, Bfloat>;

// f(Typed<T, Conv>{}) for the storage type and conversions of `type`; cudaErrorInvalidValue for a
// type that is none of chorus's.
template <typename F>
int withType(chorusDataType_t type, F&& f) {
  switch (type) {
    case chorusInt8:
      return f(Typed<int8_t, Native<int8_t>>{});
    case chorusUint8:
      return f(Typed<uint8_t, Native<uint8_t>>{});
    case chorusInt32:
      return f(Typed<int32_t, Native<int32_t>>{});
    case chorusUint32:
      return f(Typed<uint32_t, Native<uint32_t>>{});
    case chorusInt64:
      return f(Typed<int64_t, Native<int64_t>>{});
    case chorusUint64:
      return f(Typed<uint64_t, Native<uint64_t>>{});
    case chorusFloat32:
      return f(Fp32{});
    case chorusFloat64:
      return f(Fp64{});
    case chorusFloat16:
      return f(Fp16{});
    case chorusBfloat16:
      return f(Bf16{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

// vectors (count / elements per 16 bytes, or 0 when a pointer is not 16-byte aligned) go as
// 16-byte loads and stores; the elements after them one at a time.
template <typename T, typename Conv, typename Op>
__global__ void reduceKernel(T* dst, const T* a, const T* b, size_t count, size_t vectors) {
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  const size_t stride = gridThreads();
  for (size_t v = threadIndex(); v < vectors; v += stride) {
    const uint4 va = __ldg(reinterpret_cast<const uint4*>(a) + v);
    const uint4 vb = __ldg(reinterpret_cast<const uint4*>(b) + v);
    uint4 vd;
    const T* ea = reinterpret_cast<const T*>(&va);
    const T* eb = reinterpret_cast<const T*>(&vb);
    T* ed = reinterpret_cast<T*>(&vd);
#pragma unroll
    for (size_t j = 0; j < kLanes; ++j) ed[j] = Conv::store(Op::apply(Conv::load(ea[j]), Conv::load(eb[j])));
    reinterpret_cast<uint4*>(dst)[v] = vd;
  }
  for (size_t i = vectors * kLanes + threadIndex(); i < count; i += stride) {
    dst[i] = Conv::store(Op::apply(Conv::load(a[i]), Conv::load(b[i])));
  }
}

template <typename T, typename Conv>
__global__ void divideKernel(T* buf, size_t count, int divisor) {
  using C = typename Conv::Compute;
  for (size_t i = threadIndex(); i < count; i += gridThreads()) {
    if constexpr (std::is_integral_v<C>) {
      using Wide = std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>;
      buf[i] = static_cast<T>(static_cast<Wide>(buf[i]) / static_cast<Wide>(divisor));
    } else {
      buf[i] = Conv::store(Conv::load(buf[i]) / static_cast<C>(divisor));
    }
  }
}

// Enough blocks of 256 threads to give each thread about one 16-byte vector, at most 8 per SM
// slot of a large GPU (the grid-stride loop takes the rest).
unsigned gridFor(size_t items) {
  const size_t blocks = (items + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

// The sources and destinations of one reduceMany, by value.
struct Sources {
  const void* at[kMaxReduceSources];
  int count;
};
struct Destinations {
  void* at[kMaxReduceSources];
  int count;
};

// Every destination = fold of the sources, 16 bytes at a time where every pointer allows, then the
// tail. A thread loads its element of every source before it stores any destination's.
template <typename T, typename Conv, typename Op>
__global__ void reduceManyKernel(Destinations dsts, Sources srcs, size_t count, size_t vectors, int divisor) {
  using C = typename Conv::Compute;
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  const size_t stride = gridThreads();
  auto finish = [&](C value) -> T {
    if (divisor <= 1) return Conv::store(value);
    const C sum = Conv::load(Conv::store(value));  // stored, then divided once, as the reference
    if constexpr (std::is_integral_v<C>) {
      using Wide = std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>;
      return static_cast<T>(static_cast<Wide>(sum) / static_cast<Wide>(divisor));
    } else {
      return Conv::store(sum / static_cast<C>(divisor));
    }
  };
  for (size_t v = threadIndex(); v < vectors; v += stride) {
    C acc[kLanes];
    {
      const uint4 first = *(reinterpret_cast<const uint4*>(srcs.at[0]) + v);
      const T* e = reinterpret_cast<const T*>(&first);
#pragma unroll
      for (size_t j = 0; j < kLanes; ++j) acc[j] = Conv::load(e[j]);
    }
    for (int s = 1; s < srcs.count; ++s) {
      const uint4 next = *(reinterpret_cast<const uint4*>(srcs.at[s]) + v);
      const T* e = reinterpret_cast<const T*>(&next);
#pragma unroll
      for (size_t j = 0; j < kLanes; ++j) acc[j] = Op::apply(acc[j], Conv::load(e[j]));
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (size_t j = 0; j < kLanes; ++j) o[j] = finish(acc[j]);
    for (int d = 0; d < dsts.count; ++d) reinterpret_cast<uint4*>(dsts.at[d])[v] = out;
  }
  for (size_t i = vectors * kLanes + threadIndex(); i < count; i += stride) {
    C acc = Conv::load(static_cast<const T*>(srcs.at[0])[i]);
    for (int s = 1; s < srcs.count; ++s) acc = Op::apply(acc, Conv::load(static_cast<const T*>(srcs.at[s])[i]));
    const T value = finish(acc);
    for (int d = 0; d < dsts.count; ++d) static_cast<T*>(dsts.at[d])[i] = value;
  }
}

template <typename T, typename Conv, typename Op>
int launchReduceMany(const Destinations& dsts, const Sources& srcs, size_t count, int divisor, cudaStream_t stream) {
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  bool aligned = true;
  for (int d = 0; d < dsts.count; ++d) aligned = aligned && vectorAligned(dsts.at[d]);
  for (int s = 0; s < srcs.count; ++s) aligned = aligned && vectorAligned(srcs.at[s]);
  const size_t vectors = aligned ? count / kLanes : 0;
  CHORUS_LAUNCH((reduceManyKernel<T, Conv, Op>), gridFor(vectors > 0 ? vectors : count), 256, 0, stream, dsts, srcs,
                count, vectors, divisor);
  return static_cast<int>(cudaGetLastError());
}

template <typename Op>
int reduceManyTyped(const Destinations& dsts, const Sources& srcs, size_t count, chorusDataType_t type, int divisor,
                    cudaStream_t s) {
  return withType(type, [&](auto typed) {
    using Tag = decltype(typed);
    return launchReduceMany<typename Tag::Storage, typename Tag::Conv, Op>(dsts, srcs, count, divisor, s);
  });
}

template <typename T, typename Conv, typename Op>
int launchReduce(void* dst, const void* a, const void* b, size_t count, cudaStream_t stream) {
  constexpr size_t kLanes = kVectorBytes / sizeof(T);
  const size_t vectors = vectorAligned(dst) && vectorAligned(a) && vectorAligned(b) ? count / kLanes : 0;
  CHORUS_LAUNCH((reduceKernel<T, Conv, Op>), gridFor(vectors > 0 ? vectors : count), 256, 0, stream,
                static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, vectors);
  return static_cast<int>(cudaGetLastError());
}

template <typename Op>
int reduceTyped(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, cudaStream_t s) {
  return withType(type, [&](auto typed) {
    using Tag = decltype(typed);
    return launchReduce<typename Tag::Storage, typename Tag::Conv, Op>(dst, a, b, count, s);
  });
}

template <typename T, typename Conv>
int launchDivide(void* buf, size_t count, int divisor, cudaStream_t stream) {
  CHORUS_LAUNCH((divideKernel<T, Conv>), gridFor(count), 256, 0, stream, static_cast<T*>(buf), count, divisor);
  return static_cast<int>(cudaGetLastError());
}

// A cast: From's elements (a Typed tag: storage and conversions, the reductions' own) loaded,
// then stored as To's, by way of W: float, or double where either side is double. A float's round
// trip through double would quiet a signaling NaN, which the reference keeps bit for bit.
template <typename To, typename From>
__global__ void castKernel(typename To::Storage* dst, const typename From::Storage* src, size_t count) {
  constexpr bool kDouble =
      std::is_same_v<typename To::Storage, double> || std::is_same_v<typename From::Storage, double>;
  using W = std::conditional_t<kDouble, double, float>;
  using ToCompute = typename To::Conv::Compute;
  for (size_t i = threadIndex(); i < count; i += gridThreads())
    dst[i] = To::Conv::store(static_cast<ToCompute>(static_cast<W>(From::Conv::load(src[i]))));
}

template <typename To, typename From>
int launchCast(void* dst, const void* src, size_t count, cudaStream_t stream) {
  CHORUS_LAUNCH((castKernel<To, From>), gridFor(count), 256, 0, stream, static_cast<typename To::Storage*>(dst),
                static_cast<const typename From::Storage*>(src), count);
  return static_cast<int>(cudaGetLastError());
}

template <typename From>
int castFrom(void* dst, chorusDataType_t dstType, const void* src, size_t count, cudaStream_t s) {
  switch (dstType) {
    case chorusFloat32:
      return launchCast<Fp32, From>(dst, src, count, s);
    case chorusFloat64:
      return launchCast<Fp64, From>(dst, src, count, s);
    case chorusFloat16:
      return launchCast<Fp16, From>(dst, src, count, s);
    case chorusBfloat16:
      return launchCast<Bf16, From>(dst, src, count, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace

int cast(void* dst, chorusDataType_t dstType, const void* src, chorusDataType_t srcType, size_t count, void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (srcType) {
    case chorusFloat32:
      return castFrom<Fp32>(dst, dstType, src, count, s);
    case chorusFloat64:
      return castFrom<Fp64>(dst, dstType, src, count, s);
    case chorusFloat16:
      return castFrom<Fp16>(dst, dstType, src, count, s);
    case chorusBfloat16:
      return castFrom<Bf16>(dst, dstType, src, count, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int reduce(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, chorusRedOp_t op,
           void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (op) {
    case chorusSum:
    case chorusAvg:
      return reduceTyped<SumOp>(dst, a, b, count, type, s);
    case chorusProd:
      return reduceTyped<ProdOp>(dst, a, b, count, type, s);
    case chorusMax:
      return reduceTyped<MaxOp>(dst, a, b, count, type, s);
    case chorusMin:
      return reduceTyped<MinOp>(dst, a, b, count, type, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int reduceMany(void* const* dsts, int destinations, const void* const* srcs, int sources, size_t count,
               chorusDataType_t type, chorusRedOp_t op, int divisor, void* stream) {
  if (count == 0) return 0;
  if (sources < 1 || sources > kMaxReduceSources || destinations < 1 || destinations > kMaxReduceSources) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  Sources from{};
  from.count = sources;
  for (int s = 0; s < sources; ++s) from.at[s] = srcs[s];
  Destinations to{};
  to.count = destinations;
  for (int d = 0; d < destinations; ++d) to.at[d] = dsts[d];
  const auto st = static_cast<cudaStream_t>(stream);
  switch (op) {
    case chorusSum:
      return reduceManyTyped<SumOp>(to, from, count, type, 1, st);
    case chorusAvg:
      return reduceManyTyped<SumOp>(to, from, count, type, divisor, st);
    case chorusProd:
      return reduceManyTyped<ProdOp>(to, from, count, type, 1, st);
    case chorusMax:
      return reduceManyTyped<MaxOp>(to, from, count, type, 1, st);
    case chorusMin:
      return reduceManyTyped<MinOp>(to, from, count, type, 1, st);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int preloadReduceMany() {
  for (int t = 0; t < chorusNumTypes; ++t) {
    const int error = withType(static_cast<chorusDataType_t>(t), [](auto typed) {
      using Tag = decltype(typed);
      using T = typename Tag::Storage;
      using Conv = typename Tag::Conv;
      for (const int e : {loadKernel(reduceManyKernel<T, Conv, SumOp>), loadKernel(reduceManyKernel<T, Conv, ProdOp>),
                          loadKernel(reduceManyKernel<T, Conv, MaxOp>), loadKernel(reduceManyKernel<T, Conv, MinOp>)}) {
        if (e != 0) return e;
      }
      return 0;
    });
    if (error != 0) return error;
  }
  return 0;
}

int divide(void* buf, size_t count, chorusDataType_t type, int divisor, void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return withType(type, [&](auto typed) {
    using Tag = decltype(typed);
    return launchDivide<typename Tag::Storage, typename Tag::Conv>(buf, count, divisor, s);
  });
}

}  // namespace chorus::kernels::cuda
