// memory.cc: shareable host allocations (see memory.h).
#include "src/base/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  std::swap(base_, other.base_);
  std::swap(bytes_, other.bytes_);
  std::swap(name_, other.name_);
  std::swap(owner_, other.owner_);
  return *this;
}

SharedSegment::~SharedSegment() {
  unlink();
  if (base_ != nullptr) munmap(base_, bytes_);
}

SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  SharedSegment segment;
  shm_unlink(name.c_str());  // a leftover of a crashed run with the same name: start clean
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) failErrno("shared memory: shm_open(" + name + ", create)");
  const int error =
      ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (error != 0) {
    ::close(fd);
    shm_unlink(name.c_str());
    fail(chorusSystemError, "shared memory: cannot reserve {} bytes for {}: {} (is /dev/shm large enough?)", bytes,
         name, std::strerror(error));
  }
  segment.map(fd, bytes, name);
  segment.name_ = name;
  segment.owner_ = true;
  return segment;
}

SharedSegment SharedSegment::open(const std::string& name, size_t bytes) {
  SharedSegment segment;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) failErrno("shared memory: shm_open(" + name + ")");
  segment.map(fd, bytes, name);
  return segment;
}

SharedSegment SharedSegment::tryOpen(const std::string& name, size_t bytes) {
  SharedSegment segment;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return segment;
    failErrno("shared memory: shm_open(" + name + ")");
  }
  struct stat status {};
  if (fstat(fd, &status) != 0 || static_cast<size_t>(status.st_size) < bytes) {
    ::close(fd);
    return segment;
  }
  segment.map(fd, bytes, name);
  return segment;
}

void SharedSegment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

void SharedSegment::map(int fd, size_t bytes, const std::string& name) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) failErrno("shared memory: mmap(" + name + ")");
  base_ = base;
  bytes_ = bytes;
}

}  // namespace chorus
