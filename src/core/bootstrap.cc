// bootstrap.cc: the bootstrap root and the rank side of the meeting, then a TCP ring.
#include "src/core/bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "src/base/error.h"
#include "src/base/log.h"

namespace chorus {
namespace {

using wire::Hello;
using wire::PeerHello;
using wire::Purpose;
using wire::Reply;
using wire::RingNote;
using wire::ShrinkOffer;

// How long a failure found here waits for the word of the peer that failed first.
constexpr int kCauseWaitMs = 100;

void sendReplyError(int fd, chorusResult_t code, const std::string& text) {
  Reply reply{wire::kError, static_cast<uint32_t>(code), 0, text.size()};
  try {
    const Deadline deadline = deadlineAfterMs(2000);
    sendAll(fd, &reply, sizeof(reply), deadline, "bootstrap root reply");
    sendAll(fd, text.data(), text.size(), deadline, "bootstrap root reply");
  } catch (const Error&) {
    // The rank went away; nothing more to tell it.
  }
}

std::string listRanks(const std::vector<int>& ranks) {
  std::string text;
  const size_t shown = std::min<size_t>(ranks.size(), 32);
  for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  if (shown < ranks.size()) text += fmt::format(" and {} more", ranks.size() - shown);
  return text;
}

struct Arrival {
  Socket socket;
  std::vector<char> info;
  bool present = false;
};

void runRoot(Socket listener, uint64_t secret) {
  int nranks = -1;
  uint32_t infoBytes = 0;
  int firstRank = -1;
  std::vector<Arrival> arrivals;
  int arrived = 0;
  int initTimeoutMs = 0;
  Deadline deadline = Deadline::max();
  const std::string where = boundAddress(listener.fd()).toString();

  while (nranks < 0 || arrived < nranks) {
    pollfd entry{listener.fd(), POLLIN, 0};
    const int timeout = nranks < 0 ? 1000 : msLeft(deadline, 1000);
    const int ready = ::poll(&entry, 1, timeout);
    if (nranks >= 0 && Clock::now() >= deadline && ready <= 0) break;
    if (ready <= 0) continue;
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer.valid()) continue;
    Hello hello{};
    try {
      recvAll(peer.fd(), &hello, sizeof(hello), deadlineAfterMs(5000), "bootstrap root hello");
    } catch (const Error&) {
      continue;  // not one of ours, or gone
    }
    if (const std::string why = wire::checkHello(hello, secret); !why.empty()) {
      const std::string text =
          fmt::format("bootstrap root at {}: a process calling itself rank {} presented {}", where, hello.rank, why);
      logAt(LogLevel::kWarn, "{}; turned away", text);
      sendReplyError(peer.fd(), chorusRemoteError, text);
      continue;
    }
    std::vector<char> info(hello.infoBytes);
    try {
      recvAll(peer.fd(), info.data(), info.size(), deadlineAfterMs(5000), "bootstrap root info");
    } catch (const Error&) {
      continue;
    }
    if (nranks < 0) {
      if (hello.nranks < 1) continue;
      nranks = hello.nranks;
      infoBytes = hello.infoBytes;
      firstRank = hello.rank;
      arrivals.resize(nranks);
      initTimeoutMs = hello.initTimeoutMs;
      deadline = deadlineAfterMs(initTimeoutMs);
    }
    if (hello.nranks != nranks || hello.infoBytes != infoBytes) {
      sendReplyError(peer.fd(), chorusRemoteError,
                     fmt::format("bootstrap: rank {} was created with nranks={} but rank {} with nranks={}", hello.rank,
                                 hello.nranks, firstRank, nranks));
      continue;
    }
    Arrival& slot = arrivals[hello.rank];
    if (slot.present) {
      sendReplyError(peer.fd(), chorusRemoteError,
                     fmt::format("bootstrap: two processes claim rank {} of {}", hello.rank, nranks));
      continue;
    }
    slot.socket = std::move(peer);
    slot.info = std::move(info);
    slot.present = true;
    ++arrived;
  }

