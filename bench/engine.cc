// engine.cc: collbench's engine (engine.h).
#include "bench/engine.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/launch.h"
#include "kernels/cpu/copy.h"
#include "tests/support/pattern.h"

namespace chorus::bench {

// The median of the values (the mean of the middle two when their number is even); 0 if none.
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size();
  return (values[(m - 1) / 2] + values[m / 2]) / 2;
}

const char* nameOf(Op op) {
  for (const OpInfo& info : kOps) {
    if (info.op == op) return info.name;
  }
  return "?";
}

chorusCollectiveInfo_t infoOf(Op op, int nranks, size_t count) {
  chorusCollectiveInfo_t info{};
  for (const OpInfo& entry : kOps) {
    if (entry.op != op) continue;
    if (chorusGetCollectiveInfo(entry.collective, nranks, count, &info) != chorusSuccess) {
      throw std::runtime_error(chorusGetLastError(nullptr));
    }
    if (op == Op::kSendRecv) info.outputElements = info.inputElements;
    // alltoallv's counts are the call's: collbench sends count x n elements from each rank (its
    // size, as the all-to-all's), and receives what zipfCounts deals it (sized in fillInputs).
    if (op == Op::kAllToAllv) info.inputElements = info.outputElements = info.wholeElements = count * nranks;
    return info;
  }
  throw std::logic_error("collbench: an op without a collective");
}

std::vector<size_t> zipfCounts(size_t count, int nranks, double exponent) {
  const size_t n = static_cast<size_t>(nranks), total = count * n;
  std::vector<double> weight(n);
  double sum = 0;
  for (size_t p = 0; p < n; ++p) sum += weight[p] = std::pow(static_cast<double>(p + 1), -exponent);
  std::vector<size_t> counts(n);
  size_t dealt = 0;
  for (size_t p = 0; p < n; ++p) dealt += counts[p] = static_cast<size_t>(std::floor(total * weight[p] / sum));
  for (size_t p = 0; dealt < total; p = (p + 1) % n, ++dealt) ++counts[p];
  return counts;
}

const OpInfo* findOp(const std::string& name) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

bool writeJson(const std::string& path, const nlohmann::json& doc) {
  return chorus::bench::writeOutput(path, doc.dump(2) + "\n");
}

