// socket.cc: TCP socket helpers with deadlines.
#include "src/base/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "src/base/config.h"
#include "src/base/error.h"
#include "src/base/interfaces.h"

namespace chorus {

int msLeft(Deadline deadline, int capMs) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > capMs ? capMs : static_cast<int>(left);
}

SocketAddress SocketAddress::parse(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    fail(chorusInvalidArgument, "cannot resolve address '{}': {}", host, gai_strerror(rc));
  }
  SocketAddress address;
  std::memcpy(&address.storage, result->ai_addr, result->ai_addrlen);
  address.length = result->ai_addrlen;
  freeaddrinfo(result);
  address.setPort(port);
  return address;
}

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
}

void SocketAddress::setPort(uint16_t port) {
  if (storage.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  }
}

std::string SocketAddress::toString() const {
  char text[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text, sizeof(text));
    return fmt::format("[{}]:{}", text, port());
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text, sizeof(text));
  return fmt::format("{}:{}", text, port());
}

PackedAddress pack(const SocketAddress& address) {
  PackedAddress packed;
  packed.family = address.storage.ss_family;
  packed.port = address.port();
  if (packed.family == AF_INET6) {
    std::memcpy(packed.bytes, &reinterpret_cast<const sockaddr_in6*>(&address.storage)->sin6_addr, 16);
  } else {
    std::memcpy(packed.bytes, &reinterpret_cast<const sockaddr_in*>(&address.storage)->sin_addr, 4);
  }
  return packed;
}

SocketAddress unpack(const PackedAddress& packed) {
  SocketAddress address;
  if (packed.family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, packed.bytes, 16);
    address.length = sizeof(sockaddr_in6);
  } else if (packed.family == AF_INET) {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&address.storage);
    in4->sin_family = AF_INET;
    std::memcpy(&in4->sin_addr, packed.bytes, 4);
    address.length = sizeof(sockaddr_in);
  } else {
    fail(chorusInvalidArgument, "address family {} is neither IPv4 nor IPv6 (corrupt unique id?)", packed.family);
  }
  address.setPort(packed.port);
  return address;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SocketAddress defaultLocalAddress() {
  const std::string chosen = knobString(Knob::kBootstrapAddr);
  if (!chosen.empty()) return SocketAddress::parse(chosen, 0);
  const std::string wanted = knobString(Knob::kSocketIfname);
  InterfaceFilter filter;
  if (!wanted.empty()) {
    try {
      filter = parseInterfaceFilter(wanted);
    } catch (const std::invalid_argument& e) {
      fail(chorusInvalidArgument, "CHORUS_SOCKET_IFNAME='{}': {}", wanted, e.what());
    }
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) failErrno("getifaddrs()");
  std::string seen;  // every interface that is up with an address, for the error
  SocketAddress found;
  // IPv4 first; IPv6 link-local addresses need a scope, so they are skipped.
  for (const int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* it = list; it != nullptr && found.length == 0; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != family || (it->ifa_flags & IFF_UP) == 0) continue;
      SocketAddress address;
      const size_t bytes = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&address.storage, it->ifa_addr, bytes);
      address.length = static_cast<socklen_t>(bytes);
      if (family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_addr)) {
        continue;
      }
      address.setPort(0);
      seen += fmt::format("{}{} ({})", seen.empty() ? "" : ", ", it->ifa_name, address.toString());
      const bool loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
      if (wanted.empty() ? !loopback : filter.matches(it->ifa_name)) found = address;
    }
  }
  freeifaddrs(list);
  if (found.length != 0) return found;
  if (!wanted.empty()) {
    fail(chorusInvalidArgument,
         "CHORUS_SOCKET_IFNAME='{}' matches no interface that is up with an address; there are: {}", wanted,
         seen.empty() ? "none" : seen);
  }
  return SocketAddress::parse("127.0.0.1", 0);
}

Socket listenOn(const SocketAddress& address, int backlog) {
  Socket socket(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) failErrno("socket()");
  const int one = 1;
  setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    failErrno("bind(" + address.toString() + ")");
  }
  if (::listen(socket.fd(), backlog) != 0) failErrno("listen(" + address.toString() + ")");
  return socket;
}

SocketAddress boundAddress(int fd) {
  SocketAddress address;
  address.length = sizeof(address.storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) {
    failErrno("getsockname()");
  }
  return address;
}

Socket connectTo(const SocketAddress& address, Deadline deadline, const std::string& what) {
  int delayMs = 1;
  for (;;) {
    Socket socket(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!socket.valid()) failErrno("socket()");
    if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) == 0) {
      setNoDelay(socket.fd());
      return socket;
    }
    const int error = errno;
    if (error != ECONNREFUSED && error != ETIMEDOUT && error != ECONNRESET && error != EAGAIN && error != ENETUNREACH &&
        error != EHOSTUNREACH) {
      fail(chorusSystemError, "{}: connect to {} failed: {}", what, address.toString(), std::strerror(error));
    }
    if (Clock::now() >= deadline) {
      fail(chorusTimeout, "{}: nothing listens at {} (last error: {})", what, address.toString(), std::strerror(error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = delayMs < 100 ? delayMs * 2 : 100;
  }
}

Socket startConnect(const SocketAddress& address, int* error) {
  Socket socket(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket.valid()) failErrno("socket()");
  const bool started =
      ::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) == 0 ||
      errno == EINPROGRESS;
  *error = started ? 0 : errno;
  return socket;
}

int connectOutcome(int fd, int waitMs) {
  pollfd entry{fd, POLLOUT, 0};
  const int ready = ::poll(&entry, 1, waitMs);
  if (ready == 0 || (ready < 0 && errno == EINTR)) return -1;
  if (ready < 0) return errno;
  int error = 0;
  socklen_t length = sizeof(error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  return error;
}

Socket acceptFrom(int listenFd, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd entry{listenFd, POLLIN, 0};
    const int ready = ::poll(&entry, 1, msLeft(deadline, 1000));
    if (ready < 0 && errno != EINTR) failErrno(what + ": poll()");
    if (ready > 0) {
      const int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        setNoDelay(fd);
        return Socket(fd);
      }
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) failErrno(what + ": accept()");
    }
    if (Clock::now() >= deadline) fail(chorusTimeout, "{}: no connection arrived in time", what);
  }
}

void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(chorusRemoteError, "{}: send failed: {}", what, std::strerror(errno));
    }
    pollfd entry{fd, POLLOUT, 0};
    if (::poll(&entry, 1, msLeft(deadline, 1000)) == 0 && Clock::now() >= deadline) {
      fail(chorusTimeout, "{}: send timed out with {} bytes left", what, bytes);
    }
  }
}

void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) fail(chorusRemoteError, "{}: the connection was closed by the other side", what);
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      fail(chorusRemoteError, "{}: recv failed: {}", what, std::strerror(errno));
    }
    pollfd entry{fd, POLLIN, 0};
    if (::poll(&entry, 1, msLeft(deadline, 1000)) == 0 && Clock::now() >= deadline) {
      fail(chorusTimeout, "{}: timed out waiting for {} more bytes", what, bytes);
    }
  }
}

void setNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace chorus
