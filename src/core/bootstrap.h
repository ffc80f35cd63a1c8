// bootstrap.h: how the ranks of a new communicator find each other. A root (a thread in the
// process that made the unique id, or in rank 0 for torchrun-style init) collects one info blob
// per rank and hands all of them to everyone; then the ranks form a TCP ring used for small
// out-of-band collectives during set-up (all-gather, barrier). One thread per Bootstrap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/socket.h"

namespace chorus {

// What a chorusUniqueId holds.
struct UniqueIdData {
  uint32_t magic = 0;
  uint32_t version = 0;
  uint64_t secret = 0;
  PackedAddress root;
};
inline constexpr uint32_t kUniqueIdMagic = 0x63686f72;  // "chor"

// Random 64 bits from the kernel.
uint64_t randomU64();

// Starts the bootstrap root on `listener` in a detached thread. It waits for the first rank
// without limit, then for the rest as long as that rank's init timeout; ranks whose secret
// differs are turned away. If ranks are missing at the deadline, the ranks that came are told
// which are missing. The thread ends when the ranks have met or been told.
void startBootstrapRoot(Socket listener, uint64_t secret);

// Makes a unique id whose root runs in this process.
UniqueIdData createUniqueId();

class Bootstrap {
 public:
  Bootstrap(int rank, int nranks);

  // The address of this rank's ring listener (to put in its info blob).
  PackedAddress ringAddress() const { return ringAddress_; }

  // Meets every rank through the root; returns all ranks' blobs (every blob has info.size()
  // bytes, in rank order) and connects the ring. Throws chorusTimeout naming missing ranks,
  // chorusRemoteError when ranks disagree (nranks, secret, duplicate rank).
  std::vector<std::vector<char>> join(const UniqueIdData& id, const std::vector<char>& info, int initTimeoutMs);

  // data holds nranks slots of bytesPerRank; this rank's slot is filled. Fills the others.
  void allGather(void* data, size_t bytesPerRank, Deadline deadline);
  void barrier(Deadline deadline);

  uint64_t commId() const { return commId_; }

 private:
  int rank_;
  int nranks_;
  uint64_t commId_ = 0;
  Socket ringListen_;
  PackedAddress ringAddress_;
  Socket next_;
  Socket prev_;
};

}  // namespace chorus