void printColumnHeader(bool algoColumn, const std::vector<std::string>& peers, bool bound) {
  auto line = [&](const char* a, const char* b, const char* c, const char* d, const char* e, const char* algo,
                  const char* f, const char* g, const char* h, const char* i, const char* j, const char* k,
                  const char* l, const char* m, int row) {
    std::printf("# %10s  %12s  %8s  %6s  %6s", a, b, c, d, e);
    if (algoColumn) std::printf("  %20s", algo);
    std::printf("  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s", f, g, h, i, j, k, l, m);
    for (const std::string& peer : peers) {
      const std::string ratio = "x " + peer;
      const char* first = row == 0 ? peer.c_str() : row == 1 ? "busbw" : "(GB/s)";
      std::printf("  %7s  %7s", first, row == 1 ? ratio.c_str() : "");
    }
    if (bound) std::printf("  %6s", row == 1 ? "%bound" : "");
    std::printf("\n");
  };
  std::printf("#\n");
  line("", "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", "", 0);
  line("size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
       "#wrong", 1);
  line("(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 2);
  std::fflush(stdout);
}

void printRow(size_t bytes, size_t count, chorusDataType_t type, const char* redop, int root, const char* algo,
              const Result& outOfPlace, const std::string& outWrong, const Result& inPlace, const std::string& inWrong,
              const std::string& tail) {
  std::printf("  %10zu  %12zu  %8s  %6s  %6d", bytes, count, chorusTypeName(type), redop, root);
  if (algo != nullptr) std::printf("  %20s", algo);
  std::printf("  %9.2f  %7.2f  %7.2f  %6s  %9.2f  %7.2f  %7.2f  %6s%s\n", outOfPlace.timeUs, outOfPlace.algbw,
              outOfPlace.busbw, outWrong.c_str(), inPlace.timeUs, inPlace.algbw, inPlace.busbw, inWrong.c_str(),
              tail.c_str());
  std::fflush(stdout);
}

// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
double busFactor(Op op, int nranks) {
  const double n = nranks;
  switch (op) {
    case Op::kAllReduce:
      return 2 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
    case Op::kAllToAll:
    case Op::kAllToAllv:
    case Op::kGather:
    case Op::kScatter:
      return (n - 1) / n;
    default:
      return 1;
  }
}

// The least traffic a collective of `bytes` (nccl-tests' size) on n ranks needs, in copies of
// that size (a copy reads and writes each byte once): every input byte a rank needs read once and
// every output byte written once. An all-reduce reads n inputs and writes n outputs of the size:
// n copies; a reduce-scatter reads n inputs and writes n outputs of 1/n of it: (n + 1) / 2. The
// bound's time is copies * bytes over the copy bandwidth of all ranks at once (docs/collbench.md: --bound).
double boundCopies(Op op, int nranks) {
  const double n = nranks;
  switch (op) {
    case Op::kAllReduce:
    case Op::kAllGather:
    case Op::kAllToAll:
    case Op::kAllToAllv:
    case Op::kBroadcast:
    case Op::kSendRecv:
      return n;
    case Op::kReduceScatter:
    case Op::kReduce:
      return (n + 1) / 2;
    case Op::kGather:
    case Op::kScatter:
      return 1;
    default:
      return 0;  // a barrier moves no data
  }
}

// Buffers: send holds the call's input, recv its output; sizes per op in elements:
//   allreduce, broadcast, reduce, sendrecv: count in, count out
//   allgather, gather: count in, count*n out;  reducescatter, scatter: count*n in, count out;
//   alltoall: count*n in and out (count per peer);
//   alltoallv: count*n in, dealt by zipfCounts; out: what the others deal this rank.
void Bench::setVectorCounts(size_t count, double exponent) {
  sendCounts_ = zipfCounts(count, nranks_, exponent);
  recvCounts_.assign(static_cast<size_t>(nranks_), sendCounts_[static_cast<size_t>(rank_)]);
  for (auto [counts, displs] : {std::pair{&sendCounts_, &sendDispls_}, std::pair{&recvCounts_, &recvDispls_}}) {
    displs->assign(counts->size(), 0);
    for (size_t p = 1; p < counts->size(); ++p) (*displs)[p] = (*displs)[p - 1] + (*counts)[p - 1];
  }
}

void Bench::fillInputs(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  using chorus::pattern::store;
  const size_t size = chorusTypeSize(type);
  const chorusCollectiveInfo_t info = infoOf(op, nranks_, count);
  const size_t inCount = info.inputElements;
  size_t outCount = info.outputElements;
  if (op == Op::kAllToAll || op == Op::kAllToAllv) {
    setVectorCounts(count, op == Op::kAllToAllv ? o_.zipf : 0.0);  // an all-to-all's: count to each
    outCount = recvDispls_.back() + recvCounts_.back();
  }
  sendBytes_ = inCount * size + 64;
  recvBytes_ = std::max(outCount, inCount) * size + 64;
  send_.assign(sendBytes_, 0);
  recv_.assign(recvBytes_, 0);
  if (device_) {
    deviceSend_ = device_->reserve(0, sendBytes_);
    deviceRecv_ = device_->reserve(1, recvBytes_);
  }
  selectBuffers(op, count, size, inPlace);
  for (size_t i = 0; i < inCount; ++i) {
    store(sendPtr_, i, type,
          info.reduces ? chorus::pattern::reduceInput(redop, type, rank_, i) : chorus::pattern::moveInput(rank_, i));
  }
  if (device_) {
    device_->upload(deviceSend_, send_.data(), sendBytes_);
    device_->upload(deviceRecv_, recv_.data(), recvBytes_);
  }
}

char* Bench::onDevice(char* host) const {
  if (!device_) return host;
  const bool inSend = host >= send_.data() && host < send_.data() + sendBytes_;
  return inSend ? deviceSend_ + (host - send_.data()) : deviceRecv_ + (host - recv_.data());
}

void Bench::selectBuffers(Op op, size_t count, size_t size, bool inPlace) {
  sendPtr_ = send_.data();
  recvPtr_ = recv_.data();
  if (inPlace) {
    switch (op) {
      case Op::kAllGather:
        sendPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kReduceScatter:
        sendPtr_ = recv_.data();
        recvPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kGather:
        if (rank_ == o_.root) sendPtr_ = recv_.data() + rank_ * count * size;
        break;
      case Op::kScatter:
        if (rank_ == o_.root) recvPtr_ = send_.data() + rank_ * count * size;
        break;
      case Op::kAllToAll:
      case Op::kAllToAllv:
      case Op::kSendRecv:
      case Op::kBarrier:
        break;  // no in-place form: the in-place columns repeat the out-of-place call
      default:
        sendPtr_ = recv_.data();
        break;
    }
  }
  callSend_ = onDevice(sendPtr_);
  callRecv_ = onDevice(recvPtr_);
}

void Bench::once(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count) {
  if (peer_ != nullptr) {
    chorus::bench::Call peerCall{op, nameOf(op), sendPtr_, recvPtr_, count, type, redop, o_.root};
    if (op == Op::kAllToAllv) {
      peerCall.sendCounts = sendCounts_.data();
      peerCall.sendDispls = sendDispls_.data();
      peerCall.recvCounts = recvCounts_.data();
      peerCall.recvDispls = recvDispls_.data();
    }
    try {
      peer_->run(peerCall, peerAlgorithm_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "collbench rank %d: %s\n", rank_, e.what());
      std::exit(2);
    }
    return;
  }
  if (grouped_ && (op == Op::kAllToAll || op == Op::kAllToAllv)) {
    // A send and a receive per peer, itself included, in one group (the counts fillInputs set).
    const size_t size = chorusTypeSize(type);
    call("group start", chorusGroupStart());
    for (int p = 0; p < nranks_; ++p) {
      const size_t peer = static_cast<size_t>(p);
      call("send", chorusSend(callSend_ + sendDispls_[peer] * size, sendCounts_[peer], type, p, calls_, stream_));
      call("recv", chorusRecv(callRecv_ + recvDispls_[peer] * size, recvCounts_[peer], type, p, calls_, stream_));
    }
    call("group end", chorusGroupEnd());
    if (o_.blocking) finishCalls();
    return;
  }
  switch (op) {
    case Op::kAllReduce:
      call("allreduce", chorusAllReduce(callSend_, callRecv_, count, type, redop, calls_, stream_));
      break;
    case Op::kAllGather:
      call("allgather", chorusAllGather(callSend_, callRecv_, count, type, calls_, stream_));
      break;
    case Op::kReduceScatter:
      call("reducescatter", chorusReduceScatter(callSend_, callRecv_, count, type, redop, calls_, stream_));
      break;
    case Op::kBroadcast:
      call("broadcast", chorusBroadcast(callSend_, callRecv_, count, type, o_.root, calls_, stream_));
      break;
    case Op::kReduce:
      call("reduce", chorusReduce(callSend_, callRecv_, count, type, redop, o_.root, calls_, stream_));
      break;
    case Op::kAllToAll:
      call("alltoall", chorusAllToAll(callSend_, callRecv_, count, type, calls_, stream_));
      break;
    case Op::kAllToAllv:
      call("alltoallv", chorusAllToAllv(callSend_, sendCounts_.data(), sendDispls_.data(), callRecv_,
                                        recvCounts_.data(), recvDispls_.data(), type, calls_, stream_));
      break;
    case Op::kGather:
      call("gather", chorusGather(callSend_, callRecv_, count, type, o_.root, calls_, stream_));
      break;
    case Op::kScatter:
      call("scatter", chorusScatter(callSend_, callRecv_, count, type, o_.root, calls_, stream_));
      break;
    case Op::kBarrier:
      call("barrier", chorusBarrier(calls_, stream_));
      break;
    case Op::kSendRecv: {
      const int next = (rank_ + 1) % nranks_;
      const int prev = (rank_ + nranks_ - 1) % nranks_;
      char* into = callRecv_;
      call("group start", chorusGroupStart());
      call("send", chorusSend(callSend_, count, type, next, calls_, stream_));
      call("recv", chorusRecv(into, count, type, prev, calls_, stream_));
      call("group end", chorusGroupEnd());
      break;
    }
  }
  if (o_.blocking) finishCalls();
}

uint64_t Bench::checkOnce(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  using namespace chorus::pattern;
  fillInputs(op, type, redop, count, inPlace);
  once(op, type, redop, count);
  if (device_) {
    finishCalls();
    device_->download(recv_.data(), deviceRecv_, recvBytes_);
  }
  if (o_.injectWrong && rank_ == (op == Op::kReduce || op == Op::kGather ? o_.root : 0) && count > 0) {
    recvPtr_[0] = static_cast<char>(~recvPtr_[0]);  // test hook: spoil one received element
  }
  const int n = nranks_;
  const int root = o_.root;
  uint64_t wrong = 0;
  switch (op) {
    case Op::kAllReduce:
      wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return expectedReduce(redop, type, n, i); });
      break;
    case Op::kReduce:
      if (rank_ == root) {
        wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return expectedReduce(redop, type, n, i); });
      }
      break;
    case Op::kReduceScatter:
      wrong = countWrong(recvPtr_, count, type,
                         [&](size_t i) { return expectedReduce(redop, type, n, rank_ * count + i); });
      break;
    case Op::kAllGather:
      wrong = countWrong(recvPtr_, count * n, type,
                         [&](size_t j) { return asStored(type, moveInput(static_cast<int>(j / count), j % count)); });
      break;
    case Op::kBroadcast:
      wrong = countWrong(recvPtr_, count, type, [&](size_t i) { return asStored(type, moveInput(root, i)); });
      break;
    case Op::kSendRecv: {
      const int prev = (rank_ + n - 1) % n;
      const char* got = recvPtr_;
      wrong = countWrong(got, count, type, [&](size_t i) { return asStored(type, moveInput(prev, i)); });
      break;
    }
    case Op::kAllToAll:
      wrong = countWrong(recvPtr_, count * n, type, [&](size_t j) {
        return asStored(type, moveInput(static_cast<int>(j / count), rank_ * count + j % count));
      });
      break;
    case Op::kAllToAllv: {
      // From each source s, recvCounts_[s] elements: s's own from where it placed this rank's.
      const size_t from = sendDispls_[static_cast<size_t>(rank_)];
      wrong = countWrong(recvPtr_, recvDispls_.back() + recvCounts_.back(), type, [&](size_t j) {
        const size_t s =
            static_cast<size_t>(std::upper_bound(recvDispls_.begin(), recvDispls_.end(), j) - recvDispls_.begin()) - 1;
        return asStored(type, moveInput(static_cast<int>(s), from + j - recvDispls_[s]));
      });
      break;
    }
    case Op::kGather:
      if (rank_ == root) {
        wrong = countWrong(recvPtr_, count * n, type,
                           [&](size_t j) { return asStored(type, moveInput(static_cast<int>(j / count), j % count)); });
      }
      break;
    case Op::kScatter:
      wrong = countWrong(recvPtr_, count, type,
                         [&](size_t i) { return asStored(type, moveInput(root, rank_ * count + i)); });
      break;
    case Op::kBarrier:
      break;  // nothing to check but that it returned
  }
  uint64_t total = 0;
  call("allreduce of #wrong", chorusAllReduce(&wrong, &total, 1, chorusUint64, chorusSum, comm_, nullptr));
  return total;
}

