// compression.cc: the compressed all-reduce algorithms (see compression.h).
#include "src/collectives/compression.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#if defined(CHORUS_HAVE_BLAS)
#include "kernels/cpu/matmul.h"
#endif

namespace chorus::collectives {
namespace {

#if !defined(CHORUS_HAVE_BLAS)
// Built without a BLAS: parseCompressor refuses PowerSGD, so no compressor reaches a product.
void gemmMissing() {
  throw std::invalid_argument("compressor powersgd: this build of chorus has no BLAS (build with libopenblas-dev)");
}
#endif

struct Named {
  const char* name;
  CompressorKind kind;
};
constexpr Named kNames[] = {
    {"none", CompressorKind::kNone},       {"fp16", CompressorKind::kFp16},         {"bf16", CompressorKind::kBf16},
    {"qsgd", CompressorKind::kQsgd},       {"sign", CompressorKind::kSign},         {"topk", CompressorKind::kTopK},
    {"randomk", CompressorKind::kRandomK}, {"powersgd", CompressorKind::kPowerSgd},
};

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw std::invalid_argument("compressor '" + text + "': " + why +
                              " (syntax: name[:param][,key=value...]; names none fp16 bf16 qsgd sign topk randomk "
                              "powersgd; keys rank ratio levels ef warm seed min_rate whole)");
}

double number(const std::string& text, const std::string& key, const std::string& value) {
  char* end = nullptr;
  const double parsed = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(parsed)) bad(text, key + "='" + value + "' is not a number");
  return parsed;
}

size_t padded(size_t count, int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  return (count + n - 1) / n * n;
}

}  // namespace

const char* compressorName(CompressorKind kind) {
  for (const Named& n : kNames) {
    if (n.kind == kind) return n.name;
  }
  return "?";
}

CompressorSpec CompressorSpec::parse(const std::string& text) {
  CompressorSpec spec;
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  if (items.empty() || items[0].empty()) bad(text, "no compressor named");
  std::string name = items[0];
  std::string param;
  if (const size_t colon = name.find(':'); colon != std::string::npos) {
    param = name.substr(colon + 1);
    name = name.substr(0, colon);
  }
  bool known = false;
  for (const Named& n : kNames) {
    if (name == n.name) {
      spec.kind = n.kind;
      known = true;
    }
  }
  if (!known) bad(text, "unknown compressor '" + name + "'");
#if !defined(CHORUS_HAVE_BLAS)
  if (spec.kind == CompressorKind::kPowerSgd) bad(text, "powersgd needs a BLAS, and this build of chorus has none");
#endif
  // Error feedback is on where the compressor is biased.
  spec.errorFeedback = spec.kind == CompressorKind::kSign || spec.kind == CompressorKind::kTopK ||
                       spec.kind == CompressorKind::kRandomK || spec.kind == CompressorKind::kPowerSgd;
  // The positional parameter names the compressor's main setting.
  if (!param.empty()) {
    switch (spec.kind) {
      case CompressorKind::kPowerSgd:
        items.push_back("rank=" + param);
        break;
      case CompressorKind::kTopK:
      case CompressorKind::kRandomK:
        items.push_back("ratio=" + param);
        break;
      case CompressorKind::kQsgd:
        items.push_back("levels=" + param);
        break;
      default:
        bad(text, std::string(compressorName(spec.kind)) + " takes no parameter");
    }
  }
  for (size_t i = 1; i < items.size(); ++i) {
    const size_t eq = items[i].find('=');
    if (eq == std::string::npos) bad(text, "'" + items[i] + "' is not key=value");
    const std::string key = items[i].substr(0, eq);
    const std::string value = items[i].substr(eq + 1);
    static const char* const kKeys[] = {"rank", "ratio", "levels", "ef", "warm", "seed", "min_rate", "whole"};
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) bad(text, "unknown key '" + key + "'");
    if (key == "whole") {
      if (spec.kind != CompressorKind::kPowerSgd) bad(text, "whole= applies to powersgd only");
      if (value == "fp32") {
        spec.wholeEncoded = false;
      } else if (value == "bf16" || value == "fp16") {
        spec.wholeEncoded = true;
        spec.wholeCodec = value == "bf16" ? kernels::Codec::kBf16 : kernels::Codec::kFp16;
      } else {
        bad(text, "whole=" + value + " is not fp32, bf16 or fp16");
      }
      continue;
    }
    const double v = number(text, key, value);
    auto whole = [&](double lo, double hi) {
      if (v != std::floor(v) || v < lo || v > hi) {
        bad(text, key + "=" + value + " is not a whole number in [" + std::to_string(static_cast<int64_t>(lo)) + ", " +
                      std::to_string(static_cast<int64_t>(hi)) + "]");
      }
    };
    if (key == "rank") {
      whole(1, 1024);
      spec.rank = static_cast<int>(v);
    } else if (key == "ratio") {
      if (!(v > 0 && v <= 1)) bad(text, "ratio=" + value + " is not in (0, 1]");
      spec.ratio = v;
    } else if (key == "levels") {
      whole(1, 127);
      spec.levels = static_cast<int>(v);
    } else if (key == "ef") {
      whole(0, 1);
      spec.errorFeedback = v != 0;
    } else if (key == "warm") {
      whole(0, 1);
      spec.warmStart = v != 0;
    } else if (key == "seed") {
      whole(0, 9007199254740992.0);
      spec.seed = static_cast<uint64_t>(v);
    } else if (key == "min_rate") {
      if (!(v >= 1)) bad(text, "min_rate=" + value + " is below 1");
      spec.minRate = v;
    } else {
      bad(text, "unknown key '" + key + "'");
    }
  }
  if (spec.errorFeedback && (spec.kind == CompressorKind::kNone || spec.kind == CompressorKind::kFp16 ||
                             spec.kind == CompressorKind::kBf16)) {
    bad(text, "error feedback needs a compressor that drops information (not none, fp16 or bf16)");
  }
  return spec;
}

