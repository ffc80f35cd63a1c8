// peer_gloo.cc: Gloo as a collbench peer. Its tcp transport, its ranks meeting through a file
// store; every algorithm Gloo offers for a call is timed and the fastest reported (all-reduce:
// its ring and bcube, and halving-doubling from its older algorithm classes; reduce-scatter:
// halving-doubling, the only one it has). Ops Gloo lacks (sendrecv, scatter), bfloat16 and the
// average reduction are left out (N/A in the table).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>

#include "bench/peers.h"

namespace chorus::bench {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// Calls f.template operator()<T>() with T the Gloo element type of `type`; false for types Gloo
// has none for (bfloat16).
template <typename F>
bool withGlooType(chorusDataType_t type, F&& f) {
  switch (type) {
    case chorusInt8:
      f.template operator()<int8_t>();
      return true;
    case chorusUint8:
      f.template operator()<uint8_t>();
      return true;
    case chorusInt32:
      f.template operator()<int32_t>();
      return true;
    case chorusUint32:
      f.template operator()<uint32_t>();
      return true;
    case chorusInt64:
      f.template operator()<int64_t>();
      return true;
    case chorusUint64:
      f.template operator()<uint64_t>();
      return true;
    case chorusFloat16:
      f.template operator()<gloo::float16>();
      return true;
    case chorusFloat32:
      f.template operator()<float>();
      return true;
    case chorusFloat64:
      f.template operator()<double>();
      return true;
    default:
      return false;
  }
}

template <typename T>
ReduceFn reduceFnOf(chorusRedOp_t op) {
  switch (op) {
    case chorusSum:
      return &gloo::sum<T>;
    case chorusProd:
      return &gloo::product<T>;
    case chorusMax:
      return &gloo::max<T>;
    case chorusMin:
      return &gloo::min<T>;
    default:
      return nullptr;
  }
}

template <typename T>
const gloo::ReductionFunction<T>* reductionOf(chorusRedOp_t op) {
  switch (op) {
    case chorusSum:
      return gloo::ReductionFunction<T>::sum;
    case chorusProd:
      return gloo::ReductionFunction<T>::product;
    case chorusMax:
      return gloo::ReductionFunction<T>::max;
    case chorusMin:
      return gloo::ReductionFunction<T>::min;
    default:
      return nullptr;
  }
}

bool reduces(Op op) { return infoOf(op).reduces != 0; }

class GlooPeer : public Peer {
 public:
  GlooPeer(int rank, int nranks, const std::string& storeDir) : rank_(rank), nranks_(nranks) {
    gloo::transport::tcp::attr attr;
    // GLOO_SOCKET_IFNAME picks the interface, as in PyTorch; otherwise this host's name.
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
      attr.iface = iface;
    } else {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      attr.hostname = host;
    }
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    context->setTimeout(std::chrono::seconds(120));
    gloo::rendezvous::FileStore store(storeDir);
    context->connectFullMesh(store, device_);
    context_ = context;
  }

  const char* name() const override { return "gloo"; }

  std::vector<std::string> algorithms(const Call& call) const override {
    bool typed = withGlooType(call.type, []<typename T>() {});
    if (!typed || (reduces(call.op) && call.redop == chorusAvg)) return {};
    switch (call.op) {
      case Op::kAllReduce:
        return {"ring", "bcube", "halving_doubling"};
      case Op::kReduceScatter:
        return {"halving_doubling"};
      case Op::kAllGather:
      case Op::kAllToAll:
      case Op::kAllToAllv:
      case Op::kBroadcast:
      case Op::kReduce:
      case Op::kGather:
      case Op::kBarrier:
        return {""};
      default:
        return {};
    }
  }

