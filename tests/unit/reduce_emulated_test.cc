// reduce_emulated_test.cc: kernels/cuda/reduce.cu (compiled for the host against
// tests/support/cuda_emulation.h: chorus_cuda_emulated) run by tests/gpu/reduce_cuda_test.cc's own
// tests: every type x op bit for bit against the CPU reference, reduceMany into several
// destinations, NaN and infinities, misaligned buffers and tails, the casts. It checks the
// kernels' 16-byte and one-element paths and which reference function each type's loads and
// stores go through; the emulated 16-bit conversions are the reference's own, so the hardware's
// (cvt's one canonical NaN) are checked on a GPU only.
//
// The same tests under names of their own (ctest lists the GPU test's too).
#define CudaReduceTest EmulatedReduceTest
#define CudaCastTest EmulatedCastTest
#include "tests/gpu/reduce_cuda_test.cc"
