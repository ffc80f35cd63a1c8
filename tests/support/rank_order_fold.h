// rank_order_fold.h: inputs whose reduction depends on the order it is done in, and the result of
// folding them in rank order (rank 0's value, then rank 1's, ...), which is what
// CHORUS_DETERMINISTIC promises whatever the algorithm. The fold is computed here one element at a
// time in the type's own arithmetic (fp16 and bf16 in fp32, rounded after each step; integers
// wrapping; Avg divided once at the end), not by the library's kernels. Header-only.
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <vector>

#include "tests/support/pattern.h"

namespace chorus::pattern {

// Element i of rank r's input, seeded: floats of mixed signs and magnitudes (2^-6 to 2^5), so sums
// round differently in different orders; for Prod, factors near 1 (0.75 to 1.25), so products of
// a few ranks neither overflow fp16 nor vanish; integers spread over the type.
inline double unorderedInput(chorusRedOp_t op, chorusDataType_t type, int rank, size_t i, uint64_t seed) {
  uint64_t h = seed ^ (static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  h ^= h >> 31;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 29;
  if (!isFloat(type)) {
    const int64_t spread = op == chorusProd ? 5 : 200;
    const int64_t v = static_cast<int64_t>(h % static_cast<uint64_t>(spread));
    return static_cast<double>(isSigned(type) ? v - spread / 2 : v);
  }
  if (op == chorusProd) return 0.75 + static_cast<double>(h % 10000) / 20000.0;
  const double mantissa = (static_cast<double>(h % 20001) - 10000.0) / 10000.0;
  const int exponent = static_cast<int>((h >> 24) % 12) - 6;
  return asStored(type, mantissa * static_cast<double>(int64_t{1} << (exponent + 6)) / 64.0);
}

// One step of the fold in the type's arithmetic.
inline double foldStepOf(chorusRedOp_t op, chorusDataType_t type, double acc, double v) {
  switch (op) {
    case chorusMax:
      return v > acc ? v : acc;
    case chorusMin:
      return v < acc ? v : acc;
    default:
      break;
  }
  const bool product = op == chorusProd;
  if (type == chorusFloat64) return product ? acc * v : acc + v;
  if (isFloat(type)) {  // fp32, and fp16 / bf16 computed in fp32 and rounded to the type
    const float a = static_cast<float>(acc), b = static_cast<float>(v);
    return asStored(type, static_cast<double>(product ? a * b : a + b));
  }
  // Integers: exact in int64 for these inputs' few steps, then wrapped to the type.
  const int64_t a = static_cast<int64_t>(acc), b = static_cast<int64_t>(v);
  return asStored(type, static_cast<double>(product ? a * b : a + b));
}

// Element i of the fold over ranks 0..nranks-1 of unorderedInput(op, type, r, i, seed).
inline double rankOrderFold(chorusRedOp_t op, chorusDataType_t type, int nranks, size_t i, uint64_t seed) {
  double acc = unorderedInput(op, type, 0, i, seed);
  for (int r = 1; r < nranks; ++r) acc = foldStepOf(op, type, acc, unorderedInput(op, type, r, i, seed));
  if (op != chorusAvg) return acc;
  if (!isFloat(type)) return asStored(type, static_cast<double>(static_cast<int64_t>(acc) / nranks));
  if (type == chorusFloat64) return acc / nranks;
  return asStored(type, static_cast<double>(static_cast<float>(acc) / static_cast<float>(nranks)));
}

// A hash of count elements' bytes (FNV-1a), to compare results without keeping them.
inline uint64_t hashBytes(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t k = 0; k < bytes; ++k) h = (h ^ static_cast<const unsigned char*>(data)[k]) * 0x100000001b3ull;
  return h;
}

}  // namespace chorus::pattern