std::string CompressorSpec::text() const {
  std::string out = compressorName(kind);
  switch (kind) {
    case CompressorKind::kPowerSgd:
      out += ':';
      out += std::to_string(rank);
      out += warmStart ? ",warm=1" : ",warm=0";
      out += !wholeEncoded ? ",whole=fp32" : wholeCodec == kernels::Codec::kBf16 ? ",whole=bf16" : ",whole=fp16";
      break;
    case CompressorKind::kTopK:
    case CompressorKind::kRandomK: {
      std::ostringstream r;
      r << ratio;
      out += ':';
      out += r.str();
      break;
    }
    case CompressorKind::kQsgd:
      out += ':';
      out += std::to_string(levels);
      break;
    default:
      break;
  }
  if (kind != CompressorKind::kNone && kind != CompressorKind::kFp16 && kind != CompressorKind::kBf16) {
    out += std::string(",ef=") + (errorFeedback ? "1" : "0");
  }
  if (seed != 0) {
    out += ",seed=";
    out += std::to_string(seed);
  }
  return out;
}

uint64_t sumPayloadBytes(size_t count, int nranks) {
  if (count == 0 || nranks <= 1) return 0;
  return 2 * static_cast<uint64_t>(nranks - 1) * (padded(count, nranks) / static_cast<size_t>(nranks)) * sizeof(float);
}

uint64_t blocksPayloadBytes(size_t bytes, int nranks) {
  return nranks <= 1 ? 0 : static_cast<uint64_t>(nranks - 1) * bytes;
}

