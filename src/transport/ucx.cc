// ucx.cc: the UCX transport, for peers on other hosts (InfiniBand, RoCE, TCP: whatever UCX finds),
// or for every peer with CHORUS_TRANSPORT=ucx.
//
// One UCP context and worker per communicator; worker addresses travel through the bootstrap and
// every rank opens an endpoint to each of its UCX peers, with peer error handling for peers on
// other hosts, so that a dead peer fails its endpoint instead of hanging it. Messages are UCP tagged messages; UCX
// picks eager or rendezvous (zero-copy) by size. The UCP tag carries the sender's rank, a per-pair sequence number and
// a fingerprint of the chorus tag:
//
//   bits 63..44 sender rank | 43..24 sequence (mod 2^20) | 23..0 fingerprint
//
// A receive probes for the next sequence number from its peer whatever the fingerprint, then
// checks fingerprint and size before taking the message, so a mismatch is an error naming both
// sides rather than a receive that waits forever. Blocking waits sleep on the worker's event fd.
#include <poll.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <deque>
#include <list>
#include <set>
#include <thread>
#include <utility>

#include "src/base/error.h"
#include "src/base/log.h"
#include "src/transport/transport.h"

namespace chorus {
namespace {

constexpr int kRankBits = 20;
constexpr int kSequenceBits = 20;
constexpr int kFingerprintBits = 24;
constexpr uint64_t kSequenceMask = (1ull << kSequenceBits) - 1;
constexpr uint64_t kFingerprintMask = (1ull << kFingerprintBits) - 1;
constexpr uint64_t kPeerAndSequenceMask = ~kFingerprintMask;

// The chorus tag's kind (2 bits), the low 6 bits of its sequence number and its 16-bit signature.
uint64_t fingerprint(uint64_t chorusTag) {
  return (((chorusTag >> 56) & 0x3) << 22) | (((chorusTag >> 16) & 0x3f) << 16) | (chorusTag & 0xffff);
}
// The kind of chorus tag a fingerprint (or a whole UCX tag) was made from.
TagKind kindOfFingerprint(uint64_t print) { return static_cast<TagKind>((print >> 22) & 0x3); }

uint64_t ucpTag(int sender, uint64_t sequence, uint64_t chorusTag) {
  return (static_cast<uint64_t>(sender) << (kSequenceBits + kFingerprintBits)) |
         ((sequence & kSequenceMask) << kFingerprintBits) | fingerprint(chorusTag);
}

void check(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) fail(chorusSystemError, "ucx: {}: {}", what, ucs_status_string(status));
}

// One send or receive handed to UCX. Owned by the transport until UCX is done with it, which may
// be after cancelAll() has detached the caller's Request.
struct Operation {
  class UcxTransport* transport = nullptr;
  int peer = -1;
  Request* request = nullptr;
  std::list<Operation>::iterator self;  // its place in the transport's list
};

struct PendingRecv {
  uint64_t tag;
  void* data;
  size_t bytes;
  Request* request;
};

struct Peer {
  int rank = -1;
  ucp_ep_h endpoint = nullptr;
  uint64_t sendSequence = 0;
  uint64_t recvSequence = 0;
  std::deque<PendingRecv> recvs;  // posted by the caller, their message not yet probed
  int unfinished = 0;             // the caller's sends and receives with this peer not yet done
  ucs_status_t broken = UCS_OK;   // set by the endpoint's error handler
  std::vector<char> address;      // its worker's, for the endpoint opened when first needed
  bool sameHost = false;
  // Peers on this host have no UCX error handling (see linked()): their process is watched.
  pid_t pid = 0;
  int pidfd = -1;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(TransportContext& context, const std::vector<int>& peers)
      : rank_(context.rank), peers_("ucx", context.rank, context.nranks) {
    if (context.nranks > (1 << kRankBits)) {
      fail(chorusInvalidUsage, "ucx transport: {} ranks; the tag layout holds at most {}", context.nranks,
           1 << kRankBits);
    }
    for (int rank : peers) peers_.add(rank).rank = rank;
    // Every rank has a UCX peer if any rank has (peers on other hosts, or all peers with
    // CHORUS_TRANSPORT=ucx), so either all ranks exchange addresses below or none does.
    if (peers.empty()) return;
    try {
      connect(context, peers.size());
    } catch (...) {
      release();
      throw;
    }
  }

