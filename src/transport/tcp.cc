// tcp.cc: the TCP transport, for any two ranks that can reach each other.
//
// One socket per pair of ranks, opened when the first message between them is posted (or at init
// with CHORUS_CONNECT=eager): the lower rank connects to the higher rank's data listener, which
// stays open for the communicator's life, and introduces itself with a wire::PeerHello (the
// communicator's secret and id, its rank); the higher rank accepts whatever lower ranks have
// connected whenever it progresses with a message waiting for one. Messages posted before their
// connection is up wait in its queue. A message is a wire::TcpHeader (magic, sender, tag, size)
// followed by the payload. Sockets are non-blocking; progress() moves as much as the kernel takes, and a header is read
// only once a receive is posted for that peer, so unmatched data waits in the kernel (back-pressure, no unbounded
// buffering here).
//
// A slow link can be emulated (CHORUS_TCP_RATE_LIMIT, CHORUS_TCP_DELAY), since the kernel's netem
// is not always there: a message's first byte leaves no sooner than the delay after it was
// posted, and the bytes this rank writes to all its sockets together, headers included, pass a
// token bucket filled at the rate. Both act before the socket, on the sender.
#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <utility>

#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/log.h"
#include "src/transport/transport.h"

namespace chorus {
namespace {

using wire::TcpHeader;

struct PendingOp {
  uint64_t tag;
  char* data;
  size_t bytes;
  size_t done;  // for sends: header + payload bytes written; for receives: payload bytes read
  Request* request;
  Clock::time_point leaves{};  // sends: when the first byte may leave (CHORUS_TCP_DELAY)
};

// The emulated link of CHORUS_TCP_RATE_LIMIT: a token bucket in bytes, filled at the rate up to a
// burst of a couple of milliseconds' worth (at least 16 KiB), shared by every socket of the rank.
class RateLimit {
 public:
  explicit RateLimit(double bitsPerSecond)
      : bytesPerUs_(bitsPerSecond / 8e6), burst_(std::max(16384.0, bytesPerUs_ * 2000)), tokens_(burst_) {}
  bool limited() const { return bytesPerUs_ > 0; }
  // Bytes that may be written now.
  size_t allowance() {
    if (!limited()) return std::numeric_limits<size_t>::max();
    const Clock::time_point now = Clock::now();
    const double us = std::chrono::duration<double, std::micro>(now - filled_).count();
    tokens_ = std::min(burst_, tokens_ + us * bytesPerUs_);
    filled_ = now;
    return static_cast<size_t>(tokens_);
  }
  void spend(size_t bytes) {
    if (limited()) tokens_ -= static_cast<double>(bytes);
  }
  // Microseconds until `bytes` more may be written (at least 1).
  int64_t usUntil(size_t bytes) const {
    const double missing = std::min(static_cast<double>(bytes), burst_) - tokens_;
    return std::max<int64_t>(1, static_cast<int64_t>(missing / bytesPerUs_) + 1);
  }

 private:
  double bytesPerUs_;
  double burst_;
  double tokens_;
  Clock::time_point filled_ = Clock::now();
};

// A connection accepted on the listener whose hello has not all come yet.
struct Arrival {
  Socket socket;
  wire::PeerHello hello;
  size_t got;  // bytes of hello read
  Clock::time_point since;
};

struct Peer {
  int rank = -1;
  Socket socket;        // valid once connected
  bool wanted = false;  // a lower rank whose connection this rank waits to accept
  Socket probe;         // wanted: a connection checking that the rank still listens (checkAwaitedAlive)
  Clock::time_point probeSince;
  std::deque<PendingOp> sends;
  std::deque<PendingOp> recvs;
  TcpHeader incoming{};
  size_t incomingHeaderBytes = 0;  // bytes of `incoming` read so far
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(TransportContext& context, const std::vector<int>& peers)
      : rank_(context.rank),
        peers_("tcp", context.rank, context.nranks),
        exchange_(context.exchange),
        rate_(knobBitsPerSecond(Knob::kTcpRateLimit)),
        delay_(std::chrono::microseconds(knobMicroseconds(Knob::kTcpDelay))) {
    for (int rank : peers) {
      peers_.add(rank).rank = rank;
      addresses_.emplace(rank, context.peers[rank].dataAddress);
    }
    if (peers.empty()) return;
    listener_ = std::move(*context.dataListener);
    setNonBlocking(listener_.fd());
    if (context.eager) connectAll(*this, peers, rank_, context.deadline);
  }

  const char* name() const override { return "tcp"; }

