// tcp.cc: the TCP transport, for any two ranks that can reach each other.
//
// One socket per pair of ranks, opened at init: the lower rank connects to the higher rank's
// data listener and introduces itself with a wire::PeerHello (the communicator's secret and id,
// its rank). A message is a wire::TcpHeader (magic, sender, tag, size) followed by the payload. Sockets are
// non-blocking; progress() moves as much as the kernel takes, and a header is read only once a receive is posted for
// that peer, so unmatched data waits in the kernel (back-pressure, no unbounded buffering here).
//
// A slow link can be emulated (CHORUS_TCP_RATE_LIMIT, CHORUS_TCP_DELAY), since the kernel's netem
// is not always there: a message's first byte leaves no sooner than the delay after it was
// posted, and the bytes this rank writes to all its sockets together, headers included, pass a
// token bucket filled at the rate. Both act before the socket, on the sender.
#include <poll.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <deque>

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

struct Peer {
  int rank = -1;
  Socket socket;
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
        rate_(knobBitsPerSecond(Knob::kTcpRateLimit)),
        delay_(std::chrono::microseconds(knobMicroseconds(Knob::kTcpDelay))) {
    int expectedAccepts = 0;
    for (int rank : peers) {
      peers_.add(rank).rank = rank;
      if (rank < rank_) ++expectedAccepts;
    }
    // Connect to higher ranks (the kernel completes these without waiting for accept()).
    for (Peer& peer : peers_.all()) {
      if (peer.rank < rank_) continue;
      const std::string what = fmt::format("tcp transport: rank {} connecting to rank {}", rank_, peer.rank);
      peer.socket = connectTo(unpack(context.peers[peer.rank].dataAddress), context.deadline, what);
      const wire::PeerHello hello = context.exchange->peerHello(wire::Purpose::kTcpData);
      sendAll(peer.socket.fd(), &hello, sizeof(hello), context.deadline, what);
    }
    // Accept lower ranks; strangers and other communicators are turned away.
    while (expectedAccepts > 0) {
      const std::string what =
          fmt::format("tcp transport: rank {} waiting for {} lower rank(s)", rank_, expectedAccepts);
      wire::PeerHello hello{};
      Socket socket = context.exchange->acceptPeer(context.dataListener->fd(), context.deadline, what,
                                                   wire::Purpose::kTcpData, &hello);
      if (hello.rank >= rank_ || !peers_.has(hello.rank) || peers_.at(hello.rank).socket.valid()) {
        logAt(LogLevel::kWarn, "{}: rank {} connected, which this rank does not accept; turned away", what, hello.rank);
        continue;
      }
      peers_.at(hello.rank).socket = std::move(socket);
      --expectedAccepts;
    }
    for (Peer& peer : peers_.all()) {
      setNonBlocking(peer.socket.fd());
      setNoDelay(peer.socket.fd());
    }
  }

  const char* name() const override { return "tcp"; }

  void postSend(int peer, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    Peer& p = peers_.at(peer);
    const Clock::time_point leaves = delay_.count() > 0 ? Clock::now() + delay_ : Clock::time_point{};
    p.sends.push_back({tag, static_cast<char*>(const_cast<void*>(data)), bytes, 0, request, leaves});
    ++pending_;
    ++sent_.messages;
    pushSends(p);
  }

  void postRecv(int peer, uint64_t tag, void* data, size_t bytes, Request* request) override {
    Peer& p = peers_.at(peer);
    p.recvs.push_back({tag, static_cast<char*>(data), bytes, 0, request});
    ++pending_;
    pullRecvs(p);
  }

  bool progress() override {
    bool moved = false;
    for (Peer& p : peers_.all()) {
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
    for (Peer& p : peers_.all()) {
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
      sent_.bytes += static_cast<uint64_t>(n);
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

  int rank_;
  PeerTable<Peer> peers_;
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
