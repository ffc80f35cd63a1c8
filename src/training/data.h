// data.h: the training data: a text corpus read into documents, a tokenizer (byte-level, or a
// byte-level BPE trained on the corpus), token shards on disk with a held-out validation split,
// and the deterministic sampler that hands each data-parallel rank its sequences of a step.
// Everything here is deterministic: the same corpus and settings give the same shards and batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace chorus::training {

// Documents of a corpus: a file, or every regular file of a directory in name order (files named
// *.dat, *.u8 or starting with '.' skipped). A file whose lines include a lone "%" is in fortune
// format (documents between those lines); otherwise documents are separated by blank lines.
// Throws chorus::Error naming the path when nothing can be read.
std::vector<std::string> readCorpus(const std::string& path);

// Text <-> tokens. Byte-level: vocab 256, token = byte. BPE: byte-level pairs merged in the order
// they were learnt; vocab 256 + merges.
class Tokenizer {
 public:
  static Tokenizer bytes();
  // Learns merges on the documents until the vocabulary has `vocab` entries (or no pair occurs
  // twice). Words (a run of letters or digits with the space before it, or one other byte) are
  // the units, as GPT-2's pre-tokenisation, so merges never cross word boundaries.
  static Tokenizer trainBpe(const std::vector<std::string>& documents, int vocab);
  // Reads / writes the JSON form {"kind": "bytes"|"bpe", "merges": [[a, b], ...]}.
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;

  int vocab() const { return 256 + static_cast<int>(merges_.size()); }
  const std::string& kind() const { return kind_; }
  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& tokens) const;

 private:
  std::string kind_ = "bytes";
  std::vector<std::pair<int, int>> merges_;  // merge i makes token 256 + i
};

// Token shards: a 16-byte header ("CHTK", version 1, bytes per token (2 or 4), the token count as
// uint64) then the tokens.
void writeShard(const std::string& path, const std::vector<int>& tokens, int vocab);
std::vector<int> readShard(const std::string& path);

struct DataSettings {
  std::string corpus = "/usr/share/games/fortunes";
  std::string tokenizer = "bytes";  // or "bpe"
  int bpeVocab = 1024;
  int valEvery = 20;             // every valEvery-th document is held out for validation
  size_t shardTokens = 1 << 20;  // tokens per shard file
};

// What prepareData wrote: the tokenizer's vocabulary and the token counts.
struct PreparedData {
  int vocab = 0;
  size_t trainTokens = 0, valTokens = 0;
  int trainShards = 0, valShards = 0;
  bool reused = false;  // the directory already held the same preparation
};

// Reads the corpus, makes the tokenizer (tokenizer.json), and writes train_NNNNN.bin and
// val_NNNNN.bin shards and data.json into dir. When data.json there records the same settings and
// corpus size, nothing is redone. Not for concurrent use on one dir.
PreparedData prepareData(const DataSettings& settings, const std::string& dir);

// Every shard of one split (train or val) of a prepared directory, in order, as one stream.
std::vector<int> loadSplit(const std::string& dir, const std::string& split);

// Cuts a token stream into windows of seq + 1 tokens (inputs and targets shifted by one), at
// stride seq, and visits them in a fresh seeded permutation every epoch. The global sample order
// depends only on (stream, seq, seed): sample g of the run is window perm_{g / W}[g % W].
// A step's global batch is samples [step * global, (step + 1) * global); its micro-batch m for
// data-parallel rank r holds the `micro` samples starting at (m * ranks + r) * micro: so any split
// of the same global batch over ranks and micro-batches covers the same sequences.
class Sampler {
 public:
  Sampler(const std::vector<int>* stream, int seq, uint64_t seed);
  size_t windows() const { return windows_; }
  // Fills inputs and targets (micro x seq each) for (step, micro-batch m, rank r).
  void fill(long step, int m, int rank, int ranks, int micro, int accum, int* inputs, int* targets) const;
  // Sample g's window.
  void sample(uint64_t g, int* inputs, int* targets) const;

 private:
  size_t windowAt(uint64_t g) const;
  const std::vector<int>* stream_;
  int seq_;
  uint64_t seed_;
  size_t windows_;
  mutable uint64_t cachedEpoch_ = UINT64_MAX;
  mutable std::vector<uint32_t> perm_;
};

}  // namespace chorus::training
