// compression.h: compressed all-reduce of fp32 gradients. A compressor turns each rank's tensor
// into less data, the ranks exchange that, and every rank ends with the same estimate of the sum
// (or mean). The algorithms here are sequences of local compute (kernels/cpu/compress.h, BLAS) and
// three exchanges that the runtime provides (Exchange): a sum of floats, an all-to-all and an
// all-gather of bytes. No I/O and no threads here.
//
//   none      the fp32 sum (reduce-scatter + all-gather).
//   fp16/bf16 each rank's x/n in 16 bits; the owner of each 1/n shard sums the n shards in fp32
//             and rounds once; the rounded shards are all-gathered. Two roundings in all, however
//             many ranks.
//   qsgd:s    as bf16 with QSGD's s-level stochastic quantizer (unbiased) on both hops.
//   sign      scaled sign (1 bit per element, a scale per bucket), with error feedback on the
//             ranks and on the shard owners (as 1-bit Adam).
//   topk:f    the fraction f of each tensor's entries largest in magnitude, with error feedback;
//             values and indices are all-gathered (top-k is not linear: bytes grow with ranks).
//   randomk:f f of each tensor's entries at indices every rank draws alike from a shared seed,
//             summed (linear), with error feedback.
//   powersgd:r  rank-r PowerSGD (Vogels et al. 2019): each matrix M (the tensor viewed as rows x
//             count/rows) plus its error gives P = MQ, P summed and orthonormalized, Q = M^T P
//             summed; the estimate is P Q^T. Q starts from a shared-seed Gaussian and is kept
//             for the next call (warm start). Tensors where r (rows + cols) * min_rate > rows *
//             cols, and vectors, are sent whole: in bf16 through the codec exchange (whole=bf16,
//             the default), or summed in fp32 in the same message as the Ps (whole=fp32, as
//             PyTorch's hook does).
//
// Specs: "name[:param][,key=value...]"; keys rank, ratio, levels, ef (0/1), warm (0/1), seed,
// min_rate, whole (fp32/bf16/fp16). E.g. "powersgd:4", "topk:0.01,ef=0", "qsgd:15".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/compress.h"

namespace chorus::collectives {

enum class CompressorKind { kNone, kFp16, kBf16, kQsgd, kSign, kTopK, kRandomK, kPowerSgd };

struct CompressorSpec {
  CompressorKind kind = CompressorKind::kNone;
  int rank = 4;         // powersgd
  double ratio = 0.01;  // topk, randomk: the fraction of each tensor's elements sent
  int levels = 15;      // qsgd
  bool errorFeedback = false;
  bool warmStart = true;  // powersgd
  uint64_t seed = 0;
  double minRate = 2;  // powersgd: compress a matrix only where it shrinks at least this much
  // powersgd: how the tensors sent whole travel: summed in fp32 (false), or in wholeCodec.
  bool wholeEncoded = true;
  kernels::Codec wholeCodec = kernels::Codec::kBf16;

  // Throws chorusInvalidArgument naming the spec and what is wrong.
  static CompressorSpec parse(const std::string& text);
  // The spec in parse's syntax, every setting written out.
  std::string text() const;
  // Whether the result is a sum of what each rank contributes (so bytes stay flat in ranks).
  bool linear() const { return kind != CompressorKind::kTopK; }
};

const char* compressorName(CompressorKind kind);

// One tensor of a compressed buffer: its elements, and the rows PowerSGD views it as (count /
// rows columns); rows 0 or 1 (or count) marks a vector.
struct TensorShape {
  size_t count = 0;
  size_t rows = 0;
};

// The collectives a compressed all-reduce needs, provided by the runtime.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // data[i] = the sum over ranks of data[i], the same bits on every rank.
  virtual void sum(float* data, size_t count) = 0;
  // Block j (bytes each) of send goes to rank j; block j of recv comes from rank j.
  virtual void allToAll(const void* send, void* recv, size_t bytes) = 0;
  // Block j (bytes each) of recv is rank j's send.
  virtual void allGather(const void* send, void* recv, size_t bytes) = 0;
};