  void postSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    Peer& p = peers_.at(peer);
    if (!p.socket.valid()) connectTo(p);
    const Clock::time_point leaves = delay_.count() > 0 ? Clock::now() + delay_ : Clock::time_point{};
    p.sends.push_back({tag, static_cast<char*>(const_cast<void*>(data)), bytes, 0, request, leaves});
    ++pending_;
    countSent(0, 1);
    if (p.socket.valid()) pushSends(p);
  }

  void postRecv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) override {
    Peer& p = peers_.at(peer);
    if (!p.socket.valid()) connectTo(p);
    p.recvs.push_back({tag, static_cast<char*>(data), bytes, 0, request});
    ++pending_;
    if (p.socket.valid()) pullRecvs(p);
  }

  void connect(int peer) override {
    Peer& p = peers_.at(peer);
    if (!p.socket.valid()) connectTo(p);
  }
  bool connected(int peer) const override { return peers_.at(peer).socket.valid(); }
  int connections() const override { return connections_; }
  void checkConnecting() override {
    if (awaited_ > 0) checkAwaitedAlive();
  }

  bool progress() override {
    bool moved = (awaited_ > 0 || !arrivals_.empty()) && acceptArrivals();
    for (Peer& p : peers_.all()) {
      if (!p.socket.valid()) continue;
      if (!p.sends.empty()) moved |= pushSends(p);
      if (!p.recvs.empty()) moved |= pullRecvs(p);
    }
    return moved;
  }

  void wait(int timeoutMs) override {
    pollSet_.clear();
    // A send held back by the emulated link wakes the wait when it may go on, not on POLLOUT.
    int64_t heldUs = -1;
    auto holdFor = [&](int64_t us) { heldUs = heldUs < 0 ? us : std::min(heldUs, us); };
    if (awaited_ > 0) {
      checkAwaitedAlive();
      pollSet_.push_back({listener_.fd(), POLLIN, 0});
      for (const Arrival& a : arrivals_) pollSet_.push_back({a.socket.fd(), POLLIN, 0});
    }
    for (Peer& p : peers_.all()) {
      if (!p.socket.valid()) continue;
      short events = 0;
      if (const int64_t us = heldBackUs(p); us > 0) {
        holdFor(us);
      } else if (!p.sends.empty()) {
        events |= POLLOUT;
      }
      if (!p.recvs.empty()) events |= POLLIN;
      if (events != 0) pollSet_.push_back({p.socket.fd(), events, 0});
    }
    if (heldUs >= 0) timeoutMs = static_cast<int>(std::min<int64_t>(timeoutMs, (heldUs + 999) / 1000));
    if (pollSet_.empty() && heldUs < 0) return;
    ::poll(pollSet_.data(), pollSet_.size(), timeoutMs);
  }

  bool busy() const override { return pending_ > 0; }

  void cancelAll() override {
    peers_.clearQueues();
    pending_ = 0;
  }

 private:
  // Connects to a higher rank now (its listener is open since init, so the kernel completes the
  // connection without waiting for it to accept); a lower rank's connection is awaited.
  void connectTo(Peer& p) {
    if (p.rank < rank_) {
      if (!p.wanted) {
        p.wanted = true;
        ++awaited_;
      }
      acceptArrivals();
      return;
    }
    const SocketAddress address = unpack(addresses_.at(p.rank));
    const Deadline deadline = deadlineAfterMs(kConnectMs);
    int error = 0;
    Socket socket = startConnect(address, &error);
    while (error == 0) {
      const int outcome = connectOutcome(socket.fd(), msLeft(deadline, 100));
      if (outcome == 0) break;
      error = outcome > 0 ? outcome : Clock::now() >= deadline ? ETIMEDOUT : 0;
    }
    if (error != 0) {
      throw LinkLost(chorusRemoteError,
                     fmt::format("tcp: rank {} cannot connect to rank {} at {} ({}): rank {} has exited, or has left "
                                 "the communicator",
                                 rank_, p.rank, address.toString(), std::strerror(error), p.rank));
    }
    const wire::PeerHello hello = exchange_->peerHello(wire::Purpose::kTcpData);
    sendAll(socket.fd(), &hello, sizeof(hello), deadline,
            fmt::format("tcp transport: rank {} connecting to rank {}", rank_, p.rank));
    setUp(p, std::move(socket));
  }

