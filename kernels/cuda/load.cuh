// load.cuh: loads a kernel's module now, without launching it. CUDA loads a kernel at its first
// launch otherwise, and loading may wait for the whole device: a first call made during graph
// capture, or while its stream is held, would wait with it. The device engine loads every kernel
// it may launch when it is set up.
#pragma once

#include <cuda_runtime.h>

namespace chorus::kernels::cuda {

// Returns a cudaError_t as int (0: loaded).
template <typename Kernel>
int loadKernel(Kernel* kernel) {
  cudaFuncAttributes attributes;
  return static_cast<int>(cudaFuncGetAttributes(&attributes, kernel));
}

}  // namespace chorus::kernels::cuda
