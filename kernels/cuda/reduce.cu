// reduce.cu: element-wise reductions on device memory for every type x op; must match the CPU
// reference (kernels/cpu/reduce.cc): integer Sum and Prod wrap, fp16 / bf16 compute in fp32 and
// round to nearest even once, Avg combines as Sum and divides once at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/reduce.h"

namespace chorus::kernels::cuda {
namespace {

struct SumOp {
  template <typename T>
  __device__ static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct ProdOp {
  template <typename T>
  __device__ static T apply(T a, T b) {
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
  __device__ static T apply(T a, T b) {
    return a < b ? b : a;
  }
};
struct MinOp {
  template <typename T>
  __device__ static T apply(T a, T b) {
    return b < a ? b : a;
  }
};

// Storage type, compute type and conversions per chorus type.
template <typename T>
struct Native {
  using Compute = T;
  __device__ static Compute load(T v) { return v; }
  __device__ static T store(Compute v) { return v; }
};
struct Half {
  using Compute = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
struct Bfloat {
  using Compute = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T, typename Conv, typename Op>
__global__ void reduceKernel(T* dst, const T* a, const T* b, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = Conv::store(Op::apply(Conv::load(a[i]), Conv::load(b[i])));
  }
}

template <typename T, typename Conv>
__global__ void divideKernel(T* buf, size_t count, int divisor) {
  using C = typename Conv::Compute;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_integral_v<C>) {
      using Wide = std::conditional_t<std::is_signed_v<C>, int64_t, uint64_t>;
      buf[i] = static_cast<T>(static_cast<Wide>(buf[i]) / static_cast<Wide>(divisor));
    } else {
      buf[i] = Conv::store(Conv::load(buf[i]) / static_cast<C>(divisor));
    }
  }
}

unsigned gridFor(size_t count) {
  const size_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

template <typename T, typename Conv, typename Op>
int launchReduce(void* dst, const void* a, const void* b, size_t count, cudaStream_t stream) {
  reduceKernel<T, Conv, Op><<<gridFor(count), 256, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                                static_cast<const T*>(b), count);
  return static_cast<int>(cudaGetLastError());
}

template <typename Op>
int reduceTyped(void* dst, const void* a, const void* b, size_t count, chorusDataType_t type, cudaStream_t s) {
  switch (type) {
    case chorusInt8:
      return launchReduce<int8_t, Native<int8_t>, Op>(dst, a, b, count, s);
    case chorusUint8:
      return launchReduce<uint8_t, Native<uint8_t>, Op>(dst, a, b, count, s);
    case chorusInt32:
      return launchReduce<int32_t, Native<int32_t>, Op>(dst, a, b, count, s);
    case chorusUint32:
      return launchReduce<uint32_t, Native<uint32_t>, Op>(dst, a, b, count, s);
    case chorusInt64:
      return launchReduce<int64_t, Native<int64_t>, Op>(dst, a, b, count, s);
    case chorusUint64:
      return launchReduce<uint64_t, Native<uint64_t>, Op>(dst, a, b, count, s);
    case chorusFloat32:
      return launchReduce<float, Native<float>, Op>(dst, a, b, count, s);
    case chorusFloat64:
      return launchReduce<double, Native<double>, Op>(dst, a, b, count, s);
    case chorusFloat16:
      return launchReduce<__half, Half, Op>(dst, a, b, count, s);
    case chorusBfloat16:
      return launchReduce<__nv_bfloat16, Bfloat, Op>(dst, a, b, count, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

template <typename T, typename Conv>
int launchDivide(void* buf, size_t count, int divisor, cudaStream_t stream) {
  divideKernel<T, Conv><<<gridFor(count), 256, 0, stream>>>(static_cast<T*>(buf), count, divisor);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

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

int divide(void* buf, size_t count, chorusDataType_t type, int divisor, void* stream) {
  if (count == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case chorusInt8:
      return launchDivide<int8_t, Native<int8_t>>(buf, count, divisor, s);
    case chorusUint8:
      return launchDivide<uint8_t, Native<uint8_t>>(buf, count, divisor, s);
    case chorusInt32:
      return launchDivide<int32_t, Native<int32_t>>(buf, count, divisor, s);
    case chorusUint32:
      return launchDivide<uint32_t, Native<uint32_t>>(buf, count, divisor, s);
    case chorusInt64:
      return launchDivide<int64_t, Native<int64_t>>(buf, count, divisor, s);
    case chorusUint64:
      return launchDivide<uint64_t, Native<uint64_t>>(buf, count, divisor, s);
    case chorusFloat32:
      return launchDivide<float, Native<float>>(buf, count, divisor, s);
    case chorusFloat64:
      return launchDivide<double, Native<double>>(buf, count, divisor, s);
    case chorusFloat16:
      return launchDivide<__half, Half>(buf, count, divisor, s);
    case chorusBfloat16:
      return launchDivide<__nv_bfloat16, Bfloat>(buf, count, divisor, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace chorus::kernels::cuda
