// bootstrap.h: how the ranks of a new communicator find each other. A root (a thread in the
// process that made the unique id, or in rank 0 for torchrun-style init) collects one info blob
// per rank and hands all of them to everyone; then the ranks form a TCP ring used for small
// out-of-band collectives during set-up (all-gather, barrier). Afterwards the ring is the
// communicator's failure line: a rank that fails says so to both neighbours, which pass it on.
// One thread per Bootstrap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/error.h"
#include "src/base/socket.h"
#include "src/base/wire.h"
#include "src/transport/transport.h"

namespace chorus {

// What a chorusUniqueId holds.
using UniqueIdData = wire::UniqueId;

// Random 64 bits from the kernel.
uint64_t randomU64();

// Starts the bootstrap root on `listener` in a detached thread. It waits for the first rank
// without limit, then for the rest as long as that rank's init timeout; ranks whose secret
// differs are turned away. If ranks are missing at the deadline, the ranks that came are told
// which are missing. The thread ends when the ranks have met or been told.
void startBootstrapRoot(Socket listener, uint64_t secret);

// Makes a unique id whose root runs in this process.
UniqueIdData createUniqueId();

class Bootstrap final : public PeerExchange {
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
  // Every rank's blob, whatever its length (lengths first, then the blobs padded to the longest).
  std::vector<std::vector<char>> allGatherBlobs(const std::vector<char>& mine, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  uint64_t commId() const { return commId_; }
  uint64_t secret() const { return secret_; }
  // The hello that opens this rank's connections to the other ranks.
  wire::PeerHello peerHello(wire::Purpose purpose) const override;
  std::string checkHello(const wire::PeerHello& hello, wire::Purpose purpose) const override;
  // Accepts connections on listenFd until one opens with a hello that proves it belongs (a
  // wire::PeerHello for this communicator and purpose), which it stores in *hello; the others are
  // closed and logged. Throws chorusTimeout at the deadline.
  Socket acceptPeer(int listenFd, Deadline deadline, const std::string& what, wire::Purpose purpose,
                    wire::PeerHello* hello) const override;

  // For a shrink (after join), collective over the ranks in `remaining` (ascending; this rank is
  // one): the lowest makes a new unique id (its root runs in this process) and hands it to the
  // others, who wait for it on their ring listeners until the deadline. Connections that do not
  // prove they know this communicator's secret are closed and logged. Returns the id.
  UniqueIdData agreeOnNewId(const std::vector<int>& remaining, Deadline deadline);

  // The failure line (after join). Tells both neighbours that this rank failed, with the text
  // that says why; they pass it on around the ring. Best effort, never blocks; once only (a word
  // heard from a peer is passed on besides).
  void tellFailure(const std::string& text);
  // This rank failed with error in the call `where` names ("rank 0: allreduce #3 (...)").
  // Tells the peers, and returns "where: error" with what a peer that saw more said added: a
  // failure that is a peer's (it disagreed, or died) may have been told by one. A closed link
  // (LinkLost) says least, as its peer may have left after a failure of its own: then this rank
  // listens a moment first, and tells only if no word came. A rank that failed on a word it heard
  // (passed on already) tells only which call it was in, which names the other side of a
  // disagreement to the rank that found it.
  std::string failed(const Error& error, const std::string& where);
  // Tells both neighbours that this rank leaves normally (the communicator is destroyed).
  void sayGoodbye();
  // Reads what the neighbours have said, waiting up to waitMs for a word. Throws
  // chorusRemoteError with the text of a failure notice (passing it on first); once only.
  void watch(int waitMs = 0);

 private:
  void sendNote(uint32_t kind, const std::string& text, int origin);
  bool watchOnce(int waitMs);  // false when nothing came
  int rank_;
  int nranks_;
  uint64_t commId_ = 0;
  Socket ringListen_;
  PackedAddress ringAddress_;
  Socket next_;
  Socket prev_;
  uint64_t secret_ = 0;
  std::vector<PackedAddress> ringAddresses_;  // every rank's ring listener (open for shrinks)
  uint32_t shrinks_ = 0;                      // ids agreed on so far
  bool told_ = false;                         // a failure notice or goodbye went out
  bool heard_ = false;                        // a failure was heard (and thrown) once: later watches do nothing
};

}  // namespace chorus