  // Takes the connections waiting on the listener and the hellos that have come on them: lower
  // ranks' connections (wanted yet or not) come up; a waiting rank's probes are closed; strangers,
  // other communicators and connections silent for kHelloMs are turned away. Never blocks.
  // Returns true if any connection came up.
  bool acceptArrivals() {
    for (;;) {
      const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        arrivals_.push_back({Socket(fd), {}, 0, Clock::now()});
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      failErrno(fmt::format("tcp transport: rank {}: accept()", rank_));
    }
    bool accepted = false;
    for (size_t i = 0; i < arrivals_.size();) {
      Arrival& a = arrivals_[i];
      const ssize_t n = ::recv(a.socket.fd(), reinterpret_cast<char*>(&a.hello) + a.got, sizeof(a.hello) - a.got, 0);
      if (n > 0) a.got += static_cast<size_t>(n);
      const bool pending = a.got < sizeof(a.hello);
      const bool open = n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
      if (pending && open && Clock::now() - a.since < std::chrono::milliseconds(kHelloMs)) {
        ++i;
        continue;
      }
      accepted |= !pending && welcome(a);
      if (pending) {
        logAt(LogLevel::kWarn, "tcp transport: rank {}: a connection {} before its hello; turned away", rank_,
              open ? "stayed silent" : "closed");
      }
      arrivals_.erase(arrivals_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return accepted;
  }

  // The hello of an arrival has come: sets up its peer's connection (true), or turns it away.
  bool welcome(Arrival& a) {
    if (exchange_->checkHello(a.hello, wire::Purpose::kTcpProbe).empty()) return false;  // a waiting rank's check
    const std::string what = fmt::format("tcp transport: rank {} accepting a lower rank", rank_);
    if (const std::string why = exchange_->checkHello(a.hello, wire::Purpose::kTcpData); !why.empty()) {
      logAt(LogLevel::kWarn, "{}: a connection presented {}; turned away", what, why);
      return false;
    }
    const int rank = a.hello.rank;
    if (rank >= rank_ || !peers_.has(rank) || peers_.at(rank).socket.valid()) {
      logAt(LogLevel::kWarn, "{}: rank {} connected, which this rank does not accept; turned away", what, rank);
      return false;
    }
    Peer& p = peers_.at(rank);
    if (p.wanted) {
      p.wanted = false;
      p.probe.close();
      --awaited_;
    }
    setUp(p, std::move(a.socket));
    return true;
  }

  // While this rank waits for lower ranks to connect: every kProbeMs, whether each still listens
  // (a connection to its listener, closed at once with a probe's hello). Nothing listening there
  // means the rank has exited or destroyed the communicator: its connection will never come.
  void checkAwaitedAlive() {
    const Clock::time_point now = Clock::now();
    if (now - lastProbe_ < std::chrono::milliseconds(kProbeMs)) return;
    lastProbe_ = now;
    for (Peer& p : peers_.all()) {
      if (!p.wanted) continue;
      const SocketAddress address = unpack(addresses_.at(p.rank));
      int error = 0;
      if (!p.probe.valid()) {
        p.probe = startConnect(address, &error);
        p.probeSince = now;
      }
      if (error == 0) {
        error = connectOutcome(p.probe.fd(), 20);
        if (error < 0) {  // undecided: tried again later
          if (now - p.probeSince > std::chrono::seconds(10)) p.probe.close();
          continue;
        }
      }
      if (error == 0) {
        const wire::PeerHello hello = exchange_->peerHello(wire::Purpose::kTcpProbe);
        (void)::send(p.probe.fd(), &hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      p.probe.close();
      if (error == ECONNREFUSED) {
        throw LinkLost(chorusRemoteError,
                       fmt::format("tcp: rank {} waits for rank {} to connect, but nothing listens at its address {} "
                                   "any more: rank {} has exited, or has left the communicator",
                                   rank_, p.rank, address.toString(), p.rank));
      }
    }
  }

  void setUp(Peer& p, Socket socket) {
    p.socket = std::move(socket);
    setNonBlocking(p.socket.fd());
    setNoDelay(p.socket.fd());
    ++connections_;
    logAt(LogLevel::kTrace, "tcp transport: rank {} connected to rank {} ({} connection(s))", rank_, p.rank,
          connections_);
  }

  [[noreturn]] void connectionLost(const Peer& p, const char* during, int error) {
    throw LinkLost(
        chorusRemoteError,
        fmt::format("tcp: the connection from rank {} to rank {} broke while {} ({}): rank {} has exited, "
                    "or has left the communicator",
                    rank_, p.rank, during, error == 0 ? "closed by the peer" : std::strerror(error), p.rank));
  }

  // Microseconds until the emulated link lets p's first send go on; 0 when it may go now (or p
  // has nothing to send).
  int64_t heldBackUs(Peer& p) {
    if (p.sends.empty()) return 0;
    const PendingOp& op = p.sends.front();
    if (op.done == 0 && op.leaves != Clock::time_point{}) {
      const auto early = op.leaves - Clock::now();
      if (early.count() > 0) return std::chrono::duration_cast<std::chrono::microseconds>(early).count() + 1;
    }
    if (rate_.limited() && rate_.allowance() == 0) return rate_.usUntil(1);
    return 0;
  }

  bool pushSends(Peer& p) {
    bool moved = false;
    while (!p.sends.empty()) {
      PendingOp& op = p.sends.front();
      if (op.done == 0 && op.leaves != Clock::time_point{} && Clock::now() < op.leaves) break;
      const size_t allowed = rate_.allowance();
      if (allowed == 0) break;
      TcpHeader header{wire::kTcpMagic, rank_, op.tag, op.bytes};
      iovec parts[2];
      int count = 0;
      if (op.done < sizeof(header)) {
        parts[count++] = {reinterpret_cast<char*>(&header) + op.done, sizeof(header) - op.done};
        if (op.bytes > 0) parts[count++] = {op.data, op.bytes};
      } else {
        parts[count++] = {op.data + (op.done - sizeof(header)), op.bytes - (op.done - sizeof(header))};
      }
      // The emulated link takes no more than it has tokens for.
      size_t budget = allowed;
      for (int i = 0; i < count; ++i) {
        parts[i].iov_len = std::min(parts[i].iov_len, budget);
        budget -= parts[i].iov_len;
      }
      if (count == 2 && parts[1].iov_len == 0) count = 1;
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = count;
      const ssize_t n = ::sendmsg(p.socket.fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        connectionLost(p, "sending", errno);
      }
      op.done += static_cast<size_t>(n);
      countSent(static_cast<uint64_t>(n));
      rate_.spend(static_cast<size_t>(n));
      moved = moved || n > 0;
      if (op.done < sizeof(header) + op.bytes) {
        if (rate_.limited()) continue;  // the bucket, not the socket, may have stopped it
        break;
      }
      op.request->done = true;
      p.sends.pop_front();
      --pending_;
    }
    return moved;
  }

  bool pullRecvs(Peer& p) {
    bool moved = false;
    while (!p.recvs.empty()) {
      PendingOp& op = p.recvs.front();
      if (p.incomingHeaderBytes < sizeof(TcpHeader)) {
        const ssize_t n = ::recv(p.socket.fd(), reinterpret_cast<char*>(&p.incoming) + p.incomingHeaderBytes,
                                 sizeof(TcpHeader) - p.incomingHeaderBytes, MSG_DONTWAIT);
        if (n == 0) connectionLost(p, "receiving", 0);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          connectionLost(p, "receiving", errno);
        }
        p.incomingHeaderBytes += static_cast<size_t>(n);
        moved = true;
        if (p.incomingHeaderBytes < sizeof(TcpHeader)) break;
        if (const std::string why = wire::checkTcpHeader(p.incoming, p.rank, op.tag, op.bytes); !why.empty()) {
          fail(chorusRemoteError, "tcp: the next message from rank {} to rank {} is {}", p.rank, rank_, why);
        }
      }
      if (op.done < op.bytes) {
        const ssize_t n = ::recv(p.socket.fd(), op.data + op.done, op.bytes - op.done, MSG_DONTWAIT);
        if (n == 0) connectionLost(p, "receiving", 0);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          connectionLost(p, "receiving", errno);
        }
        op.done += static_cast<size_t>(n);
        moved = true;
        if (op.done < op.bytes) break;
      }
      op.request->done = true;
      p.recvs.pop_front();
      p.incomingHeaderBytes = 0;
      --pending_;
    }
    return moved;
  }

  static constexpr int kConnectMs = 30000;  // a peer's listener answers at once unless its host is gone
  static constexpr int kHelloMs = 5000;     // how long an accepted connection may take to say who it is
  static constexpr int kProbeMs = 500;      // how often a waiting rank checks the ranks it waits for

  int rank_;
  PeerTable<Peer> peers_;
  PeerExchange* exchange_;
  std::unordered_map<int, PackedAddress> addresses_;  // each peer's data listener
  Socket listener_;                                   // this rank's, for lower ranks' connections
  int awaited_ = 0;                                   // lower ranks whose connection a message waits for
  std::vector<Arrival> arrivals_;
  Clock::time_point lastProbe_ = Clock::now();
  int connections_ = 0;
  std::vector<pollfd> pollSet_;
  size_t pending_ = 0;
  RateLimit rate_;
  Clock::duration delay_;
};

}  // namespace

std::unique_ptr<Transport> createTcpTransport(TransportContext& context, const std::vector<int>& peers) {
  return std::make_unique<TcpTransport>(context, peers);
}

}  // namespace chorus
