// process_group.cc: chorus as a torch.distributed backend (python/chorus_torch registers it as
// "chorus"). One source for PyTorch 1.13 (a c10d::ProcessGroup) and PyTorch 2 (a c10d::Backend,
// registered for CPU and CUDA tensors), told apart at compile time by TORCH_VERSION_MAJOR.
//
// CPU tensors: each call is handed to the group's one worker thread in call order, so it returns
// at once with a Work (and its Future, which DistributedDataParallel waits on) as Gloo's do.
// Sends and receives start as chorus non-blocking operations, so an exchange posted send-first on
// both sides cannot deadlock; the worker finishes them as chorus reports them done.
//
// CUDA tensors (a PyTorch built with CUDA, CHORUS_TORCH_CUDA): each call is enqueued at once on
// the tensors' device's current stream through chorus's device path and returns; the Work is
// done when enqueued, its wait() makes the then-current stream wait for the call, and its Future
// is a CUDA future (consumers' streams wait on it), as ProcessGroupNCCL's are. CPU and CUDA calls
// share the communicator, one at a time.
//
// The ranks meet through the store torch.distributed gives the backend (rank 0 puts a chorus
// unique id there); the group's timeout becomes chorus's per-operation timeout. CPU tensors of
// float, double, half, bfloat16, int8, uint8, int32 and int64 (bool for MIN and MAX, and for
// the collectives that only move data); SUM, PRODUCT, MIN, MAX and AVG. Anything else is refused
// with a message naming it. Send and receive tags are not matched: messages between two ranks
// pair in the order they are posted, as chorus's do.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif
#if defined(CHORUS_TORCH_CUDA)
#include <c10/core/Event.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "chorus/chorus.h"

namespace chorus::torch {
namespace {

using c10d::OpType;
using c10d::ReduceOp;
using c10d::Work;
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

[[noreturn]] void raise(const std::string& what) { throw std::runtime_error("chorus: " + what); }

void check(chorusResult_t result, chorusComm_t comm, const char* call) {
  if (result != chorusSuccess) raise(std::string(call) + ": " + chorusGetLastError(comm));
}

chorusDataType_t typeOf(const at::Tensor& t, const char* call) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return chorusFloat32;
    case at::kDouble:
      return chorusFloat64;
    case at::kHalf:
      return chorusFloat16;
    case at::kBFloat16:
      return chorusBfloat16;
    case at::kChar:
      return chorusInt8;
    case at::kByte:
    case at::kBool:
      return chorusUint8;
    case at::kInt:
      return chorusInt32;
    case at::kLong:
      return chorusInt64;
    default:
      raise(std::string(call) + ": tensors of type " + c10::toString(t.scalar_type()) + " are not supported");
  }
}

chorusRedOp_t opOf(const ReduceOp& op, const at::Tensor& t, const char* call) {
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case ReduceOp::SUM:
      if (!boolean) return chorusSum;
      break;
    case ReduceOp::PRODUCT:
      if (!boolean) return chorusProd;
      break;
    case ReduceOp::MIN:
      return chorusMin;
    case ReduceOp::MAX:
      return chorusMax;
    case ReduceOp::AVG:
      if (!boolean) return chorusAvg;
      break;
    default:
      break;
  }
  raise(std::string(call) + ": reduce op " + std::to_string(static_cast<int>(op.op_)) + " is not supported" +
        (boolean ? " on bool tensors" : " (SUM, PRODUCT, MIN, MAX and AVG are)"));
}

// A tensor laid out densely, as chorus reads and writes buffers: on the CPU, or (a PyTorch with
// CUDA) on a CUDA device.
void checkTensor(const at::Tensor& t, const char* call) {
#if defined(CHORUS_TORCH_CUDA)
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    raise(std::string(call) + ": only CPU and CUDA tensors are supported (got " + t.device().str() + ")");
  }
#else
  if (!t.device().is_cpu()) {
    raise(std::string(call) + ": only CPU tensors are supported (this build of the backend has no CUDA; got " +
          t.device().str() + ")");
  }
#endif
  if (!t.is_contiguous()) raise(std::string(call) + ": tensors must be contiguous");
}

// Every tensor of a call on one device.
void checkSameDevice(const std::vector<at::Tensor>& tensors, const char* call) {
  for (const at::Tensor& t : tensors) {
    if (t.device() != tensors[0].device()) {
      raise(std::string(call) + ": tensors on " + tensors[0].device().str() + " and " + t.device().str() +
            " in one call");
    }
  }
}

