// growing_areas.h: a fixed number of equal areas in one allocation that only grow. The device
// engine's pinned staging is one: a call enqueued, or captured into a graph, keeps pointing into
// the areas it was given, so growing never frees them; the old allocations are kept until the
// owner goes. Growth at least doubles, so a run of growing calls allocates a few times only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "src/base/error.h"

namespace chorus {

class GrowingAreas {
 public:
  // allocate(bytes) returns memory or throws; release frees what allocate returned.
  GrowingAreas(size_t areas, std::function<void*(size_t)> allocate, std::function<void(void*)> release)
      : areas_(areas), allocate_(std::move(allocate)), release_(std::move(release)) {}
  GrowingAreas(const GrowingAreas&) = delete;
  GrowingAreas& operator=(const GrowingAreas&) = delete;
  ~GrowingAreas() {
    for (void* old : retired_) release_(old);
    if (current_ != nullptr) release_(current_);
  }

  // Makes every area at least bytes long. Areas handed out before stay valid (retired, not freed).
  void ensure(size_t bytes) {
    if (bytes <= areaBytes_) return;
    const size_t grown = std::max(bytes, areaBytes_ > std::numeric_limits<size_t>::max() / 2 ? bytes : areaBytes_ * 2);
    if (grown > std::numeric_limits<size_t>::max() / areas_) {
      fail(chorusInvalidArgument, "{} areas of {} bytes each overflow the address space", areas_, grown);
    }
    void* fresh = allocate_(grown * areas_);
    if (current_ != nullptr) retired_.push_back(current_);
    current_ = fresh;
    areaBytes_ = grown;
  }

  // Area i (0 <= i < areas) of the current allocation.
  char* area(size_t i) const { return static_cast<char*>(current_) + i * areaBytes_; }
  size_t areaBytes() const { return areaBytes_; }
  size_t retired() const { return retired_.size(); }

 private:
  size_t areas_;
  std::function<void*(size_t)> allocate_;
  std::function<void(void*)> release_;
  void* current_ = nullptr;
  size_t areaBytes_ = 0;
  std::vector<void*> retired_;
};

}  // namespace chorus
