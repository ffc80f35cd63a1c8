// stats.h: a communicator's live statistics (CHORUS_STATS, on by default): per collective and
// size bucket the calls, bytes, time and algorithms; per peer the bytes and messages each way and
// how long this rank waited on it, and a straggler hint (the peer it waited on most). Read with
// chorusCommGetStats as JSON or in Prometheus' text format, and written to CHORUS_STATS_FILE at
// destroy and, with CHORUS_STATS_INTERVAL_S, every so many seconds (at the end of a call).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "src/collectives/algorithm.h"
#include "src/core/executor.h"

namespace chorus {

class CommStats final : public OpObserver {
 public:
  CommStats(int rank, int nranks, uint64_t commId);
  CommStats(const CommStats&) = delete;  // index_ points into rows_
  CommStats& operator=(const CommStats&) = delete;

  void started(const PreparedOp&) override {}
  void finished(const PreparedOp& op, chorusResult_t result, const std::string& error) override;

  // The text (chorusCommGetStats' formats: 0 JSON, 1 Prometheus) with the links' totals and the
  // connections this rank holds (transports connect when a peer is first used).
  std::string json(const std::vector<Executor::LinkTotals>& links, int connections) const;
  std::string prometheus(const std::vector<Executor::LinkTotals>& links, int connections) const;

  // Called at the end of a call once every `seconds` (0: never): the periodic file.
  void every(double seconds, std::function<void()> write);

  // Upper bounds of the size buckets, in bytes of a call's count (the last: no bound).
  static const std::vector<uint64_t>& bucketBounds();

 private:
  struct Row {
    uint64_t calls = 0;
    uint64_t failed = 0;
    uint64_t bytes = 0;
    uint64_t ns = 0;
    // By algorithm name (the schedules' static names: compared as text, no string made per call).
    std::vector<std::pair<const char*, uint64_t>> algorithms;
  };
  static nlohmann::json algorithmsOf(const Row& row);
  int rank_;
  int nranks_;
  uint64_t commId_;
  std::map<std::pair<int, size_t>, Row> rows_;  // (collective, bucket), in the order they print
  // Each (collective, bucket)'s row once made: a call's row found without a search.
  static constexpr size_t kBuckets = 6;  // bucketBounds().size()
  std::array<std::array<Row*, kBuckets>, collectives::kCollectiveCount> index_{};
  double periodSeconds_ = 0;
  int64_t lastWriteNs_ = 0;
  std::function<void()> write_;
};

// CHORUS_STATS_FILE's name for a rank: %r the rank, %c the communicator id, %p the process id.
std::string statsFileName(const std::string& pattern, int rank, uint64_t commId);

}  // namespace chorus
