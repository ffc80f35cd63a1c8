// data.cc: corpus reading, the byte / BPE tokenizers, shards and the sampler.
#include "src/training/data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <unordered_map>

#include "chorus/error.hpp"

namespace chorus::training {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& message) { throw Error(chorusInvalidArgument, message); }

std::string readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("data: cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void splitDocuments(const std::string& text, std::vector<std::string>& out) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const bool fortunes = std::find(lines.begin(), lines.end(), "%") != lines.end();
  std::string doc;
  auto flush = [&] {
    while (!doc.empty() && doc.back() == '\n') doc.pop_back();
    if (!doc.empty()) out.push_back(doc + "\n");
    doc.clear();
  };
  for (const auto& line : lines) {
    if (fortunes ? line == "%" : line.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
    } else {
      doc += line;
      doc += '\n';
    }
  }
  flush();
}

}  // namespace

std::vector<std::string> readCorpus(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || name.starts_with(".") || ext == ".dat" || ext == ".u8") continue;
      files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  }
  if (files.empty()) fail("data: corpus '" + path + "' is not a readable file or a directory with files");
  std::vector<std::string> documents;
  for (const auto& f : files) splitDocuments(readFile(f), documents);
  if (documents.empty()) fail("data: corpus '" + path + "' holds no text");
  return documents;
}

// ---- tokenizer ----

namespace {

bool wordByte(unsigned char c) { return std::isalnum(c) != 0 || c >= 0x80; }

// GPT-2-like pre-tokenisation: " word", "word", or one other byte.
std::vector<std::string> splitWords(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && wordByte(text[j + 1])) ++j;
    if (wordByte(text[j])) {
      while (j < text.size() && wordByte(text[j])) ++j;
    } else {
      j = i + 1;
    }
    words.push_back(text.substr(i, j - i));
    i = j;
  }
  return words;
}

// Applies the merges to one word's bytes: repeatedly the pair of lowest merge index.
std::vector<int> mergeWord(const std::string& word, const std::map<std::pair<int, int>, int>& rank) {
  std::vector<int> t(word.begin(), word.end());
  for (auto& x : t) x &= 0xff;
  while (t.size() > 1) {
    int best = -1;
    for (size_t k = 0; k + 1 < t.size(); ++k) {
      auto it = rank.find({t[k], t[k + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) best = it->second;
    }
    if (best < 0) break;
    std::vector<int> next;
    for (size_t k = 0; k < t.size(); ++k) {
      const auto it = k + 1 < t.size() ? rank.find({t[k], t[k + 1]}) : rank.end();
      if (it != rank.end() && it->second == best) {
        next.push_back(256 + best);
        ++k;
      } else {
        next.push_back(t[k]);
      }
    }
    t.swap(next);
  }
  return t;
}

}  // namespace

Tokenizer Tokenizer::bytes() { return Tokenizer(); }

Tokenizer Tokenizer::trainBpe(const std::vector<std::string>& documents, int vocab) {
  if (vocab < 256) fail(fmt::format("BPE: vocab {} is below the 256 bytes", vocab));
  std::unordered_map<std::string, long> counts;
  for (const auto& d : documents) {
    for (auto& w : splitWords(d)) ++counts[w];
  }
  // Unique words in a fixed order, as symbol sequences with their counts.
  std::vector<std::pair<std::string, long>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int>> words;
  std::vector<long> weight;
  for (const auto& [w, n] : sorted) {
    std::vector<int> t(w.begin(), w.end());
    for (auto& x : t) x &= 0xff;
    if (t.size() > 1) {
      words.push_back(std::move(t));
      weight.push_back(n);
    }
  }
  Tokenizer tok;
  tok.kind_ = "bpe";
  std::map<std::pair<int, int>, long> pairs;
  while (tok.vocab() < vocab) {
    pairs.clear();
    for (size_t i = 0; i < words.size(); ++i) {
      const auto& t = words[i];
      for (size_t k = 0; k + 1 < t.size(); ++k) pairs[{t[k], t[k + 1]}] += weight[i];
    }
    // The most frequent pair; ties to the smallest pair, so the result is deterministic.
    std::pair<int, int> best{-1, -1};
    long bestCount = 1;
    for (const auto& [p, n] : pairs) {
      if (n > bestCount) {
        best = p;
        bestCount = n;
      }
    }
    if (best.first < 0) break;
    const int id = tok.vocab();
    tok.merges_.push_back(best);
    for (auto& t : words) {
      size_t out = 0;
      for (size_t k = 0; k < t.size(); ++k) {
        if (k + 1 < t.size() && t[k] == best.first && t[k + 1] == best.second) {
          t[out++] = id;
          ++k;
        } else {
          t[out++] = t[k];
        }
      }
      t.resize(out);
    }
  }
  return tok;
}

Tokenizer Tokenizer::load(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(readFile(path));
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer " + path + ": " + e.what());
  }
  Tokenizer tok;
  tok.kind_ = j.value("kind", "bytes");
  if (tok.kind_ != "bytes" && tok.kind_ != "bpe") fail("tokenizer " + path + ": unknown kind '" + tok.kind_ + "'");
  for (const auto& m : j.value("merges", nlohmann::json::array())) {
    const int a = m.at(0), b = m.at(1);
    if (a < 0 || b < 0 || a >= tok.vocab() || b >= tok.vocab()) fail("tokenizer " + path + ": bad merge");
    tok.merges_.emplace_back(a, b);
  }
  return tok;
}

