// reduce_avx2.cc: reduce_vector.h for AVX2 (with F16C), 32-byte vectors. Built with -mavx2
// -mf16c; called only where the CPU has both (kernels/cpu/reduce.cc decides).
#define CHORUS_VECTOR_BYTES 32
#define CHORUS_VECTOR_NAMESPACE avx2
#include "kernels/cpu/reduce_vector.h"
