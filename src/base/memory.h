// memory.h: host memory that ranks on one host can map (chorusMemAlloc). Each allocation is a
// memfd of its own, kept open while it lives, so a peer process can take the descriptor
// (pidfd_getfd) and map the same pages: the shm transport then moves a message out of such a
// buffer with one copy at memory speed, straight from the sender's pages.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus {

// Where a byte range lies in a shareable allocation of this process.
struct SharedRange {
  int fd = -1;          // the allocation's memfd in this process
  uint64_t serial = 0;  // unique per allocation in this process (fd numbers are reused)
  size_t bytes = 0;     // the allocation's size
  size_t offset = 0;    // where the range starts in it
};

// Allocates bytes (page-aligned, zeroed) of shareable memory; throws chorus::Error if it cannot.
void* allocShared(size_t bytes);
// Frees what allocShared returned; throws chorusInvalidArgument for any other pointer.
void freeShared(void* pointer);
// True, with *range filled, when [data, data + bytes) lies within one shareable allocation.
bool findShared(const void* data, size_t bytes, SharedRange* range);

}  // namespace chorus
