// wire.cc: the checks of wire.h.
#include "src/base/wire.h"

#include <fmt/format.h>

#include "chorus/chorus.h"

namespace chorus::wire {

const char* tagKindName(TagKind kind) {
  switch (kind) {
    case TagKind::kCollective:
      return "collective";
    case TagKind::kPointToPoint:
      return "point-to-point";
    case TagKind::kAgreement:
      return "the agreement before rooted collective";
  }
  return "unknown";
}

std::string describeTag(uint64_t tag) {
  const uint64_t sequence = (tag >> 16) & 0xffffffffffull;
  return fmt::format("{} #{} (signature 0x{:04x})", tagKindName(static_cast<TagKind>(tag >> 56)), sequence,
                     tag & 0xffff);
}

std::string checkUniqueId(const UniqueId& id) {
  if (id.magic != kUniqueIdMagic) return "it is not one made by chorusGetUniqueId (bad magic)";
  if (id.version != kVersion)
    return fmt::format("it is of protocol version {}, this library speaks {}", id.version, kVersion);
  if (id.root.family != 2 /* AF_INET */ && id.root.family != 10 /* AF_INET6 */) {
    return fmt::format("its root address has family {}, neither IPv4 nor IPv6", id.root.family);
  }
  return {};
}

std::string checkHello(const Hello& hello, uint64_t secret) {
  if (hello.magic != kHelloMagic) return fmt::format("bad magic {:#x}: not a chorus rank", hello.magic);
  if (hello.version != kVersion) {
    return fmt::format("protocol version {}, this root speaks {}", hello.version, kVersion);
  }
  if (hello.secret != secret) return "a wrong secret: is it using this communicator's unique id?";
  if (hello.nranks < 1) return fmt::format("nranks {} is less than 1", hello.nranks);
  if (hello.rank < 0 || hello.rank >= hello.nranks) {
    return fmt::format("rank {} is out of range [0, {})", hello.rank, hello.nranks);
  }
  if (hello.infoBytes > kMaxInfoBytes) {
    return fmt::format("an info blob of {} bytes, more than {}", hello.infoBytes, kMaxInfoBytes);
  }
  if (hello.initTimeoutMs < 0) return fmt::format("init timeout {} ms is negative", hello.initTimeoutMs);
  return {};
}

std::string checkReply(const Reply& reply, int nranks, size_t infoBytes) {
  if (reply.status == kError) {
    if (reply.errorCode == chorusSuccess || reply.errorCode >= static_cast<uint32_t>(chorusNumResults)) {
      return fmt::format("an error reply with result code {}", reply.errorCode);
    }
    if (reply.payloadBytes > kMaxErrorText) {
      return fmt::format("an error text of {} bytes, more than {}", reply.payloadBytes, kMaxErrorText);
    }
    return {};
  }
  if (reply.status != kOk) return fmt::format("reply status {}", reply.status);
  if (reply.payloadBytes != static_cast<uint64_t>(nranks) * infoBytes) {
    return fmt::format("a reply of {} bytes where {} ranks x {} bytes were expected", reply.payloadBytes, nranks,
                       infoBytes);
  }
  return {};
}

std::string checkPeerHello(const PeerHello& hello, uint64_t secret, uint64_t commId, int nranks, Purpose purpose) {
  if (hello.magic != kPeerHelloMagic) return fmt::format("bad magic {:#x}: not a chorus rank", hello.magic);
  if (hello.version != kVersion)
    return fmt::format("protocol version {}, this rank speaks {}", hello.version, kVersion);
  if (hello.secret != secret) return "a wrong secret";
  if (hello.commId != commId) return fmt::format("communicator {:016x}, not {:016x}", hello.commId, commId);
  if (hello.rank < 0 || hello.rank >= nranks) return fmt::format("rank {} is out of range [0, {})", hello.rank, nranks);
  if (hello.purpose != static_cast<int32_t>(purpose)) {
    return fmt::format("a connection for purpose {} where {} was expected", hello.purpose,
                       static_cast<int32_t>(purpose));
  }
  return {};
}

std::string checkShrinkOffer(const ShrinkOffer& offer, uint32_t generation, int remaining) {
  if (offer.generation != generation || offer.remaining != remaining) {
    return fmt::format("shrink #{} to {} ranks, where this rank expects shrink #{} to {} ranks", offer.generation,
                       offer.remaining, generation, remaining);
  }
  if (std::string why = checkUniqueId(offer.id); !why.empty()) return "a new unique id that is bad: " + why;
  return {};
}

std::string checkRingNote(const RingNote& note, int nranks) {
  if (note.magic != kNoteMagic) return fmt::format("bad magic {:#x}", note.magic);
  if (note.kind != kGoodbye && note.kind != kFailure) return fmt::format("unknown kind {}", note.kind);
  if (note.origin < 0 || note.origin >= nranks)
    return fmt::format("origin rank {} out of range [0, {})", note.origin, nranks);
  if (note.textBytes > kMaxNoteText) return fmt::format("{} bytes of text, more than {}", note.textBytes, kMaxNoteText);
  return {};
}

std::string checkTcpHeader(const TcpHeader& header, int sender, uint64_t tag, uint64_t bytes) {
  if (header.magic != kTcpMagic) {
    return fmt::format("bytes that are not a chorus message header (magic {:#x}, tag {:#x}, size {})", header.magic,
                       header.tag, header.bytes);
  }
  if (header.sender != sender) return fmt::format("a header that says it comes from rank {}", header.sender);
  if (header.tag != tag || header.bytes != bytes) {
    return fmt::format(
        "{} with {} bytes, but the receive posted is for {} with {} bytes (the ranks called different operations, or "
        "with different sizes)",
        describeTag(header.tag), header.bytes, describeTag(tag), bytes);
  }
  return {};
}

std::string checkSlotPiece(const SlotPiece& piece, uint64_t tag, uint64_t bytes, uint64_t done, uint64_t slotBytes) {
  if (piece.tag != tag || piece.messageBytes != bytes) {
    return fmt::format(
        "{} with {} bytes, but the receive posted is for {} with {} bytes (the ranks called different operations, or "
        "with different sizes)",
        describeTag(piece.tag), piece.messageBytes, describeTag(tag), bytes);
  }
  // done <= bytes (the receive's own count), so bytes - done cannot wrap.
  if (piece.offset != done || piece.pieceBytes > bytes - done || (piece.inSlot && piece.pieceBytes > slotBytes)) {
    return fmt::format("a piece of {} bytes at offset {} of {}, where {} bytes have come and slots hold {}",
                       piece.pieceBytes, piece.offset, describeTag(tag), done, slotBytes);
  }
  return {};
}

}  // namespace chorus::wire
