// memory.cc: shareable host allocations (see memory.h).
#include "src/base/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "src/base/error.h"

namespace chorus {
namespace {

struct Allocation {
  size_t bytes;
  int fd;
  uint64_t serial;
};

std::mutex allocationsMutex;
std::map<uintptr_t, Allocation> allocations;  // by base address
std::atomic<size_t> allocationCount{0};       // lets findShared skip the lock when there are none
uint64_t nextSerial = 1;

}  // namespace

void* allocShared(size_t bytes) {
  if (bytes == 0) fail(chorusInvalidArgument, "chorusMemAlloc: size is 0");
  const int fd = memfd_create("chorus-buffer", MFD_CLOEXEC);
  if (fd < 0) failErrno("chorusMemAlloc: memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    ::close(fd);
    fail(chorusSystemError, "chorusMemAlloc: cannot size a memfd to {} bytes: {}", bytes, std::strerror(error));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int error = errno;
    ::close(fd);
    fail(chorusSystemError, "chorusMemAlloc: cannot map {} bytes: {}", bytes, std::strerror(error));
  }
  std::lock_guard<std::mutex> lock(allocationsMutex);
  allocations[reinterpret_cast<uintptr_t>(base)] = {bytes, fd, nextSerial++};
  allocationCount.store(allocations.size(), std::memory_order_release);
  return base;
}

void freeShared(void* pointer) {
  Allocation allocation{};
  {
    std::lock_guard<std::mutex> lock(allocationsMutex);
    auto found = allocations.find(reinterpret_cast<uintptr_t>(pointer));
    if (found == allocations.end()) {
      fail(chorusInvalidArgument, "chorusMemFree: {} was not returned by chorusMemAlloc (or was freed already)",
           pointer);
    }
    allocation = found->second;
    allocations.erase(found);
    allocationCount.store(allocations.size(), std::memory_order_release);
  }
  munmap(pointer, allocation.bytes);
  ::close(allocation.fd);
}

bool findShared(const void* data, size_t bytes, SharedRange* range) {
  if (allocationCount.load(std::memory_order_acquire) == 0) return false;
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(allocationsMutex);
  auto after = allocations.upper_bound(address);
  if (after == allocations.begin()) return false;
  const auto& [base, allocation] = *std::prev(after);
  if (address + bytes > base + allocation.bytes) return false;
  *range = {allocation.fd, allocation.serial, allocation.bytes, address - base};
  return true;
}

}  // namespace chorus
