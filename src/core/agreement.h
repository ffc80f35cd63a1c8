// agreement.h: the ranks' agreement on a rooted collective before it runs. Each rank states its
// call in a record; the schedule's agreement steps (collectives::prependAgreement) pass what each
// rank knows around in a dissemination exchange and merge it here, keeping the calls of least and
// greatest hash seen; after the last round every rank holds the same pair, so where any two ranks'
// calls differ every rank fails, naming both calls, instead of some returning success on wrong data.
#pragma once

#include <cstdint>
#include <string>

#include "chorus/chorus.h"
#include "src/collectives/schedule.h"

namespace chorus {

// One rank's call, as it travels between ranks of one build (raw bytes, fixed layout).
struct CallRecord {
  uint64_t hash = 0;  // of every field but rank
  int32_t rank = -1;
  int32_t collective = 0;
  uint64_t count = 0;
  int32_t type = 0;
  int32_t op = 0;  // reducing collectives only, else 0
  int32_t root = 0;
  int32_t algorithm = 0;
  uint64_t order = 0;  // the communicator's rank order, hashed
};

// What a rank knows after some rounds: the calls of least and greatest hash (ties: lower rank).
struct CallAgreement {
  CallRecord least;
  CallRecord most;
};

CallRecord callRecord(int rank, collectives::Collective collective, size_t count, chorusDataType_t type,
                      chorusRedOp_t op, int root, collectives::Algorithm algorithm, uint64_t order);
inline CallAgreement agreementOf(const CallRecord& mine) { return {mine, mine}; }
// What a rank knows from its own and a peer's agreement.
CallAgreement merged(const CallAgreement& mine, const CallAgreement& theirs);
// Empty where every call seen is the same; else why the call fails, naming two ranks' calls.
std::string disagreement(const CallAgreement& agreement, uint64_t sequence);

}  // namespace chorus