  if (arrived < nranks) {
    std::vector<int> missing;
    for (int r = 0; r < nranks; ++r) {
      if (!arrivals[r].present) missing.push_back(r);
    }
    const std::string text = fmt::format("bootstrap: {} of {} ranks did not arrive within {} ms: missing rank(s) {}",
                                         missing.size(), nranks, initTimeoutMs, listRanks(missing));
    logAt(LogLevel::kWarn, "{}", text);
    for (Arrival& a : arrivals) {
      if (a.present) sendReplyError(a.socket.fd(), chorusTimeout, text);
    }
    return;
  }

  std::vector<char> all(static_cast<size_t>(nranks) * infoBytes);
  for (int r = 0; r < nranks; ++r)
    std::memcpy(all.data() + static_cast<size_t>(r) * infoBytes, arrivals[r].info.data(), infoBytes);
  Reply reply{wire::kOk, 0, randomU64(), all.size()};
  for (Arrival& a : arrivals) {
    try {
      const Deadline sendDeadline = deadlineAfterMs(initTimeoutMs);
      sendAll(a.socket.fd(), &reply, sizeof(reply), sendDeadline, "bootstrap root reply");
      sendAll(a.socket.fd(), all.data(), all.size(), sendDeadline, "bootstrap root reply");
    } catch (const Error& e) {
      logAt(LogLevel::kWarn, "bootstrap root: {}", e.what());
    }
  }
}

}  // namespace

std::string Bootstrap::checkHello(const PeerHello& hello, Purpose purpose) const {
  return wire::checkPeerHello(hello, secret_, commId_, nranks_, purpose);
}

Socket Bootstrap::acceptPeer(int listenFd, Deadline deadline, const std::string& what, Purpose purpose,
                             PeerHello* hello) const {
  for (;;) {
    Socket candidate = acceptFrom(listenFd, deadline, what);
    // The hello comes at once from a rank; a stranger that sends nothing is not waited for long.
    try {
      recvAll(candidate.fd(), hello, sizeof(*hello), std::min(deadline, deadlineAfterMs(5000)), what);
    } catch (const Error& e) {
      logAt(LogLevel::kWarn, "{}: a connection closed before its hello ({}); turned away", what, e.what());
      continue;
    }
    const std::string why = wire::checkPeerHello(*hello, secret_, commId_, nranks_, purpose);
    if (why.empty()) return candidate;
    logAt(LogLevel::kWarn, "{}: a connection presented {}; turned away", what, why);
  }
}

uint64_t randomU64() {
  uint64_t value = 0;
  if (getrandom(&value, sizeof(value), 0) != sizeof(value)) failErrno("getrandom()");
  return value;
}

void startBootstrapRoot(Socket listener, uint64_t secret) {
  std::thread([listener = std::move(listener), secret]() mutable {
    try {
      runRoot(std::move(listener), secret);
    } catch (const std::exception& e) {
      logAt(LogLevel::kWarn, "bootstrap root failed: {}", e.what());
    }
  }).detach();
}

UniqueIdData createUniqueId() {
  Socket listener = listenOn(defaultLocalAddress());
  UniqueIdData id;
  id.magic = wire::kUniqueIdMagic;
  id.version = wire::kVersion;
  id.secret = randomU64();
  id.root = pack(boundAddress(listener.fd()));
  startBootstrapRoot(std::move(listener), id.secret);
  return id;
}

Bootstrap::Bootstrap(int rank, int nranks) : rank_(rank), nranks_(nranks) {
  SocketAddress local = defaultLocalAddress();
  ringListen_ = listenOn(local);
  ringAddress_ = pack(boundAddress(ringListen_.fd()));
}

