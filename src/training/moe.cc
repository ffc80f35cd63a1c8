// moe.cc: the mixture-of-experts MLP of moe.h: the routing on the host through kernels/cpu/moe.h,
// the rows, the gated sum and the experts' products through the backend (backend.h), the rows
// between ranks by the public API's all-to-all(v).
#include "src/training/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <utility>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/nn.h"

namespace chorus::training {

namespace kn = chorus::kernels;

void MoeConfig::validate(int width, int ep) const {
  auto fail = [](const std::string& what) { throw Error(chorusInvalidArgument, "MoE: " + what); };
  if (experts < 0) fail(fmt::format("experts = {} is negative", experts));
  if (experts == 0) return;
  if (topK != 1 && topK != 2) fail(fmt::format("top_k = {} is not 1 or 2", topK));
  if (topK > experts) fail(fmt::format("top_k = {} exceeds experts = {}", topK, experts));
  if (ep < 1 || experts % ep != 0) fail(fmt::format("experts = {} is not a multiple of ep = {}", experts, ep));
  if (hidden < 0) fail(fmt::format("expert hidden width {} is negative", hidden));
  if (width <= 0) fail(fmt::format("model width {} is not positive", width));
  if (capacityFactor < 0) fail(fmt::format("capacity_factor = {} is negative", capacityFactor));
  if (chunks < 1) fail(fmt::format("dispatch_chunks = {} is not at least 1", chunks));
  if (auxCoef < 0 || zCoef < 0) fail(fmt::format("aux_loss = {} and z_loss = {} must not be negative", auxCoef, zCoef));
}

std::string MoeConfig::describe() const {
  if (!enabled()) return "dense";
  return fmt::format("{} experts, top-{}, {}, capacity {}, aux {} z {}{}", experts, topK, swiglu ? "SwiGLU" : "GELU",
                     capacityFactor > 0 ? fmt::format("x{}", capacityFactor) : std::string("unlimited"), auxCoef, zCoef,
                     chunks > 1 ? fmt::format(", {} dispatch chunks", chunks) : std::string());
}

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

// A pass's exchanges: the ones still in flight when it leaves early (an exchange or a product
// failed) are waited for, so that none writes into buffers that go away with the error.
struct Exchanges {
  explicit Exchanges(size_t n) : futures(n) {}
  ~Exchanges() {
    for (auto& f : futures) {
      if (f.valid()) f.wait();
    }
  }
  std::vector<std::future<void>> futures;
};

}  // namespace

size_t MoeChunk::sent() const { return sum(sendRows); }
size_t MoeChunk::received() const { return sum(recvRows); }

void MoeProfile::add(const MoeProfile& o) {
  route += o.route;
  dispatch += o.dispatch;
  experts += o.experts;
  combine += o.combine;
  wait += o.wait;
  chunks += o.chunks;
  overlapped += o.overlapped;
}

size_t MoeActivations::floats() const {
  // ints and size_ts counted as floats' worth of memory by their bytes.
  size_t ints = expert.size() + row.size() + assigned.size() + counts.size(), sizes = 0;
  for (const MoeChunk& c : chunks) {
    ints += c.row.size() + c.counts.size() + c.recvCounts.size();
    sizes += c.sendRows.size() + c.recvRows.size() + 2;
  }
  ints += chunkRows.size();
  return probs.size() + lse.size() + gate.size() + gates.size() + expertIn.size() + fc.size() + act.size() +
         combined.size() + ints + sizes * sizeof(size_t) / sizeof(float);
}

MoeMlp::MoeMlp(const MoeConfig& config, int width, ExpertParallel ep, Communicator* tokenGroup,
               std::optional<kernels::Float16> sixteen, Backend* backend)
    : config_(config),
      C_(width),
      hidden_(config.hiddenFor(width)),
      ep_(ep),
      tokenGroup_(tokenGroup),
      sixteen_(sixteen),
      ownBackend_(backend == nullptr ? makeBackend(Device::kCpu) : nullptr),
      backend_(backend == nullptr ? *ownBackend_ : *backend),
      onDevice_(backend_.device() != Device::kCpu && ep.size() > 1) {
  config_.validate(width, ep.size());
  if (!config_.enabled()) throw Error(chorusInvalidArgument, "MoE: a layer needs experts > 0");
  localExperts_ = config_.experts / ep_.size();
  // The communication thread enqueues on this backend's device.
  if (onDevice_ && ep_.worker != nullptr) ep_.worker->run([this](Communicator&) { backend_.bindThread(); });
}

