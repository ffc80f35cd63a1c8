// memory.h: host memory that ranks on one host can map: the program's buffers (chorusMemAlloc),
// and named shared-memory segments (the shm transport's FIFOs, the device path's flags). Each
// chorusMemAlloc allocation is a memfd of its own, kept open while it lives, so a peer process can
// take the descriptor (pidfd_getfd) and map the same pages: the shm transport then moves a message
// out of such a buffer with one copy at memory speed, straight from the sender's pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

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

// A POSIX shared-memory segment (shm_open) mapped in this process: made by one process, opened by
// name in the others. The maker removes the name when the segment goes (or at unlink()), unless
// it was left to another process (keepName()); the pages stay while any process maps them.
// Failures throw chorus::Error naming the segment. Not thread-safe.
class SharedSegment {
 public:
  SharedSegment() = default;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  ~SharedSegment();

  // Makes the segment `name` of `bytes` (zeroed, its pages reserved now, so a full /dev/shm fails
  // here rather than at the first write); a leftover of that name is replaced.
  static SharedSegment create(const std::string& name, size_t bytes);
  // Maps the segment `name` another process made.
  static SharedSegment open(const std::string& name, size_t bytes);
  // The segment of that name if it exists with at least `bytes` (its maker may not have sized it
  // yet), else an unmapped one.
  static SharedSegment tryOpen(const std::string& name, size_t bytes);

  bool mapped() const { return base_ != nullptr; }
  // Leaves the name for another process to remove.
  void keepName() { owner_ = false; }
  // Removes the name now (the maker only); the mapping stays.
  void unlink();
  char* base() const { return static_cast<char*>(base_); }

 private:
  void map(int fd, size_t bytes, const std::string& name);

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

}  // namespace chorus
