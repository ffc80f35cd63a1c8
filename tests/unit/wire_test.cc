// wire_test.cc: the checks every message gets before it is used (src/base/wire.h), and
// CHORUS_SOCKET_IFNAME's parser (src/base/interfaces.h), on hand-made good and bad input.
#include "src/base/wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>

#include "src/base/interfaces.h"

namespace chorus {
namespace {

using namespace wire;

TEST(WireTest, TcpHeadersMustCarryTheMagicTheSenderAndThePostedTagAndSize) {
  const uint64_t tag = makeTag(TagKind::kCollective, 12, 0x1a2b);
  const TcpHeader good{kTcpMagic, 3, tag, 4096};
  EXPECT_EQ(checkTcpHeader(good, 3, tag, 4096), "");
  TcpHeader bad = good;
  bad.magic = 0x12345678;
  EXPECT_NE(checkTcpHeader(bad, 3, tag, 4096).find("not a chorus message header"), std::string::npos);
  EXPECT_NE(checkTcpHeader(good, 2, tag, 4096).find("from rank 3"), std::string::npos);
  const std::string size = checkTcpHeader(good, 3, tag, 8192);
  EXPECT_NE(size.find("collective #12 (signature 0x1a2b) with 4096 bytes"), std::string::npos) << size;
  EXPECT_NE(size.find("with 8192 bytes"), std::string::npos) << size;
}

TEST(WireTest, ShmPiecesMustLieWithinThePostedReceiveWithoutWrappingAround) {
  const uint64_t tag = makeTag(TagKind::kPointToPoint, 3, 7);
  EXPECT_EQ(checkSlotPiece({tag, 1000, 256, 256, true}, tag, 1000, 256, 256), "");
  EXPECT_EQ(checkSlotPiece({tag, 1000, 0, 1000, false}, tag, 1000, 0, 256), "");    // read whole from the sender
  EXPECT_NE(checkSlotPiece({tag, 1000, 0, 1000, true}, tag, 1000, 0, 256), "");     // larger than a slot
  EXPECT_NE(checkSlotPiece({tag, 1000, 512, 256, true}, tag, 1000, 256, 256), "");  // not where the receive is
  EXPECT_NE(checkSlotPiece({tag, 1000, 900, 200, true}, tag, 1000, 900, 256), "");  // past the end
  EXPECT_NE(checkSlotPiece({tag, 2000, 0, 10, true}, tag, 1000, 0, 256).find("with 2000 bytes"), std::string::npos);
  // offset + pieceBytes wraps to 5: a plain "offset + piece > size" test lets this through.
  const uint64_t huge = std::numeric_limits<uint64_t>::max() - 4;
  EXPECT_NE(checkSlotPiece({tag, 1000, 10, huge, false}, tag, 1000, 10, 256), "");
}

TEST(WireTest, BootstrapHellosAreCheckedForSecretRanksAndSizes) {
  const Hello good{kHelloMagic, kVersion, 42, 4, 3, 256, 1000};
  EXPECT_EQ(checkHello(good, 42), "");
  EXPECT_NE(checkHello(good, 43).find("wrong secret"), std::string::npos);
  Hello bad = good;
  bad.version = kVersion + 1;
  EXPECT_NE(checkHello(bad, 42).find("protocol version"), std::string::npos);
  bad = good;
  bad.rank = 4;
  EXPECT_NE(checkHello(bad, 42).find("rank 4 is out of range [0, 4)"), std::string::npos);
  bad = good;
  bad.infoBytes = kMaxInfoBytes + 1;
  EXPECT_NE(checkHello(bad, 42).find("info blob"), std::string::npos);

  EXPECT_EQ(checkReply({kOk, 0, 9, 4 * 256}, 4, 256), "");
  EXPECT_NE(checkReply({kOk, 0, 9, 4 * 256 + 1}, 4, 256), "");
  EXPECT_EQ(checkReply({kError, 7, 0, 100}, 4, 256), "");
  EXPECT_NE(checkReply({kError, 7, 0, kMaxErrorText + 1}, 4, 256), "");  // not read into memory
  EXPECT_NE(checkReply({kError, 0, 0, 10}, 4, 256), "");                 // an error that is success
  EXPECT_NE(checkReply({5, 0, 0, 0}, 4, 256), "");
}

TEST(WireTest, ConnectionsBetweenRanksMustProveTheSecretAndTheirPurpose) {
  const PeerHello good{kPeerHelloMagic, kVersion, 42, 77, 1, static_cast<int32_t>(Purpose::kRing)};
  EXPECT_EQ(checkPeerHello(good, 42, 77, 4, Purpose::kRing), "");
  EXPECT_EQ(checkPeerHello(good, 41, 77, 4, Purpose::kRing), "a wrong secret");
  EXPECT_NE(checkPeerHello(good, 42, 78, 4, Purpose::kRing).find("communicator"), std::string::npos);
  EXPECT_NE(checkPeerHello(good, 42, 77, 1, Purpose::kRing).find("out of range"), std::string::npos);
  EXPECT_NE(checkPeerHello(good, 42, 77, 4, Purpose::kShrink).find("purpose"), std::string::npos);

  EXPECT_EQ(checkRingNote({kNoteMagic, kFailure, 2, 100}, 4), "");
  EXPECT_NE(checkRingNote({kNoteMagic, kFailure, 4, 100}, 4), "");
  EXPECT_NE(checkRingNote({kNoteMagic, 3, 2, 100}, 4), "");
  EXPECT_NE(checkRingNote({kNoteMagic, kGoodbye, 2, kMaxNoteText + 1}, 4), "");

  UniqueId id;
  id.magic = kUniqueIdMagic;
  id.version = kVersion;
  id.root.family = 2;
  EXPECT_EQ(checkShrinkOffer({3, 5, id}, 3, 5), "");
  EXPECT_NE(checkShrinkOffer({3, 4, id}, 3, 5), "");
  id.magic = 0;
  EXPECT_NE(checkShrinkOffer({3, 5, id}, 3, 5).find("bad magic"), std::string::npos);
}

TEST(InterfaceFilterTest, PrefixesExclusionAndExactNames) {
  const InterfaceFilter eth = parseInterfaceFilter("eth,ib");
  EXPECT_TRUE(eth.matches("eth0"));
  EXPECT_TRUE(eth.matches("ib1"));
  EXPECT_FALSE(eth.matches("lo"));
  const InterfaceFilter notLo = parseInterfaceFilter("^lo,docker");
  EXPECT_FALSE(notLo.matches("lo"));
  EXPECT_FALSE(notLo.matches("docker0"));
  EXPECT_TRUE(notLo.matches("eth0"));
  const InterfaceFilter exact = parseInterfaceFilter("=eth0");
  EXPECT_TRUE(exact.matches("eth0"));
  EXPECT_FALSE(exact.matches("eth01"));
  const InterfaceFilter notExact = parseInterfaceFilter("^=eth0");
  EXPECT_FALSE(notExact.matches("eth0"));
  EXPECT_TRUE(notExact.matches("eth01"));
  for (const char* bad : {"", "^", "=", "^=", "eth0,", ",eth0", "a,,b", "eth 0", "averyveryverylongname"}) {
    EXPECT_THROW(parseInterfaceFilter(bad), std::invalid_argument) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace chorus
