// train_emulated_test.cc: training steps on the CUDA backend (compiled for the host against
// tests/support/cuda_emulation.h: chorus_training_emulated) against the same steps on the CPU, by
// tests/gpu/train_cuda_test.cc's own tests: every ZeRO stage on one and two ranks (forked
// processes joined by chorus), SGD and AdamW with clipping and a loss scale, and what the device
// refuses. The emulation's streams are the null stream, so the gradients go through chorus's host
// collectives on the emulated device memory: it checks the data-parallel layer's device path (its
// buffers, buckets, shards and optimizer state on the device), not the device collectives, which
// the GPU test and device_collectives_test check on the hardware.
//
// The same tests under a name of their own (ctest lists the GPU test's too).
#define CudaTrainTest EmulatedTrainTest
#include "tests/gpu/train_cuda_test.cc"
