// transport.h: moves bytes between two ranks. One interface; one file per transport (self, shm,
// ucx, tcp), listed in priority order in registry.cc. A transport knows tags and byte ranges, never
// collectives. Every transport object is used by one thread at a time (its communicator's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "src/base/error.h"
#include "src/base/process.h"  // the transports watch their same-host peers' processes
#include "src/base/socket.h"
#include "src/base/wire.h"

namespace chorus {

// What every rank tells the others at bootstrap. The ring address must come first (bootstrap.cc
// reads it from the blob).
struct PeerInfo {
  PackedAddress ringAddress;
  PackedAddress dataAddress;  // tcp transport listener
  int32_t rank = 0;
  int32_t pid = 0;
  uint64_t hostHash = 0;       // equal for processes that can share memory (same host and namespaces)
  char transportMode[8] = {};  // CHORUS_TRANSPORT in effect; all ranks must agree
  int32_t eagerConnect = 0;    // CHORUS_CONNECT=eager; all ranks must agree
  uint64_t grownFrom = 0;      // chorusCommGrow: the communicator this rank comes from (0: a new rank)
  char hostname[48] = {};
};

using wire::describeTag;
using wire::makeTag;
using wire::TagKind;
using wire::tagKindName;

// Completion flag of one posted send or receive, set by the transport.
struct Request {
  bool done = false;
  // Receives: the caller's hint that the message lands in a large final destination, so the
  // transport may write it with streaming stores (kernels::streamingPays).
  bool streamed = false;
  // Streaming sends (postStreamingSend): bytes of the message that exist so far, raised by the
  // caller as it produces them; other sends have every byte at once.
  size_t ready = std::numeric_limits<size_t>::max();
};

// Consumes a received message piece by piece as it arrives, so that its bytes need not be stored
// first: a receive fused with the reduction that uses it.
class PieceSink {
 public:
  // `piece` holds the message's bytes [offset, offset + bytes); it is valid only during the call.
  // offset is a multiple of 64, and so is bytes except for the message's last piece. The sink may
  // post and feed streaming sends from here (that is how a receive's result is sent on as it
  // arrives).
  virtual void consume(size_t offset, const void* piece, size_t bytes) = 0;

 protected:
  ~PieceSink() = default;
};

// What a transport has sent: bytes on the wire (payload plus the transport's own headers and
// framing) and messages.
struct Traffic {
  uint64_t bytes = 0;
  uint64_t messages = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Everything this transport has sent since it was created, counted where it leaves: a byte is
  // counted once it is handed to the link (socket, shared FIFO, UCX), headers included. May be
  // read from any thread (a device path's proxy sends while the communicator's owner reads).
  Traffic sent() const {
    return {sentBytes_.load(std::memory_order_relaxed), sentMessages_.load(std::memory_order_relaxed)};
  }

