// chorus-trace DIR: reads the flight recorders' files the ranks wrote under CHORUS_TRACE_DIR
// (src/core/flight_recorder.h) and says in one paragraph per communicator what happened: the
// first call where the ranks' calls differ, else the rank that never arrived at the call the
// others wait in (a rank that left no file is named as such), with each rank's call there and
// what it waited on.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace {

using nlohmann::json;

// "0, 1 and 3"
std::string listOf(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

// What must agree across ranks for a collective: everything but the algorithm and the times.
std::string signatureOf(const json& op) {
  return op.value("collective", "") + "/" + std::to_string(op.value("count", 0ull)) + "/" + op.value("type", "") + "/" +
         op.value("op", "") + "/" + std::to_string(op.value("root_or_peer", -1));
}

bool pointToPoint(const json& op) {
  const std::string c = op.value("collective", "");
  return c == "send" || c == "recv";
}

struct Rank {
  json doc;
  std::map<uint64_t, json> calls;  // collectives by sequence
  uint64_t last() const { return calls.empty() ? 0 : calls.rbegin()->first; }
};

// One communicator's files: the paragraph, then a line per rank.
void explain(const std::string& comm, const std::map<int, Rank>& ranks) {
  int nranks = 0;
  for (const auto& [r, rank] : ranks) nranks = std::max(nranks, rank.doc.value("nranks", 0));
  std::vector<int> missing;
  for (int r = 0; r < nranks; ++r) {
    if (!ranks.count(r)) missing.push_back(r);
  }
  std::printf(
      "communicator %s: %d ranks, records from %zu%s\n", comm.c_str(), nranks, ranks.size(),
      missing.empty()
          ? ""
          : (" (none from rank" + std::string(missing.size() > 1 ? "s " : " ") + listOf(missing) + ")").c_str());

  // 1. The first call the ranks made differently.
  std::set<uint64_t> sequences;
  for (const auto& [r, rank] : ranks) {
    for (const auto& [s, op] : rank.calls) sequences.insert(s);
  }
  std::string paragraph;
  for (uint64_t s : sequences) {
    std::map<std::string, std::vector<int>> bySignature;
    for (const auto& [r, rank] : ranks) {
      auto it = rank.calls.find(s);
      if (it != rank.calls.end()) bySignature[signatureOf(it->second)].push_back(r);
    }
    if (bySignature.size() < 2) continue;
    paragraph = "The ranks diverged at collective #" + std::to_string(s) + ":";
    bool first = true;
    for (const auto& [signature, who] : bySignature) {
      const json& op = ranks.at(who.front()).calls.at(s);
      paragraph += std::string(first ? "" : ";") + " rank" + (who.size() > 1 ? "s " : " ") + listOf(who) + " called " +
                   op.value("call", "");
      first = false;
    }
    paragraph += ". The first of these calls is where the program's ranks went apart; every rank failed there.";
    break;
  }

  // 2. Else the call the others wait in, and who never came to it.
  if (paragraph.empty()) {
    uint64_t stuck = UINT64_MAX;
    std::vector<int> waiting;
    for (const auto& [r, rank] : ranks) {
      for (const auto& [s, op] : rank.calls) {
        if (op.value("state", "") != "done") {
          stuck = std::min(stuck, s);
          break;
        }
      }
    }
    std::string callName;
    for (const auto& [r, rank] : ranks) {
      auto it = rank.calls.find(stuck);
      if (it != rank.calls.end() && it->second.value("state", "") != "done") {
        waiting.push_back(r);
        if (callName.empty()) callName = it->second.value("call", "");
      }
    }
    // Who the waiting ranks waited on, by their records.
    std::map<int, std::vector<int>> waitedOnBy;
    for (int r : waiting) {
      const json& w = ranks.at(r).doc["waiting"];
      if (w.is_object() && w.value("peer", -1) >= 0) waitedOnBy[w.value("peer", -1)].push_back(r);
    }
    std::vector<int> absent;  // recorded, but never reached the call
    for (const auto& [r, rank] : ranks) {
      if (stuck != UINT64_MAX && !rank.calls.count(stuck) && rank.last() < stuck) absent.push_back(r);
    }
    if (stuck == UINT64_MAX) {
      paragraph = "Every recorded call completed on every rank that left a record";
      paragraph += missing.empty() ? "."
                                   : "; rank" + std::string(missing.size() > 1 ? "s " : " ") + listOf(missing) +
                                         " left none (stopped, killed, or not recording).";
    } else if (!absent.empty()) {
      const int k = absent.front();
      const Rank& rank = ranks.at(k);
      const std::string last = rank.calls.empty() ? "none recorded"
                                                  : rank.calls.rbegin()->second.value("call", "") + ", " +
                                                        rank.calls.rbegin()->second.value("state", "");
      paragraph = "Rank " + std::to_string(k) + " never arrived at " + callName + ": its last call was " + last +
                  ", and its record was written because " + rank.doc.value("reason", "") + ". Rank" +
                  (waiting.size() > 1 ? "s " : " ") + listOf(waiting) + " waited in that call" +
                  (waitedOnBy.count(k) ? " (rank" + std::string(waitedOnBy[k].size() > 1 ? "s " : " ") +
                                             listOf(waitedOnBy[k]) + " on rank " + std::to_string(k) + " itself)"
                                       : "") +
                  ".";
    } else {
      // A rank without a record that others wait on, else the rank waited on most.
      int culprit = -1;
      for (int r : missing) {
        if (waitedOnBy.count(r)) culprit = r;
      }
      if (culprit < 0 && !missing.empty()) culprit = missing.front();
      if (culprit >= 0) {
        std::string lastMessage;
        for (int r : waitedOnBy[culprit]) {
          for (const json& link : ranks.at(r).doc["links"]) {
            if (link.value("peer", -1) == culprit && link.value("received_any", false)) {
              lastMessage =
                  link.value("last_collective", "") + " #" + std::to_string(link.value("last_sequence", 0ull));
            }
          }
        }
        paragraph = "Rank " + std::to_string(culprit) +
                    " left no record (stopped, killed, or not recording) and held the others up in " + callName +
                    ": rank" + (waiting.size() > 1 ? "s " : " ") + listOf(waiting) + " waited in that call" +
                    (waitedOnBy.count(culprit)
                         ? ", rank" + std::string(waitedOnBy[culprit].size() > 1 ? "s " : " ") +
                               listOf(waitedOnBy[culprit]) + " on rank " + std::to_string(culprit) + " itself"
                         : "") +
                    (lastMessage.empty() ? "" : " (its last message to them belonged to " + lastMessage + ")") + ".";
      } else {
        int most = -1;
        for (const auto& [peer, who] : waitedOnBy) {
          if (most < 0 || who.size() > waitedOnBy[most].size()) most = peer;
        }
        paragraph =
            "Every rank reached " + callName + "; rank" + (waiting.size() > 1 ? "s " : " ") + listOf(waiting) +
            " waited in it" +
            (most >= 0 ? ", most of them on rank " + std::to_string(most) + " (a rank slow inside the call)" : "") +
            ".";
      }
    }
  }
  std::printf("%s\n", paragraph.c_str());

  // Each rank's story: its last calls, what it waited on, why it wrote.
  for (int r = 0; r < nranks; ++r) {
    auto it = ranks.find(r);
    if (it == ranks.end()) {
      std::printf("  rank %d: no record\n", r);
      continue;
    }
    const Rank& rank = it->second;
    std::string last = "no call";
    for (auto op = rank.calls.rbegin(); op != rank.calls.rend(); ++op) {
      last = op->second.value("call", "") + " (" + op->second.value("state", "") + ")";
      break;
    }
    const json& w = rank.doc["waiting"];
    std::printf("  rank %d: last call %s; %s; record written because %s\n", r, last.c_str(),
                w.is_object() ? ("waiting: " + w.value("text", "")).c_str() : "waiting on nothing",
                rank.doc.value("reason", "").c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fprintf(stderr,
                 "usage: chorus-trace DIR\n"
                 "  DIR: the CHORUS_TRACE_DIR the ranks wrote their flight recorders' files to\n");
    return argc == 2 ? 0 : 2;
  }
  std::map<std::string, std::map<int, Rank>> comms;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1], error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("chorus-trace-", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.contains("rank") || !doc.contains("comm")) {
      std::fprintf(stderr, "chorus-trace: %s is not a flight recorder's file; skipped\n", entry.path().c_str());
      continue;
    }
    Rank rank;
    for (const json& op : doc["ops"]) {
      if (!pointToPoint(op)) rank.calls[op.value("sequence", 0ull)] = op;
    }
    rank.doc = std::move(doc);
    comms[rank.doc.value("comm", "")][rank.doc.value("rank", -1)] = std::move(rank);
  }
  if (error) {
    std::fprintf(stderr, "chorus-trace: %s: %s\n", argv[1], error.message().c_str());
    return 2;
  }
  if (comms.empty()) {
    std::fprintf(stderr, "chorus-trace: no chorus-trace-*.json under %s\n", argv[1]);
    return 1;
  }
  for (const auto& [comm, ranks] : comms) explain(comm, ranks);
  return 0;
}