void checkSingle(const std::vector<at::Tensor>& tensors, const char* call) {
  if (tensors.size() != 1) {
    raise(std::string(call) + ": takes one tensor per call (got " + std::to_string(tensors.size()) + ")");
  }
  checkTensor(tensors[0], call);
}

// The tensors' elements end to end, as one flat tensor.
at::Tensor joined(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape(-1));
  return at::cat(flat);
}

// Copies a flat tensor's consecutive blocks into the tensors, each of its own size.
void spread(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

// The one list of one tensor per rank a gather's or scatter's root passes (what: "output" / "input").
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* call,
                                 const char* what) {
  if (lists.size() != 1 || static_cast<int>(lists[0].size()) != size) {
    raise(std::string(call) + ": the root expects one list of " + std::to_string(size) + " " + what + " tensors");
  }
  return lists[0];
}

// The Work of one call: done when the worker has run it (CPU), or when it is enqueued on its
// stream (CUDA: wait() then orders the current stream after it); its Future carries the output
// tensors, and for CUDA ones is a CUDA future of their device.
class ChorusWork : public Work {
 public:
  ChorusWork(int rank, OpType type, std::vector<at::Tensor> outputs, std::optional<c10::Device> cuda = std::nullopt)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        future_(cuda ? c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                                std::vector<c10::Device>{*cuda})
                     : c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
        cuda_(cuda) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

#if defined(CHORUS_TORCH_CUDA)
  // CUDA: the event recorded on the call's stream right after it was enqueued.
  void enqueued(c10::Stream stream) {
    event_.emplace(c10::DeviceType::CUDA);
    event_->record(stream);
  }
  bool wait(std::chrono::milliseconds timeout) override {
    if (event_) {
      const c10::Stream current = c10::cuda::getCurrentCUDAStream(cuda_->index()).unwrap();
      event_->block(current);
      return true;
    }
    return Work::wait(timeout);
  }
#endif

