// gpt_emulated_test.cc: the GPT model on the CUDA backend (src/training/backend_cuda.cc and
// kernels/cuda, compiled for the host against tests/support/cuda_emulation.h:
// chorus_training_emulated) against the model on the CPU, by tests/gpu/gpt_cuda_test.cc's own
// tests: one forward and backward in fp32 and bf16 with each recompute mode, and MoE blocks. It
// checks the device path of the layers (what they keep on the device, copy to and from the host,
// and hand the kernels: every pointer a kernel or product is given must be device memory); the GPU
// test checks it on the hardware.
//
// The same tests under a name of their own (ctest lists the GPU test's too).
#define CudaGptTest EmulatedGptTest
#include "tests/gpu/gpt_cuda_test.cc"
