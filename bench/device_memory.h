// device_memory.h: collbench's device buffers (--mem device): each rank takes CUDA device
// rank % (devices on its host), allocates its buffers there and makes its calls on one stream of
// its own. The host keeps a copy of every buffer: inputs are written there and uploaded, results
// downloaded there and checked, so the pattern code (pattern.h) serves both kinds of memory.
// Every failure prints what failed with CUDA's reason and exits 2, as collbench does for host
// allocation; a build without CUDA fails so at construction.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "chorus/chorus.h"

namespace chorus::bench {

class DeviceMemory {
 public:
  explicit DeviceMemory(int rank);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // "device 0 (NVIDIA H100 80GB HBM3)", for the rank lines.
  std::string describe() const;
  // What names the GPU itself among the ranks: the host's name and the device's PCI bus id, so
  // ranks that share a GPU (several per device) have the same one.
  std::string identity() const;
  chorusStream_t stream() const;
  // Device memory of at least bytes for buffer `slot` (0 or 1), kept and grown across rows.
  char* reserve(int slot, size_t bytes);
  void upload(char* device, const char* host, size_t bytes);
  void download(char* host, const char* device, size_t bytes);
  // Waits for everything enqueued on the stream; a failed call's error ends the process.
  void synchronize();
  // Device-to-device copies of `bytes`, `copies` times on the stream: bytes copied per second
  // (each byte read once and written once), timed by CUDA events.
  double copyBytesPerSecond(size_t bytes, int copies);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus::bench
