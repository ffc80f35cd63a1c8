// traits.h: what each collective is, said once: its name, whether it reduces, whether it has a
// root (or a peer), and how many elements of input and output a rank has for the API's count.
// The C ABI's argument checks, the executor, the device path and (through chorusGetCollectiveInfo)
// collbench read it here. Pure data.
#pragma once

#include <cstddef>

#include "src/collectives/schedule.h"

namespace chorus::collectives {

// A rank's buffer for the API's count: none, count elements, count per rank (nranks * count), or
// per-peer counts and displacements given with the call (all-to-allv).
enum class Extent : unsigned char { kNone, kCount, kCountPerRank, kVector };

struct CollectiveTraits {
  Collective collective;
  const char* name;   // as CHORUS_ALGO and collbench spell it: "allreduce"
  bool reduces;       // takes a reduction operator
  bool rooted;        // has a root (broadcast, reduce, gather, scatter)
  bool pointToPoint;  // has a peer (send, recv)
  Extent input;
  Extent output;
  bool inputAtRootOnly;   // only the root's input is read (broadcast, scatter)
  bool outputAtRootOnly;  // only the root's output is written (reduce, gather)
  bool inPlace;           // the input and output may be one buffer
};

const CollectiveTraits& traitsOf(Collective collective);

// Elements of a rank's input and output for `count` (0 where the rank has none: a non-root's
// input of a broadcast). kVector: 0 (the call's counts say).
size_t elementsOf(Extent extent, size_t count, int nranks);
size_t inputElements(Collective collective, size_t count, int nranks, bool isRoot);
size_t outputElements(Collective collective, size_t count, int nranks, bool isRoot);

// The count's multiple in a collective's whole size: nranks where a rank's input or output is a
// block per rank, else 1.
size_t blocksOf(Collective collective, int nranks);
// All-to-allv: the elements a buffer must hold for its per-peer counts and displacements (the
// end of the furthest block).
size_t vectorExtent(const size_t* counts, const size_t* displs, int nranks);

// The size a tuner and a cost model see: the buffer for all-reduce, broadcast and reduce; the
// whole nranks-block buffer where a rank's input or output is a block per rank (nccl-tests' size).
size_t wholeElements(Collective collective, size_t count, int nranks);

}  // namespace chorus::collectives
