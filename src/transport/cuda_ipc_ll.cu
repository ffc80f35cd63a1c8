// cuda_ipc_ll.cu: the LL protocol's ring kernels (every type x op), in a translation unit of their own.
#include "src/transport/cuda_ipc_device.cuh"

namespace chorus::ipc {

int launchRingLl(const RingArgs& args, chorusDataType_t type, chorusRedOp_t op, int threads, void* stream) {
  ringKernel<true><<<dim3(static_cast<unsigned>(args.channels)), dim3(static_cast<unsigned>(threads)), 0,
                     static_cast<cudaStream_t>(stream)>>>(args, type, op);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace chorus::ipc