CompressedAllReduce::CompressedAllReduce(CompressorSpec spec, std::vector<TensorShape> tensors, int rank, int nranks)
    : spec_(spec), tensors_(std::move(tensors)), rank_(rank), nranks_(nranks) {
  if (tensors_.empty()) throw std::invalid_argument("a compressed all-reduce needs at least one tensor");
  for (size_t t = 0; t < tensors_.size(); ++t) {
    TensorShape& shape = tensors_[t];
    if (shape.rows > 1 && shape.count % shape.rows != 0) {
      throw std::invalid_argument("tensor " + std::to_string(t) + ": rows " + std::to_string(shape.rows) +
                                  " do not divide its count " + std::to_string(shape.count));
    }
    offsets_.push_back(count_);
    count_ += shape.count;
  }
  const bool sparse = spec_.kind == CompressorKind::kTopK || spec_.kind == CompressorKind::kRandomK;
  if (sparse && count_ > std::numeric_limits<uint32_t>::max()) {
    throw std::invalid_argument("a " + std::string(compressorName(spec_.kind)) +
                                " buffer holds at most 2^32 - 1 elements, not " + std::to_string(count_));
  }
  switch (spec_.kind) {
    case CompressorKind::kFp16:
      codec_.codec = kernels::Codec::kFp16;
      break;
    case CompressorKind::kBf16:
      codec_.codec = kernels::Codec::kBf16;
      break;
    case CompressorKind::kQsgd:
      codec_.codec = kernels::Codec::kQsgd;
      codec_.levels = spec_.levels;
      break;
    case CompressorKind::kSign:
      codec_.codec = kernels::Codec::kSign;
      break;
    case CompressorKind::kPowerSgd:
      codec_.codec = spec_.wholeCodec;
      break;
    default:
      break;
  }
  if (spec_.errorFeedback) error_.assign(count_, 0.0f);
  contribution_.assign(count_, 0.0f);
  for (const TensorShape& shape : tensors_) {
    const size_t k = static_cast<size_t>(std::ceil(spec_.ratio * static_cast<double>(shape.count)));
    keep_.push_back(std::min(shape.count, std::max<size_t>(1, k)));
    if (spec_.kind != CompressorKind::kPowerSgd) continue;
    const size_t rows = shape.rows;
    const size_t cols = rows > 0 ? shape.count / rows : 0;
    const double r = spec_.rank;
    const bool matrix = rows > 1 && cols > 1;
    const bool gains =
        matrix && r * static_cast<double>(rows + cols) * spec_.minRate <= static_cast<double>(shape.count);
    compressedTensor_.push_back(gains);
    q_.emplace_back();
  }
}

void CompressedAllReduce::run(const float* input, float* output, size_t count, bool average, Exchange& exchange) {
  if (count != count_) {
    throw std::invalid_argument("the compressed all-reduce was made for " + std::to_string(count_) + " elements, not " +
                                std::to_string(count));
  }
  work_.assign(input, input + count_);
  if (spec_.errorFeedback) {
    for (size_t i = 0; i < count_; ++i) work_[i] += error_[i];
  }
  switch (spec_.kind) {
    case CompressorKind::kNone:
      runNone(output, exchange);
      break;
    case CompressorKind::kFp16:
    case CompressorKind::kBf16:
    case CompressorKind::kQsgd:
    case CompressorKind::kSign:
      runCodec(output, exchange);
      break;
    case CompressorKind::kTopK:
      runTopK(output, exchange);
      break;
    case CompressorKind::kRandomK:
      runRandomK(output, exchange);
      break;
    case CompressorKind::kPowerSgd:
      runPowerSgd(output, exchange);
      break;
  }
  // Every algorithm leaves the sum; the codecs' is the mean (they scale before rounding).
  const bool leftMean = spec_.kind == CompressorKind::kFp16 || spec_.kind == CompressorKind::kBf16 ||
                        spec_.kind == CompressorKind::kQsgd || spec_.kind == CompressorKind::kSign;
  if (average != leftMean) {
    const float factor = average ? 1.0f / static_cast<float>(nranks_) : static_cast<float>(nranks_);
    for (size_t i = 0; i < count_; ++i) output[i] *= factor;
  }
  ++calls_;
}

size_t CompressedAllReduce::keptTotal() const {
  size_t total = 0;
  for (size_t k : keep_) total += k;
  return total;
}

void CompressedAllReduce::keepError() {
  if (!spec_.errorFeedback) return;
  for (size_t i = 0; i < count_; ++i) error_[i] = work_[i] - contribution_[i];
}

void CompressedAllReduce::runNone(float* output, Exchange& exchange) {
  std::copy(work_.begin(), work_.end(), contribution_.begin());
  std::copy(work_.begin(), work_.end(), output);
  exchange.sum(output, count_);
}

