// wire_fuzz.cc: the transports' message headers (wire.h) against arbitrary bytes and arbitrary
// posted receives: a tcp header, an shm slot piece, and the tag text of every error message.
// Every check must return (good or what is wrong), never crash or overflow.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>

#include "src/base/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace chorus::wire;
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: {
      TcpHeader header{};
      const auto bytes = in.ConsumeBytes<uint8_t>(sizeof(header));
      if (!bytes.empty()) std::memcpy(&header, bytes.data(), bytes.size());
      const int sender = in.ConsumeIntegral<int>();
      const uint64_t tag = in.ConsumeIntegral<uint64_t>();
      const uint64_t posted = in.ConsumeIntegral<uint64_t>();
      const std::string why = checkTcpHeader(header, sender, tag, posted);
      // A header that passes says exactly what was posted.
      if (why.empty() && (header.tag != tag || header.bytes != posted || header.sender != sender)) __builtin_trap();
      break;
    }
    case 1: {
      SlotPiece piece{};
      piece.tag = in.ConsumeIntegral<uint64_t>();
      piece.messageBytes = in.ConsumeIntegral<uint64_t>();
      piece.offset = in.ConsumeIntegral<uint64_t>();
      piece.pieceBytes = in.ConsumeIntegral<uint64_t>();
      piece.inSlot = in.ConsumeBool();
      const uint64_t tag = in.ConsumeIntegral<uint64_t>();
      const uint64_t bytes = in.ConsumeIntegral<uint64_t>();
      const uint64_t done = in.ConsumeIntegralInRange<uint64_t>(0, bytes);  // a receive's own count
      const uint64_t slotBytes = in.ConsumeIntegral<uint64_t>();
      const std::string why = checkSlotPiece(piece, tag, bytes, done, slotBytes);
      // A piece that passes lies within the posted receive, and within a slot if it is in one.
      if (why.empty() &&
          (piece.offset != done || piece.offset + piece.pieceBytes > bytes ||
           piece.offset + piece.pieceBytes < piece.offset || (piece.inSlot && piece.pieceBytes > slotBytes))) {
        __builtin_trap();
      }
      break;
    }
    default:
      (void)describeTag(in.ConsumeIntegral<uint64_t>());
      break;
  }
  return 0;
}
