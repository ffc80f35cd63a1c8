// flight_recorder.h: each rank's record of its last operations (CHORUS_TRACE_DIR), written to a
// file of its own when something goes wrong, so `chorus-trace DIR` can say which rank or which
// call a hang or a failure comes from.
//
// Per communicator, the last CHORUS_TRACE_OPS calls (collectives and point-to-point): sequence,
// the call as errors name it, its signature's parts, algorithm, bytes, start and end times
// (steady clock, one clock for every process of a host), and how it ended. The file
// (DIR/chorus-trace-<comm id>-rank<r>.json) is written on a failure of the stream (a timeout, a
// peer's failure, a mismatch, an abort), on SIGUSR1 while a call waits, and when the communicator
// is destroyed (unless a failure wrote it first); with the operations it holds what the rank
// waited on then (the step, the peer, whether that peer had reached the call) and what each link
// had moved.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "src/core/executor.h"

namespace chorus {

class FlightRecorder final : public OpObserver {
 public:
  FlightRecorder(std::string dir, size_t capacity, int rank, int nranks, uint64_t commId);

  // An operation submitted, and its end (result chorusSuccess, or the error).
  void started(const PreparedOp& op) override;
  void finished(const PreparedOp& op, chorusResult_t result, const std::string& error) override;

  // What the rank waited on when the record was written: the earliest unfinished step.
  struct Wait {
    bool any = false;
    uint64_t sequence = 0;
    std::string collective;
    std::string call;
    std::string step;  // its kind: send, recv, ...
    int peer = -1;
    size_t bytes = 0;
    std::string text;  // as errors word it
  };
  struct LinkState {
    int peer = -1;
    uint64_t sentMessages = 0;
    uint64_t receivedMessages = 0;
    bool receivedAny = false;
    std::string lastCollective;  // of the last message received from the peer
    uint64_t lastSequence = 0;
  };
  // Writes the file (replacing it); `failure` marks a reason that a later write at destroy keeps.
  void write(const std::string& reason, bool failure, const Wait& wait, const std::vector<LinkState>& links);
  bool wroteFailure() const { return wroteFailure_; }

 private:
  struct Entry {
    uint64_t sequence = 0;
    collectives::Collective collective = collectives::Collective::kAllReduce;
    int rootOrPeer = -1;
    std::string call;
    size_t count = 0;
    chorusDataType_t type = chorusFloat32;
    chorusRedOp_t op = chorusSum;
    std::string algorithm;
    size_t bytes = 0;
    int64_t startNs = 0;
    int64_t endNs = 0;
    chorusResult_t result = chorusSuccess;
    bool done = false;
    std::string error;
  };
  std::string dir_;
  size_t capacity_;
  int rank_;
  int nranks_;
  uint64_t commId_;
  std::deque<Entry> entries_;
  bool wroteFailure_ = false;
};

}  // namespace chorus