Result Bench::measure(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count, bool inPlace) {
  Result result;
  fillInputs(op, type, redop, count, inPlace);
  for (int i = 0; i < o_.warmup; ++i) once(op, type, redop, count);
  finishCalls();
  call("barrier", chorusBarrier(comm_, nullptr));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o_.iters; ++i) once(op, type, redop, count);
  finishCalls();
  result = resultOf(op, type, count, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    o_.iters);
  if (o_.check) result.wrong = checkOnce(op, type, redop, count, inPlace);
  return result;
}

Result Bench::resultOf(Op op, chorusDataType_t type, size_t count, double seconds, int iters) {
  Result result;
  double mine = seconds / std::max(1, iters), sum = 0;
  call("allreduce of times", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
  const double avgSeconds = sum / nranks_;  // nccl-tests reports the rank average
  const size_t size = chorusTypeSize(type);
  const size_t bytes = infoOf(op, nranks_, count).wholeElements * size;
  result.timeUs = avgSeconds * 1e6;
  result.algbw = avgSeconds > 0 ? static_cast<double>(bytes) / 1e9 / avgSeconds : 0;
  result.busbw = result.algbw * busFactor(op);
  return result;
}

CopyRates Bench::measureCopyGBps() {
  if (device_) {
    // Device memory: cudaMemcpyAsync device to device, timed by events, 256 MiB (beyond the L2
    // cache of the GPUs we know, 50-60 MiB); the fastest of 5 blocks; summed over the GPUs, which
    // copy at once. One rank per GPU copies: ranks sharing a GPU without MPS take turns on it, so
    // each would time the whole GPU's rate while the others wait, and a sum over them counted the
    // one GPU once per rank (by the H200 runs' printed shares: twice its rate at 2 ranks, four times at 4).
    constexpr size_t kDeviceBytes = size_t{256} << 20;
    constexpr size_t kIdentity = 128;
    std::vector<char> identities(kIdentity * static_cast<size_t>(nranks_));
    std::vector<char> own(kIdentity, '\0');
    const std::string identity = device_->identity();
    std::copy_n(identity.begin(), std::min(identity.size(), kIdentity - 1), own.begin());
    call("allgather of GPU identities",
         chorusAllGather(own.data(), identities.data(), kIdentity, chorusUint8, comm_, nullptr));
    bool first = true;  // the lowest rank on this GPU
    for (int r = 0; r < rank_ && first; ++r) {
      first = !std::equal(own.begin(), own.end(), identities.begin() + static_cast<ptrdiff_t>(r * kIdentity));
    }
    CopyRates result;
    int one = first ? 1 : 0;
    call("allreduce of GPU counts", chorusAllReduce(&one, &result.devices, 1, chorusInt32, chorusSum, comm_, nullptr));
    for (int b = 0; b < 5; ++b) {
      call("barrier", chorusBarrier(comm_, nullptr));
      double mine = first ? device_->copyBytesPerSecond(kDeviceBytes, 3) / 1e9 : 0, sum = 0;
      call("allreduce of copy rates", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
      result.memcpyGBps = std::max(result.memcpyGBps, sum);
    }
    result.GBps = result.memcpyGBps;
    return result;
  }
  // 64 MiB per rank: beyond the last-level cache of machines like ours (tens of MiB); on a
  // machine with a larger cache C is a cache speed and %bound comes out low. Each block times
  // memcpy and the streaming copy (kernels/cpu/copy.h) one after the other; each rate is its
  // fastest block (a bound: noise only slows a copy), and C is the faster of the two.
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr int kBlocks = 5;
  constexpr int kCopies = 3;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);
  std::memcpy(to.data(), from.data(), kBytes);  // both buffers' pages mapped before timing
  std::vector<double> rates[2];
  for (int b = 0; b < kBlocks; ++b) {
    for (int streaming = 0; streaming < 2; ++streaming) {
      call("barrier", chorusBarrier(comm_, nullptr));
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < kCopies; ++i) {
        char* dst = (i % 2 == 0 ? to : from).data();
        const char* src = (i % 2 == 0 ? from : to).data();
        if (streaming != 0) {
          chorus::kernels::copyStreaming(dst, src, kBytes);
        } else {
          std::memcpy(dst, src, kBytes);
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      double mine = kCopies * static_cast<double>(kBytes) / 1e9 / seconds, sum = 0;
      call("allreduce of copy rates", chorusAllReduce(&mine, &sum, 1, chorusFloat64, chorusSum, comm_, nullptr));
      rates[streaming].push_back(sum);
    }
  }
  CopyRates result;
  result.memcpyGBps = *std::max_element(rates[0].begin(), rates[0].end());
  result.streamingGBps = *std::max_element(rates[1].begin(), rates[1].end());
  result.GBps = std::max(result.memcpyGBps, result.streamingGBps);
  return result;
}

std::vector<std::string> Bench::peerAlgorithms(size_t p, const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop,
                                               size_t count) {
  if (count == 0 && info.op != Op::kBarrier) return {};
  const chorus::bench::Call probe{info.op, info.name, nullptr, nullptr, count, type, redop, o_.root};
  return peers_[p]->algorithms(probe);
}

nlohmann::json Bench::measurePeers(const OpInfo& info, chorusDataType_t type, chorusRedOp_t redop, size_t count,
                                   std::vector<Result>* bestOfPeer, uint64_t* wrong, const std::vector<Result>* timed) {
  nlohmann::json all = nlohmann::json::object();
  bestOfPeer->assign(peers_.size(), Result{});
  size_t next = 0;  // into *timed
  for (size_t p = 0; p < peers_.size(); ++p) {
    const std::vector<std::string> algorithms = peerAlgorithms(p, info, type, redop, count);
    if (algorithms.empty()) continue;
    nlohmann::json byAlgorithm = nlohmann::json::object();
    Result best;
    std::string bestName;
    uint64_t peerWrong = 0;
    for (const std::string& algorithm : algorithms) {
      Result r;
      if (timed != nullptr) {
        r = (*timed)[next++];
      } else {
        use(info.name, {static_cast<int>(p), algorithm});
        r = measure(info.op, type, redop, count, false);
      }
      peerWrong += r.wrong;
      byAlgorithm[algorithm.empty() ? "default" : algorithm] = r.busbw;
      if (bestName.empty() || r.busbw > best.busbw) {
        best = r;
        bestName = algorithm.empty() ? "default" : algorithm;
      }
    }
    use(info.name, {});
    (*bestOfPeer)[p] = best;
    *wrong += peerWrong;
    if (peerWrong > 0 && rank_ == 0) {
      std::printf("# %s: %llu wrong values at %zu elements\n", peers_[p]->name(),
                  static_cast<unsigned long long>(peerWrong), count);
    }
    all[peers_[p]->name()] = {{"time_us", best.timeUs},   {"algbw_GBps", best.algbw},
                              {"busbw_GBps", best.busbw}, {"algo", bestName},
                              {"wrong", peerWrong},       {"algorithms_busbw_GBps", byAlgorithm}};
    if (!best.turnUs.empty()) all[peers_[p]->name()]["turn_time_us"] = best.turnUs;
  }
  return all;
}

chorusComm_t Bench::variant(const std::string& row) {
  auto it = variants_.find(row);
  if (it != variants_.end()) return it->second;
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  if (row == kDeterministicRow) config.deterministic = 1;
  // The environment is read when a communicator is made: CHORUS_STATS=0 for that one only.
  const char* stats = std::getenv("CHORUS_STATS");
  const std::string kept = stats != nullptr ? stats : "";
  if (row == kNoStatsRow) setenv("CHORUS_STATS", "0", 1);
  chorusComm_t made = nullptr;
  const chorusResult_t result = chorusCommSplit(comm_, 0, rank_, &made, &config);
  if (row == kNoStatsRow) {
    if (stats != nullptr) {
      setenv("CHORUS_STATS", kept.c_str(), 1);
    } else {
      unsetenv("CHORUS_STATS");
    }
  }
  call(("chorusCommSplit (" + row + " row)").c_str(), result);
  return variants_[row] = made;
}

void Bench::use(const char* opName, const Contestant& contestant) {
  if (contestant.peer >= 0) {
    peer_ = peers_[contestant.peer].get();
    peerAlgorithm_ = contestant.algorithm;
    return;
  }
  peer_ = nullptr;
  calls_ = comm_;
  grouped_ = contestant.algorithm == kGroupedRow;
  if (grouped_) return;
  if (auto it = variants_.find(contestant.algorithm); it != variants_.end()) {
    calls_ = it->second;
  } else if (!contestant.algorithm.empty()) {
    call("chorusCommSetAlgorithms",
         chorusCommSetAlgorithms(comm_, (std::string(opName) + ":" + contestant.algorithm).c_str()));
  }
}

void Bench::settle(Op op, chorusDataType_t type, chorusRedOp_t redop, size_t count) {
  // The first calls after a switch pay for what the one before left behind: after MPICH's block
  // (its ranks spin), chorus's next 8-byte all-reduces on 4 ranks over 2 cores took 20-30 us
  // where the block after took 5; 100 untimed calls (about half a millisecond) brought them to
  // 5-6 in one run. It narrows the effect, not more: with 2 ms of them, single blocks of 20-30 us
  // still came in later runs, as bursts of the machine's noise do. Rank 0's clock decides, so
  // every rank makes the same calls.
  constexpr double kSettleUs = 2000;
  const auto start = std::chrono::steady_clock::now();
  int more = 0;
  do {
    once(op, type, redop, count);
    finishCalls();
    more = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() < kSettleUs;
    call("broadcast", chorusBroadcast(&more, &more, 1, chorusInt32, 0, comm_, nullptr));
  } while (more != 0);
}

std::vector<std::pair<Result, Result>> Bench::measureInTurns(const char* opName, Op op,
                                                             const std::vector<Contestant>& contestants,
                                                             chorusDataType_t type, chorusRedOp_t redop, size_t count,
                                                             const TurnPlan& plan) {
  auto sidesOf = [&](const Contestant& c) { return plan.inPlace && c.peer < 0 ? 2 : 1; };
  for (const Contestant& contestant : contestants) {  // every one warmed up before any is timed
    use(opName, contestant);
    const int sides = sidesOf(contestant);
    for (int side = 0; side < sides; ++side) {
      fillInputs(op, type, redop, count, side == 1);
      for (int i = 0; i < plan.warmup; ++i) once(op, type, redop, count);
      finishCalls();
    }
  }
  std::vector<double> seconds(2 * contestants.size(), 0);  // [2a]: out of place, [2a + 1]: in place
  std::vector<std::vector<double>> turnUs(2 * contestants.size());
  const int turns = std::min(plan.turns, *std::min_element(plan.iters.begin(), plan.iters.end()));
  for (int t = 0; t < turns; ++t) {
    for (size_t a = 0; a < contestants.size(); ++a) {
      const int iters = plan.iters[a] * (t + 1) / turns - plan.iters[a] * t / turns;
      use(opName, contestants[a]);
      const int sides = sidesOf(contestants[a]);
      for (int side = 0; side < sides; ++side) {
        // Both forms were filled above; the warm-up left the pointers at the last one.
        selectBuffers(op, count, chorusTypeSize(type), side == 1);
        settle(op, type, redop, count);
        call("barrier", chorusBarrier(comm_, nullptr));
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) once(op, type, redop, count);
        finishCalls();
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        seconds[2 * a + side] += elapsed;
        turnUs[2 * a + side].push_back(elapsed * 1e6 / iters);
      }
    }
  }
  std::vector<std::pair<Result, Result>> results(contestants.size());
  for (size_t a = 0; a < contestants.size(); ++a) {
    for (int side = 0; side < sidesOf(contestants[a]); ++side) {
      Result& result = side == 0 ? results[a].first : results[a].second;
      result = resultOf(op, type, count, seconds[2 * a + side], plan.iters[a]);
      // Each turn's time, averaged over the ranks as the row's time is.
      std::vector<double>& mine = turnUs[2 * a + side];
      result.turnUs.resize(mine.size());
      call("allreduce of turn times",
           chorusAllReduce(mine.data(), result.turnUs.data(), mine.size(), chorusFloat64, chorusSum, comm_, nullptr));
      for (double& us : result.turnUs) us /= nranks_;
    }
    if (plan.check) {
      use(opName, contestants[a]);
      results[a].first.wrong = checkOnce(op, type, redop, count, false);
      if (sidesOf(contestants[a]) == 2) results[a].second.wrong = checkOnce(op, type, redop, count, true);
    }
  }
  peer_ = nullptr;
  return results;
}

int Bench::run() {
  Sweep sweep;
  int code = 0;
  for (const std::string& name : splitCommas(o_.op)) {
    if (name.empty()) continue;
    const int result = runOp(name, sweep);
    if (result == 2) return 2;
    code = std::max(code, result);
  }
  if (rank_ == 0 && !o_.json.empty()) {
    const double avgBusbw = sweep.busbwCount ? sweep.busbwSum / sweep.busbwCount : 0;
    nlohmann::json doc = {
        {"tool", "collbench"},        {"op", o_.op},         {"nranks", nranks_}, {"iters", o_.iters},
        {"turns", o_.turns},          {"warmup", o_.warmup}, {"check", o_.check}, {"wrong_total", sweep.wrong},
        {"avg_busbw_GBps", avgBusbw}, {"mem", o_.mem},       {"rows", sweep.rows}};
    if (o_.bound) {
      doc["copy_GBps"] = sweep.copy.GBps;
      doc["copy_memcpy_GBps"] = sweep.copy.memcpyGBps;
      doc["copy_streaming_GBps"] = sweep.copy.streamingGBps;
      if (device_) doc["copy_devices"] = sweep.copy.devices;
    }
    if (!peers_.empty()) {
      std::vector<std::string> peerNames;
      for (const auto& peer : peers_) peerNames.push_back(peer->name());
      doc["peers"] = peerNames;
    }
    if (!writeJson(o_.json, doc)) return 2;
  }
  return code;
}

int Bench::runOp(const std::string& name, Sweep& sweep) {
  const OpInfo* opInfo = findOp(name);
  std::vector<chorusDataType_t> types;
  for (int i = 0; i < static_cast<int>(sizeof(kTypes) / sizeof(kTypes[0])); ++i) {
    if (o_.type == "all" ? i < kDistinctTypes : o_.type == kTypes[i].name) types.push_back(kTypes[i].type);
  }
  std::vector<chorusRedOp_t> redops;
  for (const RedOpInfo& info : kRedOps) {
    if (o_.redop == "all" || o_.redop == info.name) redops.push_back(info.op);
  }
  if (opInfo == nullptr || types.empty() || redops.empty() || o_.root < 0 || o_.root >= nranks_) {
    if (rank_ == 0) {
      std::fprintf(stderr, "collbench: unknown --op '%s', -d '%s' or -o '%s', or root %d outside [0, %d)\n",
                   name.c_str(), o_.type.c_str(), o_.redop.c_str(), o_.root, nranks_);
    }
    return 2;
  }
  const chorusCollectiveInfo_t opTraits = infoOf(opInfo->op);  // reduces? rooted?
  if (!opTraits.reduces) redops = {chorusSum};

  const bool print = rank_ == 0;
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  if (print) {
    std::printf(
        "# collbench (chorus) op: %s  nranks: %d  minBytes: %zu  maxBytes: %zu  step: %s  warmup iters: %d  "
        "iters: %d  validation: %d  blocking: %d\n#\n",
        opInfo->name, nranks_, o_.minBytes, o_.maxBytes,
        o_.factorGiven ? (std::to_string(static_cast<int>(o_.stepFactor)) + "(factor)").c_str()
                       : (std::to_string(o_.stepBytes) + "(bytes)").c_str(),
        o_.warmup, o_.iters, o_.check, o_.blocking);
  }
  // One line per rank, like nccl-tests' device list, gathered to rank 0 so lines do not interleave.
  struct RankLine {
    int32_t pid;
    char host[60];
    char cpus[64];
    char device[64];
  } mine{static_cast<int32_t>(getpid()), {}, {}, {}};
  std::memcpy(mine.host, host, sizeof(mine.host) - 1);
  std::snprintf(mine.cpus, sizeof(mine.cpus), "%s", allowedCpus().c_str());
  if (device_) std::snprintf(mine.device, sizeof(mine.device), " %s", device_->describe().c_str());
  std::vector<RankLine> lines(static_cast<size_t>(nranks_));
  call("allgather of rank lines", chorusAllGather(&mine, lines.data(), sizeof(RankLine), chorusUint8, comm_, nullptr));
  if (print) {
    const char* transport = std::getenv("CHORUS_TRANSPORT");
    for (int r = 0; r < nranks_; ++r) {
      std::printf("#  Rank %3d Pid %7d on %10s cpus %s transport %s%s\n", r, lines[r].pid, lines[r].host, lines[r].cpus,
                  transport ? transport : "auto", lines[r].device);
    }
    if (device_) {
      std::printf("#  Buffers: device memory (--mem device), calls on one stream per rank, %s\n",
                  o_.blocking ? "each waited for (-z 1)" : "waited for at the end of each timed loop (-z 0)");
    } else {
      std::printf("#  Buffers: %s\n", o_.mem == "chorus" ? "chorusMemAlloc (--mem chorus)" : "the heap (--mem host)");
    }
  }
  std::vector<std::string> peerNames;
  for (const auto& peer : peers_) peerNames.push_back(peer->name());
  if (!peers_.empty() && print) {
    std::printf(
        "#  Peers: %s, each timed out of place on the same buffers %s; x PEER is chorus's\n"
        "#  out-of-place busbw over the peer's (its fastest algorithm)\n",
        o_.compare.c_str(), o_.turns > 1 ? "in turns with chorus (--turns)" : "before chorus");
  }
  double copyGBps = 0;
  CopyRates copyRates;
  if (o_.bound && device_) {
    copyRates = measureCopyGBps();
    copyGBps = copyRates.GBps;
    if (print) {
      std::printf(
          "#  Bound: copy bandwidth %.2f GB/s (%d GPU(s) each copying 256 MiB device to device at once, one rank on "
          "each, summed, fastest of 5); %%bound = out-of-place algbw * copies / copy bandwidth, copies = %g for %s "
          "(docs/collbench.md)\n",
          copyGBps, copyRates.devices, boundCopies(opInfo->op, nranks_), opInfo->name);
    }
  } else if (o_.bound) {
    copyRates = measureCopyGBps();
    copyGBps = copyRates.GBps;
    if (print) {
      std::printf(
          "#  Bound: copy bandwidth %.2f GB/s (%d ranks each copying 64 MiB at once, summed, fastest of 5; the faster "
          "of memcpy "
          "%.2f and streaming stores %.2f); %%bound = out-of-place algbw * copies / copy bandwidth, copies = %g for %s "
          "(docs/collbench.md)\n",
          copyGBps, nranks_, copyRates.memcpyGBps, copyRates.streamingGBps, boundCopies(opInfo->op, nranks_),
          opInfo->name);
    }
  }
  if (print) {
    const bool grouped = o_.grouped && (opInfo->op == Op::kAllToAll || opInfo->op == Op::kAllToAllv);
    printColumnHeader(!o_.algo.empty() || (o_.deterministic && opTraits.reduces) || o_.stats || grouped, peerNames,
                      o_.bound);
  }

  // --algo: one algorithm, or all of the collective's, measured side by side per size.
  std::vector<std::string> algos{""};
  if (!o_.algo.empty()) {
    const char* names = opInfo->op == Op::kSendRecv ? nullptr : chorusAlgorithmNames(opInfo->name);
    if (names == nullptr) {
      if (print) std::fprintf(stderr, "collbench: --algo does not apply to %s\n", opInfo->name);
      return 2;
    }
    algos.clear();
    for (const std::string& name : splitCommas(o_.algo == "all" ? names : o_.algo)) {
      if (!name.empty()) algos.push_back(name);
    }
    for (const std::string& algo : algos) {
      const std::string spec = std::string(opInfo->name) + ":" + algo;
      if (chorusCommSetAlgorithms(comm_, spec.c_str()) != chorusSuccess) {
        if (print) std::fprintf(stderr, "collbench: --algo %s: %s\n", algo.c_str(), chorusGetLastError(comm_));
        return 2;
      }
    }
  }
  // --deterministic, --stats: the tuner's choice on comm_ and on communicators of its ranks made
  // otherwise, a row each.
  std::vector<std::string> variantRows;
  if (o_.deterministic && opTraits.reduces) variantRows.push_back(kDeterministicRow);
  if (o_.stats) variantRows.push_back(kNoStatsRow);
  if (o_.grouped && (opInfo->op == Op::kAllToAll || opInfo->op == Op::kAllToAllv)) variantRows.push_back(kGroupedRow);
  if (!variantRows.empty()) {
    if (!o_.algo.empty()) {
      if (print) {
        std::fprintf(stderr,
                     "collbench: --deterministic, --stats and --grouped time the tuner's choice: not with --algo\n");
      }
      return 2;
    }
    algos = {""};
    for (const std::string& row : variantRows) {
      if (row != kGroupedRow) variant(row);
      algos.push_back(row);
    }
  }
  const bool labeled = algos.size() > 1 || !o_.algo.empty();  // rows name their algorithm
  grouped_ = false;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<std::pair<double, size_t>>> peerRatios(peers_.size());  // (ratio, size) per row
  uint64_t totalWrong = 0;
  double busbwSum = 0;
  int busbwCount = 0;
  // Blocks the size is split into: nranks where a rank's input or output is a block per rank.
  const size_t blocks = infoOf(opInfo->op, nranks_, 1).wholeElements;
  for (chorusDataType_t type : types) {
    for (chorusRedOp_t redop : redops) {
      const size_t size = chorusTypeSize(type);
      size_t bytes = o_.minBytes;
      for (;;) {
        // Elements per call, as nccl-tests: ops over n blocks split the size over ranks.
        const size_t count = opInfo->op == Op::kBarrier ? 0 : bytes / size / blocks;
        const size_t shownBytes = count * blocks * size;
        // --turns: chorus's algorithms and every peer's, timed round robin.
        std::vector<std::pair<Result, Result>> inTurns;
        std::vector<Result> peersInTurns;
        if (o_.turns > 1 && (algos.size() > 1 || !peers_.empty())) {
          std::vector<Contestant> contestants;
          for (const std::string& algo : algos) contestants.push_back({-1, algo});
          for (size_t p = 0; p < peers_.size(); ++p) {
            for (const std::string& algorithm : peerAlgorithms(p, *opInfo, type, redop, count)) {
              contestants.push_back({static_cast<int>(p), algorithm});
            }
          }
          const TurnPlan plan{std::vector<int>(contestants.size(), o_.iters), o_.turns, o_.warmup, true, o_.check != 0};
          inTurns = measureInTurns(opInfo->name, opInfo->op, contestants, type, redop, count, plan);
          for (size_t k = algos.size(); k < inTurns.size(); ++k) peersInTurns.push_back(inTurns[k].first);
          inTurns.resize(algos.size());
        }
        std::vector<Result> peerBest;
        nlohmann::json peerJson;
        if (!peers_.empty()) {
          peerJson = measurePeers(*opInfo, type, redop, count, &peerBest, &totalWrong,
                                  inTurns.empty() ? nullptr : &peersInTurns);
        }
        for (size_t a = 0; a < algos.size(); ++a) {
          const std::string& algo = algos[a];
          if (inTurns.empty()) use(opInfo->name, {-1, algo});
          const Result outOfPlace = inTurns.empty() ? measure(opInfo->op, type, redop, count, false) : inTurns[a].first;
          const Result inPlace = inTurns.empty() ? measure(opInfo->op, type, redop, count, true) : inTurns[a].second;
          totalWrong += outOfPlace.wrong + inPlace.wrong;
          busbwSum += outOfPlace.busbw + inPlace.busbw;
          busbwCount += 2;
          if (!print) continue;
          // The peers' columns: their busbw and chorus's over it (as times: a barrier moves no bytes).
          std::string tail;
          char cell[64];
          for (size_t p = 0; p < peerBest.size(); ++p) {
            const double ratio =
                peerBest[p].timeUs > 0 && outOfPlace.timeUs > 0 ? peerBest[p].timeUs / outOfPlace.timeUs : 0;
            if (ratio > 0) {
              std::snprintf(cell, sizeof(cell), "  %7.2f  %7.2f", peerBest[p].busbw, ratio);
              peerRatios[p].push_back({ratio, shownBytes});
              peerJson[peerNames[p]]["chorus_over_peer"] = ratio;
            } else {
              std::snprintf(cell, sizeof(cell), "  %7s  %7s", "N/A", "N/A");
            }
            tail += cell;
          }
          const double copies = boundCopies(opInfo->op, nranks_);
          const double boundPct = copyGBps > 0 ? 100 * outOfPlace.algbw * copies / copyGBps : 0;
          if (o_.bound) {
            if (copies > 0) {
              std::snprintf(cell, sizeof(cell), "  %6.1f", boundPct);
            } else {
              std::snprintf(cell, sizeof(cell), "  %6s", "N/A");
            }
            tail += cell;
          }
          printRow(shownBytes, count, type, opTraits.reduces ? chorusOpName(redop) : "none",
                   opTraits.rooted ? o_.root : -1, labeled ? (algo.empty() ? "default" : algo.c_str()) : nullptr,
                   outOfPlace, o_.check ? std::to_string(outOfPlace.wrong) : "N/A", inPlace,
                   o_.check ? std::to_string(inPlace.wrong) : "N/A", tail);
          auto side = [&](const Result& r) {
            nlohmann::json j = {{"time_us", r.timeUs}, {"algbw_GBps", r.algbw}, {"busbw_GBps", r.busbw}};
            if (o_.check) j["wrong"] = r.wrong;
            if (!r.turnUs.empty()) j["turn_time_us"] = r.turnUs;
            return j;
          };
          nlohmann::json row = {{"op", opInfo->name},
                                {"size_bytes", shownBytes},
                                {"count", count},
                                {"type", chorusTypeName(type)},
                                {"redop", opTraits.reduces ? chorusOpName(redop) : "none"},
                                {"root", opTraits.rooted ? o_.root : -1},
                                {"algo", algo.empty() ? "default" : algo},
                                {"nranks", nranks_},
                                {"out_of_place", side(outOfPlace)},
                                {"in_place", side(inPlace)}};
          if (!peers_.empty()) row["peers"] = peerJson;
          if (o_.bound && copies > 0) row["bound_pct"] = boundPct;
          if (opInfo->op == Op::kAllToAllv) {  // every rank's (they send alike)
            row["zipf"] = o_.zipf;
            row["send_counts"] = sendCounts_;
          }
          rows.push_back(std::move(row));
        }
        if (opInfo->op == Op::kBarrier) break;  // one row: a barrier has no size
        bytes = nextSize(o_, bytes);
        if (bytes == 0) break;
      }
    }
  }
  const double avgBusbw = busbwCount ? busbwSum / busbwCount : 0;
  if (print) {
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(totalWrong),
                totalWrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n", avgBusbw);
    for (size_t p = 0; p < peers_.size(); ++p) {
      if (peerRatios[p].empty()) {
        std::printf("# x %-5s: no row (%s cannot make these calls)\n", peerNames[p].c_str(), peerNames[p].c_str());
        continue;
      }
      const auto lowest = *std::min_element(peerRatios[p].begin(), peerRatios[p].end());
      std::vector<double> ratios;
      for (const auto& r : peerRatios[p]) ratios.push_back(r.first);
      std::printf("# x %-5s: lowest %.2f (at %zu B), median %.2f over %zu rows\n", peerNames[p].c_str(), lowest.first,
                  lowest.second, median(ratios), ratios.size());
    }
    std::printf("#\n");
    std::fflush(stdout);
  }
  for (auto& row : rows) sweep.rows.push_back(std::move(row));
  sweep.wrong += totalWrong;
  sweep.busbwSum += busbwSum;
  sweep.busbwCount += busbwCount;
  if (o_.bound) sweep.copy = copyRates;
  return totalWrong == 0 ? 0 : 1;
}

}  // namespace chorus::bench