std::vector<std::vector<char>> Bootstrap::join(const UniqueIdData& id, const std::vector<char>& info,
                                               int initTimeoutMs) {
  if (const std::string why = wire::checkUniqueId(id); !why.empty()) {
    fail(chorusInvalidArgument, "rank {}: the unique id is unusable: {}", rank_, why);
  }
  const SocketAddress root = unpack(id.root);
  // Ranks wait a little longer than the root, so the root's word on missing ranks arrives first.
  const Deadline deadline = deadlineAfterMs(static_cast<int64_t>(initTimeoutMs) + 5000);
  const std::string what = fmt::format("rank {}: bootstrap with root {}", rank_, root.toString());
  Socket socket = connectTo(root, deadline, what);
  Hello hello{wire::kHelloMagic, wire::kVersion, id.secret, nranks_, rank_, static_cast<uint32_t>(info.size()),
              initTimeoutMs};
  sendAll(socket.fd(), &hello, sizeof(hello), deadline, what);
  sendAll(socket.fd(), info.data(), info.size(), deadline, what);
  Reply reply{};
  recvAll(socket.fd(), &reply, sizeof(reply), deadline, what + " (waiting for all ranks)");
  if (const std::string why = wire::checkReply(reply, nranks_, info.size()); !why.empty()) {
    fail(chorusRemoteError, "{}: the root sent {}", what, why);
  }
  if (reply.status == wire::kError) {
    std::string text(reply.payloadBytes, '\0');
    recvAll(socket.fd(), text.data(), text.size(), deadline, what);
    fail(static_cast<chorusResult_t>(reply.errorCode), "rank {}: {}", rank_, text);
  }
  commId_ = reply.commId;
  secret_ = id.secret;
  std::vector<char> all(reply.payloadBytes);
  recvAll(socket.fd(), all.data(), all.size(), deadline, what);
  std::vector<std::vector<char>> infos(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    infos[r].assign(all.begin() + static_cast<ptrdiff_t>(r * info.size()),
                    all.begin() + static_cast<ptrdiff_t>((r + 1) * info.size()));
  }

  ringAddresses_.resize(nranks_);
  for (int r = 0; r < nranks_; ++r) std::memcpy(&ringAddresses_[r], infos[r].data(), sizeof(PackedAddress));

  if (nranks_ > 1) {
    // Ring: connect to the next rank's listener, accept the previous rank. Every info blob
    // begins with the rank's ring address.
    const int next = (rank_ + 1) % nranks_;
    PackedAddress nextAddress;
    std::memcpy(&nextAddress, infos[next].data(), sizeof(nextAddress));
    const std::string ringWhat = fmt::format("rank {}: bootstrap ring", rank_);
    next_ = connectTo(unpack(nextAddress), deadline, ringWhat + fmt::format(" to rank {}", next));
    const PeerHello mine = peerHello(Purpose::kRing);
    sendAll(next_.fd(), &mine, sizeof(mine), deadline, ringWhat);
    const int prev = (rank_ + nranks_ - 1) % nranks_;
    for (;;) {
      const std::string from = ringWhat + fmt::format(" from rank {}", prev);
      PeerHello theirs{};
      Socket candidate = acceptPeer(ringListen_.fd(), deadline, from, Purpose::kRing, &theirs);
      if (theirs.rank == prev) {
        prev_ = std::move(candidate);
        break;
      }
      logAt(LogLevel::kWarn, "{}: rank {} connected instead; turned away", from, theirs.rank);
    }
  }
  return infos;
}

void Bootstrap::allGather(void* data, size_t bytesPerRank, Deadline deadline) {
  // Ring all-gather: at step s, pass on the slot received at step s-1 (our own at step 0).
  char* base = static_cast<char*>(data);
  for (int step = 0; step < nranks_ - 1; ++step) {
    const int sendSlot = (rank_ - step + nranks_) % nranks_;
    const int recvSlot = (rank_ - step - 1 + nranks_) % nranks_;
    const std::string what = fmt::format("rank {}: bootstrap all-gather step {}", rank_, step);
    sendAll(next_.fd(), base + static_cast<size_t>(sendSlot) * bytesPerRank, bytesPerRank, deadline, what);
    recvAll(prev_.fd(), base + static_cast<size_t>(recvSlot) * bytesPerRank, bytesPerRank, deadline, what);
  }
}