void CompressedAllReduce::codecMean(const float* in, size_t count, float* contribution, float* out,
                                    Exchange& exchange) {
  const size_t n = static_cast<size_t>(nranks_);
  const size_t shard = padded(count, nranks_) / n;
  const size_t block = kernels::encodedBytes(codec_, shard);
  // Each rank encodes x / n, shard by shard (padding zeros), and sends shard j to its owner j.
  floats_.assign(shard * n, 0.0f);
  const float inverse = 1.0f / static_cast<float>(nranks_);
  for (size_t i = 0; i < count; ++i) floats_[i] = in[i] * inverse;
  bytes_.assign(block * n, 0);
  for (size_t j = 0; j < n; ++j) {
    kernels::encode(codec_, floats_.data() + j * shard, shard, kernels::mixSeed(spec_.seed, calls_, rank_, j),
                    bytes_.data() + j * block);
  }
  // The contribution is what the encoding decodes to (times n).
  std::fill(contribution, contribution + count, 0.0f);
  std::vector<float> decoded(shard);
  for (size_t j = 0; j < n; ++j) {
    std::fill(decoded.begin(), decoded.end(), 0.0f);
    kernels::decodeAdd(codec_, bytes_.data() + j * block, shard, static_cast<float>(nranks_), decoded.data());
    const size_t begin = j * shard;
    const size_t end = std::min(count, begin + shard);
    for (size_t i = begin; i < end; ++i) contribution[i] = decoded[i - begin];
  }
  received_.resize(block * n);
  exchange.allToAll(bytes_.data(), received_.data(), block);
  // The owner sums its shard from every rank in fp32, in rank order, and encodes the mean once.
  std::vector<float> mean(shard, 0.0f);
  for (size_t r = 0; r < n; ++r) kernels::decodeAdd(codec_, received_.data() + r * block, shard, 1.0f, mean.data());
  const bool ownerFeedback = spec_.kind == CompressorKind::kSign && spec_.errorFeedback;
  if (ownerFeedback) {
    ownerError_.resize(shard, 0.0f);
    ownerBegin_ = static_cast<size_t>(rank_) * shard;
    for (size_t i = 0; i < shard; ++i) mean[i] += ownerError_[i];
  }
  std::vector<uint8_t> owned(block);
  kernels::encode(codec_, mean.data(), shard, kernels::mixSeed(spec_.seed, calls_, rank_, n + 1), owned.data());
  if (ownerFeedback) {
    std::vector<float> sent(shard, 0.0f);
    kernels::decodeAdd(codec_, owned.data(), shard, 1.0f, sent.data());
    for (size_t i = 0; i < shard; ++i) ownerError_[i] = mean[i] - sent[i];
  }
  exchange.allGather(owned.data(), received_.data(), block);
  floats_.assign(shard * n, 0.0f);
  for (size_t j = 0; j < n; ++j) {
    kernels::decodeAdd(codec_, received_.data() + j * block, shard, 1.0f, floats_.data() + j * shard);
  }
  std::copy(floats_.begin(), floats_.begin() + static_cast<std::ptrdiff_t>(count), out);
}

void CompressedAllReduce::ownerError(float* out) const {
  std::fill(out, out + count_, 0.0f);
  for (size_t i = 0; i < ownerError_.size() && ownerBegin_ + i < count_; ++i) out[ownerBegin_ + i] = ownerError_[i];
}

void CompressedAllReduce::runCodec(float* output, Exchange& exchange) {
  codecMean(work_.data(), count_, contribution_.data(), output, exchange);
  keepError();
}

void CompressedAllReduce::runTopK(float* output, Exchange& exchange) {
  const size_t total = keptTotal();
  // One message: total values, then total indices (into the whole buffer).
  std::vector<uint32_t> packed(2 * total);
  float* values = reinterpret_cast<float*>(packed.data());
  uint32_t* indices = packed.data() + total;
  size_t at = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    kernels::topKIndices(work_.data() + offsets_[t], tensors_[t].count, keep_[t], indices + at, scratch_);
    for (size_t i = 0; i < keep_[t]; ++i) {
      indices[at + i] += static_cast<uint32_t>(offsets_[t]);
      values[at + i] = work_[indices[at + i]];
    }
    at += keep_[t];
  }
  std::fill(contribution_.begin(), contribution_.end(), 0.0f);
  for (size_t i = 0; i < total; ++i) contribution_[indices[i]] = values[i];
  keepError();
  const size_t block = packed.size() * sizeof(uint32_t);
  received_.resize(block * static_cast<size_t>(nranks_));
  exchange.allGather(packed.data(), received_.data(), block);
  std::fill(output, output + count_, 0.0f);
  for (int r = 0; r < nranks_; ++r) {
    const uint8_t* from = received_.data() + static_cast<size_t>(r) * block;
    for (size_t i = 0; i < total; ++i) {
      float value;
      uint32_t index;
      std::memcpy(&value, from + i * sizeof(float), sizeof(float));
      std::memcpy(&index, from + (total + i) * sizeof(uint32_t), sizeof(uint32_t));
      if (index >= count_)
        throw std::runtime_error("top-k: rank " + std::to_string(r) + " sent index " + std::to_string(index) +
                                 " beyond the buffer");
      output[index] += value;
    }
  }
}

