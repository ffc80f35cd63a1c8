// stats.cc: a communicator's live statistics and their two text forms (stats.h).
#include "src/core/stats.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "src/collectives/traits.h"

namespace chorus {
namespace {

size_t bucketOf(uint64_t bytes) {
  const auto& bounds = CommStats::bucketBounds();
  for (size_t b = 0; b < bounds.size(); ++b) {
    if (bytes <= bounds[b]) return b;
  }
  return bounds.size() - 1;
}

std::string bucketLabel(size_t bucket) {
  const uint64_t bound = CommStats::bucketBounds()[bucket];
  return bound == std::numeric_limits<uint64_t>::max() ? "+Inf" : std::to_string(bound);
}

// The peer this rank waited on longest, or -1 when it never blocked.
const Executor::LinkTotals* mostWaitedOn(const std::vector<Executor::LinkTotals>& links) {
  const Executor::LinkTotals* most = nullptr;
  for (const auto& l : links) {
    if (l.waitNs > 0 && (most == nullptr || l.waitNs > most->waitNs)) most = &l;
  }
  return most;
}

}  // namespace

nlohmann::json CommStats::algorithmsOf(const Row& row) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, calls] : row.algorithms) out[name] = calls;
  return out;
}

const std::vector<uint64_t>& CommStats::bucketBounds() {
  // 1 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, then the rest.
  static const std::vector<uint64_t> bounds = {1ull << 10, 1ull << 16, 1ull << 20,
                                               1ull << 24, 1ull << 28, std::numeric_limits<uint64_t>::max()};
  return bounds;
}

CommStats::CommStats(int rank, int nranks, uint64_t commId) : rank_(rank), nranks_(nranks), commId_(commId) {}

void CommStats::finished(const PreparedOp& op, chorusResult_t result, const std::string&) {
  const uint64_t bytes = op.count * chorusTypeSize(op.type);
  const int collective = static_cast<int>(op.collective);
  const size_t bucket = bucketOf(bytes);
  Row*& slot = index_[collective][bucket];
  if (slot == nullptr) slot = &rows_[{collective, bucket}];
  Row& row = *slot;
  const int64_t now = steadyNs();
  ++row.calls;
  row.failed += result == chorusSuccess ? 0 : 1;
  row.bytes += bytes;
  row.ns += static_cast<uint64_t>(std::max<int64_t>(now - op.startNs, 0));
  const char* algorithm = op.schedule ? op.schedule->algorithm : "";
  auto it = std::find_if(row.algorithms.begin(), row.algorithms.end(),
                         [&](const auto& a) { return std::strcmp(a.first, algorithm) == 0; });
  if (it == row.algorithms.end()) {
    row.algorithms.emplace_back(algorithm, 1);
  } else {
    ++it->second;
  }
  if (write_ && periodSeconds_ > 0 && (now - lastWriteNs_) * 1e-9 >= periodSeconds_) {
    lastWriteNs_ = now;
    write_();
  }
}

void CommStats::every(double seconds, std::function<void()> write) {
  periodSeconds_ = seconds;
  write_ = std::move(write);
  lastWriteNs_ = steadyNs();
}

std::string CommStats::json(const std::vector<Executor::LinkTotals>& links, int connections) const {
  nlohmann::json calls = nlohmann::json::array();
  for (const auto& [key, row] : rows_) {
    calls.push_back({{"collective", collectives::collectiveName(static_cast<collectives::Collective>(key.first))},
                     {"bytes_at_most", bucketLabel(key.second)},
                     {"calls", row.calls},
                     {"failed", row.failed},
                     {"bytes", row.bytes},
                     {"seconds", row.ns * 1e-9},
                     {"algorithms", algorithmsOf(row)}});
  }
  nlohmann::json peers = nlohmann::json::array();
  for (const auto& l : links) {
    peers.push_back({{"peer", l.peer},
                     {"sent_messages", l.sentMessages},
                     {"sent_bytes", l.sentBytes},
                     {"received_messages", l.receivedMessages},
                     {"received_bytes", l.receivedBytes},
                     {"wait_seconds", l.waitNs * 1e-9}});
  }
  nlohmann::json hint = nullptr;
  if (const Executor::LinkTotals* most = mostWaitedOn(links)) {
    uint64_t total = 0;
    for (const auto& l : links) total += l.waitNs;
    hint = {{"peer", most->peer},
            {"wait_seconds", most->waitNs * 1e-9},
            {"share_of_waits", static_cast<double>(most->waitNs) / static_cast<double>(total)}};
  }
  const nlohmann::json doc = {{"rank", rank_},
                              {"nranks", nranks_},
                              {"comm", fmt::format("{:016x}", commId_)},
                              {"connections", connections},
                              {"collectives", calls},
                              {"peers", peers},
                              {"straggler_hint", hint}};
  return doc.dump(1) + "\n";
}

