// registry.cc: the transports in priority order, each asked in turn "can you connect to this peer?".
#include "src/core/error.h"
#include "src/transport/transport.h"

namespace chorus {

const std::vector<TransportKind>& transportRegistry() {
  static const std::vector<TransportKind> kinds = {
      {"self", [](const TransportContext& c, int peer) { return peer == c.rank; }, createSelfTransport},
      {"shm",
       [](const TransportContext& c, int peer) {
         return c.mode != "tcp" && c.peers[peer].hostHash == c.peers[c.rank].hostHash;
       },
       createShmTransport},
      {"tcp", [](const TransportContext& c, int) { return c.mode != "shm"; }, createTcpTransport},
  };
  return kinds;
}

}  // namespace chorus
