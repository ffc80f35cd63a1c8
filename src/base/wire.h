// wire.h: every message chorus puts on a socket, and the check each gets before anything in it
// is used: magic and version, the secret where the message opens a connection, ranks in range,
// lengths within what the receiver posted or will hold. A check returns "" for a good message,
// else what is wrong (the caller names the sender and fails, or turns the connection away). The
// checks are pure functions: the fuzz targets (tests/fuzz) feed them arbitrary bytes.
//
// All integers are in the host's byte order: the ranks of one communicator run one build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/base/socket.h"

namespace chorus::wire {

inline constexpr uint32_t kVersion = 2;

// Message tags: a kind, a sequence number and a signature of the operation. Messages between two
// ranks are matched in post order; the tag only checks that both sides agree.
// kAgreement: the ranks' agreement on a collective before it runs (the collective's sequence).
enum class TagKind : uint8_t { kCollective = 1, kPointToPoint = 2, kAgreement = 3 };
inline uint64_t makeTag(TagKind kind, uint64_t sequence, uint16_t signature) {
  return (static_cast<uint64_t>(kind) << 56) | ((sequence & 0xffffffffffull) << 16) | signature;
}
// "collective #12 (signature 0x1a2b)" or "point-to-point #3 (signature ...)".
std::string describeTag(uint64_t tag);
// "collective", "point-to-point", "the agreement before rooted collective"; "unknown" otherwise.
const char* tagKindName(TagKind kind);

// What a chorusUniqueId holds.
struct UniqueId {
  uint32_t magic = 0;
  uint32_t version = 0;
  uint64_t secret = 0;
  PackedAddress root;
  // An id for chorusCommGrow (chorusCommGetUniqueId): the communicator it grows and its rank
  // count, whose ranks keep their numbers; 0 in other ids.
  uint64_t parent = 0;
  int32_t parentNranks = 0;
};
inline constexpr uint32_t kUniqueIdMagic = 0x63686f72;  // "chor"
std::string checkUniqueId(const UniqueId& id);

// Bootstrap: a rank's hello to the root, followed by its info blob of infoBytes.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  int32_t nranks;
  int32_t rank;
  uint32_t infoBytes;
  int32_t initTimeoutMs;  // how long the root waits for the rest once this rank is the first
};
inline constexpr uint32_t kHelloMagic = 0x63686f31;  // "cho1"
inline constexpr uint32_t kMaxInfoBytes = 64 * 1024;
std::string checkHello(const Hello& hello, uint64_t secret);

// The root's answer: kOk then nranks blobs, or kError then the error's text.
struct Reply {
  uint32_t status;
  uint32_t errorCode;  // chorusResult_t when status is kError
  uint64_t commId;
  uint64_t payloadBytes;
};
enum ReplyStatus : uint32_t { kOk = 0, kError = 1 };
inline constexpr uint64_t kMaxErrorText = 64 * 1024;
std::string checkReply(const Reply& reply, int nranks, size_t infoBytes);

// The first bytes of every connection between the ranks of a communicator (bootstrap ring, tcp
// transport, shrink): proof that the sender knows the communicator's secret, and who it is.
// kTcpProbe: a rank that waits for a lower rank's tcp connection checks that rank still listens.
enum class Purpose : int32_t { kRing = 1, kTcpData = 2, kShrink = 3, kTcpProbe = 4 };
struct PeerHello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  uint64_t commId;
  int32_t rank;
  int32_t purpose;  // Purpose
};
inline constexpr uint32_t kPeerHelloMagic = 0x63686f50;  // "choP"
std::string checkPeerHello(const PeerHello& hello, uint64_t secret, uint64_t commId, int nranks, Purpose purpose);

// What the lowest remaining rank of a shrink sends each other remaining rank, after its hello.
struct ShrinkOffer {
  uint32_t generation;  // which shrink of this communicator
  int32_t remaining;    // how many ranks the new communicator has
  UniqueId id;
};
std::string checkShrinkOffer(const ShrinkOffer& offer, uint32_t generation, int remaining);

// The failure line (the bootstrap ring after set-up): a note, then textBytes of text.
enum NoteKind : uint32_t { kGoodbye = 1, kFailure = 2 };
struct RingNote {
  uint32_t magic;
  uint32_t kind;
  int32_t origin;  // the rank that wrote the text
  uint32_t textBytes;
};
inline constexpr uint32_t kNoteMagic = 0x63686f4e;  // "choN"
inline constexpr uint32_t kMaxNoteText = 8192;
std::string checkRingNote(const RingNote& note, int nranks);

// tcp transport: every message is a header, then its bytes.
struct TcpHeader {
  uint32_t magic;
  int32_t sender;
  uint64_t tag;
  uint64_t bytes;
};
inline constexpr uint32_t kTcpMagic = 0x63686f54;  // "choT"
// Against the receive posted for it: the sender's rank, the tag and the size must match.
std::string checkTcpHeader(const TcpHeader& header, int sender, uint64_t tag, uint64_t bytes);

// shm transport: one piece of a message in a FIFO slot, against the receive posted for it
// (tag, size, bytes received so far). Pieces in the slot hold at most slotBytes; a piece the
// receiver reads from the sender's memory may be the whole message.
struct SlotPiece {
  uint64_t tag;
  uint64_t messageBytes;
  uint64_t offset;
  uint64_t pieceBytes;
  bool inSlot;
};
std::string checkSlotPiece(const SlotPiece& piece, uint64_t tag, uint64_t bytes, uint64_t done, uint64_t slotBytes);

}  // namespace chorus::wire
