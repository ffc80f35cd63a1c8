// shm.cc: the shared-memory transport, for ranks on one host.
//
// Every ordered pair (src -> dst) owns a FIFO in a POSIX shared-memory segment: a ring of
// CHORUS_SHM_SLOTS slots of CHORUS_SHM_SLOT_BYTES each and a tail (slots consumed by dst). A
// message is cut into slot-sized pieces; each piece carries the message's tag, total size and
// offset, so the receiver checks that it matches what it posted. No system call per message: the
// sender copies into the slot and publishes it by storing the piece's sequence number in the
// slot's header last (release); the receiver watches the header of the next slot it expects, so
// a small message (header and up to 16 bytes in one cache line) reaches the receiver as a single
// cache-line transfer, with no separate counter to fetch first (the "flags in line with data" of
// NCCL's LL protocol). Each rank also owns a doorbell, a futex word that peers bump when they
// publish or free slots while it sleeps; a rank with nothing to do sleeps on it (ranks may
// outnumber cores), so nobody spins for long. A rank about to sleep says so first (waiters), and
// a peer rings only then, so a message between awake ranks costs no atomic read-modify-write.
//
// Large messages (CHORUS_SHM_READ_BYTES and up; off by default, as it measured slower than two
// copies through the cached FIFO, see docs/performance.md) take one copy instead of two: the sender
// publishes one slot that holds no bytes but the message's address in its own memory, the
// receiver copies the message straight into its buffer with process_vm_readv (cross-memory
// attach) and counts the read done in the FIFO, and only then does the send complete. Whether
// the receiver may read the sender's memory (same PID namespace, ptrace permission) is probed
// once at set-up; where it may not, that pair keeps the two-copy path.
//
// Messages whose buffer lies in a chorusMemAlloc allocation (CHORUS_SHM_MAP_BYTES and up) take
// one copy at memory speed: the sender publishes one slot naming the allocation (its memfd's
// number in the sender, a serial, the offset), the receiver takes the descriptor with
// pidfd_getfd once per allocation, maps it, and copies or reduces straight out of the sender's
// pages; as above, the send completes when the receiver has counted the message done. Whether the
// receiver may take the sender's descriptors is probed at set-up with a small memfd. The same
// mappings serve the communicator's direct all-reduce (mapPeerMemory), which writes into them.
//
// A receive posted with a sink (a receive fused with its reduction) stores nothing: each piece is
// handed to the sink straight from its slot, and a message read from the sender's memory is read
// in slot-sized pieces into one buffer that stays in the cache, each consumed before the next.
// A streaming send (its bytes produced while it is posted: a ring's receive-reduce-send, which
// the executor fuses) is queued like any send and leaves as far as its producer has come. When it
// is first in its queue with a slot free, its next bytes' slot is offered as a window
// (streamingWindow): the producer writes the bytes there in the same pass as into their place
// (never read back) and the slot is published at once; otherwise the send copies them from its
// buffer when it can. Either way it never sends a byte before it has been produced.
//
// Set-up at init is collective and small: the lowest rank of the host creates a segment of
// doorbells, one per rank of the host, all meet at a bootstrap barrier, the others map it, all
// meet again, and the creator unlinks its name, so nothing outlives the processes. A pair's FIFOs
// (both directions, in one segment) are made when the first message between the two is posted (or
// at init with CHORUS_CONNECT=eager), so a rank maps FIFOs only with the peers its schedules use:
// the lower rank creates the segment and may send at once; the higher rank maps it when it needs
// the pair (its messages wait in their queue until the segment is there), answers the lower rank's
// probes of its memory, says so in the segment and unlinks the name; the lower rank then answers
// the higher rank's probes (and unlinks the name too, if it was first). A lower rank that leaves
// before its peer opened a pair with messages in it leaves the name for the peer (unless the peer
// has exited); a higher rank that leaves removes the names of pairs it never opened. Each rings
// the other's doorbell at its step. Until its probes are
// answered a sender uses the two-copy path.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/copy.h"
#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/base/memory.h"
#include "src/transport/transport.h"

