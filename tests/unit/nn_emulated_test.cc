// nn_emulated_test.cc: kernels/cuda/nn.cu, attention.cu, moe.cu and matmul.cu (their kernels and
// launchers, compiled for the host against tests/support/cuda_emulation.h: chorus_cuda_emulated)
// run there by tests/gpu/nn_cuda_test.cc's own tests of them: embeddings, layernorm, the
// element-wise layers (16 bytes at a time and a float at a time), the products (cuBLAS emulated),
// cross-entropy, the optimizers and the sums, attention (whole and in ring blocks; fp32 on the
// scalar kernels, 16-bit on the tensor-core ones, through attention.cu's choice and launch
// geometry), the MoE router, dispatch, combine and SwiGLU, against the CPU reference within the GPU
// test's bounds. It checks the kernels' indexing, their vector and scalar paths, their block and
// warp sums, and that every pointer they are given is device memory; the GPU test checks them on
// the hardware.
//
// The same tests under a name of their own (ctest lists the GPU test's too).
#define CudaNnTest EmulatedNnTest
#include "tests/gpu/nn_cuda_test.cc"