size_t MoeMlp::expertFloats() const {
  const size_t F = static_cast<size_t>(fcRows());
  return F * C_ + F + static_cast<size_t>(C_) * hidden_ + C_;
}

MoeMlp::ExpertTensors MoeMlp::expertTensors(int localExpert) const {
  const size_t F = static_cast<size_t>(fcRows());
  ExpertTensors t;
  t.fcWeight = static_cast<size_t>(localExpert) * expertFloats();
  t.fcBias = t.fcWeight + F * C_;
  t.projWeight = t.fcBias + F;
  t.projBias = t.projWeight + static_cast<size_t>(C_) * hidden_;
  return t;
}

size_t MoeMlp::scratchFloats() const {
  size_t floats = logits_.size() + dlogits_.size() + dgate_.size() + logitsOn_.size() + dlogitsOn_.size() +
                  dgateOn_.size() + dExpertIn_.size() + dfc_.size() + dact_.size() + grouped_.size() +
                  (inp16_.size() + weight16_.size()) / 2;
  for (const auto* buffers : {&sent_, &received_, &returned_}) {
    for (const auto& b : *buffers) floats += b.size();
  }
  return floats;
}

MoeProfile MoeMlp::takeProfile() { return std::exchange(profile_, MoeProfile{}); }

void MoeMlp::planChunks(MoeActivations& a) {
  const int E = config_.experts, k = config_.topK, n = a.tokens, P = ep_.size(), El = localExperts_;
  // Every ep rank cuts into the same number of chunks (some may be empty), so the exchanges pair up.
  const int K = P > 1 ? config_.chunks : 1;
  a.chunks.assign(K, MoeChunk{});
  std::vector<int> chunkOf(n);
  for (int c = 0; c < K; ++c) {
    MoeChunk& ch = a.chunks[c];
    ch.first = static_cast<int>(static_cast<long>(c) * n / K);
    ch.tokens = static_cast<int>(static_cast<long>(c + 1) * n / K) - ch.first;
    std::fill(chunkOf.begin() + ch.first, chunkOf.begin() + ch.first + ch.tokens, c);
    ch.row.assign(static_cast<size_t>(ch.tokens) * k, -1);
    ch.counts.assign(E, 0);
  }
  if (K == 1) {
    a.chunks[0].row = a.row;
    a.chunks[0].counts = a.counts;
  } else {
    // Walk the batch's rows in order (expert by expert, each in priority order) and number each
    // within its token's chunk, so each chunk keeps the batch's order.
    const size_t rows = std::accumulate(a.counts.begin(), a.counts.end(), size_t{0});
    std::vector<int> choiceOfRow(rows);
    for (int i = 0; i < n * k; ++i) {
      if (a.row[i] >= 0) {
        choiceOfRow[a.row[i]] = i;
        ++a.chunks[chunkOf[i / k]].counts[a.expert[i]];
      }
    }
    std::vector<std::vector<int>> next(K, std::vector<int>(E, 0));
    for (int c = 0; c < K; ++c)
      std::exclusive_scan(a.chunks[c].counts.begin(), a.chunks[c].counts.end(), next[c].begin(), 0);
    for (size_t r = 0; r < rows; ++r) {
      const int i = choiceOfRow[r];
      MoeChunk& ch = a.chunks[chunkOf[i / k]];
      ch.row[i - ch.first * k] = next[&ch - a.chunks.data()][a.expert[i]]++;
    }
  }
  // The counts of every chunk to every expert's rank, in one all-to-all: [rank][chunk][local expert].
  std::vector<int> out(static_cast<size_t>(P) * K * El), in(out.size());
  for (int p = 0; p < P; ++p) {
    for (int c = 0; c < K; ++c) {
      std::copy_n(a.chunks[c].counts.begin() + p * El, El, out.begin() + (static_cast<size_t>(p) * K + c) * El);
    }
  }
  if (P == 1) {
    in = out;
  } else if (ep_.worker != nullptr) {
    ep_.worker->run([&](Communicator& comm) { comm.allToAll<int>(out, in); });
  } else {
    ep_.comm->allToAll<int>(out, in);
  }
  size_t sentAt = 0, expertAt = 0;
  for (int c = 0; c < K; ++c) {
    MoeChunk& ch = a.chunks[c];
    ch.recvCounts.resize(static_cast<size_t>(P) * El);
    for (int s = 0; s < P; ++s) {
      std::copy_n(in.begin() + (static_cast<size_t>(s) * K + c) * El, El, ch.recvCounts.begin() + s * El);
    }
    ch.sendRows.assign(P, 0);
    for (int e = 0; e < E; ++e) ch.sendRows[e / El] += ch.counts[e];
    ch.recvRows.assign(P, 0);
    for (int i = 0; i < P * El; ++i) ch.recvRows[i / El] += ch.recvCounts[i];
    ch.sentAt = sentAt;
    ch.expertAt = expertAt;
    sentAt += ch.sent();
    expertAt += ch.received();
  }
}

