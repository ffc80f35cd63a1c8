// The device engine's staging areas (src/core/growing_areas.h) on host memory: a larger call after
// a smaller one (a captured call first, as on the GPU) gets areas of its size, and what the earlier
// call was given stays allocated, with its bytes, until the owner goes.
#include "src/core/growing_areas.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

namespace chorus {
namespace {

struct Tracker {
  std::set<void*> live;
  size_t allocations = 0;
  std::vector<size_t> sizes;
};

GrowingAreas makeAreas(Tracker& t, size_t areas) {
  return GrowingAreas(
      areas,
      [&t](size_t bytes) {
        void* p = std::malloc(bytes);
        t.live.insert(p);
        ++t.allocations;
        t.sizes.push_back(bytes);
        return p;
      },
      [&t](void* p) {
        EXPECT_EQ(t.live.erase(p), 1u) << "freed twice or never allocated";
        std::free(p);
      });
}

TEST(GrowingAreas, ALargerCallAfterASmallerOneGetsItsSizeAndTheOldAreasStay) {
  Tracker t;
  {
    GrowingAreas staging = makeAreas(t, 4);
    staging.ensure(4000);  // the captured call: 4000 bytes per area
    ASSERT_EQ(staging.areaBytes(), 4000u);
    char* captured[4];
    for (size_t i = 0; i < 4; ++i) {
      captured[i] = staging.area(i);
      std::memset(captured[i], static_cast<int>(i + 1), 4000);
    }
    staging.ensure(70001 * 4);  // the next, larger call outside capture
    EXPECT_GE(staging.areaBytes(), 70001u * 4);
    EXPECT_EQ(staging.retired(), 1u);
    for (size_t i = 0; i < 4; ++i) {
      std::memset(staging.area(i), 0xee, staging.areaBytes());  // the new call fills its areas
      // The graph's areas are untouched and still allocated (a replay reads and writes them).
      EXPECT_EQ(t.live.count(captured[0]), 1u);
      for (size_t b = 0; b < 4000; b += 997) EXPECT_EQ(captured[i][b], static_cast<char>(i + 1)) << i << " " << b;
    }
    // Areas do not overlap.
    EXPECT_EQ(staging.area(1) - staging.area(0), static_cast<std::ptrdiff_t>(staging.areaBytes()));
    EXPECT_EQ(t.live.size(), 2u);
  }
  EXPECT_TRUE(t.live.empty()) << "the owner's end frees every allocation, old and current";
}

TEST(GrowingAreas, GrowthAtLeastDoublesAndASmallerCallReusesTheAreas) {
  Tracker t;
  GrowingAreas staging = makeAreas(t, 2);
  staging.ensure(1000);
  staging.ensure(1001);  // a little larger: doubles, so a run of growing calls allocates rarely
  EXPECT_EQ(staging.areaBytes(), 2000u);
  staging.ensure(1500);
  staging.ensure(2000);
  EXPECT_EQ(t.allocations, 2u);
  ASSERT_EQ(t.sizes.size(), 2u);
  EXPECT_EQ(t.sizes[0], 2000u);
  EXPECT_EQ(t.sizes[1], 4000u);
  staging.ensure(10000);  // more than double: exactly what was asked
  EXPECT_EQ(staging.areaBytes(), 10000u);
}

TEST(GrowingAreas, AnOverflowingSizeIsRefusedNamingItAndNothingIsLost) {
  Tracker t;
  GrowingAreas staging = makeAreas(t, 4);
  staging.ensure(64);
  char* before = staging.area(0);
  try {
    staging.ensure(std::numeric_limits<size_t>::max() / 2);
    FAIL() << "an area size that overflows was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), chorusInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("4 areas of"), std::string::npos) << e.what();
  }
  EXPECT_EQ(staging.area(0), before);
  EXPECT_EQ(staging.areaBytes(), 64u);
}

}  // namespace
}  // namespace chorus