std::vector<std::vector<char>> Bootstrap::allGatherBlobs(const std::vector<char>& mine, Deadline deadline) {
  std::vector<uint64_t> lengths(static_cast<size_t>(nranks_));
  lengths[rank_] = mine.size();
  allGather(lengths.data(), sizeof(uint64_t), deadline);
  const size_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::vector<char>> blobs(static_cast<size_t>(nranks_));
  if (longest == 0) return blobs;
  std::vector<char> slots(longest * static_cast<size_t>(nranks_));
  std::copy(mine.begin(), mine.end(), slots.begin() + static_cast<std::ptrdiff_t>(longest * rank_));
  allGather(slots.data(), longest, deadline);
  for (int r = 0; r < nranks_; ++r) {
    const auto start = slots.begin() + static_cast<std::ptrdiff_t>(longest * r);
    blobs[r].assign(start, start + static_cast<std::ptrdiff_t>(lengths[r]));
  }
  return blobs;
}

void Bootstrap::barrier(Deadline deadline) {
  std::vector<char> slots(static_cast<size_t>(nranks_), 1);
  allGather(slots.data(), 1, deadline);
}

UniqueIdData Bootstrap::agreeOnNewId(const std::vector<int>& remaining, Deadline deadline) {
  const uint32_t generation = ++shrinks_;
  const int lowest = remaining.front();
  const int count = static_cast<int>(remaining.size());
  const std::string what = fmt::format("rank {}: shrink #{} of communicator {:016x}", rank_, generation, commId_);
  if (rank_ == lowest) {
    const PeerHello hello = peerHello(Purpose::kShrink);
    const ShrinkOffer offer{generation, count, createUniqueId()};
    for (int i = 1; i < count; ++i) {
      const int r = remaining[i];
      const std::string to = fmt::format("{}: handing the new id to rank {}", what, r);
      Socket socket = connectTo(unpack(ringAddresses_[r]), deadline, to);
      sendAll(socket.fd(), &hello, sizeof(hello), deadline, to);
      sendAll(socket.fd(), &offer, sizeof(offer), deadline, to);
    }
    return offer.id;
  }
  const std::string from = fmt::format("{}: waiting for rank {} to hand over the new id", what, lowest);
  for (;;) {
    PeerHello hello{};
    Socket socket = acceptPeer(ringListen_.fd(), deadline, from, Purpose::kShrink, &hello);
    ShrinkOffer offer{};
    try {
      recvAll(socket.fd(), &offer, sizeof(offer), std::min(deadline, deadlineAfterMs(5000)), from);
    } catch (const Error& e) {
      logAt(LogLevel::kWarn, "{}: rank {} closed the connection without an offer: {}", what, hello.rank, e.what());
      continue;
    }
    if (hello.rank != lowest) {
      fail(chorusInvalidUsage,
           "{}: rank {} offers a new id, but this rank expects rank {}, the lowest of the {} remaining ranks (the "
           "remaining ranks must exclude the same ranks)",
           what, hello.rank, lowest, count);
    }
    if (const std::string why = wire::checkShrinkOffer(offer, generation, count); !why.empty()) {
      fail(chorusInvalidUsage, "{}: rank {} offers {} (the remaining ranks must exclude the same ranks)", what,
           hello.rank, why);
    }
    return offer.id;
  }
}

PeerHello Bootstrap::peerHello(Purpose purpose) const {
  return PeerHello{wire::kPeerHelloMagic, wire::kVersion, secret_, commId_, rank_, static_cast<int32_t>(purpose)};
}