std::future<void> MoeMlp::startExchange(const Buffer<float>& in, float* out, size_t c, const MoeChunk& chunk,
                                        bool toExperts) {
  const std::vector<size_t>& sendRows = toExperts ? chunk.sendRows : chunk.recvRows;
  const std::vector<size_t>& recvRows = toExperts ? chunk.recvRows : chunk.sendRows;
  const std::span<const float> from(in.data(), in.size());
  const std::span<float> to(out, sum(recvRows) * C_);
  // On a device the exchange is a device all-to-allv on the expert-parallel lane, after the work
  // the compute queue has so far (which wrote `in` and last read `out`); finish() has the compute
  // queue wait for it.
  const Backend::Mark ready = onDevice_ ? backend_.mark(Backend::Queue::kCompute) : Backend::Mark{};
  auto move = [this, from, to, ready, c, &sendRows, &recvRows](Communicator& comm) {
    std::vector<size_t> sendCounts(sendRows.size()), recvCounts(recvRows.size());
    for (size_t r = 0; r < sendRows.size(); ++r) {
      sendCounts[r] = sendRows[r] * C_;
      recvCounts[r] = recvRows[r] * C_;
    }
    if (!onDevice_) {
      comm.allToAllv<float>(from, sendCounts, to, recvCounts);
      return;
    }
    constexpr int kLane = Backend::kExpertParallelLane;
    backend_.wait(Backend::Queue::kComm, ready, kLane);
    comm.allToAllv<float>(from, sendCounts, to, recvCounts,
                          static_cast<chorusStream_t>(backend_.stream(Backend::Queue::kComm, kLane)));
    arrived_[c] = backend_.mark(Backend::Queue::kComm, kLane);
  };
  if (ep_.worker != nullptr) {
    return ep_.worker->submit([move](Communicator& comm) -> std::optional<Request> {
      move(comm);
      return std::nullopt;
    });
  }
  // On the calling thread (one rank: the rows only copied where they go), the whole exchange is
  // waiting (on a device: its enqueueing).
  std::promise<void> done;
  const auto t0 = Clock::now();
  if (ep_.comm == nullptr) {
    backend_.copy(out, in.data(), in.size() * sizeof(float));
  } else {
    move(*ep_.comm);
  }
  profile_.wait += since(t0);
  done.set_value();
  return done.get_future();
}

void MoeMlp::finish(std::future<void>& exchange, size_t c) {
  const auto t0 = Clock::now();
  exchange.get();
  if (onDevice_) backend_.wait(Backend::Queue::kCompute, std::exchange(arrived_[c], nullptr));
  profile_.wait += since(t0);
}

void MoeMlp::sizeChunkBuffers(const MoeActivations& a) {
  const size_t K = a.chunks.size();
  sent_.resize(K);
  received_.resize(K);
  returned_.resize(K);
  if (onDevice_) arrived_.resize(K);
  for (size_t c = 0; c < K; ++c) {
    sent_[c].ensure(backend_, a.chunks[c].sent() * C_);
    received_[c].ensure(backend_, a.chunks[c].received() * C_);
    returned_[c].ensure(backend_, a.chunks[c].received() * C_);
  }
}

void MoeMlp::arrive(std::vector<std::future<void>>& exchanges, size_t c, double& phase) {
  const auto t0 = Clock::now();
  finish(exchanges[c], c);
  phase += since(t0);
  if (c + 1 < exchanges.size() && exchanges[c + 1].wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ++profile_.overlapped;
  }
  ++profile_.chunks;
}