namespace chorus {
namespace {

struct alignas(64) Doorbell {
  std::atomic<uint32_t> sequence;
  std::atomic<uint32_t> waiters;
};

// The start of a pair's segment; the FIFO from the lower rank to the higher follows it, then the
// one back.
enum PairState : uint32_t { kPairMade = 0, kPairReady = 1, kPairOpened = 2 };
struct alignas(64) PairHeader {
  std::atomic<uint32_t> state;  // PairState: ready once the lower rank has set up both FIFOs
};

// What the receiver answers to the set-up probe of the sender's memory.
enum ReadProbe : uint32_t { kNotProbed = 0, kCanRead = 1, kCannotRead = 2 };
constexpr uint64_t kProbeMagic = 0x63686f7275732121ull;

struct alignas(64) FifoControl {
  alignas(64) std::atomic<uint64_t> tail;   // pieces consumed by the receiver
  alignas(64) std::atomic<uint64_t> reads;  // messages the receiver read from the sender's memory
  std::atomic<uint32_t> probe;              // ReadProbe, set by the receiver at set-up
  uint64_t probeValue;                      // kProbeMagic, written by the sender
  uint64_t probeAddress;                    // where probeValue lies in the sender's address space
  std::atomic<uint32_t> mapProbe;           // ReadProbe for the sender's memfds, set by the receiver
  int32_t probeFd;                          // the sender's probe memfd (holds kProbeMagic)
};

// 48 bytes: a piece of up to kInlineBytes follows it in the same cache line (slots are
// 64-aligned); a larger one starts at the next line, so vector loads of it do not straddle lines.
struct SlotHeader {
  std::atomic<uint64_t> sequence;  // n + 1 once the n-th piece of the FIFO is in this slot
  uint64_t tag;
  uint64_t messageBytes;
  uint64_t offset;
  uint64_t pieceBytes;
  uint64_t remote;  // 0: the piece follows the header; else its address in the sender's memory
};
static_assert(sizeof(SlotHeader) == 48);
constexpr size_t kInlineBytes = 16;
// SlotHeader::remote of a message in a shareable allocation; the slot's body holds a MappedRef.
constexpr uint64_t kMappedMessage = 1;

struct MappedRef {
  int32_t fd;       // the allocation's memfd, as numbered in the sender
  uint64_t serial;  // the sender's serial of the allocation
  uint64_t bytes;   // its size
  uint64_t offset;  // where the message starts in it
};

// A peer's allocation mapped here (read-write: the direct all-reduce writes into peers' outputs).
struct Mapping {
  int32_t fd;
  uint64_t serial;
  char* base;
  size_t bytes;
};

// The descriptor fd of the process behind pidfd, duplicated into this one; -1 and errno on failure.
int pidfdGetfd(int pidfd, int fd) { return static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0)); }

char* pieceOf(SlotHeader* header) {
  return reinterpret_cast<char*>(header) + (header->pieceBytes <= kInlineBytes ? sizeof(SlotHeader) : 64);
}
const char* pieceOf(const SlotHeader* header) { return pieceOf(const_cast<SlotHeader*>(header)); }

