// device_algorithms.cc: the device engine's algorithms (device buffers, enqueued on a stream), as
// rows of the one algorithm table: which collectives each takes, in the engine's order of
// preference. src/core/device.cc runs them (each is a way of using CUDA, not a schedule, so the
// rows have no builder or cost); CHORUS_ALGO forces one for a collective as it forces a host one.
//  - direct: every rank on one GPU; each rank's kernels read its peers' published (or, for large
//    all-reduces, their own) buffers, mapped with CUDA IPC. Every collective of fixed blocks.
//  - ipc: the ring kernel, every rank on one host, each inbox mapped by its ring neighbours.
//  - staged: through pinned host memory to the host engine; every collective.
#include "src/collectives/descriptor.h"

namespace chorus::collectives {

namespace {

constexpr AlgorithmDescriptor device(Collective collective, Algorithm algorithm) {
  return {collective, algorithm, nullptr, nullptr, Follows::kNumbers, Engine::kDevice};
}

}  // namespace

std::span<const AlgorithmDescriptor> deviceAlgorithms() {
  using C = Collective;
  using A = Algorithm;
  static constexpr AlgorithmDescriptor kAll[] = {
      device(C::kAllReduce, A::kDirect),     device(C::kAllReduce, A::kIpc),     device(C::kAllReduce, A::kStaged),
      device(C::kAllGather, A::kDirect),     device(C::kAllGather, A::kIpc),     device(C::kAllGather, A::kStaged),
      device(C::kReduceScatter, A::kDirect), device(C::kReduceScatter, A::kIpc), device(C::kReduceScatter, A::kStaged),
      device(C::kBroadcast, A::kDirect),     device(C::kBroadcast, A::kIpc),     device(C::kBroadcast, A::kStaged),
      device(C::kReduce, A::kDirect),        device(C::kReduce, A::kIpc),        device(C::kReduce, A::kStaged),
      device(C::kAllToAll, A::kDirect),      device(C::kAllToAll, A::kStaged),   device(C::kGather, A::kDirect),
      device(C::kGather, A::kStaged),        device(C::kScatter, A::kDirect),    device(C::kScatter, A::kStaged),
      device(C::kAllToAllv, A::kStaged),     device(C::kSend, A::kStaged),       device(C::kRecv, A::kStaged),
      device(C::kBarrier, A::kStaged),
  };
  return kAll;
}

}  // namespace chorus::collectives