void MoeMlp::regroup(const float* in, float* out, const MoeChunk& chunk, bool toExpertMajor) const {
  const int P = ep_.size(), El = localExperts_;
  // Where each (source, expert) run starts in either order.
  std::vector<size_t> sourceMajor(static_cast<size_t>(P) * El), expertMajor(static_cast<size_t>(P) * El);
  size_t at = 0;
  for (int s = 0; s < P; ++s) {
    for (int e = 0; e < El; ++e) {
      sourceMajor[s * El + e] = at;
      at += chunk.recvCounts[s * El + e];
    }
  }
  at = 0;
  for (int e = 0; e < El; ++e) {
    for (int s = 0; s < P; ++s) {
      expertMajor[s * El + e] = at;
      at += chunk.recvCounts[s * El + e];
    }
  }
  for (int i = 0; i < P * El; ++i) {
    const size_t from = toExpertMajor ? sourceMajor[i] : expertMajor[i];
    const size_t to = toExpertMajor ? expertMajor[i] : sourceMajor[i];
    if (chunk.recvCounts[i] == 0) continue;  // (the buffers may be empty: no pointer to copy through)
    backend_.copy(out + to * C_, in + from * C_, sizeof(float) * C_ * chunk.recvCounts[i]);
  }
}

int MoeMlp::rowsOf(const MoeChunk& chunk, int localExpert) const {
  int rows = 0;
  for (int s = 0; s < ep_.size(); ++s) rows += chunk.recvCounts[s * localExperts_ + localExpert];
  return rows;
}

void MoeMlp::castOperands(const float* inp, size_t inCount, const float* weight, size_t weightCount) {
  inp16_.ensure(backend_, inCount);
  weight16_.ensure(backend_, weightCount);
  backend_.toFloat16(*sixteen_, inp, inp16_.data(), inCount);
  backend_.toFloat16(*sixteen_, weight, weight16_.data(), weightCount);
}

void MoeMlp::expertLinearForward(float* out, const float* inp, const float* weight, const float* bias, int n, int c,
                                 int oc) {
  if (!sixteen_) {
    backend_.matmulForward(out, inp, weight, bias, n, c, oc);
    return;
  }
  castOperands(inp, static_cast<size_t>(n) * c, weight, static_cast<size_t>(oc) * c);
  backend_.matmulForward16(*sixteen_, out, inp16_.data(), weight16_.data(), bias, n, c, oc);
}

void MoeMlp::expertLinearBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, int n, int c, int oc) {
  if (!sixteen_) {
    backend_.matmulBackward(dinp, dweight, dbias, dout, inp, weight, n, c, oc);
    return;
  }
  castOperands(inp, static_cast<size_t>(n) * c, weight, static_cast<size_t>(oc) * c);
  backend_.matmulBackward16(*sixteen_, dinp, dweight, dbias, dout, inp16_.data(), weight16_.data(), n, c, oc);
}

template <typename Fn>
void MoeMlp::forEachExpert(const MoeChunk& chunk, Fn fn) const {
  size_t first = chunk.expertAt;
  for (int e = 0; e < localExperts_; ++e) {
    const int count = rowsOf(chunk, e);
    if (count > 0) fn(expertTensors(e), first, count);
    first += count;
  }
}

void MoeMlp::expertsForward(float* y, const float* experts, MoeActivations& a, const MoeChunk& chunk) {
  const int C = C_, F = fcRows(), H = hidden_;
  forEachExpert(chunk, [&](const ExpertTensors& t, size_t first, int count) {
    float* fc = a.fc.data() + first * F;
    float* act = a.act.data() + first * H;
    expertLinearForward(fc, a.expertIn.data() + first * C, experts + t.fcWeight, experts + t.fcBias, count, C, F);
    if (config_.swiglu) {
      backend_.swigluForward(act, fc, count, H);
    } else {
      backend_.geluForward(act, fc, static_cast<size_t>(count) * H);
    }
    expertLinearForward(y + (first - chunk.expertAt) * C, act, experts + t.projWeight, experts + t.projBias, count, H,
                        C);
  });
}

void MoeMlp::expertsBackward(float* dx, float* dExperts, const float* dy, const float* experts, const MoeActivations& a,
                             const MoeChunk& chunk) {
  const int C = C_, F = fcRows(), H = hidden_;
  forEachExpert(chunk, [&](const ExpertTensors& t, size_t first, int count) {
    const size_t local = first - chunk.expertAt;
    dact_.ensure(backend_, static_cast<size_t>(count) * H);
    dfc_.ensure(backend_, static_cast<size_t>(count) * F);
    backend_.zero(dact_.data(), dact_.size() * sizeof(float));
    backend_.zero(dfc_.data(), dfc_.size() * sizeof(float));
    const float* fc = a.fc.data() + first * F;
    expertLinearBackward(dact_.data(), dExperts + t.projWeight, dExperts + t.projBias, dy + local * C,
                         a.act.data() + first * H, experts + t.projWeight, count, H, C);
    if (config_.swiglu) {
      backend_.swigluBackward(dfc_.data(), fc, dact_.data(), count, H);
    } else {
      backend_.geluBackward(dfc_.data(), fc, dact_.data(), static_cast<size_t>(count) * H);
    }
    expertLinearBackward(dx + local * C, dExperts + t.fcWeight, dExperts + t.fcBias, dfc_.data(),
                         a.expertIn.data() + first * C, experts + t.fcWeight, count, C, F);
  });
}

