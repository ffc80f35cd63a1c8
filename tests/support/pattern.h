// pattern.h: check data for collbench and the tests. Inputs are small integers built from
// (rank, index), exact in every type, so every collective's result is known in closed form and
// compared exactly; the expected values are computed here in double precision, independently of
// the library's reduction kernels. Header-only; pure functions.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/half.h"

namespace chorus::pattern {

inline bool isSigned(chorusDataType_t type) {
  return type == chorusInt8 || type == chorusInt32 || type == chorusInt64 || type == chorusFloat16 ||
         type == chorusFloat32 || type == chorusFloat64 || type == chorusBfloat16;
}
inline bool isFloat(chorusDataType_t type) {
  return type == chorusFloat16 || type == chorusFloat32 || type == chorusFloat64 || type == chorusBfloat16;
}

// Input of a reduction: for Prod 1 or 2 (products stay exact: powers of two); otherwise one of
// 7 values, -3..3 for signed types and 0..6 for unsigned ones, varying with rank and index.
inline double reduceInput(chorusRedOp_t op, chorusDataType_t type, int rank, size_t index) {
  if (op == chorusProd) return 1.0 + static_cast<double>((static_cast<size_t>(rank) + index) % 2);
  const double base = static_cast<double>((static_cast<size_t>(rank) * 3 + index) % 7);
  return isSigned(type) ? base - 3.0 : base;
}

// Input of a data-moving collective (all-gather, broadcast, send): 0..100, distinct enough
// across ranks and positions to catch misplaced blocks.
inline double moveInput(int rank, size_t index) {
  return static_cast<double>((static_cast<size_t>(rank) * 31 + index * 7) % 101);
}

// Stores v into element i of buf as the given type. Integer types wrap modulo 2^bits (v must
// be an exact integer); float types round to nearest even.
inline void store(void* buf, size_t i, chorusDataType_t type, double v) {
  switch (type) {
    case chorusInt8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case chorusUint8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case chorusInt32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case chorusUint32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case chorusInt64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case chorusUint64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    case chorusFloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::floatToHalf(static_cast<float>(v));
      break;
    case chorusBfloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::floatToBfloat16(static_cast<float>(v));
      break;
    case chorusFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case chorusFloat64:
      static_cast<double*>(buf)[i] = v;
      break;
    default:
      break;
  }
}

// Reads element i of buf as a double.
inline double load(const void* buf, size_t i, chorusDataType_t type) {
  switch (type) {
    case chorusInt8:
      return static_cast<const int8_t*>(buf)[i];
    case chorusUint8:
      return static_cast<const uint8_t*>(buf)[i];
    case chorusInt32:
      return static_cast<const int32_t*>(buf)[i];
    case chorusUint32:
      return static_cast<const uint32_t*>(buf)[i];
    case chorusInt64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case chorusUint64:
      return static_cast<double>(static_cast<const uint64_t*>(buf)[i]);
    case chorusFloat16:
      return kernels::halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case chorusBfloat16:
      return kernels::bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case chorusFloat32:
      return static_cast<const float*>(buf)[i];
    case chorusFloat64:
      return static_cast<const double*>(buf)[i];
    default:
      return 0;
  }
}

// The type's value of element i once v is stored (wrapping / rounding applied).
inline double asStored(chorusDataType_t type, double v) {
  uint64_t slot = 0;
  store(&slot, 0, type, v);
  return load(&slot, 0, type);
}

// The exact result of reducing reduceInput(op, type, r, index) over ranks r < nranks, with the
// type's semantics: integer Sum and Prod wrap; Avg is the (wrapped) sum divided by nranks,
// truncated for integers and rounded once for floats (fp16 / bf16 divide in fp32).
inline double expectedReduce(chorusRedOp_t op, chorusDataType_t type, int nranks, size_t index) {
  double acc = reduceInput(op, type, 0, index);
  for (int r = 1; r < nranks; ++r) {
    const double v = reduceInput(op, type, r, index);
    switch (op) {
      case chorusSum:
      case chorusAvg:
        acc += v;
        break;
      case chorusProd:
        acc *= v;
        break;
      case chorusMax:
        acc = v > acc ? v : acc;
        break;
      case chorusMin:
        acc = v < acc ? v : acc;
        break;
      default:
        break;
    }
  }
  const double stored = asStored(type, acc);  // sums and products stay far below 2^53
  if (op != chorusAvg) return stored;
  if (!isFloat(type)) {
    const int64_t quotient = static_cast<int64_t>(stored) / nranks;  // truncates toward zero
    return asStored(type, static_cast<double>(quotient));
  }
  if (type == chorusFloat64) return stored / nranks;
  return asStored(type, static_cast<double>(static_cast<float>(stored) / static_cast<float>(nranks)));
}

// Number of elements i in [0, count) with buf[i] != expected(i).
template <typename Expected>
size_t countWrong(const void* buf, size_t count, chorusDataType_t type, Expected expected) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += load(buf, i, type) != expected(i) ? 1 : 0;
  return wrong;
}

}  // namespace chorus::pattern