  ~UcxTransport() override { release(); }

  const char* name() const override { return "ucx"; }

  void postSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    Peer& p = linked(peer);
    const uint64_t wireTag = ucpTag(rank_, p.sendSequence++, tag);
    // UCX's own framing is not visible here; its tag is the header chorus asks for.
    countSent(bytes + sizeof(wireTag), 1);
    ++p.unfinished;
    ++pending_;
    Operation* op = track(peer, request);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = onSendDone;
    param.user_data = op;
    void* handle = ucp_tag_send_nbx(p.endpoint, data, bytes, wireTag, &param);
    settle(p, op, handle, "sending to");
  }

  void postRecv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) override {
    Peer& p = linked(peer);
    p.recvs.push_back({tag, data, bytes, request});
    ++p.unfinished;
    ++pending_;
    takeArrived(p);
  }

  void connect(int peer) override { linked(peer); }
  bool connected(int peer) const override { return peers_.at(peer).endpoint != nullptr; }
  int connections() const override { return connections_; }

  bool progress() override {
    bool moved = false;
    while (ucp_worker_progress(worker_) != 0) moved = true;
    for (Peer& p : peers_.all()) {
      if (!p.recvs.empty()) moved |= takeArrived(p);
      if (p.broken != UCS_OK && p.unfinished > 0) connectionLost(p, "waiting for", p.broken);
    }
    const bool completed = completions_ > 0;
    completions_ = 0;
    return moved || completed;
  }

  void wait(int timeoutMs) override {
    if (worker_ == nullptr) return;
    checkPeersAlive();
    // Arm the event fd only when nothing is waiting to be processed (else arming says busy).
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
    pollfd fd{eventFd_, POLLIN, 0};
    ::poll(&fd, 1, timeoutMs);
  }

  bool busy() const override { return pending_ > 0; }

  void cancelAll() override {
    cancelled_ = true;
    for (Operation& op : operations_) op.request = nullptr;
    for (Peer& p : peers_.all()) {
      p.recvs.clear();
      p.unfinished = 0;
    }
    pending_ = 0;
  }

 private:
  void connect(TransportContext& context, size_t npeers) {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "reading the UCX_* configuration");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.estimated_num_eps = npeers;
    const ucs_status_t initStatus = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(initStatus, fmt::format("rank {}: ucp_init", rank_));

    ucp_worker_params_t workerParams{};
    workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    workerParams.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &workerParams, &worker_), fmt::format("rank {}: creating a worker", rank_));
    check(ucp_worker_get_efd(worker_, &eventFd_), fmt::format("rank {}: the worker's event fd", rank_));

    ucp_address_t* address = nullptr;
    size_t length = 0;
    check(ucp_worker_get_address(worker_, &address, &length), fmt::format("rank {}: the worker's address", rank_));
    const char* bytes = reinterpret_cast<const char*>(address);
    const std::vector<char> mine(bytes, bytes + length);
    ucp_worker_release_address(worker_, address);
    std::vector<std::vector<char>> addresses = context.exchange->allGatherBlobs(mine, context.deadline);
    for (Peer& peer : peers_.all()) {
      if (addresses[peer.rank].empty()) {
        fail(chorusRemoteError, "ucx transport: rank {} has no UCX worker but rank {} expects one", peer.rank, rank_);
      }
      peer.address = std::move(addresses[peer.rank]);
      peer.sameHost = context.peers[peer.rank].hostHash == context.peers[rank_].hostHash;
      peer.pid = context.peers[peer.rank].pid;
    }
    // Endpoints open here, every one: opened lazily, a survivor's endpoint to a rank killed before
    // it was needed aborted in UCX's teardown now and then (kill_test at 150 trials, seed
    // 2498463362). Lazy endpoints wait for that to be understood.
    for (Peer& peer : peers_.all()) linked(peer.rank);
    logAt(LogLevel::kTrace, "ucx transport: rank {} has {} peer(s); address {} bytes", rank_, npeers, length);
  }

  // The peer's endpoint, opened the first time a message to or from it is posted.
  Peer& linked(int rank) {
    Peer& peer = peers_.at(rank);
    if (peer.endpoint != nullptr) return peer;
    ucp_ep_params_t ep{};
    ep.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer.address.data());
    // UCX's shared-memory transports offer no peer failure handling, and asking for it rules
    // them out: peers on this host go without (a dead one is reported by the failure line).
    ep.err_mode = peer.sameHost ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
    if (peer.sameHost) peer.pidfd = pidfdOpen(peer.pid);
    ep.err_handler.cb = onEndpointError;
    ep.err_handler.arg = &peer;
    if (const ucs_status_t status = ucp_ep_create(worker_, &ep, &peer.endpoint); status != UCS_OK) {
      peer.endpoint = nullptr;
      throw LinkLost(chorusRemoteError,
                     fmt::format("ucx: rank {} cannot open an endpoint to rank {} ({}): rank {} has exited, or has "
                                 "left the communicator",
                                 rank_, peer.rank, ucs_status_string(status), peer.rank));
    }
    ++connections_;
    return peer;
  }

  void release() {
    if (worker_ == nullptr) {
      if (context_ != nullptr) ucp_cleanup(context_);
      return;
    }
    if (stuckWithAFailedPeer()) {
      // A transfer with a peer on this host that has exited (kill -9 mid-message), or after an
      // abort with a peer that has dropped its side, can stay queued on UCX's shared-memory
      // endpoint, and UCX asserts (aborts the process) when it destroys an endpoint with work
      // queued. The worker and its endpoints are left to the process's exit.
      logAt(LogLevel::kInfo,
            "ucx: rank {}: a transfer with a peer that has exited or failed is still queued; this communicator's UCX "
            "worker is left as it is until the process exits",
            rank_);
    } else {
      closeWorker();
    }
    for (Peer& p : peers_.all()) {
      if (p.pidfd >= 0) ::close(p.pidfd);
    }
  }

  // Closes the endpoints and destroys the worker and context.
  void closeWorker() {
    // Close endpoints gracefully (pending sends flushed) for a short while, then by force.
    std::vector<void*> closing;
    for (Peer& p : peers_.all()) {
      if (p.endpoint == nullptr) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = cancelled_ || p.broken != UCS_OK ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      void* request = ucp_ep_close_nbx(p.endpoint, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
    }
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (void* request : closing) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < giveUp) {
        ucp_worker_progress(worker_);
      }
      if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker_, request);
      ucp_request_free(request);
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  // Whether a transfer UCX may never finish is still its after a short while of progress (what
  // UCX can still finish or fail, it does meanwhile): one with a peer on this host that has
  // exited, or, once the transfers were cancelled (an abort, or a failure), one with any peer: a
  // live peer may have destroyed its worker with the other side of a rendezvous queued.
  bool stuckWithAFailedPeer() {
    std::set<int> exited;
    for (const Peer& p : peers_.all()) {
      if (cancelled_ || (p.sameHost && p.pid > 0 && processExited(p.pidfd, p.pid))) exited.insert(p.rank);
    }
    if (exited.empty()) return false;
    auto stuck = [&] {
      for (const Operation& op : operations_) {
        if (exited.count(op.peer) != 0) return true;
      }
      return false;
    };
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (stuck() && std::chrono::steady_clock::now() < giveUp) ucp_worker_progress(worker_);
    return stuck();
  }

  static void onEndpointError(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Peer*>(arg)->broken = status; }

  static void onSendDone(void* handle, ucs_status_t status, void* user) {
    auto* op = static_cast<Operation*>(user);
    op->transport->finish(op, status);
    ucp_request_free(handle);
  }

  static void onRecvDone(void* handle, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
    auto* op = static_cast<Operation*>(user);
    op->transport->finish(op, status);
    ucp_request_free(handle);
  }

  Operation* track(int peer, Request* request) {
    Operation* op = &operations_.emplace_back(Operation{this, peer, request, {}});
    op->self = std::prev(operations_.end());
    return op;
  }

  // What UCX answered to a send or receive: done at once (nullptr), an error, or in flight.
  void settle(Peer& p, Operation* op, void* handle, const char* doing) {
    if (handle == nullptr) {
      finish(op, UCS_OK);
    } else if (UCS_PTR_IS_ERR(handle)) {
      const ucs_status_t status = UCS_PTR_STATUS(handle);
      finish(op, status);  // marks p broken
      connectionLost(p, doing, status);
    }
  }

  void finish(Operation* op, ucs_status_t status) {
    Peer& p = peers_.at(op->peer);
    if (op->request != nullptr) {
      if (status == UCS_OK) {
        op->request->done = true;
        --p.unfinished;
        --pending_;
        ++completions_;
      } else if (p.broken == UCS_OK) {
        p.broken = status;  // reported by progress() with the peer's name
      }
    }
    operations_.erase(op->self);
  }

  // Takes the messages that have arrived for p's posted receives, in sequence order.
  bool takeArrived(Peer& p) {
    bool moved = false;
    while (!p.recvs.empty()) {
      PendingRecv& recv = p.recvs.front();
      ucp_tag_recv_info_t info{};
      const uint64_t wanted = ucpTag(p.rank, p.recvSequence, recv.tag);
      ucp_tag_message_h message = ucp_tag_probe_nb(worker_, wanted, kPeerAndSequenceMask, 1, &info);
      if (message == nullptr) break;
      if ((info.sender_tag & kFingerprintMask) != fingerprint(recv.tag) || info.length != recv.bytes) {
        fail(chorusRemoteError,
             "ucx: the next message from rank {} to rank {} has tag fingerprint {:06x} ({}, signature 0x{:04x}) and "
             "{} bytes, but {} of {} bytes (fingerprint {:06x}) was expected",
             p.rank, rank_, info.sender_tag & kFingerprintMask, tagKindName(kindOfFingerprint(info.sender_tag)),
             info.sender_tag & 0xffff, info.length, describeTag(recv.tag), recv.bytes, fingerprint(recv.tag));
      }
      ++p.recvSequence;
      Operation* op = track(p.rank, recv.request);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv = onRecvDone;
      param.user_data = op;
      void* data = recv.data;
      const size_t bytes = recv.bytes;
      p.recvs.pop_front();
      void* handle = ucp_tag_msg_recv_nbx(worker_, data, bytes, message, &param);
      settle(p, op, handle, "receiving from");
      moved = true;
    }
    return moved;
  }

  // Peers on this host that have exited while this rank waits for them (at most every 100 ms).
  void checkPeersAlive() {
    const auto now = std::chrono::steady_clock::now();
    if (now - lastAliveCheck_ < std::chrono::milliseconds(100)) return;
    lastAliveCheck_ = now;
    for (Peer& p : peers_.all()) {
      if (p.pid <= 0 || p.unfinished == 0 || !processExited(p.pidfd, p.pid)) continue;
      // What it sent before it left may still be on its way in.
      progress();
      if (p.unfinished == 0) continue;
      connectionLost(p, "waiting for", UCS_ERR_ENDPOINT_TIMEOUT);
    }
  }

  [[noreturn]] void connectionLost(const Peer& p, const char* doing, ucs_status_t status) {
    const std::string why = p.pid > 0 && processExited(p.pidfd, p.pid)
                                ? fmt::format("rank {} has exited (pid {} on this host)", p.rank, p.pid)
                                : fmt::format("rank {} has exited, or has left the communicator", p.rank);
    throw LinkLost(chorusRemoteError, fmt::format("ucx: rank {} {} rank {} failed ({}): {}", rank_, doing, p.rank,
                                                  ucs_status_string(status), why));
  }

  int rank_;
  PeerTable<Peer> peers_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int eventFd_ = -1;
  std::list<Operation> operations_;
  size_t pending_ = 0;      // caller's requests not yet done
  int connections_ = 0;     // endpoints opened
  size_t completions_ = 0;  // requests completed since the last progress()
  bool cancelled_ = false;
  std::chrono::steady_clock::time_point lastAliveCheck_ = std::chrono::steady_clock::now();
};

}  // namespace

std::unique_ptr<Transport> createUcxTransport(TransportContext& context, const std::vector<int>& peers) {
  return std::make_unique<UcxTransport>(context, peers);
}

}  // namespace chorus