void MoeMlp::forward(float* out, const float* x, int n, const float* router, const float* experts, MoeActivations& a) {
  const int E = config_.experts, k = config_.topK, C = C_;
  auto t0 = Clock::now();
  a.tokens = n;
  // The router's product where x is, its logits to the host for the routing.
  logitsOn_.ensure(backend_, static_cast<size_t>(n) * E);
  backend_.matmulForward(logitsOn_.data(), x, router, nullptr, n, C, E);
  logits_.resize(logitsOn_.size());
  backend_.toHost(logits_.data(), logitsOn_.data(), logits_.size() * sizeof(float));
  a.probs.resize(static_cast<size_t>(n) * E);
  a.lse.resize(n);
  kn::routerSoftmax(a.probs.data(), a.lse.data(), logits_.data(), n, E);
  a.expert.resize(static_cast<size_t>(n) * k);
  a.gate.resize(a.expert.size());
  a.row.resize(a.expert.size());
  a.assigned.resize(E);
  a.counts.resize(E);
  a.dropped =
      kn::routeTopK(a.expert.data(), a.gate.data(), a.row.data(), a.assigned.data(), a.counts.data(), a.probs.data(), n,
                    E, k, config_.normalizeGates(), kn::expertCapacity(config_.capacityFactor, n, E, k));
  // The losses are means over the token group's tokens: its ranks add up their sums first.
  std::vector<float> sums(E + 2);
  kn::routerColumnSums(sums.data(), a.probs.data(), n, E);
  sums[E] = static_cast<float>(kn::routerSquares(a.lse.data(), n));
  sums[E + 1] = static_cast<float>(n);
  if (tokenGroup_ != nullptr) {
    tokenGroup_->allReduce(std::span<float>(sums));
    tokenGroup_->allReduce(std::span<int>(a.assigned));
  }
  a.total = static_cast<int>(sums[E + 1]);
  a.aux = kn::routerAuxLoss(sums.data(), a.assigned.data(), a.total, E, k);
  a.z = sums[E] / static_cast<float>(a.total);
  profile_.route += since(t0);

  // Dispatch: each chunk's rows in expert order (each rank's experts' rows one block), sent as
  // soon as they are gathered.
  t0 = Clock::now();
  planChunks(a);
  const size_t K = a.chunks.size();
  // What the kernels read of the routing: each chunk's rows (token order) and the gates.
  std::vector<int> rows;
  rows.reserve(static_cast<size_t>(n) * k);
  for (const MoeChunk& ch : a.chunks) rows.insert(rows.end(), ch.row.begin(), ch.row.end());
  a.chunkRows.ensure(backend_, rows.size());
  backend_.fromHost(a.chunkRows.data(), rows.data(), rows.size() * sizeof(int));
  a.gates.ensure(backend_, a.gate.size());
  backend_.fromHost(a.gates.data(), a.gate.data(), a.gate.size() * sizeof(float));
  sizeChunkBuffers(a);
  Exchanges dispatched(K), combined(K);
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    backend_.moeDispatch(sent_[c].data(), x + static_cast<size_t>(ch.first) * C,
                         a.chunkRows.data() + static_cast<size_t>(ch.first) * k, ch.tokens, k, C);
    dispatched.futures[c] = startExchange(sent_[c], received_[c].data(), c, ch, true);
  }
  const size_t localRows = a.chunks.back().expertAt + a.chunks.back().received();
  a.expertIn.ensure(backend_, localRows * C);
  a.fc.ensure(backend_, localRows * fcRows());
  a.act.ensure(backend_, localRows * hidden_);
  a.combined.ensure(backend_, (a.chunks.back().sentAt + a.chunks.back().sent()) * C);
  profile_.dispatch += since(t0);

  // The experts, chunk by chunk as its rows arrive, each on its rows from every rank; the outputs
  // start back at once.
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    arrive(dispatched.futures, c, profile_.dispatch);
    t0 = Clock::now();
    regroup(received_[c].data(), a.expertIn.data() + ch.expertAt * C, ch, true);
    grouped_.ensure(backend_, ch.received() * C);
    expertsForward(grouped_.data(), experts, a, ch);
    regroup(grouped_.data(), returned_[c].data(), ch, false);
    profile_.experts += since(t0);
    t0 = Clock::now();
    combined.futures[c] = startExchange(returned_[c], a.combined.data() + ch.sentAt * C, c, ch, false);
    profile_.combine += since(t0);
  }

  // Combine: the gated sum of each chunk's tokens once its outputs are home.
  t0 = Clock::now();
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    finish(combined.futures[c], c);
    const size_t at = static_cast<size_t>(ch.first) * k;
    backend_.moeCombine(out + static_cast<size_t>(ch.first) * C, a.combined.data() + ch.sentAt * C,
                        a.chunkRows.data() + at, a.gates.data() + at, ch.tokens, k, C);
  }
  profile_.combine += since(t0);
}