  void complete(std::exception_ptr error) {
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::optional<c10::Device> cuda_;
#if defined(CHORUS_TORCH_CUDA)
  std::optional<c10::Event> event_;
#endif
};

// Backends made by this process, in order: each meets its peers under its own store key (every
// rank makes its groups in the same order).
std::atomic<int> backendsMade{0};

class ProcessGroupChorus : public BackendBase {
 public:
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout)
      : BackendBase(rank, size) {
    chorusUniqueId id;
    const std::string key = "chorus/unique_id/" + std::to_string(backendsMade.fetch_add(1));
    if (rank == 0) {
      check(chorusGetUniqueId(&id), nullptr, "chorusGetUniqueId");
      store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id + 1)));
    } else {
      const std::vector<uint8_t> got = store->get(key);  // waits for rank 0, within the store's timeout
      if (got.size() != sizeof(id)) raise("the unique id in the store has " + std::to_string(got.size()) + " bytes");
      std::memcpy(&id, got.data(), sizeof(id));
    }
    chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
    if (timeout.count() > 0 && timeout.count() < INT32_MAX) config.timeoutMs = static_cast<int>(timeout.count());
    check(chorusCommInitRankConfig(&comm_, size, id, rank, &config), nullptr, "chorusCommInitRankConfig");
    worker_ = std::thread([this] { work(); });
  }

  ~ProcessGroupChorus() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    // The worker may be dropping the last reference to a tensor Python also knew, which takes the
    // GIL: a destructor run from Python (holding it) lets it go while it waits.
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      worker_.join();
    } else {
      worker_.join();
    }
    chorusCommDestroy(comm_);
  }

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    checkSingle(tensors, "broadcast");
    at::Tensor t = tensors[0];
    const chorusDataType_t type = typeOf(t, "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    return post(OpType::BROADCAST, t, {t}, [=, this](chorusStream_t stream) {
      check(chorusBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), type, root, comm_, stream), comm_, "broadcast");
    });
  }

  c10::intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    checkSingle(tensors, "allreduce");
    at::Tensor t = tensors[0];
    const chorusDataType_t type = typeOf(t, "allreduce");
    const chorusRedOp_t op = opOf(opts.reduceOp, t, "allreduce");
    return post(OpType::ALLREDUCE, t, {t}, [=, this](chorusStream_t stream) {
      check(chorusAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, op, comm_, stream), comm_, "allreduce");
    });
  }

  c10::intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceCoalescedOptions& opts) override {
    if (tensors.empty()) raise("allreduce_coalesced: no tensors");
    for (const at::Tensor& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      if (t.scalar_type() != tensors[0].scalar_type()) raise("allreduce_coalesced: tensors of different types");
    }
    checkSameDevice(tensors, "allreduce_coalesced");
    const chorusDataType_t type = typeOf(tensors[0], "allreduce_coalesced");
    const chorusRedOp_t op = opOf(opts.reduceOp, tensors[0], "allreduce_coalesced");
    std::vector<at::Tensor> all = tensors;
    return post(OpType::ALLREDUCE_COALESCED, all[0], all, [=, this](chorusStream_t stream) {
      at::Tensor flat = joined(all);
      check(chorusAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), type, op, comm_, stream), comm_,
            "allreduce_coalesced");
      spread(flat, all);
    });
  }

  c10::intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    checkSingle(tensors, "reduce");
    at::Tensor t = tensors[0];
    const chorusDataType_t type = typeOf(t, "reduce");
    const chorusRedOp_t op = opOf(opts.reduceOp, t, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    return post(OpType::REDUCE, t, {t}, [=, this](chorusStream_t stream) {
      check(chorusReduce(t.data_ptr(), t.data_ptr(), t.numel(), type, op, root, comm_, stream), comm_, "reduce");
    });
  }

  c10::intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                     const c10d::AllgatherOptions&) override {
    checkSingle(inputs, "allgather");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
      raise("allgather: expects one list of " + std::to_string(getSize()) + " output tensors");
    }
    at::Tensor in = inputs[0];
    for (const at::Tensor& out : outputs[0]) {
      if (out.numel() != in.numel() || out.scalar_type() != in.scalar_type()) {
        raise("allgather: every output tensor must have the input's size and type");
      }
    }
    std::vector<at::Tensor> every = outputs[0];
    every.push_back(in);
    checkSameDevice(every, "allgather");
    const chorusDataType_t type = typeOf(in, "allgather");
    std::vector<at::Tensor> outs = outputs[0];
    return post(OpType::ALLGATHER, in, outs, [=, this](chorusStream_t stream) {
      at::Tensor flat = at::empty({static_cast<int64_t>(outs.size()) * in.numel()}, in.options());
      check(chorusAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), type, comm_, stream), comm_, "allgather");
      spread(flat, outs);
    });
  }

  c10::intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::AllgatherOptions&) override {
    checkTensor(input, "_allgather_base");
    checkTensor(output, "_allgather_base");
    if (output.numel() != input.numel() * getSize()) raise("_allgather_base: output must hold size x input");
    checkSameDevice({input, output}, "_allgather_base");
    const chorusDataType_t type = typeOf(input, "_allgather_base");
    at::Tensor in = input, out = output;
    return post(OpType::_ALLGATHER_BASE, in, {out}, [=, this](chorusStream_t stream) {
      check(chorusAllGather(in.data_ptr(), out.data_ptr(), in.numel(), type, comm_, stream), comm_, "_allgather_base");
    });
  }

  c10::intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                          std::vector<std::vector<at::Tensor>>& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    checkSingle(outputs, "reduce_scatter");
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
      raise("reduce_scatter: expects one list of " + std::to_string(getSize()) + " input tensors");
    }
    at::Tensor out = outputs[0];
    const chorusDataType_t type = typeOf(out, "reduce_scatter");
    const chorusRedOp_t op = opOf(opts.reduceOp, out, "reduce_scatter");
    std::vector<at::Tensor> ins = inputs[0];
    for (const at::Tensor& in : ins) {
      if (in.numel() != out.numel() || in.scalar_type() != out.scalar_type()) {
        raise("reduce_scatter: every input tensor must have the output's size and type");
      }
    }
    std::vector<at::Tensor> every = ins;
    every.push_back(out);
    checkSameDevice(every, "reduce_scatter");
    return post(OpType::REDUCE_SCATTER, out, {out}, [=, this](chorusStream_t stream) {
      const at::Tensor flat = joined(ins);
      check(chorusReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), type, op, comm_, stream), comm_,
            "reduce_scatter");
    });
  }

  c10::intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                const c10d::ReduceScatterOptions& opts) override {
    checkTensor(input, "_reduce_scatter_base");
    checkTensor(output, "_reduce_scatter_base");
    if (input.numel() != output.numel() * getSize()) raise("_reduce_scatter_base: input must hold size x output");
    checkSameDevice({input, output}, "_reduce_scatter_base");
    const chorusDataType_t type = typeOf(output, "_reduce_scatter_base");
    const chorusRedOp_t op = opOf(opts.reduceOp, output, "_reduce_scatter_base");
    at::Tensor in = input, out = output;
    return post(OpType::_REDUCE_SCATTER_BASE, in, {out}, [=, this](chorusStream_t stream) {
      check(chorusReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, op, comm_, stream), comm_,
            "_reduce_scatter_base");
    });
  }

  c10::intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
                                         std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions&) override {
    checkTensor(input, "alltoall_base");
    checkTensor(output, "alltoall_base");
    checkSameDevice({input, output}, "alltoall_base");
    const chorusDataType_t type = typeOf(input, "alltoall_base");
    const size_t n = static_cast<size_t>(getSize());
    at::Tensor in = input, out = output;
    if (outputSplits.empty() && inputSplits.empty()) {
      if (in.numel() % getSize() != 0 || out.numel() != in.numel()) {
        raise("alltoall_base: input and output must be equal and divide among the ranks");
      }
      return post(OpType::ALLTOALL_BASE, in, {out}, [=, this](chorusStream_t stream) {
        check(chorusAllToAll(in.data_ptr(), out.data_ptr(), in.numel() / n, type, comm_, stream), comm_,
              "alltoall_base");
      });
    }
    // Uneven: splits are in rows of dimension 0.
    auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
      const int64_t row = t.dim() > 0 && t.size(0) > 0 ? t.numel() / t.size(0) : 0;
      std::vector<size_t> c(n);
      if (splits.empty()) {
        if (t.dim() == 0 || t.size(0) % getSize() != 0)
          raise(std::string("alltoall_base: ") + which + " does not divide");
        for (size_t r = 0; r < n; ++r) c[r] = static_cast<size_t>(t.size(0) / getSize() * row);
      } else {
        if (splits.size() != n) raise(std::string("alltoall_base: ") + which + " splits must name every rank");
        for (size_t r = 0; r < n; ++r) c[r] = static_cast<size_t>(splits[r] * row);
      }
      return c;
    };
    const std::vector<size_t> sendCounts = counts(in, inputSplits, "input");
    const std::vector<size_t> recvCounts = counts(out, outputSplits, "output");
    return post(OpType::ALLTOALL_BASE, in, {out}, [=, this](chorusStream_t stream) {
      std::vector<size_t> sendDispls(n, 0), recvDispls(n, 0);
      for (size_t r = 1; r < n; ++r) {
        sendDispls[r] = sendDispls[r - 1] + sendCounts[r - 1];
        recvDispls[r] = recvDispls[r - 1] + recvCounts[r - 1];
      }
      check(chorusAllToAllv(in.data_ptr(), sendCounts.data(), sendDispls.data(), out.data_ptr(), recvCounts.data(),
                            recvDispls.data(), type, comm_, stream),
            comm_, "alltoall_base");
    });
  }

  c10::intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                    const c10d::AllToAllOptions&) override {
    const size_t n = static_cast<size_t>(getSize());
    if (outputs.size() != n || inputs.size() != n) raise("alltoall: expects one input and one output tensor per rank");
    for (const at::Tensor& t : inputs) checkTensor(t, "alltoall");
    for (const at::Tensor& t : outputs) checkTensor(t, "alltoall");
    std::vector<at::Tensor> every = inputs;
    every.insert(every.end(), outputs.begin(), outputs.end());
    checkSameDevice(every, "alltoall");
    const chorusDataType_t type = typeOf(inputs[0], "alltoall");
    std::vector<at::Tensor> ins = inputs, outs = outputs;
    return post(OpType::ALLTOALL, ins[0], outs, [=, this](chorusStream_t stream) {
      std::vector<size_t> sendCounts(n), recvCounts(n), sendDispls(n, 0), recvDispls(n, 0);
      for (size_t r = 0; r < n; ++r) {
        sendCounts[r] = static_cast<size_t>(ins[r].numel());
        recvCounts[r] = static_cast<size_t>(outs[r].numel());
        if (r > 0) {
          sendDispls[r] = sendDispls[r - 1] + sendCounts[r - 1];
          recvDispls[r] = recvDispls[r - 1] + recvCounts[r - 1];
        }
      }
      const at::Tensor flat = joined(ins);
      at::Tensor received = at::empty({static_cast<int64_t>(recvDispls[n - 1] + recvCounts[n - 1])}, outs[0].options());
      check(chorusAllToAllv(flat.data_ptr(), sendCounts.data(), sendDispls.data(), received.data_ptr(),
                            recvCounts.data(), recvDispls.data(), type, comm_, stream),
            comm_, "alltoall");
      spread(received, outs);
    });
  }

  c10::intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const c10d::GatherOptions& opts) override {
    checkSingle(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor in = inputs[0];
    const std::vector<at::Tensor> outs =
        getRank() == root ? rootList(outputs, getSize(), "gather", "output") : std::vector<at::Tensor>{};
    const chorusDataType_t type = typeOf(in, "gather");
    return post(OpType::GATHER, in, outs, [=, this](chorusStream_t stream) {
      at::Tensor flat = at::empty({outs.empty() ? 0 : getSize() * in.numel()}, in.options());
      check(
          chorusGather(in.data_ptr(), outs.empty() ? nullptr : flat.data_ptr(), in.numel(), type, root, comm_, stream),
          comm_, "gather");
      spread(flat, outs);
    });
  }

  c10::intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                   const c10d::ScatterOptions& opts) override {
    checkSingle(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor out = outputs[0];
    const std::vector<at::Tensor> ins =
        getRank() == root ? rootList(inputs, getSize(), "scatter", "input") : std::vector<at::Tensor>{};
    const chorusDataType_t type = typeOf(out, "scatter");
    return post(OpType::SCATTER, out, {out}, [=, this](chorusStream_t stream) {
      const at::Tensor flat = ins.empty() ? at::Tensor() : joined(ins);
      check(chorusScatter(ins.empty() ? nullptr : flat.data_ptr(), out.data_ptr(), out.numel(), type, root, comm_,
                          stream),
            comm_, "scatter");
    });
  }

  c10::intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    checkSingle(tensors, "send");
    at::Tensor t = tensors[0];
    const chorusDataType_t type = typeOf(t, "send");
    // A CUDA tensor goes from a host copy (made now, in stream order).
    const at::Tensor from = t.is_cpu() ? t : t.to(at::kCPU);
    return postPointToPoint(OpType::SEND, t, [=, this](chorusRequest_t* request) {
      check(chorusISend(from.data_ptr(), from.numel(), type, dstRank, comm_, request), comm_, "send");
    });
  }

  c10::intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    checkSingle(tensors, "recv");
    at::Tensor t = tensors[0];
    const chorusDataType_t type = typeOf(t, "recv");
    // A CUDA tensor is received into a host copy, then copied in before the Work is done.
    const at::Tensor into = t.is_cpu() ? t : at::empty_like(t, t.options().device(at::kCPU));
    return postPointToPoint(
        OpType::RECV, t,
        [=, this](chorusRequest_t* request) {
          check(chorusIRecv(into.data_ptr(), into.numel(), type, srcRank, comm_, request), comm_, "recv");
        },
        t.is_cpu() ? std::function<void()>() : [t, into] { copyIn(t, into); });
  }

  c10::intrusive_ptr<Work> barrier(const c10d::BarrierOptions&) override {
    return post(OpType::BARRIER, at::Tensor(), {},
                [this](chorusStream_t stream) { check(chorusBarrier(comm_, stream), comm_, "barrier"); });
  }

 private:
  struct Task {
    c10::intrusive_ptr<ChorusWork> work;
    std::function<void(chorusStream_t)> run;      // a blocking call (host buffers: a NULL stream)
    std::function<void(chorusRequest_t*)> start;  // or a non-blocking one to start,
    std::function<void()> finish;                 // and what follows its completion (may be empty)
  };
  struct InFlight {
    c10::intrusive_ptr<ChorusWork> work;
    chorusRequest_t request;
    std::function<void()> finish;
    // What start captured (a CUDA tensor's host copy being sent) lives until the operation is
    // done: chorus reads the buffer while it is in flight.
    std::function<void(chorusRequest_t*)> start;
  };

  // A call on tensors on like's device (CPU when like is undefined): CPU ones go to the worker,
  // CUDA ones are enqueued now on the current stream.
  c10::intrusive_ptr<Work> post(OpType type, const at::Tensor& like, std::vector<at::Tensor> outputs,
                                std::function<void(chorusStream_t)> run) {
#if defined(CHORUS_TORCH_CUDA)
    if (like.defined() && like.is_cuda()) return onStream(type, like.device(), std::move(outputs), run);
#endif
    auto work = c10::make_intrusive<ChorusWork>(getRank(), type, std::move(outputs));
    enqueue({work, std::move(run), nullptr, nullptr});
    return work;
  }

  // Sends and receives go through the worker as chorus non-blocking operations on host memory
  // (CUDA tensors through a host copy: finish then copies a received one in).
  c10::intrusive_ptr<Work> postPointToPoint(OpType type, at::Tensor t, std::function<void(chorusRequest_t*)> start,
                                            std::function<void()> finish = {}) {
    auto work = c10::make_intrusive<ChorusWork>(getRank(), type, std::vector<at::Tensor>{t});
    enqueue({work, nullptr, std::move(start), std::move(finish)});
    return work;
  }

  // dst (a CUDA tensor) = src (its host copy), finished before this returns.
  static void copyIn(const at::Tensor& dst, const at::Tensor& src) {
#if defined(CHORUS_TORCH_CUDA)
    c10::cuda::CUDAGuard guard(dst.device());
    dst.copy_(src);
    c10::cuda::getCurrentCUDAStream(dst.device().index()).synchronize();
#else
    dst.copy_(src);
#endif
  }

