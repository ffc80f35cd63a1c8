// nn_emulated_test.cc: kernels/cuda/nn.cu, attention.cu and moe.cu (their kernels and launchers)
// compiled for the host against tests/support/cuda_emulation.h and run there by
// tests/gpu/nn_cuda_test.cc's own tests of them: embeddings, layernorm, the element-wise layers (16
// bytes at a time and a float at a time), cross-entropy, the optimizers and the sums, attention
// (whole and in ring blocks; fp32 on the scalar kernels, 16-bit on the tensor-core ones, through
// attention.cu's choice and launch geometry), the MoE router, dispatch, combine and SwiGLU, against
// the CPU reference within the GPU test's bounds. It checks the kernels' indexing,
// their vector and scalar paths, and their block and warp sums; the GPU test checks them on the
// hardware.
#include "tests/support/cuda_emulation.h"
// The emulation first: the source below is compiled against it.
#include "kernels/cuda/attention.cu"
#include "kernels/cuda/moe.cu"
#include "kernels/cuda/nn.cu"
// The same tests under a name of their own (ctest lists the GPU test's too).
#define CudaNnTest EmulatedNnTest
#include "tests/gpu/nn_cuda_test.cc"