void MoeMlp::backward(float* dx, float* dRouter, float* dExperts, const float* dout, const float* x,
                      const float* router, const float* experts, const MoeActivations& a, float lossScale) {
  const int E = config_.experts, k = config_.topK, C = C_, n = a.tokens;
  const size_t K = a.chunks.size();
  // The gradient of the combine, chunk by chunk, each sent to the experts at once.
  auto t0 = Clock::now();
  dgateOn_.ensure(backend_, static_cast<size_t>(n) * k);
  sizeChunkBuffers(a);
  Exchanges toExperts(K), back(K);
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    const size_t at = static_cast<size_t>(ch.first) * k;
    backend_.moeCombineBackward(sent_[c].data(), dgateOn_.data() + at, dout + static_cast<size_t>(ch.first) * C,
                                a.combined.data() + ch.sentAt * C, a.chunkRows.data() + at, a.gates.data() + at,
                                ch.tokens, k, C);
    toExperts.futures[c] = startExchange(sent_[c], received_[c].data(), c, ch, true);
  }
  profile_.combine += since(t0);

  // The experts' backward as each chunk's gradient arrives; the inputs' gradient starts back at once.
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    arrive(toExperts.futures, c, profile_.combine);
    t0 = Clock::now();
    grouped_.ensure(backend_, ch.received() * C);
    regroup(received_[c].data(), grouped_.data(), ch, true);
    dExpertIn_.ensure(backend_, ch.received() * C);
    backend_.zero(dExpertIn_.data(), dExpertIn_.size() * sizeof(float));
    expertsBackward(dExpertIn_.data(), dExperts, grouped_.data(), experts, a, ch);
    regroup(dExpertIn_.data(), returned_[c].data(), ch, false);
    profile_.experts += since(t0);
    // (sent_[c] held the combine's gradient, which has left: it takes the inputs' gradient now.)
    t0 = Clock::now();
    back.futures[c] = startExchange(returned_[c], sent_[c].data(), c, ch, false);
    profile_.dispatch += since(t0);
  }
  t0 = Clock::now();
  for (size_t c = 0; c < K; ++c) {
    const MoeChunk& ch = a.chunks[c];
    finish(back.futures[c], c);
    backend_.moeDispatchBackward(dx + static_cast<size_t>(ch.first) * C, sent_[c].data(),
                                 a.chunkRows.data() + static_cast<size_t>(ch.first) * k, ch.tokens, k, C);
  }
  profile_.dispatch += since(t0);

  // The router's gradient: the gates' gradient to the host, through the routing there, its
  // logits' gradient back for the product.
  t0 = Clock::now();
  dgate_.resize(dgateOn_.size());
  backend_.toHost(dgate_.data(), dgateOn_.data(), dgate_.size() * sizeof(float));
  dlogits_.resize(static_cast<size_t>(n) * E);
  kn::routerBackward(dlogits_.data(), dgate_.data(), a.probs.data(), a.lse.data(), a.expert.data(), a.gate.data(),
                     a.row.data(), a.assigned.data(), n, a.total, E, k, config_.normalizeGates(),
                     config_.auxCoef * lossScale, config_.zCoef * lossScale);
  dlogitsOn_.ensure(backend_, dlogits_.size());
  backend_.fromHost(dlogitsOn_.data(), dlogits_.data(), dlogits_.size() * sizeof(float));
  backend_.matmulBackward(dx, dRouter, nullptr, dlogitsOn_.data(), x, router, n, C, E);
  profile_.route += since(t0);
}

}  // namespace chorus::training