void CompressedAllReduce::drawRandomK(size_t t, uint32_t* out) {
  kernels::randomKIndices(kernels::mixSeed(spec_.seed, calls_, t, 0x72616e646f6dull), tensors_[t].count, keep_[t], out,
                          marks_);
  for (size_t i = 0; i < keep_[t]; ++i) out[i] += static_cast<uint32_t>(offsets_[t]);
}

void CompressedAllReduce::runRandomK(float* output, Exchange& exchange) {
  const size_t total = keptTotal();
  indices_.resize(total);
  size_t at = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    drawRandomK(t, indices_.data() + at);
    at += keep_[t];
  }
  floats_.resize(total);
  for (size_t i = 0; i < total; ++i) floats_[i] = work_[indices_[i]];
  std::fill(contribution_.begin(), contribution_.end(), 0.0f);
  for (size_t i = 0; i < total; ++i) contribution_[indices_[i]] = floats_[i];
  keepError();
  exchange.sum(floats_.data(), total);
  std::fill(output, output + count_, 0.0f);
  for (size_t i = 0; i < total; ++i) output[indices_[i]] = floats_[i];
}

CompressedAllReduce::PowerSgdCounts CompressedAllReduce::powerSgdCounts() const {
  const size_t r = static_cast<size_t>(spec_.rank);
  PowerSgdCounts c;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (compressedTensor_[t]) {
      c.first += tensors_[t].rows * r;
      c.second += tensors_[t].count / tensors_[t].rows * r;
    } else {
      (spec_.wholeEncoded ? c.whole : c.first) += tensors_[t].count;
    }
  }
  return c;
}