void Tokenizer::save(const std::string& path) const {
  nlohmann::json j;
  j["kind"] = kind_;
  j["merges"] = nlohmann::json::array();
  for (const auto& [a, b] : merges_) j["merges"].push_back({a, b});
  std::ofstream(path) << j.dump() << "\n";
}

std::vector<int> Tokenizer::encode(const std::string& text) const {
  std::vector<int> out;
  if (merges_.empty()) {
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::map<std::pair<int, int>, int> rank;
  for (size_t i = 0; i < merges_.size(); ++i) rank.emplace(merges_[i], static_cast<int>(i));
  std::unordered_map<std::string, std::vector<int>> cache;
  for (const auto& w : splitWords(text)) {
    auto it = cache.find(w);
    if (it == cache.end()) it = cache.emplace(w, mergeWord(w, rank)).first;
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int>& tokens) const {
  std::string out;
  std::vector<int> stack;
  for (int t : tokens) {
    if (t < 0 || t >= vocab()) fail(fmt::format("tokenizer: token {} is not in [0, {})", t, vocab()));
    stack.push_back(t);
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (x < 256) {
        out += static_cast<char>(x);
      } else {
        stack.push_back(merges_[x - 256].second);
        stack.push_back(merges_[x - 256].first);
      }
    }
  }
  return out;
}

// ---- shards ----

namespace {
constexpr char kShardMagic[4] = {'C', 'H', 'T', 'K'};
}

void writeShard(const std::string& path, const std::vector<int>& tokens, int vocab) {
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  const uint32_t version = 1;
  const uint64_t count = tokens.size();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(kShardMagic, 4);
    f.write(reinterpret_cast<const char*>(&version), 2);
    f.write(reinterpret_cast<const char*>(&width), 2);
    f.write(reinterpret_cast<const char*>(&count), 8);
    if (width == 2) {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      f.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    } else {
      f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    }
    if (!f) fail("data: cannot write " + tmp);
  }
  fs::rename(tmp, path);
}

std::vector<int> readShard(const std::string& path) {
  const std::string bytes = readFile(path);
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kShardMagic, 4) != 0) fail("data: " + path + " is not a shard");
  uint16_t version = 0, width = 0;
  uint64_t count = 0;
  std::memcpy(&version, bytes.data() + 4, 2);
  std::memcpy(&width, bytes.data() + 6, 2);
  std::memcpy(&count, bytes.data() + 8, 8);
  if (version != 1 || (width != 2 && width != 4) || bytes.size() != 16 + count * width) {
    fail(fmt::format("data: shard {} is damaged (version {}, {} bytes per token, {} tokens, {} bytes)", path, version,
                     width, count, bytes.size()));
  }
  std::vector<int> tokens(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (width == 2) {
      uint16_t t;
      std::memcpy(&t, bytes.data() + 16 + 2 * i, 2);
      tokens[i] = t;
    } else {
      std::memcpy(&tokens[i], bytes.data() + 16 + 4 * i, 4);
    }
  }
  return tokens;
}

void to_json(nlohmann::json& j, const PreparedData& p) {
  j = {{"vocab", p.vocab},
       {"train_tokens", p.trainTokens},
       {"val_tokens", p.valTokens},
       {"train_shards", p.trainShards},
       {"val_shards", p.valShards}};
}
void from_json(const nlohmann::json& j, PreparedData& p) {
  p.vocab = j.at("vocab");
  p.trainTokens = j.at("train_tokens");
  p.valTokens = j.at("val_tokens");
  p.trainShards = j.at("train_shards");
  p.valShards = j.at("val_shards");
}

