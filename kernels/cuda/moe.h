// moe.h (CUDA): a mixture-of-experts layer's routing on device memory, matching kernels/cpu/moe.h
// (the reference) function for function. Host code includes this header; it holds no CUDA runtime
// types. Each function enqueues on `stream` (a cudaStream_t; null: the default stream), does not
// wait, and returns 0 or the cudaError_t of the first launch that failed. The top-k choice gives
// exactly the reference's experts and rows (ties to the lower expert, places in GShard's priority
// order); the sums over one token's choices go in the reference's order, so dispatch, combine and
// their gradients repeat bit for bit.
#pragma once

#include <cstddef>

namespace chorus::kernels::cuda {

// The largest E the router kernels take (cudaErrorInvalidValue above it).
constexpr int kMaxExperts = 1024;

// As kernels::routerSoftmax.
int routerSoftmax(float* probs, float* lse, const float* logits, int n, int E, void* stream);
// As kernels::routeTopK, with the number of choices dropped written to *dropped (device) instead of
// returned.
int routeTopK(int* expert, float* gate, int* row, int* assigned, int* counts, int* dropped, const float* probs, int n,
              int E, int k, bool normalize, int capacity, void* stream);
// As kernels::routerColumnSums (each column summed in double).
int routerColumnSums(float* sums, const float* probs, int n, int E, void* stream);
// As kernels::routerBackward; assigned is a device array.
int routerBackward(float* dlogits, const float* dgate, const float* probs, const float* lse, const int* expert,
                   const float* gate, const int* row, const int* assigned, int n, int total, int E, int k,
                   bool normalize, float auxScale, float zScale, void* stream);
// As kernels::moeDispatch, moeDispatchBackward, moeCombine, moeCombineBackward.
int moeDispatch(float* buffer, const float* x, const int* row, int n, int k, int C, void* stream);
int moeDispatchBackward(float* dx, const float* dbuffer, const int* row, int n, int k, int C, void* stream);
int moeCombine(float* out, const float* y, const int* row, const float* gate, int n, int k, int C, void* stream);
int moeCombineBackward(float* dy, float* dgate, const float* dout, const float* y, const int* row, const float* gate,
                       int n, int k, int C, void* stream);
// As kernels::swigluForward / swigluBackward.
int swigluForward(float* out, const float* inp, int n, int h, void* stream);
int swigluBackward(float* dinp, const float* inp, const float* dout, int n, int h, void* stream);

}  // namespace chorus::kernels::cuda