  void run(const Call& call, const std::string& algorithm) override {
    try {
      withGlooType(call.type, [&]<typename T>() { runTyped<T>(call, algorithm); });
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("gloo ") + call.opName + (algorithm.empty() ? "" : " (" + algorithm + ")") +
                               " failed on rank " + std::to_string(rank_) + ": " + e.what());
    }
  }

 private:
  template <typename T>
  void runTyped(const Call& call, const std::string& algorithm) {
    T* in = static_cast<T*>(const_cast<void*>(call.send));
    T* out = static_cast<T*>(call.recv);
    const size_t count = call.count;
    const size_t n = static_cast<size_t>(nranks_);
    const size_t bytes = count * sizeof(T);
    switch (call.op) {
      case Op::kAllReduce:
        if (algorithm == "halving_doubling") {
          // Gloo's older algorithm classes work in place on buffers fixed when they are built:
          // the input is copied to the output first, as an out-of-place call must.
          auto& kept = keep<gloo::AllreduceHalvingDoubling<T>>(call, [&] {
            return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(
                context_, std::vector<T*>{out}, static_cast<int>(count), reductionOf<T>(call.redop));
          });
          std::memcpy(call.recv, call.send, bytes);
          kept.run();
        } else {
          gloo::AllreduceOptions opts(context_);
          opts.setAlgorithm(algorithm == "bcube" ? gloo::AllreduceOptions::Algorithm::BCUBE
                                                 : gloo::AllreduceOptions::Algorithm::RING);
          opts.setInput(in, count);
          opts.setOutput(out, count);
          opts.setReduceFunction(reduceFnOf<T>(call.redop));
          gloo::allreduce(opts);
        }
        break;
      case Op::kReduceScatter: {
        // In place on a whole input's worth of scratch; this rank's block lands at its start.
        scratch_.resize(bytes * n);
        T* work = reinterpret_cast<T*>(scratch_.data());
        auto& kept = keep<gloo::ReduceScatterHalvingDoubling<T>>(call, [&] {
          return std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(
              context_, std::vector<T*>{work}, static_cast<int>(count * n),
              std::vector<int>(n, static_cast<int>(count)), reductionOf<T>(call.redop));
        });
        std::memcpy(scratch_.data(), call.send, bytes * n);
        kept.run();
        std::memcpy(call.recv, scratch_.data(), bytes);
        break;
      }
      case Op::kAllGather: {
        gloo::AllgatherOptions opts(context_);
        opts.setInput(in, count);
        opts.setOutput(out, count * n);
        gloo::allgather(opts);
        break;
      }
      case Op::kAllToAll: {
        gloo::AlltoallOptions opts(context_);
        opts.setInput(in, count * n);
        opts.setOutput(out, count * n);
        gloo::alltoall(opts);
        break;
      }
      case Op::kAllToAllv: {
        // Gloo takes the elements per rank; the blocks lie back to back in rank order, as
        // collbench's displacements place them.
        std::vector<int64_t> sendCounts(n), recvCounts(n);
        for (size_t r = 0; r < n; ++r) {
          sendCounts[r] = static_cast<int64_t>(call.sendCounts[r]);
          recvCounts[r] = static_cast<int64_t>(call.recvCounts[r]);
        }
        gloo::AlltoallvOptions opts(context_);
        opts.setInput(in, std::move(sendCounts));
        opts.setOutput(out, std::move(recvCounts));
        gloo::alltoallv(opts);
        break;
      }
      case Op::kBroadcast: {
        gloo::BroadcastOptions opts(context_);
        if (rank_ == call.root) opts.setInput(in, count);
        opts.setOutput(out, count);
        opts.setRoot(call.root);
        gloo::broadcast(opts);
        break;
      }
      case Op::kReduce: {
        gloo::ReduceOptions opts(context_);
        opts.setInput(in, count);
        opts.setOutput(out, count);
        opts.setRoot(call.root);
        opts.setReduceFunction(reduceFnOf<T>(call.redop));
        gloo::reduce(opts);
        break;
      }
      case Op::kGather: {
        gloo::GatherOptions opts(context_);
        opts.setInput(in, count);
        if (rank_ == call.root) opts.setOutput(out, count * n);
        opts.setRoot(call.root);
        gloo::gather(opts);
        break;
      }
      case Op::kBarrier: {
        gloo::BarrierOptions opts(context_);
        gloo::barrier(opts);
        break;
      }
      default:
        throw std::runtime_error("no such op in Gloo");
    }
  }

  // The algorithm object of an older Gloo class for this call, built when the call's buffers,
  // size, type or reduction change (building one connects its buffers, so it is not per call).
  template <typename A, typename Make>
  A& keep(const Call& call, Make make) {
    const Key key{call.op, call.send, call.recv, call.count, call.type, call.redop};
    if (!(key == keptKey_) || kept_.get() == nullptr) {
      kept_.reset();  // its buffers' slots are released before the new one takes them
      kept_ = make();
      keptKey_ = key;
    }
    return static_cast<A&>(*kept_);
  }

  struct Key {
    Op op = Op::kBarrier;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    chorusDataType_t type = chorusFloat32;
    chorusRedOp_t redop = chorusSum;
    bool operator==(const Key&) const = default;
  };

  int rank_;
  int nranks_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::Algorithm> kept_;
  Key keptKey_;
  std::vector<char> scratch_;
};

}  // namespace

std::unique_ptr<Peer> makeGlooPeer(int rank, int nranks, const std::string& storeDir) {
  try {
    return std::make_unique<GlooPeer>(rank, nranks, storeDir);
  } catch (const std::exception& e) {
    throw std::runtime_error("gloo: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                             " could not connect through the file store in " + storeDir + ": " + e.what());
  }
}

}  // namespace chorus::bench
