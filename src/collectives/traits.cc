// traits.cc: the table of collectives.
#include "src/collectives/traits.h"

#include <algorithm>

namespace chorus::collectives {
namespace {

using enum Extent;
// In the order of Collective.
constexpr CollectiveTraits kTraits[] = {
    // collective, name, reduces, rooted, point-to-point, input, output, input at root only, output
    // at root only, in place
    {Collective::kAllReduce, "allreduce", true, false, false, kCount, kCount, false, false, true},
    {Collective::kAllGather, "allgather", false, false, false, kCount, kCountPerRank, false, false, true},
    {Collective::kReduceScatter, "reducescatter", true, false, false, kCountPerRank, kCount, false, false, true},
    {Collective::kBroadcast, "broadcast", false, true, false, kCount, kCount, true, false, true},
    {Collective::kReduce, "reduce", true, true, false, kCount, kCount, false, true, true},
    {Collective::kSend, "send", false, false, true, kCount, kNone, false, false, false},
    {Collective::kRecv, "recv", false, false, true, kNone, kCount, false, false, false},
    {Collective::kBarrier, "barrier", false, false, false, kNone, kNone, false, false, false},
    {Collective::kAllToAll, "alltoall", false, false, false, kCountPerRank, kCountPerRank, false, false, false},
    {Collective::kAllToAllv, "alltoallv", false, false, false, kVector, kVector, false, false, false},
    {Collective::kGather, "gather", false, true, false, kCount, kCountPerRank, false, true, true},
    {Collective::kScatter, "scatter", false, true, false, kCountPerRank, kCount, true, false, true},
};
static_assert(sizeof(kTraits) / sizeof(kTraits[0]) == static_cast<size_t>(Collective::kScatter) + 1);

constexpr bool inOrder() {
  for (size_t i = 0; i < sizeof(kTraits) / sizeof(kTraits[0]); ++i) {
    if (static_cast<size_t>(kTraits[i].collective) != i) return false;
  }
  return true;
}
static_assert(inOrder(), "kTraits lists the collectives in the order of Collective");

}  // namespace

const CollectiveTraits& traitsOf(Collective collective) { return kTraits[static_cast<size_t>(collective)]; }

size_t elementsOf(Extent extent, size_t count, int nranks) {
  switch (extent) {
    case kCount:
      return count;
    case kCountPerRank:
      return count * static_cast<size_t>(nranks);
    case kNone:
    case kVector:
      return 0;
  }
  return 0;
}

size_t inputElements(Collective collective, size_t count, int nranks, bool isRoot) {
  const CollectiveTraits& t = traitsOf(collective);
  return t.inputAtRootOnly && !isRoot ? 0 : elementsOf(t.input, count, nranks);
}

size_t outputElements(Collective collective, size_t count, int nranks, bool isRoot) {
  const CollectiveTraits& t = traitsOf(collective);
  return t.outputAtRootOnly && !isRoot ? 0 : elementsOf(t.output, count, nranks);
}

size_t blocksOf(Collective collective, int nranks) {
  const CollectiveTraits& t = traitsOf(collective);
  return t.input == kCountPerRank || t.output == kCountPerRank ? static_cast<size_t>(nranks) : 1;
}

size_t vectorExtent(const size_t* counts, const size_t* displs, int nranks) {
  size_t end = 0;
  for (int r = 0; r < nranks; ++r) end = std::max(end, displs[r] + counts[r]);
  return end;
}

size_t wholeElements(Collective collective, size_t count, int nranks) { return count * blocksOf(collective, nranks); }

}  // namespace chorus::collectives
