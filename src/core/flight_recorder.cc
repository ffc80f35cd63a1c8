// flight_recorder.cc: the record of each rank's last operations, and its file (flight_recorder.h).
#include "src/core/flight_recorder.h"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "src/base/log.h"
#include "src/collectives/traits.h"

namespace chorus {

FlightRecorder::FlightRecorder(std::string dir, size_t capacity, int rank, int nranks, uint64_t commId)
    : dir_(std::move(dir)), capacity_(capacity == 0 ? 1 : capacity), rank_(rank), nranks_(nranks), commId_(commId) {}

void FlightRecorder::started(const PreparedOp& op) {
  if (entries_.size() >= capacity_) entries_.pop_front();
  Entry entry;
  entry.sequence = op.sequence;
  entry.collective = op.collective;
  entry.rootOrPeer = op.rootOrPeer;
  entry.call = op.what();
  entry.count = op.count;
  entry.type = op.type;
  entry.op = op.op;
  entry.algorithm = op.schedule ? op.schedule->algorithm : "";
  entry.bytes = op.count * chorusTypeSize(op.type);
  entry.startNs = op.startNs;
  entries_.push_back(std::move(entry));
}

void FlightRecorder::finished(const PreparedOp& op, chorusResult_t result, const std::string& error) {
  // The latest entry of this call (point-to-point sequences count per peer and direction).
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->sequence == op.sequence && it->collective == op.collective && it->rootOrPeer == op.rootOrPeer) {
      if (it->done) return;
      it->done = true;
      it->endNs = steadyNs();
      it->result = result;
      it->error = error;
      return;
    }
  }
}

void FlightRecorder::write(const std::string& reason, bool failure, const Wait& wait,
                           const std::vector<LinkState>& links) {
  if (!failure && wroteFailure_) return;  // what the failure left stays
  wroteFailure_ = wroteFailure_ || failure;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  nlohmann::json ops = nlohmann::json::array();
  for (const Entry& e : entries_) {
    const collectives::CollectiveTraits& traits = collectives::traitsOf(e.collective);
    nlohmann::json entry = {{"sequence", e.sequence},
                            {"collective", traits.name},
                            {"call", e.call},
                            {"count", e.count},
                            {"type", chorusTypeName(e.type)},
                            {"op", traits.reduces ? chorusOpName(e.op) : "none"},
                            {"root_or_peer", e.rootOrPeer},
                            {"algorithm", e.algorithm},
                            {"bytes", e.bytes},
                            {"start_ns", e.startNs},
                            {"end_ns", e.endNs},
                            {"state", !e.done ? "pending" : (e.result == chorusSuccess ? "done" : "failed")}};
    if (!e.error.empty()) entry["error"] = e.error;
    ops.push_back(std::move(entry));
  }
  nlohmann::json waiting = nullptr;
  if (wait.any) {
    waiting = {{"sequence", wait.sequence}, {"collective", wait.collective}, {"call", wait.call}, {"step", wait.step},
               {"peer", wait.peer},         {"bytes", wait.bytes},           {"text", wait.text}};
  }
  nlohmann::json linkList = nlohmann::json::array();
  for (const LinkState& l : links) {
    nlohmann::json link = {{"peer", l.peer},
                           {"sent_messages", l.sentMessages},
                           {"received_messages", l.receivedMessages},
                           {"received_any", l.receivedAny}};
    if (l.receivedAny) {
      link["last_collective"] = l.lastCollective;
      link["last_sequence"] = l.lastSequence;
    }
    linkList.push_back(std::move(link));
  }
  const nlohmann::json doc = {{"tool", "chorus flight recorder"},
                              {"rank", rank_},
                              {"nranks", nranks_},
                              {"comm", fmt::format("{:016x}", commId_)},
                              {"host", host},
                              {"pid", static_cast<int64_t>(getpid())},
                              {"reason", reason},
                              {"failure", failure},
                              {"written_ns", steadyNs()},
                              {"ops", ops},
                              {"waiting", waiting},
                              {"links", linkList}};
  const std::string path = fmt::format("{}/chorus-trace-{:016x}-rank{}.json", dir_, commId_, rank_);
  if (!writeFileWhole(path, doc.dump(1))) {
    logAt(LogLevel::kWarn, "rank {}: CHORUS_TRACE_DIR: cannot write {}", rank_, path);
  }
}

}  // namespace chorus
