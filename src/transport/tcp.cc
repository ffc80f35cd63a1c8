// tcp.cc: the TCP transport, for any two ranks that can reach each other.
//
// One socket per pair of ranks, opened at init: the lower rank connects to the higher rank's
// data listener and introduces itself with a wire::PeerHello (the communicator's secret and id,
// its rank). A message is a wire::TcpHeader (magic, sender, tag, size) followed by the payload. Sockets are
// non-blocking; progress() moves as much as the kernel takes, and a header is read only once a receive is posted for
// that peer, so unmatched data waits in the kernel (back-pressure, no unbounded buffering here).
#include <poll.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include "src/core/error.h"
#include "src/core/log.h"
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
      : rank_(context.rank), peers_("tcp", context.rank, context.nranks) {
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
      const wire::PeerHello hello = context.bootstrap->peerHello(wire::Purpose::kTcpData);
      sendAll(peer.socket.fd(), &hello, sizeof(hello), context.deadline, what);
    }
    // Accept lower ranks; strangers and other communicators are turned away.
    while (expectedAccepts > 0) {
      const std::string what =
          fmt::format("tcp transport: rank {} waiting for {} lower rank(s)", rank_, expectedAccepts);
      wire::PeerHello hello{};
      Socket socket = acceptPeer(context.dataListener->fd(), context.deadline, what, context.secret, context.commId,
                                 context.nranks, wire::Purpose::kTcpData, &hello);
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
    p.sends.push_back({tag, static_cast<char*>(const_cast<void*>(data)), bytes, 0, request});
    ++pending_;
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
    for (Peer& p : peers_.all()) {
      short events = 0;
      if (!p.sends.empty()) events |= POLLOUT;
      if (!p.recvs.empty()) events |= POLLIN;
      if (events != 0) pollSet_.push_back({p.socket.fd(), events, 0});
    }
    if (pollSet_.empty()) return;
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

  bool pushSends(Peer& p) {
    bool moved = false;
    while (!p.sends.empty()) {
      PendingOp& op = p.sends.front();
      TcpHeader header{wire::kTcpMagic, rank_, op.tag, op.bytes};
      iovec parts[2];
      int count = 0;
      if (op.done < sizeof(header)) {
        parts[count++] = {reinterpret_cast<char*>(&header) + op.done, sizeof(header) - op.done};
        if (op.bytes > 0) parts[count++] = {op.data, op.bytes};
      } else {
        parts[count++] = {op.data + (op.done - sizeof(header)), op.bytes - (op.done - sizeof(header))};
      }
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = count;
      const ssize_t n = ::sendmsg(p.socket.fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        connectionLost(p, "sending", errno);
      }
      op.done += static_cast<size_t>(n);
      moved = moved || n > 0;
      if (op.done < sizeof(header) + op.bytes) break;
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
};

}  // namespace

std::unique_ptr<Transport> createTcpTransport(TransportContext& context, const std::vector<int>& peers) {
  return std::make_unique<TcpTransport>(context, peers);
}

}  // namespace chorus
