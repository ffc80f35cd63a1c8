// socket.h: TCP socket helpers with deadlines: listen, connect with retry, accept, send and
// receive exactly n bytes. Every wait is bounded by a deadline. Not thread-safe per socket.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace chorus {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadlineAfterMs(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
// Milliseconds left until the deadline (0 if passed), capped at capMs.
int msLeft(Deadline deadline, int capMs = 1 << 30);

// An IPv4 or IPv6 address and port, packable into 20 bytes for ids and peer tables.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  static SocketAddress parse(const std::string& host, uint16_t port);  // numeric or a name
  uint16_t port() const;
  void setPort(uint16_t port);
  std::string toString() const;  // "1.2.3.4:5678" or "[::1]:5678"
};

struct PackedAddress {
  uint16_t family = 0;
  uint16_t port = 0;  // host order
  uint8_t bytes[16] = {};
};
PackedAddress pack(const SocketAddress& address);
SocketAddress unpack(const PackedAddress& packed);

// Owns a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = other.release();
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// The address this process listens on and advertises: CHORUS_BOOTSTRAP_ADDR; else the first
// address (IPv4 before IPv6) of an interface that is up and CHORUS_SOCKET_IFNAME chooses
// (interfaces.h; chorusInvalidArgument naming the interfaces there are when none is); else, with
// the knob unset, of the first such interface that is not loopback; else 127.0.0.1. Port 0.
SocketAddress defaultLocalAddress();

// Listens on address (port 0: any free port). The socket is blocking; accept with a deadline.
Socket listenOn(const SocketAddress& address, int backlog = 1024);
SocketAddress boundAddress(int fd);
// Connects, retrying while the peer is not yet listening, until the deadline.
Socket connectTo(const SocketAddress& address, Deadline deadline, const std::string& what);
// A connection to address started without blocking; *error is the connect's errno (0: made, or
// under way). connectOutcome then says how it came out, waiting up to waitMs: -1 still undecided,
// else its errno (0: connected).
Socket startConnect(const SocketAddress& address, int* error);
int connectOutcome(int fd, int waitMs);
// Accepts one connection, or throws chorusTimeout at the deadline.
Socket acceptFrom(int listenFd, Deadline deadline, const std::string& what);
// Sends / receives exactly `bytes`, or throws (chorusTimeout, chorusRemoteError on close).
void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what);
void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what);
void setNoDelay(int fd);
void setNonBlocking(int fd);

}  // namespace chorus