PreparedData prepareData(const DataSettings& s, const std::string& dir) {
  fs::create_directories(dir);
  const auto documents = readCorpus(s.corpus);
  size_t corpusBytes = 0;
  for (const auto& d : documents) corpusBytes += d.size();
  nlohmann::json want = {{"corpus", s.corpus},           {"corpus_bytes", corpusBytes}, {"documents", documents.size()},
                         {"tokenizer", s.tokenizer},     {"bpe_vocab", s.bpeVocab},     {"val_every", s.valEvery},
                         {"shard_tokens", s.shardTokens}};
  const std::string metaPath = dir + "/data.json";
  if (fs::exists(metaPath)) {
    try {
      const auto have = nlohmann::json::parse(readFile(metaPath));
      if (have.at("settings") == want) {
        PreparedData p = have.at("result").get<PreparedData>();
        p.reused = true;
        return p;
      }
    } catch (const nlohmann::json::exception&) {
      // Prepared by something else or damaged: prepared again below.
    }
  }
  if (s.valEvery < 2) fail(fmt::format("data: val_every = {} (at least 2)", s.valEvery));
  Tokenizer tok = Tokenizer::bytes();
  if (s.tokenizer == "bpe") {
    std::vector<std::string> trainDocs;
    for (size_t i = 0; i < documents.size(); ++i) {
      if (static_cast<int>(i % s.valEvery) != s.valEvery - 1) trainDocs.push_back(documents[i]);
    }
    tok = Tokenizer::trainBpe(trainDocs, s.bpeVocab);
  } else if (s.tokenizer != "bytes") {
    fail("data: tokenizer '" + s.tokenizer + "' is not 'bytes' or 'bpe'");
  }
  tok.save(dir + "/tokenizer.json");

  PreparedData p;
  p.vocab = tok.vocab();
  std::vector<int> train, val;
  for (size_t i = 0; i < documents.size(); ++i) {
    auto t = tok.encode(documents[i] + "\n");
    auto& split = static_cast<int>(i % s.valEvery) == s.valEvery - 1 ? val : train;
    split.insert(split.end(), t.begin(), t.end());
  }
  auto writeSplit = [&](const std::vector<int>& tokens, const std::string& name) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().filename().string().starts_with(name + "_")) fs::remove(e.path());
    }
    int shards = 0;
    for (size_t at = 0; at < tokens.size() || shards == 0; at += s.shardTokens) {
      const size_t end = std::min(tokens.size(), at + s.shardTokens);
      writeShard(fmt::format("{}/{}_{:05d}.bin", dir, name, shards++),
                 std::vector<int>(tokens.begin() + static_cast<long>(at), tokens.begin() + static_cast<long>(end)),
                 p.vocab);
      if (end == tokens.size()) break;
    }
    return shards;
  };
  p.trainTokens = train.size();
  p.valTokens = val.size();
  p.trainShards = writeSplit(train, "train");
  p.valShards = writeSplit(val, "val");
  nlohmann::json record = {{"settings", want}, {"result", p}};
  std::ofstream(metaPath + ".tmp") << record.dump(1) << "\n";
  fs::rename(metaPath + ".tmp", metaPath);
  return p;
}

std::vector<int> loadSplit(const std::string& dir, const std::string& split) {
  std::vector<int> stream;
  for (int i = 0;; ++i) {
    const std::string path = fmt::format("{}/{}_{:05d}.bin", dir, split, i);
    if (!fs::exists(path)) {
      if (i == 0) fail("data: no " + split + " shards in " + dir + " (prepare the data first)");
      break;
    }
    auto t = readShard(path);
    stream.insert(stream.end(), t.begin(), t.end());
  }
  return stream;
}

// ---- sampler ----

Sampler::Sampler(const std::vector<int>* stream, int seq, uint64_t seed) : stream_(stream), seq_(seq), seed_(seed) {
  windows_ = stream->size() > static_cast<size_t>(seq) ? (stream->size() - 1) / seq : 0;
  if (windows_ == 0) {
    fail(fmt::format("data: {} tokens cannot make one sequence of {} + 1 tokens", stream->size(), seq));
  }
}

size_t Sampler::windowAt(uint64_t g) const {
  const uint64_t epoch = g / windows_;
  if (epoch != cachedEpoch_) {
    // Fisher-Yates with splitmix64 seeded by (seed, epoch).
    perm_.resize(windows_);
    for (size_t i = 0; i < windows_; ++i) perm_[i] = static_cast<uint32_t>(i);
    uint64_t state = seed_ * 0x9E3779B97F4A7C15ull + epoch * 0xD1B54A32D192ED03ull + 1;
    auto next = [&state] {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    for (size_t i = windows_ - 1; i > 0; --i) std::swap(perm_[i], perm_[next() % (i + 1)]);
    cachedEpoch_ = epoch;
  }
  return perm_[g % windows_];
}

void Sampler::sample(uint64_t g, int* inputs, int* targets) const {
  const size_t start = windowAt(g) * static_cast<size_t>(seq_);
  const int* s = stream_->data() + start;
  std::memcpy(inputs, s, seq_ * sizeof(int));
  std::memcpy(targets, s + 1, seq_ * sizeof(int));
}

void Sampler::fill(long step, int m, int rank, int ranks, int micro, int accum, int* inputs, int* targets) const {
  const uint64_t global = static_cast<uint64_t>(micro) * ranks * accum;
  const uint64_t first = static_cast<uint64_t>(step) * global + (static_cast<uint64_t>(m) * ranks + rank) * micro;
  for (int i = 0; i < micro; ++i)
    sample(first + i, inputs + static_cast<size_t>(i) * seq_, targets + static_cast<size_t>(i) * seq_);
}

}  // namespace chorus::training
