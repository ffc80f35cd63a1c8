// collective_checks.h: one call of each collective on this rank with inputs built from (rank,
// index), and the result compared with the closed form (tests/support/pattern.h). gtest assertions;
// for the forked multi-process tests.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <initializer_list>

namespace chorus::testing {

void checkAllReduce(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                    bool inPlace);
void checkReduceScatter(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                        bool inPlace);
void checkReduce(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, chorusRedOp_t op,
                 bool inPlace, int root);
void checkAllGather(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace);
void checkBroadcast(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root);
// A ring shift of send/recv in a group, and (even n) the blocking ungrouped exchange.
void checkSendRecv(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type);
void checkAllToAll(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type);
// Sizes vary per pair: rank r sends (r + 2j) % 3 + count elements to rank j.
void checkAllToAllv(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type);
void checkGather(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root);
void checkScatter(chorusComm_t comm, int rank, int n, size_t count, chorusDataType_t type, bool inPlace, int root);

// The checks' buffers come from chorusMemAlloc (true) or the heap (false, the default).
void useChorusMemAlloc(bool shared);

// Every collective above over counts x types x (in place, out of place), the reductions for each
// op, roots varying by case; the send/recv shift too when withSendRecv. Stops at a fatal failure.
void checkEveryCollective(chorusComm_t comm, int rank, int n, std::initializer_list<size_t> counts,
                          std::initializer_list<chorusDataType_t> types, std::initializer_list<chorusRedOp_t> ops,
                          bool withSendRecv);

}  // namespace chorus::testing
