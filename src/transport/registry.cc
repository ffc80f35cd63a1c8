// registry.cc: the transports in priority order, each asked in turn "can you connect to this peer?".
#include <fmt/ranges.h>

#include <algorithm>
#include <thread>

#include "src/base/error.h"
#include "src/transport/transport.h"

namespace chorus {

const std::vector<TransportKind>& transportRegistry() {
  static const std::vector<TransportKind> kinds = {
    {"self", [](const TransportContext& c, int peer) { return peer == c.rank; }, createSelfTransport},
    {"shm",
     [](const TransportContext& c, int peer) {
       return (c.mode == "auto" || c.mode == "shm") && c.peers[peer].hostHash == c.peers[c.rank].hostHash;
     },
     createShmTransport},
#if defined(CHORUS_HAVE_UCX)
    // auto: peers on other hosts. Every rank then has a UCX peer (ucx.cc relies on it).
    {"ucx",
     [](const TransportContext& c, int peer) {
       return c.mode == "ucx" || (c.mode == "auto" && c.peers[peer].hostHash != c.peers[c.rank].hostHash);
     },
     createUcxTransport},
    {"tcp", [](const TransportContext& c, int) { return c.mode == "tcp"; }, createTcpTransport},
#else
    // Built without UCX: auto takes tcp to peers on other hosts.
    {"tcp",
     [](const TransportContext& c, int peer) {
       return c.mode == "tcp" || (c.mode == "auto" && c.peers[peer].hostHash != c.peers[c.rank].hostHash);
     },
     createTcpTransport},
#endif
  };
  return kinds;
}

void connectAll(Transport& transport, const std::vector<int>& peers, int rank, Deadline deadline,
                const std::function<void()>& whileWaiting) {
  for (int peer : peers) transport.connect(peer);
  int pauseUs = 1;
  for (;;) {
    std::vector<int> missing;
    for (int peer : peers) {
      if (!transport.connected(peer)) missing.push_back(peer);
    }
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      fail(chorusTimeout, "{} transport: rank {} could not connect to rank(s) {} in time (have they exited?)",
           transport.name(), rank, fmt::join(missing, ","));
    }
    if (transport.progress()) {
      pauseUs = 1;
      continue;
    }
    transport.checkConnecting();
    if (whileWaiting) whileWaiting();
    std::this_thread::sleep_for(std::chrono::microseconds(pauseUs));
    pauseUs = std::min(pauseUs * 2, 1000);
  }
}

bool transportBuilt(const std::string& name) {
  for (const TransportKind& kind : transportRegistry()) {
    if (kind.name == name) return true;
  }
  return false;
}

}  // namespace chorus