std::string CommStats::prometheus(const std::vector<Executor::LinkTotals>& links, int connections) const {
  const std::string base = fmt::format("comm=\"{:016x}\",rank=\"{}\"", commId_, rank_);
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  struct Metric {
    const char* name;
    const char* help;
    double (*value)(const Row&);
  };
  const Metric metrics[] = {
      {"chorus_calls_total", "Calls completed, by collective and size bucket (bytes of the call's count).",
       [](const Row& r) { return static_cast<double>(r.calls); }},
      {"chorus_failed_calls_total", "Calls that failed.", [](const Row& r) { return static_cast<double>(r.failed); }},
      {"chorus_bytes_total", "Bytes of the calls' counts.", [](const Row& r) { return static_cast<double>(r.bytes); }},
      {"chorus_call_seconds_total", "Time from submit to completion, summed.",
       [](const Row& r) { return r.ns * 1e-9; }},
  };
  for (const Metric& m : metrics) {
    family(m.name, "counter", m.help);
    for (const auto& [key, row] : rows_) {
      out += fmt::format("{}{{{},collective=\"{}\",le=\"{}\"}} {}\n", m.name, base,
                         collectives::collectiveName(static_cast<collectives::Collective>(key.first)),
                         bucketLabel(key.second), m.value(row));
    }
  }
  family("chorus_algorithm_calls_total", "counter", "Calls by the algorithm that ran them.");
  for (const auto& [key, row] : rows_) {
    for (const auto& [algorithm, calls] : row.algorithms) {
      out += fmt::format("chorus_algorithm_calls_total{{{},collective=\"{}\",le=\"{}\",algorithm=\"{}\"}} {}\n", base,
                         collectives::collectiveName(static_cast<collectives::Collective>(key.first)),
                         bucketLabel(key.second), algorithm, calls);
    }
  }
  const struct {
    const char* name;
    const char* help;
    double (*value)(const Executor::LinkTotals&);
  } perPeer[] = {
      {"chorus_peer_sent_bytes_total", "Bytes sent to the peer.",
       [](const Executor::LinkTotals& l) { return static_cast<double>(l.sentBytes); }},
      {"chorus_peer_received_bytes_total", "Bytes received from the peer.",
       [](const Executor::LinkTotals& l) { return static_cast<double>(l.receivedBytes); }},
      {"chorus_peer_wait_seconds_total", "Time this rank was blocked on a step with the peer.",
       [](const Executor::LinkTotals& l) { return l.waitNs * 1e-9; }},
  };
  for (const auto& m : perPeer) {
    family(m.name, "counter", m.help);
    for (const auto& l : links) out += fmt::format("{}{{{},peer=\"{}\"}} {}\n", m.name, base, l.peer, m.value(l));
  }
  family("chorus_connections", "gauge", "Peers this rank holds connections to (made when a peer is first used).");
  out += fmt::format("chorus_connections{{{}}} {}\n", base, connections);
  family("chorus_straggler_hint", "gauge", "The peer this rank waited on longest (-1: none).");
  const Executor::LinkTotals* most = mostWaitedOn(links);
  out += fmt::format("chorus_straggler_hint{{{}}} {}\n", base, most != nullptr ? most->peer : -1);
  return out;
}

std::string statsFileName(const std::string& pattern, int rank, uint64_t commId) {
  std::string name;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      const char c = pattern[i + 1];
      if (c == 'r' || c == 'c' || c == 'p' || c == '%') {
        name += c == 'r'   ? std::to_string(rank)
                : c == 'c' ? fmt::format("{:016x}", commId)
                : c == 'p' ? std::to_string(getpid())
                           : "%";
        ++i;
        continue;
      }
    }
    name += pattern[i];
  }
  return name;
}

}  // namespace chorus