void Bootstrap::sendNote(uint32_t kind, const std::string& text, int origin) {
  if (nranks_ < 2) return;
  const std::string body = text.substr(0, wire::kMaxNoteText);
  const RingNote note{wire::kNoteMagic, kind, origin, static_cast<uint32_t>(body.size())};
  for (Socket* socket : {&next_, &prev_}) {
    if (!socket->valid()) continue;
    // A neighbour that has gone, or has stopped reading, is not waited for.
    iovec parts[2] = {{const_cast<RingNote*>(&note), sizeof(note)}, {const_cast<char*>(body.data()), body.size()}};
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = 2;
    (void)::sendmsg(socket->fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

void Bootstrap::tellFailure(const std::string& text) {
  if (std::exchange(told_, true)) return;
  sendNote(wire::kFailure, text, rank_);
}

std::string Bootstrap::failed(const Error& error, const std::string& where) {
  std::string message = fmt::format("{}: {}", where, error.what());
  if (heard_) {
    tellFailure(where + ": stopped on hearing of the failure");
    return message;
  }
  const bool theirs = error.code() == chorusRemoteError;
  const bool closed = dynamic_cast<const LinkLost*>(&error) != nullptr;
  try {
    if (closed) watch(kCauseWaitMs);
    tellFailure(message);
    if (theirs && !closed) watch(kCauseWaitMs);
  } catch (const Error& cause) {
    message += fmt::format("; {}", cause.what());
  }
  return message;
}

void Bootstrap::sayGoodbye() {
  if (std::exchange(told_, true)) return;
  sendNote(wire::kGoodbye, "", rank_);
}

void Bootstrap::watch(int waitMs) {
  if (nranks_ < 2 || heard_) return;
  const Deadline until = deadlineAfterMs(waitMs);
  for (bool first = true; first || Clock::now() < until; first = false) {
    if (!watchOnce(msLeft(until))) return;
  }
}

bool Bootstrap::watchOnce(int waitMs) {
  const int neighbours[2] = {(rank_ + nranks_ - 1) % nranks_, (rank_ + 1) % nranks_};
  Socket* sockets[2] = {&prev_, &next_};
  pollfd entries[2];
  int watched[2];
  int count = 0;
  for (int i = 0; i < 2; ++i) {
    if (!sockets[i]->valid()) continue;
    entries[count] = {sockets[i]->fd(), POLLIN, 0};
    watched[count++] = i;
  }
  if (count == 0 || ::poll(entries, static_cast<nfds_t>(count), waitMs) <= 0) return false;
  for (int k = 0; k < count; ++k) {
    if (entries[k].revents == 0) continue;
    const int i = watched[k];
    const int neighbour = neighbours[i];
    RingNote note{};
    const ssize_t got = ::recv(sockets[i]->fd(), &note, sizeof(note), MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (got <= 0) {
      // Gone without a goodbye: dead, or exited without destroying the communicator after its
      // last call. Which it was shows where this rank still waits for it (the transports see its
      // exit), and a rank that does tells the others.
      logAt(LogLevel::kInfo, "rank {}: rank {} has closed its bootstrap connection without a goodbye", rank_,
            neighbour);
      sockets[i]->close();
      continue;
    }
    const std::string what = fmt::format("rank {}: the failure line from rank {}", rank_, neighbour);
    // A note is sent in one piece; the rest of a short read follows at once.
    const Deadline deadline = deadlineAfterMs(1000);
    if (static_cast<size_t>(got) < sizeof(note)) {
      recvAll(sockets[i]->fd(), reinterpret_cast<char*>(&note) + got, sizeof(note) - static_cast<size_t>(got), deadline,
              what);
    }
    if (const std::string why = wire::checkRingNote(note, nranks_); !why.empty()) {
      sockets[i]->close();
      heard_ = true;
      fail(chorusRemoteError, "rank {} sent rank {} a malformed note on the failure line: {}", neighbour, rank_, why);
    }
    std::string text(note.textBytes, '\0');
    recvAll(sockets[i]->fd(), text.data(), text.size(), deadline, what);
    if (note.kind == wire::kGoodbye) {
      sockets[i]->close();  // left normally; nothing more will come
      continue;
    }
    if (note.origin == rank_) continue;           // this rank's own word, passed back around
    sendNote(wire::kFailure, text, note.origin);  // on around the ring, as it was written
    heard_ = true;
    fail(chorusRemoteError, "rank {} failed, and said: {}", note.origin, text);
  }
  return true;
}

}  // namespace chorus
