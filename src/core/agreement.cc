// agreement.cc: call records, their merge and the message of a disagreement (agreement.h).
#include "src/core/agreement.h"

#include <fmt/format.h>

#include <initializer_list>
#include <tuple>

#include "src/collectives/algorithm.h"
#include "src/collectives/traits.h"
#include "src/core/executor.h"

namespace chorus {
namespace {

bool before(const CallRecord& a, const CallRecord& b) { return std::tie(a.hash, a.rank) < std::tie(b.hash, b.rank); }

// The call a record states, named as errors name calls.
std::string describe(const CallRecord& record, uint64_t sequence) {
  return nameOfCall(static_cast<collectives::Collective>(record.collective), sequence, record.count,
                    static_cast<chorusDataType_t>(record.type), static_cast<chorusRedOp_t>(record.op), record.root,
                    collectives::algorithmName(static_cast<collectives::Algorithm>(record.algorithm)));
}

}  // namespace

CallRecord callRecord(int rank, collectives::Collective collective, size_t count, chorusDataType_t type,
                      chorusRedOp_t op, int root, collectives::Algorithm algorithm, uint64_t order) {
  CallRecord record;
  record.rank = rank;
  record.collective = static_cast<int32_t>(collective);
  record.count = count;
  record.type = static_cast<int32_t>(type);
  record.op = collectives::traitsOf(collective).reduces ? static_cast<int32_t>(op) : 0;
  record.root = root;
  record.algorithm = static_cast<int32_t>(algorithm);
  record.order = order;
  uint64_t h = 1469598103934665603ull;
  for (uint64_t v : {static_cast<uint64_t>(record.collective), record.count, static_cast<uint64_t>(record.type),
                     static_cast<uint64_t>(record.op), static_cast<uint64_t>(record.root),
                     static_cast<uint64_t>(record.algorithm), record.order}) {
    h = (h ^ v) * 1099511628211ull;
  }
  record.hash = h;
  return record;
}

CallAgreement merged(const CallAgreement& mine, const CallAgreement& theirs) {
  return {before(theirs.least, mine.least) ? theirs.least : mine.least,
          before(mine.most, theirs.most) ? theirs.most : mine.most};
}

std::string disagreement(const CallAgreement& agreement, uint64_t sequence) {
  if (agreement.least.hash == agreement.most.hash) return {};
  const CallRecord& a = agreement.least;
  const CallRecord& b = agreement.most;
  const std::string first = describe(a, sequence);
  const std::string second = describe(b, sequence);
  std::string text = fmt::format("the ranks disagree on collective #{}: rank {} called {}, rank {} called {}", sequence,
                                 a.rank, first, b.rank, second);
  if (first == second) text += " (with different rank orders: CHORUS_RANK_ORDER)";
  return text;
}

}  // namespace chorus
