// reduce_avx512.cc: reduce_vector.h for AVX-512 (F, BW, DQ, VL), 64-byte vectors. Built with
// those flags; called only where the CPU has them (kernels/cpu/reduce.cc decides).
// GCC 12 reports the undefined source vector inside _mm512_cvtph_ps as maybe uninitialized
// (avx512fintrin.h); the instruction overwrites every lane.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CHORUS_VECTOR_BYTES 64
#define CHORUS_VECTOR_NAMESPACE avx512
#include "kernels/cpu/reduce_vector.h"