void CompressedAllReduce::runPowerSgd(float* output, Exchange& exchange) {
#if !defined(CHORUS_HAVE_BLAS)
  (void)output;
  (void)exchange;
  gemmMissing();
#else
  const size_t r = static_cast<size_t>(spec_.rank);
  // First message: each compressed matrix's P = M Q, then (whole=fp32) every uncompressed tensor.
  const bool encoded = spec_.wholeEncoded;
  const auto [first, second, whole] = powerSgdCounts();
  std::vector<float> ps(first);
  std::vector<float> qs(second);
  std::vector<float> wholes(whole);
  size_t at = 0;
  size_t wholeAt = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const float* m = work_.data() + offsets_[t];
    if (!compressedTensor_[t]) {
      float* to = encoded ? wholes.data() + wholeAt : ps.data() + at;
      std::copy(m, m + tensors_[t].count, to);
      (encoded ? wholeAt : at) += tensors_[t].count;
      continue;
    }
    const size_t rows = tensors_[t].rows;
    const size_t cols = tensors_[t].count / rows;
    std::vector<float>& q = q_[t];
    if (q.empty() || !spec_.warmStart) {
      // Every rank draws the same Q: from the seed, the tensor and (without warm start) the call.
      q.resize(cols * r);
      const uint64_t seed = kernels::mixSeed(spec_.seed, t, spec_.warmStart ? 0 : calls_ + 1, 0x706f776572ull);
      for (size_t i = 0; i < q.size(); ++i) q[i] = kernels::randomNormal(seed, i);
    }
    kernels::gemm(false, false, static_cast<int>(rows), static_cast<int>(r), static_cast<int>(cols), 1.0f, m,
                  static_cast<int>(cols), q.data(), static_cast<int>(r), 0.0f, ps.data() + at, static_cast<int>(r));
    at += rows * r;
  }
  exchange.sum(ps.data(), first);
  // Orthonormalize each P (the same bits on every rank, so the same basis), then Q = M^T P.
  at = 0;
  size_t qAt = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (!compressedTensor_[t]) {
      if (!encoded) at += tensors_[t].count;
      continue;
    }
    const size_t rows = tensors_[t].rows;
    const size_t cols = tensors_[t].count / rows;
    float* p = ps.data() + at;
    kernels::orthonormalizeColumns(p, rows, r);
    const float* m = work_.data() + offsets_[t];
    kernels::gemm(true, false, static_cast<int>(cols), static_cast<int>(r), static_cast<int>(rows), 1.0f, m,
                  static_cast<int>(cols), p, static_cast<int>(r), 0.0f, qs.data() + qAt, static_cast<int>(r));
    // This rank's contribution P Q^T.
    float* mine = contribution_.data() + offsets_[t];
    kernels::gemm(false, true, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(r), 1.0f, p,
                  static_cast<int>(r), qs.data() + qAt, static_cast<int>(r), 0.0f, mine, static_cast<int>(cols));
    at += rows * r;
    qAt += cols * r;
  }
  // The tensors sent whole in 16 bits: their mean through the codec exchange, times n for the sum.
  std::vector<float> wholeContribution(whole);
  std::vector<float> wholeMean(whole);
  if (encoded && whole > 0) codecMean(wholes.data(), whole, wholeContribution.data(), wholeMean.data(), exchange);
  exchange.sum(qs.data(), second);
  at = 0;
  qAt = 0;
  wholeAt = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    float* out = output + offsets_[t];
    float* mine = contribution_.data() + offsets_[t];
    const size_t count = tensors_[t].count;
    if (!compressedTensor_[t]) {
      if (encoded) {
        const float n = static_cast<float>(nranks_);
        for (size_t i = 0; i < count; ++i) out[i] = wholeMean[wholeAt + i] * n;
        std::copy(wholeContribution.data() + wholeAt, wholeContribution.data() + wholeAt + count, mine);
        wholeAt += count;
      } else {
        std::copy(ps.data() + at, ps.data() + at + count, out);
        std::copy(work_.data() + offsets_[t], work_.data() + offsets_[t] + count, mine);
        at += count;
      }
      continue;
    }
    const size_t rows = tensors_[t].rows;
    const size_t cols = count / rows;
    const float* q = qs.data() + qAt;
    kernels::gemm(false, true, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(r), 1.0f,
                  ps.data() + at, static_cast<int>(r), q, static_cast<int>(r), 0.0f, out, static_cast<int>(cols));
    // Warm start: the next call begins from this call's mean Q.
    const float inverse = 1.0f / static_cast<float>(nranks_);
    for (size_t i = 0; i < cols * r; ++i) q_[t][i] = q[i] * inverse;
    at += rows * r;
    qAt += cols * r;
  }
  keepError();
#endif
}

uint64_t CompressedAllReduce::payloadBytes() const { return payloadBytesFor(nranks_); }

uint64_t CompressedAllReduce::payloadBytesFor(int nranks) const {
  const size_t n = static_cast<size_t>(nranks);
  switch (spec_.kind) {
    case CompressorKind::kNone:
      return sumPayloadBytes(count_, nranks);
    case CompressorKind::kFp16:
    case CompressorKind::kBf16:
    case CompressorKind::kQsgd:
    case CompressorKind::kSign:
      return 2 * blocksPayloadBytes(kernels::encodedBytes(codec_, padded(count_, nranks) / n), nranks);
    case CompressorKind::kTopK:
      return blocksPayloadBytes(keptTotal() * (sizeof(float) + sizeof(uint32_t)), nranks);
    case CompressorKind::kRandomK:
      return sumPayloadBytes(keptTotal(), nranks);
    case CompressorKind::kPowerSgd: {
      const auto [first, second, whole] = powerSgdCounts();
      const uint64_t wholeBytes =
          whole == 0 ? 0 : 2 * blocksPayloadBytes(kernels::encodedBytes(codec_, padded(whole, nranks) / n), nranks);
      return sumPayloadBytes(first, nranks) + sumPayloadBytes(second, nranks) + wholeBytes;
    }
  }
  return 0;
}

double CompressedAllReduce::ratio() const {
  const int n = std::max(nranks_, 2);  // one rank sends nothing: compare as two would
  const uint64_t mine = payloadBytesFor(n);
  const uint64_t plain = sumPayloadBytes(count_, n);
  if (mine == 0) return 1.0;
  return static_cast<double>(plain) / static_cast<double>(mine);
}

}  // namespace chorus::collectives