// Copies bytes from address `remote` of process pid into local; the errno of a failure, else 0.
int readRemote(pid_t pid, void* local, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec to{static_cast<char*>(local) + done, bytes - done};
    iovec from{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t got = process_vm_readv(pid, &to, 1, &from, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return got < 0 ? errno : EFAULT;
    done += static_cast<size_t>(got);
  }
  return 0;
}

// Wakes the owner of the bell if it sleeps (or is about to). The caller has published (released)
// what the owner waits for; the fence orders that before reading waiters, and the owner's wait
// raises waiters before it looks for work, so one of the two sees the other.
void ring(Doorbell* bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell->waiters.load(std::memory_order_relaxed) > 0) {
    bell->sequence.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, &bell->sequence, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

struct PendingOp {
  uint64_t tag;
  char* data;
  size_t bytes;
  size_t done;  // bytes copied so far
  Request* request;
  PieceSink* sink = nullptr;  // receives only: where the pieces go instead of data
};

enum class Link {
  kNone,     // no message posted yet
  kWaiting,  // the higher rank of the pair, waiting for the lower rank's segment
  kUp,       // the FIFOs are mapped
};

struct Peer {
  int rank = -1;
  pid_t pid = 0;
  Link link = Link::kNone;
  SharedSegment segment;      // the pair's FIFOs
  bool probedByPeer = false;  // the lower rank of the pair: the higher has opened the segment
  bool probesKnown = false;   // the peer has answered this rank's probes (peerReads, peerMaps)
  FifoControl* out = nullptr;
  FifoControl* in = nullptr;
  char* outSlots = nullptr;
  char* inSlots = nullptr;
  Doorbell* bell = nullptr;  // the peer's doorbell (in the host's segment)
  uint64_t head = 0;         // pieces this rank has published to the peer
  uint64_t tailSeen = 0;     // the peer's tail when last read (it only grows)
  std::deque<PendingOp> sends;
  std::deque<PendingOp> recvs;
  // Sends the peer reads from this rank's memory, each with the count of reads that completes it.
  std::deque<std::pair<uint64_t, Request*>> beingRead;
  uint64_t readsPublished = 0;
  bool peerReads = false;  // the peer may read this rank's memory (the probe succeeded)
  bool peerMaps = false;   // the peer may map this rank's memfds (the probe succeeded)
  int pidfd = -1;          // the peer's process: to take its memfds, to see it exit
  std::vector<Mapping> mappings;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(TransportContext& context, const std::vector<int>& peers)
      : rank_(context.rank),
        slots_(static_cast<uint64_t>(knobInt(Knob::kShmSlots))),
        slotBytes_(static_cast<size_t>(knobInt(Knob::kShmSlotBytes)) / 64 * 64),
        readBytes_(static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kShmReadBytes), 0))),
        mapBytes_(static_cast<size_t>(std::max<int64_t>(knobInt(Knob::kShmMapBytes), 0))),
        peers_("shm", context.rank, context.nranks) {
    if (slots_ < 2 || slotBytes_ < 64) {  // (slot sizes are rounded down to a multiple of 64)
      fail(chorusInvalidArgument,
           "shm transport: need CHORUS_SHM_SLOTS >= 2 and CHORUS_SHM_SLOT_BYTES >= 64 (got {}, {})", slots_,
           slotBytes_);
    }
    slotStride_ = 64 + (slotBytes_ + 63) / 64 * 64;
    fifoBytes_ = sizeof(FifoControl) + slots_ * slotStride_;
    prefix_ = fmt::format("/chorus-{:016x}", context.commId);

    // The host's doorbells, one per rank in rank order, made by its lowest rank.
    std::vector<int> host = peers;
    host.push_back(rank_);
    std::sort(host.begin(), host.end());
    const std::string bells = fmt::format("{}-bells-{}", prefix_, host.front());
    const size_t bellBytes = host.size() * sizeof(Doorbell);
    if (!peers.empty() && host.front() == rank_) {
      bellsSegment_ = SharedSegment::create(bells, bellBytes);
      for (size_t i = 0; i < host.size(); ++i) new (bellsSegment_.base() + i * sizeof(Doorbell)) Doorbell{};
    }
    context.exchange->barrier(context.deadline);
    if (!peers.empty() && host.front() != rank_) bellsSegment_ = SharedSegment::open(bells, bellBytes);
    context.exchange->barrier(context.deadline);
    bellsSegment_.unlink();
    if (peers.empty()) return;
    auto bellOf = [&](int rank) {
      const size_t index = static_cast<size_t>(std::lower_bound(host.begin(), host.end(), rank) - host.begin());
      return reinterpret_cast<Doorbell*>(bellsSegment_.base() + index * sizeof(Doorbell));
    };
    bell_ = bellOf(rank_);
    // The memfd peers take to learn whether they may take this rank's (kept for late pairs).
    probeFd_ = memfd_create("chorus-probe", MFD_CLOEXEC);
    if (probeFd_ >= 0 && pwrite(probeFd_, &kProbeMagic, sizeof(kProbeMagic), 0) != sizeof(kProbeMagic)) {
      ::close(probeFd_);
      probeFd_ = -1;
    }
    for (int rank : peers) {
      Peer& peer = peers_.add(rank);
      peer.rank = rank;
      peer.pid = context.peers[rank].pid;
      peer.bell = bellOf(rank);
    }
    if (context.eager) connectAll(*this, peers, rank_, context.deadline);
  }

  ~ShmTransport() override {
    for (Peer& peer : peers_.all()) {
      // A pair this rank made, whose peer has not opened it yet but has messages waiting in it:
      // its name stays for the peer, which removes it when it opens it (unless the peer is gone).
      if (peer.rank > rank_ && peer.link == Link::kUp && !peer.probedByPeer && peer.head > 0 &&
          !processExited(peer.pidfd, peer.pid)) {
        peer.segment.keepName();
      }
      // A pair a lower rank may have made for this one, never opened here: its name goes now.
      if (peer.rank < rank_ && peer.link != Link::kUp) shm_unlink(pairName(peer.rank, rank_).c_str());
      for (const Mapping& mapping : peer.mappings) munmap(mapping.base, mapping.bytes);
      if (peer.pidfd >= 0) ::close(peer.pidfd);
    }
    if (probeFd_ >= 0) ::close(probeFd_);
  }

  const char* name() const override { return "shm"; }

  void postSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    Peer& p = linked(peer);
    p.sends.push_back({tag, static_cast<char*>(const_cast<void*>(data)), bytes, 0, request});
    ++pending_;
    countSent(0, 1);
    if (p.link == Link::kUp) pushSends(p);
  }

  void postRecv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) override {
    Peer& p = linked(peer);
    p.recvs.push_back({tag, static_cast<char*>(data), bytes, 0, request});
    ++pending_;
    if (p.link == Link::kUp) pullRecvs(p);
  }

  bool postRecvToSink(int peer, uint64_t tag, PieceSink* sink, size_t bytes, Request* request) override {
    Peer& p = linked(peer);
    p.recvs.push_back({tag, nullptr, bytes, 0, request, sink});
    ++pending_;
    if (p.link == Link::kUp) pullRecvs(p);
    return true;
  }

  void connect(int peer) override { linked(peer); }
  bool connected(int peer) const override { return setUp(peers_.at(peer)); }
  int connections() const override { return connections_; }
  // Every pair not yet set up on both sides, not only those linking_ counts: a higher rank that
  // opened a pair still waits for the lower rank's answers to its probes.
  void checkConnecting() override { checkPeersAlive(/*linking=*/true); }

  std::string describePeer(int peer) const override {
    if (!peers_.has(peer)) return "";
    const Peer& p = peers_.at(peer);
    std::string text = fmt::format("link {}, {} op(s) pending in all; to it: head {}, tail {} ({} slots)",
                                   p.link == Link::kUp ? "up" : (p.link == Link::kWaiting ? "waiting" : "none"),
                                   pending_, p.head, p.link == Link::kUp ? p.out->tail.load() : 0, slots_);
    if (!p.sends.empty()) {
      const PendingOp& op = p.sends.front();
      const size_t ready = op.request->ready;
      text +=
          fmt::format(", {} send(s) queued, the first {} of {} bytes out, {} ready", p.sends.size(), op.done, op.bytes,
                      ready == std::numeric_limits<size_t>::max() ? std::string("all") : std::to_string(ready));
    }
    if (!p.beingRead.empty()) text += fmt::format(", {} being read", p.beingRead.size());
    if (p.link == Link::kUp) {
      const uint64_t tail = p.in->tail.load();
      text += fmt::format("; from it: tail {}, next slot's sequence {}", tail, slot(p.inSlots, tail)->sequence.load());
    }
    if (!p.recvs.empty()) {
      const PendingOp& op = p.recvs.front();
      text += fmt::format(", {} receive(s) posted, the first {} of {} bytes in", p.recvs.size(), op.done, op.bytes);
    }
    return text;
  }

  bool postStreamingSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    request->ready = 0;
    postSend(peer, tag, data, bytes, request);  // the sends queued before it may go; it waits for its bytes
    return true;
  }

  // The next slot to peer, when the streaming send is first in that peer's queue with every byte
  // before offset sent (what is queued before it is pushed first) and a slot is free (its header
  // is then written).
  void* streamingWindow(int peer, Request* request, size_t offset, size_t count) override {
    if (count > slotBytes_) return nullptr;
    Peer& q = peers_.at(peer);
    if (q.link != Link::kUp) return nullptr;
    auto caughtUp = [&] {
      return !q.sends.empty() && q.sends.front().request == request && q.sends.front().done == offset;
    };
    if (!caughtUp()) pushSends(q);
    if (!caughtUp() || !slotFree(q)) return nullptr;
    const PendingOp& send = q.sends.front();
    SlotHeader* header = slot(q.outSlots, q.head);
    header->tag = send.tag;
    header->messageBytes = send.bytes;
    header->offset = offset;
    header->pieceBytes = count;
    header->remote = 0;
    return pieceOf(header);
  }

  void produced(int peer, Request* /*request*/, size_t windowBytes) override {
    Peer& q = peers_.at(peer);
    if (q.link != Link::kUp) return;  // (no window was given) the send leaves once the pair is up
    if (windowBytes > 0) publish(q, windowBytes);
    pushSends(q);  // the rest of the send, and what follows it, as far as they can go
    if (windowBytes > 0) ring(q.bell);
  }

  bool progress() override {
    bool moved = linking_ > 0 && advanceLinks();
    for (Peer& p : peers_.all()) {
      if (p.link != Link::kUp) continue;
      if (!p.sends.empty()) moved |= pushSends(p);
      if (!p.recvs.empty()) moved |= pullRecvs(p);
      if (!p.beingRead.empty()) moved |= completeReads(p);
    }
    return moved;
  }

  void wait(int timeoutMs) override {
    if (bell_ == nullptr || pending_ == 0) return;
    // Say "about to sleep" before the last look for work: a peer that publishes after that look
    // sees waiters raised and bumps the sequence, so the futex wait returns at once.
    const uint32_t seen = bell_->sequence.load(std::memory_order_seq_cst);
    bell_->waiters.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!progress()) {
      timespec timeout{timeoutMs / 1000, (timeoutMs % 1000) * 1000000L};
      syscall(SYS_futex, &bell_->sequence, FUTEX_WAIT, seen, &timeout, nullptr, 0);
    }
    bell_->waiters.fetch_sub(1, std::memory_order_seq_cst);
    checkPeersAlive();
  }

  bool busy() const override { return pending_ > 0; }

  bool peerMapsMemory(int peer) const override {
    if (!peers_.has(peer)) return false;
    const Peer& p = peers_.at(peer);
    return p.link == Link::kUp && p.out->mapProbe.load(std::memory_order_acquire) == kCanRead;
  }
  char* mapPeerMemory(int peer, int fd, uint64_t serial, size_t bytes) override {
    return mapAllocation(peers_.at(peer), fd, serial, bytes, "memory the communicator maps");
  }

  void cancelAll() override {
    peers_.clearQueues();
    for (Peer& p : peers_.all()) p.beingRead.clear();
    pending_ = 0;
  }

 private:
  std::string pairName(int lower, int higher) const { return fmt::format("{}-{}-{}", prefix_, lower, higher); }
  size_t pairBytes() const { return sizeof(PairHeader) + 2 * fifoBytes_; }

  // The peer, its link started if it had none.
  Peer& linked(int peer) {
    Peer& p = peers_.at(peer);
    if (p.link != Link::kNone) return p;
    if (p.pidfd < 0) p.pidfd = pidfdOpen(p.pid);  // readable once the peer has exited (zombie or not)
    if (rank_ < p.rank) {
      createPair(p);  // (if it throws, nothing is counted and the next post tries again)
    } else {
      p.link = Link::kWaiting;
    }
    ++connections_;
    ++linking_;
    if (p.link == Link::kWaiting) openPair(p);
    return p;
  }

  // This rank's FIFO to p and p's to it, in the pair's segment (`lowerFirst`: this rank is the
  // lower of the two, whose FIFO comes first), with this rank's probe values for p to check.
  void attach(Peer& p, bool lowerFirst) {
    char* lower = p.segment.base() + sizeof(PairHeader);
    char* higher = lower + fifoBytes_;
    char* out = lowerFirst ? lower : higher;
    char* in = lowerFirst ? higher : lower;
    p.out = reinterpret_cast<FifoControl*>(out);
    p.in = reinterpret_cast<FifoControl*>(in);
    p.outSlots = out + sizeof(FifoControl);
    p.inSlots = in + sizeof(FifoControl);
    p.out->probeValue = kProbeMagic;
    p.out->probeAddress = reinterpret_cast<uint64_t>(&p.out->probeValue);
    p.out->probeFd = probeFd_;
  }

  // The lower rank of the pair: makes its segment; this rank may send at once.
  void createPair(Peer& p) {
    p.segment = SharedSegment::create(pairName(rank_, p.rank), pairBytes());
    auto* header = new (p.segment.base()) PairHeader{};
    new (p.segment.base() + sizeof(PairHeader)) FifoControl{};
    new (p.segment.base() + sizeof(PairHeader) + fifoBytes_) FifoControl{};
    attach(p, /*lowerFirst=*/true);
    header->state.store(kPairReady, std::memory_order_release);
    p.link = Link::kUp;
    ring(p.bell);  // the peer may sleep waiting for it
  }

  // The higher rank of the pair: maps the lower rank's segment once it is ready, answers its probes
  // and says so. Returns true once done.
  bool openPair(Peer& p) {
    if (!p.segment.mapped()) {
      p.segment = SharedSegment::tryOpen(pairName(p.rank, rank_), pairBytes());
      if (!p.segment.mapped()) return false;
    }
    auto* header = reinterpret_cast<PairHeader*>(p.segment.base());
    if (header->state.load(std::memory_order_acquire) < kPairReady) return false;
    shm_unlink(pairName(p.rank, rank_).c_str());  // (the lower rank may have left it for this one to remove)
    attach(p, /*lowerFirst=*/false);
    answerProbes(p);
    header->state.store(kPairOpened, std::memory_order_release);
    p.link = Link::kUp;
    --linking_;
    ring(p.bell);
    return true;
  }

  // The lower rank of the pair, once the higher has opened the segment: answers its probes and
  // removes the name. Returns true once done.
  bool finishPair(Peer& p) {
    auto* header = reinterpret_cast<PairHeader*>(p.segment.base());
    if (header->state.load(std::memory_order_acquire) != kPairOpened) return false;
    answerProbes(p);
    p.segment.unlink();
    p.probedByPeer = true;
    --linking_;
    ring(p.bell);
    return true;
  }

  // Moves the links being made along. Returns true if any moved.
  bool advanceLinks() {
    bool moved = false;
    for (Peer& p : peers_.all()) {
      if (p.link == Link::kWaiting) {
        moved |= openPair(p);
      } else if (toFinish(p)) {
        moved |= finishPair(p);
      }
    }
    return moved;
  }

  // Can this rank read p's memory, and take its memfds? Checks the values p put in its FIFO's
  // control and tells p.
  void answerProbes(Peer& peer) {
    uint64_t value = 0;
    const int error = readBytes_ > 0 ? readRemote(peer.pid, &value, peer.in->probeAddress, sizeof(value)) : EPERM;
    const bool canRead = error == 0 && value == kProbeMagic;
    peer.in->probe.store(canRead ? kCanRead : kCannotRead, std::memory_order_release);
    if (!canRead && readBytes_ > 0) {
      logAt(LogLevel::kInfo, "shm: rank {} cannot read rank {}'s memory ({}); two copies per message from it", rank_,
            peer.rank, error != 0 ? std::strerror(error) : "probe value differs");
    }
    const bool canMap = probeMapping(peer);
    peer.in->mapProbe.store(canMap ? kCanRead : kCannotRead, std::memory_order_release);
  }

  // The peer's answers to this rank's probes, once it has given both.
  void learnProbes(Peer& p) {
    const uint32_t reads = p.out->probe.load(std::memory_order_acquire);
    const uint32_t maps = p.out->mapProbe.load(std::memory_order_acquire);
    if (reads == kNotProbed || maps == kNotProbed) return;
    p.peerReads = reads == kCanRead;
    p.peerMaps = maps == kCanRead;
    p.probesKnown = true;
  }

  SlotHeader* slot(char* slots, uint64_t index) const {
    return reinterpret_cast<SlotHeader*>(slots + (index % slots_) * slotStride_);
  }

  // Copies pieces of the queued sends into free slots. Returns true if any piece moved.
  bool pushSends(Peer& p) {
    if (!p.probesKnown) learnProbes(p);
    bool moved = false;
    while (!p.sends.empty()) {
      PendingOp& op = p.sends.front();
      // A streaming send goes as far as its producer has come (the rest of its pieces, where
      // there was room, the producer wrote into its window and produced() published).
      const size_t ready = op.request->ready;
      if (op.done < op.bytes && ready <= op.done) break;
      if (!slotFree(p)) break;
      // A large message not yet started: where it lies only, for the receiver to copy from the
      // mapped allocation, or to read from this process. Never a streaming send.
      const bool whole = op.done == 0 && ready == std::numeric_limits<size_t>::max();
      SharedRange shared;
      const bool mappable = whole && mapBytes_ > 0 && op.bytes >= mapBytes_ && findShared(op.data, op.bytes, &shared);
      const bool readable = whole && readBytes_ > 0 && op.bytes >= readBytes_;
      // Such a message on a pair just made waits for the peer's answers (it is setting up the pair
      // to receive it), so it too takes one copy.
      if ((mappable || readable) && !p.probesKnown) break;
      const bool mapped = mappable && p.peerMaps;
      const bool byAddress = mapped || (readable && p.peerReads);
      const size_t piece = byAddress ? op.bytes : std::min({slotBytes_, op.bytes - op.done, ready - op.done});
      SlotHeader* header = slot(p.outSlots, p.head);
      header->tag = op.tag;
      header->messageBytes = op.bytes;
      header->offset = op.done;
      header->pieceBytes = piece;
      header->remote = mapped ? kMappedMessage : byAddress ? reinterpret_cast<uint64_t>(op.data) : 0;
      if (mapped) {
        new (reinterpret_cast<char*>(header) + 64) MappedRef{shared.fd, shared.serial, shared.bytes, shared.offset};
      } else if (piece > 0 && !byAddress) {
        std::memcpy(pieceOf(header), op.data + op.done, piece);
      }
      moved = true;
      if (byAddress) {
        countSent(sizeof(SlotHeader) + op.bytes);  // the peer reads the bytes from here
        header->sequence.store(++p.head, std::memory_order_release);
        p.beingRead.emplace_back(++p.readsPublished, op.request);  // done when the peer has read it
        p.sends.pop_front();
      } else {
        publish(p, piece);
      }
    }
    if (moved) ring(p.bell);
    return moved;
  }

  // Whether the FIFO to p has a free slot (re-reading the peer's tail only when it looked full).
  bool slotFree(Peer& p) {
    if (p.head - p.tailSeen < slots_) return true;
    p.tailSeen = p.out->tail.load(std::memory_order_acquire);
    return p.head - p.tailSeen < slots_;
  }

  // Publishes the next slot to p, which holds `piece` bytes of the send at the front of p's
  // queue (its header written), and completes that send with its last piece.
  void publish(Peer& p, size_t piece) {
    PendingOp& op = p.sends.front();
    op.done += piece;
    countSent(sizeof(SlotHeader) + piece);
    slot(p.outSlots, p.head)->sequence.store(p.head + 1, std::memory_order_release);
    ++p.head;
    if (op.done == op.bytes) {
      op.request->done = true;
      --pending_;
      p.sends.pop_front();
    }
  }

  // Copies published pieces into the posted receives. Returns true if any piece moved.
  bool pullRecvs(Peer& p) {
    bool moved = false;
    uint64_t tail = p.in->tail.load(std::memory_order_relaxed);
    while (!p.recvs.empty()) {
      const SlotHeader* header = slot(p.inSlots, tail);
      if (header->sequence.load(std::memory_order_acquire) != tail + 1) break;
      PendingOp& op = p.recvs.front();
      const wire::SlotPiece piece{header->tag, header->messageBytes, header->offset, header->pieceBytes,
                                  header->remote == 0};
      if (const std::string why = wire::checkSlotPiece(piece, op.tag, op.bytes, op.done, slotBytes_); !why.empty()) {
        fail(chorusRemoteError, "shm: the next message from rank {} to rank {} is {}", p.rank, rank_, why);
      }
      if (header->remote == kMappedMessage) {
        const auto* ref = reinterpret_cast<const MappedRef*>(reinterpret_cast<const char*>(header) + 64);
        deliver(op, mappedBytes(p, *ref, header->pieceBytes, op), header->pieceBytes);
        p.in->reads.fetch_add(1, std::memory_order_release);  // the sender may reuse its buffer
      } else if (header->remote != 0) {
        if (const int error = read(p, op, header->remote, header->pieceBytes); error == ESRCH) {
          throw LinkLost(chorusRemoteError, fmt::format("shm: rank {} has exited (pid {} on this host) while rank {} "
                                                        "reads {} from it",
                                                        p.rank, p.pid, rank_, describeTag(op.tag)));
        } else if (error != 0) {
          fail(chorusSystemError, "shm: rank {} could not read {} bytes of {} from rank {} (pid {}): {}", rank_,
               header->pieceBytes, describeTag(op.tag), p.rank, p.pid, std::strerror(error));
        }
        p.in->reads.fetch_add(1, std::memory_order_release);  // the sender may reuse its buffer
      } else {
        deliver(op, pieceOf(header), header->pieceBytes);
      }
      op.done += header->pieceBytes;
      ++tail;
      p.in->tail.store(tail, std::memory_order_release);
      moved = true;
      if (op.done == op.bytes) {
        op.request->done = true;
        p.recvs.pop_front();
        --pending_;
      }
    }
    if (moved) ring(p.bell);
    return moved;
  }

  // Hands bytes that continue receive op to its sink, or copies them into its buffer.
  void deliver(PendingOp& op, const char* bytes, size_t count) {
    if (count == 0) return;
    if (op.sink != nullptr) {
      op.sink->consume(op.done, bytes, count);
    } else if (op.request->streamed) {
      // Where the caller asks (a large final destination), streamed into place: all-gather of
      // 16-256 MiB on 2 ranks measured 11-25% faster out of the slots.
      kernels::copyStreaming(op.data + op.done, bytes, count);
    } else {
      std::memcpy(op.data + op.done, bytes, count);
    }
  }

  // Set-up: can this rank take peer's memfds? Takes its probe memfd and checks what it holds.
  bool probeMapping(Peer& peer) {
    const int theirs = peer.in->probeFd;
    if (theirs < 0 || peer.pid <= 0) return false;
    const int fd = peer.pidfd >= 0 ? pidfdGetfd(peer.pidfd, theirs) : -1;
    uint64_t value = 0;
    const bool ok = fd >= 0 && pread(fd, &value, sizeof(value), 0) == sizeof(value) && value == kProbeMagic;
    if (!ok) {
      logAt(LogLevel::kInfo,
            "shm: rank {} cannot take rank {}'s memfds ({}); chorusMemAlloc buffers from it take two "
            "copies",
            rank_, peer.rank, fd < 0 ? std::strerror(errno) : "probe value differs");
    }
    if (fd >= 0) ::close(fd);
    return ok;
  }

  // Where the message that ref names lies in this process: the peer's allocation, mapped once.
  const char* mappedBytes(Peer& p, const MappedRef& ref, size_t bytes, const PendingOp& op) {
    if (ref.offset > ref.bytes || bytes > ref.bytes - ref.offset) {
      fail(chorusRemoteError, "shm: rank {} named bytes [{}, {}) of a {}-byte buffer for {}", p.rank, ref.offset,
           ref.offset + bytes, ref.bytes, describeTag(op.tag));
    }
    return mapAllocation(p, ref.fd, ref.serial, ref.bytes, describeTag(op.tag)) + ref.offset;
  }

  // The allocation in p's descriptor fd, mapped read-write; cached per descriptor and serial.
  char* mapAllocation(Peer& p, int fd, uint64_t serial, size_t bytes, const std::string& what) {
    auto found = std::find_if(p.mappings.begin(), p.mappings.end(), [&](const Mapping& m) { return m.fd == fd; });
    if (found != p.mappings.end() && (found->serial != serial || found->bytes != bytes)) {
      munmap(found->base, found->bytes);  // that descriptor now holds another allocation
      p.mappings.erase(found);
      found = p.mappings.end();
    }
    if (found == p.mappings.end()) {
      const int mine = p.pidfd >= 0 ? pidfdGetfd(p.pidfd, fd) : -1;
      if (mine < 0 && errno == ESRCH) {
        throw LinkLost(chorusRemoteError, fmt::format("shm: rank {} has exited (pid {} on this host) before rank {} "
                                                      "could map its buffer for {}",
                                                      p.rank, p.pid, rank_, what));
      }
      if (mine < 0) {
        failErrno(fmt::format("shm: rank {} cannot take descriptor {} of rank {} (pid {}) for {}", rank_, fd, p.rank,
                              p.pid, what));
      }
      void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
      const int error = errno;
      ::close(mine);
      if (base == MAP_FAILED) {
        fail(chorusSystemError, "shm: rank {} cannot map rank {}'s {}-byte buffer for {}: {}", rank_, p.rank, bytes,
             what, std::strerror(error));
      }
      p.mappings.push_back({fd, serial, static_cast<char*>(base), bytes});
      found = p.mappings.end() - 1;
    }
    return found->base;
  }

  // Reads bytes at address remote of peer p into receive op: into its buffer, or for a sink in
  // slot-sized pieces through readBuffer_. The errno of a failure, else 0.
  int read(const Peer& p, PendingOp& op, uint64_t remote, size_t bytes) {
    if (op.sink == nullptr) return readRemote(p.pid, op.data + op.done, remote, bytes);
    if (readBuffer_.size() < slotBytes_) readBuffer_.resize(slotBytes_);
    for (size_t done = 0; done < bytes; done += slotBytes_) {
      const size_t piece = std::min(slotBytes_, bytes - done);
      if (const int error = readRemote(p.pid, readBuffer_.data(), remote + done, piece); error != 0) return error;
      op.sink->consume(op.done + done, readBuffer_.data(), piece);
    }
    return 0;
  }

  // Completes the sends the peer has finished reading. Returns true if any completed.
  bool completeReads(Peer& p) {
    const uint64_t reads = p.out->reads.load(std::memory_order_acquire);
    bool completed = false;
    while (!p.beingRead.empty() && p.beingRead.front().first <= reads) {
      p.beingRead.front().second->done = true;
      p.beingRead.pop_front();
      --pending_;
      completed = true;
    }
    return completed;
  }

  // Whether the pair with p is set up on both sides: mapped here, this rank's probes answered by
  // p, and (this rank the lower) p's answered here. settingUp: begun and not yet that.
  bool setUp(const Peer& p) const {
    return p.link == Link::kUp && (p.rank < rank_ || p.probedByPeer) &&
           p.out->probe.load(std::memory_order_acquire) != kNotProbed &&
           p.out->mapProbe.load(std::memory_order_acquire) != kNotProbed;
  }
  bool settingUp(const Peer& p) const { return p.link != Link::kNone && !setUp(p); }
  // The lower rank of an opened pair that has still to answer its peer's probes.
  bool toFinish(const Peer& p) const { return p.link == Link::kUp && p.rank > rank_ && !p.probedByPeer; }

  // Throws LinkLost for a peer that has exited while this rank has work with it (or, with
  // `linking`, is still setting up their pair).
  void checkPeersAlive(bool linking = false) {
    const auto now = Clock::now();
    if (now - lastAliveCheck_ < std::chrono::milliseconds(100)) return;
    lastAliveCheck_ = now;
    for (Peer& p : peers_.all()) {
      auto waitedOn = [&] {
        return !p.sends.empty() || !p.recvs.empty() || !p.beingRead.empty() || (linking && settingUp(p));
      };
      if (!waitedOn() || p.pid <= 0) continue;
      if (!processExited(p.pidfd, p.pid)) continue;
      // A peer that sent its last messages and left normally: what it published is all here (in a
      // pair it may have made for this rank and left), and what it read of ours before leaving is
      // done.
      if (p.link == Link::kWaiting) openPair(p);
      if (p.link == Link::kUp) {
        pullRecvs(p);
        completeReads(p);
      }
      if (toFinish(p)) finishPair(p);  // it opened the pair, then left
      if (!waitedOn()) continue;
      throw LinkLost(chorusRemoteError,
                     fmt::format("shm: rank {} has exited (pid {} on this host) while rank {} waits for it", p.rank,
                                 p.pid, rank_));
    }
  }

  int rank_;
  uint64_t slots_;
  size_t slotBytes_;
  size_t readBytes_;  // CHORUS_SHM_READ_BYTES
  size_t mapBytes_;   // CHORUS_SHM_MAP_BYTES
  size_t slotStride_ = 0;
  size_t fifoBytes_ = 0;
  std::string prefix_;            // of this communicator's segment names
  std::vector<char> readBuffer_;  // pieces read for a sink
  PeerTable<Peer> peers_;
  SharedSegment bellsSegment_;  // the host's doorbells
  Doorbell* bell_ = nullptr;    // this rank's
  int probeFd_ = -1;
  int connections_ = 0;
  int linking_ = 0;  // links with set-up work left here (the higher rank's ends once it opens the pair)
  size_t pending_ = 0;
  Clock::time_point lastAliveCheck_ = Clock::now();
};

}  // namespace

std::unique_ptr<Transport> createShmTransport(TransportContext& context, const std::vector<int>& peers) {
  return std::make_unique<ShmTransport>(context, peers);
}

}  // namespace chorus
