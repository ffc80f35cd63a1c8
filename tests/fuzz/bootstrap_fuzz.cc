// bootstrap_fuzz.cc: every bootstrap message (wire.h) against arbitrary bytes: the hello a root
// reads, the reply a rank reads, the hello that opens a connection between ranks, a shrink offer,
// a note on the failure line, a unique id. Checks must return, and what passes must be in range.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>

#include "src/base/wire.h"

namespace {

template <typename T>
T consume(FuzzedDataProvider& in) {
  T value{};
  const auto bytes = in.ConsumeBytes<uint8_t>(sizeof(T));
  if (!bytes.empty()) std::memcpy(&value, bytes.data(), bytes.size());
  return value;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus::wire;
  FuzzedDataProvider in(data, size);
  const uint64_t secret = in.ConsumeIntegral<uint64_t>();
  const uint64_t commId = in.ConsumeIntegral<uint64_t>();
  const int nranks = in.ConsumeIntegralInRange<int>(-1, 1 << 20);
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: {
      const auto hello = consume<Hello>(in);
      if (checkHello(hello, secret).empty() &&
          (hello.secret != secret || hello.rank < 0 || hello.rank >= hello.nranks || hello.infoBytes > kMaxInfoBytes)) {
        __builtin_trap();
      }
      break;
    }
    case 1: {
      const auto reply = consume<Reply>(in);
      const size_t infoBytes = in.ConsumeIntegralInRange<size_t>(0, kMaxInfoBytes);
      if (checkReply(reply, nranks, infoBytes).empty() && reply.status == kError &&
          reply.payloadBytes > kMaxErrorText) {
        __builtin_trap();
      }
      break;
    }
    case 2: {
      const auto hello = consume<PeerHello>(in);
      const auto purpose = static_cast<Purpose>(in.ConsumeIntegralInRange<int>(1, 3));
      if (checkPeerHello(hello, secret, commId, nranks, purpose).empty() &&
          (hello.secret != secret || hello.commId != commId || hello.rank < 0 || hello.rank >= nranks)) {
        __builtin_trap();
      }
      break;
    }
    case 3: {
      const auto offer = consume<ShrinkOffer>(in);
      (void)checkShrinkOffer(offer, in.ConsumeIntegral<uint32_t>(), nranks);
      break;
    }
    case 4: {
      const auto note = consume<RingNote>(in);
      if (checkRingNote(note, nranks).empty() && (note.textBytes > kMaxNoteText || note.origin >= nranks)) {
        __builtin_trap();
      }
      break;
    }
    default:
      (void)checkUniqueId(consume<UniqueId>(in));
      break;
  }
  return 0;
}