#if defined(CHORUS_TORCH_CUDA)
  // Enqueues run on device's current stream (the device made current for it); the Work is done,
  // and its CUDA future completed on that stream, once it is enqueued.
  c10::intrusive_ptr<Work> onStream(OpType type, c10::Device device, std::vector<at::Tensor> outputs,
                                    const std::function<void(chorusStream_t)>& run) {
    c10::cuda::CUDAGuard guard(device);
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
    auto work = c10::make_intrusive<ChorusWork>(getRank(), type, std::move(outputs), device);
    {
      std::lock_guard<std::mutex> lock(commMutex_);
      run(reinterpret_cast<chorusStream_t>(stream.stream()));
    }
    work->enqueued(stream.unwrap());
    work->complete(nullptr);
    return work;
  }
#endif

  void enqueue(Task task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

  // The worker: calls in the order they were made; non-blocking ones tested between calls and
  // while idle (every millisecond), so their progress never waits for the next call.
  void work() {
    std::vector<InFlight> inFlight;
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (inFlight.empty()) {
          ready_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        } else {
          ready_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_ || !tasks_.empty(); });
        }
        if (tasks_.empty() && stop_ && inFlight.empty()) return;
        if (!tasks_.empty()) {
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
      }
      if (task.work) {
        try {
          std::lock_guard<std::mutex> lock(commMutex_);
          if (task.run) {
            task.run(nullptr);
          } else {
            chorusRequest_t request = nullptr;
            task.start(&request);
            inFlight.push_back({task.work, request, std::move(task.finish), std::move(task.start)});
          }
        } catch (...) {
          task.work->complete(std::current_exception());
          task.work.reset();
        }
        if (task.work && task.run) task.work->complete(nullptr);
      }
      for (size_t i = 0; i < inFlight.size();) {
        int done = 0;
        chorusResult_t tested;
        {
          std::lock_guard<std::mutex> lock(commMutex_);
          tested = chorusTest(&inFlight[i].request, &done);
        }
        if (tested != chorusSuccess || done != 0) {
          std::exception_ptr error;
          if (tested != chorusSuccess) {
            error = std::make_exception_ptr(std::runtime_error(std::string("chorus: ") + chorusGetLastError(comm_)));
          } else if (inFlight[i].finish) {
            try {
              inFlight[i].finish();
            } catch (...) {
              error = std::current_exception();
            }
          }
          inFlight[i].work->complete(error);
          inFlight.erase(inFlight.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
  }

  chorusComm_t comm_ = nullptr;
  std::mutex commMutex_;  // one chorus call at a time: the worker's (CPU) or a caller's (CUDA)
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_;
  bool stop_ = false;
};

c10::intrusive_ptr<BackendBase> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<ProcessGroupChorus>(store, rank, size,
                                                 std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

}  // namespace
}  // namespace chorus::torch

PYBIND11_MODULE(_C, module) {
  module.doc() = "chorus's torch.distributed backend (import chorus_torch to register it as \"chorus\")";
  module.def("create_process_group", &chorus::torch::create, pybind11::arg("store"), pybind11::arg("rank"),
             pybind11::arg("world_size"), pybind11::arg("timeout"));
#if defined(CHORUS_TORCH_CUDA)
  module.attr("cuda") = true;
#else
  module.attr("cuda") = false;
#endif
}