  // Posts a send of bytes from data to peer. data must stay unchanged until request->done.
  // Messages to one peer leave in post order. A message may have 0 bytes.
  virtual void postSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) = 0;
  // Posts a receive of exactly bytes into data. The next message from peer must carry the same
  // tag and size, else progress() throws chorusRemoteError naming both.
  virtual void postRecv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) = 0;
  // Posts a receive as postRecv, whose bytes go to sink piece by piece instead of to a buffer.
  // Returns false, posting nothing, where the transport cannot deliver pieces (the caller then
  // receives into a buffer).
  virtual bool postRecvToSink(int /*peer*/, uint64_t /*tag*/, PieceSink* /*sink*/, size_t /*bytes*/,
                              Request* /*request*/) {
    return false;
  }
  // A send whose bytes are produced while it is posted: as postSend, in order with this rank's
  // other sends to peer, but only bytes [0, request->ready) may leave; ready starts at 0 and the
  // caller raises it, telling the transport with produced(). Returns false, posting nothing, where
  // the transport cannot (the caller then sends once every byte exists). A transport that takes
  // streaming sends takes sinks too (postRecvToSink).
  virtual bool postStreamingSend(int /*peer*/, uint64_t /*tag*/, const void* /*data*/, size_t /*bytes*/,
                                 Request* /*request*/) {
    return false;
  }
  // Where bytes [offset, offset + count) of a streaming send, the next it has to send, may be
  // written so that they leave without a copy (a place in the outgoing message), or null: then
  // they are copied from the send's data once produced. Valid until produced() is called.
  virtual void* streamingWindow(int /*peer*/, Request* /*request*/, size_t /*offset*/, size_t /*count*/) {
    return nullptr;
  }
  // The caller raised request->ready of a streaming send to peer, having written `windowBytes` of
  // the new bytes into the window streamingWindow gave (0: none, or no window): they may leave.
  virtual void produced(int /*peer*/, Request* /*request*/, size_t /*windowBytes*/) {}
  // Memory shared between ranks of one host (chorusMemAlloc allocations, whose descriptors a peer
  // can take): whether peer can map this rank's allocations (found at set-up), and peer's
  // allocation held in its descriptor fd (serial tells allocations apart), mapped read-write into
  // this process. The mapping stays until that descriptor names another allocation. Transports
  // that share no memory answer false, and fail to map.
  virtual bool peerMapsMemory(int /*peer*/) const { return false; }
  virtual char* mapPeerMemory(int peer, int fd, uint64_t /*serial*/, size_t bytes) {
    fail(chorusInternalError, "{} transport cannot map descriptor {} ({} bytes) of rank {}", name(), fd, bytes, peer);
  }
  // Connections are made when first needed: a send or receive posted to a peer not yet connected
  // waits in its queue while the transport connects (progress() advances that), so a rank holds
  // connections only to the peers its schedules use (CHORUS_CONNECT=eager: to all, at init).
  // connect() starts connecting to peer without blocking; connected() says whether the connection
  // is up and set up completely (shm: both sides' probes answered); connections() counts the peers
  // this transport has connected to or is connecting to.
  virtual void connect(int /*peer*/) {}
  virtual bool connected(int /*peer*/) const { return true; }
  virtual int connections() const { return 0; }
  // Throws chorusRemoteError (LinkLost) naming a peer this rank is connecting to that has exited
  // (connectAll asks while it waits).
  virtual void checkConnecting() {}
  // What this transport holds for peer, for a state dump ("" where it has nothing to say): queued
  // messages and where its FIFOs stand.
  virtual std::string describePeer(int /*peer*/) const { return ""; }
  // Moves whatever can move without blocking. Returns true if anything moved.
  virtual bool progress() = 0;
  // Blocks until something may be able to move, or timeoutMs passes. Throws chorusRemoteError if
  // a peer with pending work is found dead.
  virtual void wait(int timeoutMs) = 0;
  // True while posted requests are incomplete.
  virtual bool busy() const = 0;
  // Drops all posted requests (after an error or abort), leaving the connections unusable.
  virtual void cancelAll() = 0;

 protected:
  // Counts what leaves: bytes handed to the link, messages posted.
  void countSent(uint64_t bytes, uint64_t messages = 0) {
    sentBytes_.fetch_add(bytes, std::memory_order_relaxed);
    sentMessages_.fetch_add(messages, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> sentBytes_{0}, sentMessages_{0};
};

// A transport's per-peer state, looked up by rank. Peer has `sends` and `recvs` queues.
template <typename Peer>
class PeerTable {
 public:
  PeerTable(const char* transport, int rank, int nranks) : transport_(transport), rank_(rank), index_(nranks, -1) {}

  Peer& add(int peerRank) {
    index_[peerRank] = static_cast<int>(peers_.size());
    peers_.emplace_back();
    return peers_.back();
  }
  bool has(int peerRank) const {
    return peerRank >= 0 && peerRank < static_cast<int>(index_.size()) && index_[peerRank] >= 0;
  }
  Peer& at(int peerRank) {
    if (!has(peerRank)) {
      fail(chorusInternalError, "{} transport of rank {} has no connection to rank {}", transport_, rank_, peerRank);
    }
    return peers_[index_[peerRank]];
  }
  const Peer& at(int peerRank) const { return const_cast<PeerTable*>(this)->at(peerRank); }
  std::vector<Peer>& all() { return peers_; }
  // Drops every queued send and receive.
  void clearQueues() {
    for (Peer& p : peers_) {
      p.sends.clear();
      p.recvs.clear();
    }
  }

 private:
  const char* transport_;
  int rank_;
  std::vector<int> index_;
  std::vector<Peer> peers_;
};

// What a transport may ask of the communicator's ranks while it connects: the narrow part of the
// bootstrap (which implements it) a transport needs. Collective calls (barrier, allGatherBlobs)
// must be made by every rank, in the same order.
class PeerExchange {
 public:
  // Returns once every rank has called it, or throws chorusTimeout at the deadline.
  virtual void barrier(Deadline deadline) = 0;
  // Every rank's blob, in rank order, whatever their lengths.
  virtual std::vector<std::vector<char>> allGatherBlobs(const std::vector<char>& mine, Deadline deadline) = 0;
  // The hello that opens this rank's connections to the other ranks (it proves the secret).
  virtual wire::PeerHello peerHello(wire::Purpose purpose) const = 0;
  // Accepts connections on listenFd until one opens with a hello for this communicator and
  // purpose, stored in *hello; strangers are closed and logged. Throws chorusTimeout at the
  // deadline; `what` names the wait in errors.
  virtual Socket acceptPeer(int listenFd, Deadline deadline, const std::string& what, wire::Purpose purpose,
                            wire::PeerHello* hello) const = 0;
  // Why `hello` does not come from a rank of this communicator for `purpose` (empty: it does).
  virtual std::string checkHello(const wire::PeerHello& hello, wire::Purpose purpose) const = 0;

 protected:
  ~PeerExchange() = default;
};

// What a transport is made from. `exchange` lives as long as the transport; a transport that
// connects lazily keeps what it needs of the rest (the tcp transport takes the data listener).
struct TransportContext {
  int rank = 0;
  int nranks = 0;
  uint64_t commId = 0;  // names this communicator's shared objects
  std::vector<PeerInfo> peers;
  PeerExchange* exchange = nullptr;
  Socket* dataListener = nullptr;
  Deadline deadline;
  std::string mode;    // auto | shm | tcp | ucx
  bool eager = false;  // CHORUS_CONNECT=eager: connect to every peer at init
};

// Connects `transport` to every peer of `peers` (all started at once, then progressed until every
// one is up), or throws chorusTimeout at the deadline naming those still missing. The peers must
// do the same (or be connecting to this rank already), as at init or before a direct call.
// whileWaiting (may be empty) is called between polls: the communicator's watch for failures its
// peers tell on the failure line (it throws when one is told), so that a rank does not wait out
// its timeout for a peer that has stopped on hearing of a failure elsewhere. Not at init, whose
// all-gather the same sockets carry.
void connectAll(Transport& transport, const std::vector<int>& peers, int rank, Deadline deadline,
                const std::function<void()>& whileWaiting = {});

// One line per transport in registry.cc.
struct TransportKind {
  const char* name;
  // Whether this transport serves self <-> peer. Must give the same answer on both sides.
  bool (*canConnect)(const TransportContext& context, int peer);
  // Collective: every rank calls it for every kind, in registry order, with the peers it chose
  // (possibly none). Connects to those peers.
  std::unique_ptr<Transport> (*create)(TransportContext& context, const std::vector<int>& peers);
};

const std::vector<TransportKind>& transportRegistry();
// Whether this build has the transport of that name (ucx only where UCX was found).
bool transportBuilt(const std::string& name);

// Constructors, one per transport file.
std::unique_ptr<Transport> createSelfTransport(TransportContext& context, const std::vector<int>& peers);
std::unique_ptr<Transport> createShmTransport(TransportContext& context, const std::vector<int>& peers);
std::unique_ptr<Transport> createTcpTransport(TransportContext& context, const std::vector<int>& peers);
std::unique_ptr<Transport> createUcxTransport(TransportContext& context, const std::vector<int>& peers);

}  // namespace chorus