// The bytes one rank sends for each exchange, payload only (what transports add is theirs):
// sum as reduce-scatter + all-gather of count padded to a multiple of nranks; all-to-all and
// all-gather as (nranks - 1) blocks.
uint64_t sumPayloadBytes(size_t count, int nranks);
uint64_t blocksPayloadBytes(size_t bytes, int nranks);

// The persistent state of compressed all-reduces of one buffer (its tensors back to back): error
// feedback memories, PowerSGD's Qs, the call count that seeds shared draws. Every rank makes one
// with the same spec and shapes and calls it in the same order.
class CompressedAllReduce {
 public:
  // Throws chorusInvalidArgument (a shape whose rows do not divide its count, no tensors, a
  // buffer over 2^32 elements for the sparsifiers).
  CompressedAllReduce(CompressorSpec spec, std::vector<TensorShape> tensors, int rank, int nranks);

  // output = the sum over ranks of input (or the mean), compressed; output may equal input.
  void run(const float* input, float* output, size_t count, bool average, Exchange& exchange);

  const CompressorSpec& spec() const { return spec_; }
  size_t count() const { return count_; }
  // Payload bytes this rank sends per call, by formula from the exchanges it makes.
  uint64_t payloadBytes() const;
  // The compression ratio: the payload bytes of the fp32 all-reduce (sum) of the buffer over the
  // payload bytes of this one, with this many ranks (two where there is one).
  double ratio() const;
  uint64_t calls() const { return calls_; }
  // The error-feedback memory, count floats (zero where there is none).
  std::span<const float> error() const { return error_; }
  // This rank's own compressed contribution of the last call, before the exchange (where the
  // compressor has one: error feedback conserves input + old error = contribution + new error).
  std::span<const float> contribution() const { return contribution_; }
  // The second hop's error-feedback memory (sign), count floats: this rank's shard's, zero elsewhere.
  void ownerError(float* out) const;
  // PowerSGD: which tensors are compressed (true) or sent whole.
  const std::vector<bool>& compressed() const { return compressedTensor_; }

 private:
  uint64_t payloadBytesFor(int nranks) const;
  size_t keptTotal() const;  // topk, randomk: elements sent per call
  void keepError();          // error = work - contribution, with error feedback
  void runNone(float* output, Exchange& exchange);
  // The codec exchange of count floats: each rank's in / n encoded shard by shard and sent to the
  // shard's owner, summed there in fp32 and encoded once, all-gathered. out = the mean;
  // contribution = what this rank's encoding decodes to, times n.
  void codecMean(const float* in, size_t count, float* contribution, float* out, Exchange& exchange);
  void runCodec(float* output, Exchange& exchange);
  void runTopK(float* output, Exchange& exchange);
  void runRandomK(float* output, Exchange& exchange);
  void runPowerSgd(float* output, Exchange& exchange);
  // PowerSGD's floats per call: in the P message (Ps, and the whole tensors with whole=fp32), in
  // the Q message, and sent whole through the codec exchange.
  struct PowerSgdCounts {
    size_t first = 0, second = 0, whole = 0;
  };
  PowerSgdCounts powerSgdCounts() const;
  // Indices every rank draws alike for tensor t this call, offset into the buffer.
  void drawRandomK(size_t t, uint32_t* out);

  CompressorSpec spec_;
  std::vector<TensorShape> tensors_;
  std::vector<size_t> offsets_;  // of each tensor in the buffer
  std::vector<size_t> keep_;     // topk, randomk: elements kept per tensor
  int rank_;
  int nranks_;
  size_t count_ = 0;
  uint64_t calls_ = 0;
  kernels::CodecParams codec_;
  std::vector<float> work_;  // input + error
  std::vector<float> error_;
  std::vector<float> contribution_;
  std::vector<float> ownerError_;  // sign: the error of this rank's shard of the sum
  size_t ownerBegin_ = 0;          // where that shard starts
  std::vector<bool> compressedTensor_;
  std::vector<std::vector<float>> q_;  // powersgd: each compressed tensor's Q (cols x rank)
  std::vector<uint8_t> bytes_;
  std::vector<uint8_t> received_;
  std::vector<float> floats_;
  std::vector<uint32_t> indices_;
  std::vector<uint32_t> scratch_;
  std::vector<uint64_t> marks_;
};

}  // namespace chorus::collectives
