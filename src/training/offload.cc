// offload.cc: the state stores (offload.h): in memory, or a file streamed through a window.
//
// The file holds the state chunk by chunk: chunk c is C elements of array 0, then C of array 1, and
// so on, so one read or write moves a chunk of every array. The window is S slots (four, fewer when
// the state has fewer chunks) of one chunk each; chunk c lives in slot c mod S. A pass starts with
// the first S chunks being read. When the pass moves past chunk c, its slot writes c back (if the
// pass touched it) and then reads chunk c + S, the two linked so they run in that order; the pass
// waits only when it reaches a chunk whose read has not finished. Each slot has at most one such
// group in flight, so its reads and writes never overlap on its buffer.
#include "src/training/offload.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "chorus/error.hpp"
#include "src/training/backend.h"

#ifdef CHORUS_HAVE_URING
#include <liburing.h>
#endif

namespace chorus::training {

OffloadTarget parseOffloadTarget(const std::string& text) {
  if (text == "none") return OffloadTarget::kNone;
  if (text == "host") return OffloadTarget::kHost;
  if (text == "file") return OffloadTarget::kFile;
  throw Error(chorusInvalidArgument, fmt::format("offload target '{}' is not none, host or file", text));
}

const char* offloadTargetName(OffloadTarget target) {
  switch (target) {
    case OffloadTarget::kHost:
      return "host";
    case OffloadTarget::kFile:
      return "file";
    default:
      return "none";
  }
}

OffloadIo parseOffloadIo(const std::string& text) {
  if (text == "auto") return OffloadIo::kAuto;
  if (text == "io_uring") return OffloadIo::kUring;
  if (text == "threads") return OffloadIo::kThreads;
  throw Error(chorusInvalidArgument, fmt::format("offload io '{}' is not auto, io_uring or threads", text));
}

namespace {

// A wait on the disk longer than this is an error, not a slow step.
constexpr auto kIoTimeout = std::chrono::seconds(300);
constexpr size_t kChunkQuantum = 1024;  // chunk lengths are multiples of this many elements
constexpr int kSlots = 4;

class MemoryStore final : public StateStore {
 public:
  // memory null: host memory.
  MemoryStore(int arrays, size_t elements, Backend* memory)
      : StateStore(arrays, elements),
        host_(memory == nullptr ? makeBackend(Device::kCpu) : nullptr),
        memory_(memory == nullptr ? *host_ : *memory) {
    for (int a = 0; a < arrays; ++a) data_[a] = Buffer<float>(memory_, elements);
  }
  Run at(size_t i) override {
    Run r;
    for (int a = 0; a < arrays(); ++a) r.array[a] = data_[a].data() + i;
    r.count = elements() - i;
    return r;
  }
  void read(int array, size_t lo, size_t count, float* out) const override {
    memory_.toHost(out, data_[array].data() + lo, count * sizeof(float));
  }
  void write(int array, size_t lo, size_t count, const float* in) override {
    memory_.fromHost(data_[array].data() + lo, in, count * sizeof(float));
  }
  size_t residentBytes() const override { return static_cast<size_t>(arrays()) * elements() * sizeof(float); }
  std::string describe() const override {
    return memory_.device() == Device::kCpu ? "memory" : "memory of " + memory_.describe();
  }

 private:
  std::unique_ptr<Backend> host_;
  Backend& memory_;
  Buffer<float> data_[kMaxArrays];
};

// One read or write of a whole chunk between a slot's buffer and the file.
struct Transfer {
  bool write = false;
  char* buffer = nullptr;
  size_t bytes = 0;
  off_t offset = 0;
};

// Runs groups of transfers, each group in order; a slot has at most one group in flight.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual void submit(int slot, std::vector<Transfer> group) = 0;
  // Waits for the slot's group; throws the first failure.
  virtual void wait(int slot) = 0;
  virtual const char* name() const = 0;
};

std::string transferFailure(const std::string& path, const Transfer& t, int error) {
  return fmt::format("offload: {} of {} bytes at offset {} of {}: {}", t.write ? "write" : "read", t.bytes, t.offset,
                     path, error ? std::strerror(error) : "short transfer");
}

// Throws a slot's recorded failure, if any, and clears it (the slot is usable again).
void throwFailure(std::string& failure) {
  if (failure.empty()) return;
  std::string message;
  message.swap(failure);
  throw Error(chorusSystemError, message);
}

// Whole transfer by pread/pwrite (retried on short counts and EINTR); 0 or an errno.
int transferAll(int fd, const Transfer& t) {
  size_t done = 0;
  while (done < t.bytes) {
    const ssize_t n = t.write ? ::pwrite(fd, t.buffer + done, t.bytes - done, t.offset + static_cast<off_t>(done))
                              : ::pread(fd, t.buffer + done, t.bytes - done, t.offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;  // the file is shorter than it was made: someone truncated it
    done += static_cast<size_t>(n);
  }
  return 0;
}

// A thread per slot, working through its slot's groups with pread and pwrite.
class ThreadEngine final : public IoEngine {
 public:
  ThreadEngine(int fd, std::string path, int slots) : fd_(fd), path_(std::move(path)), slots_(slots) {
    for (auto& s : slots_) s.thread = std::thread([this, &s] { serve(s); });
  }
  ~ThreadEngine() override {
    for (auto& s : slots_) {
      {
        std::lock_guard lock(s.mutex);
        s.stop = true;
      }
      s.ready.notify_all();
      s.thread.join();
    }
  }
  void submit(int slot, std::vector<Transfer> group) override {
    Slot& s = slots_[slot];
    {
      std::lock_guard lock(s.mutex);
      s.queue.push_back(std::move(group));
    }
    s.ready.notify_all();
  }
  void wait(int slot) override {
    Slot& s = slots_[slot];
    std::unique_lock lock(s.mutex);
    if (!s.done.wait_for(lock, kIoTimeout, [&] { return s.queue.empty() && !s.busy; })) {
      throw Error(chorusTimeout, fmt::format("offload: slot {}'s transfers on {} did not finish in {} s", slot, path_,
                                             kIoTimeout.count()));
    }
    throwFailure(s.failure);
  }
  const char* name() const override { return "threads"; }

 private:
  struct Slot {
    std::thread thread;
    std::mutex mutex;
    std::condition_variable ready, done;
    std::deque<std::vector<Transfer>> queue;
    bool busy = false, stop = false;
    std::string failure;
  };
  void serve(Slot& s) {
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.ready.wait(lock, [&] { return s.stop || !s.queue.empty(); });
      if (s.queue.empty()) return;  // stopping
      std::vector<Transfer> group = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
      lock.unlock();
      std::string failure;
      for (const auto& t : group) {
        if (const int error = transferAll(fd_, t)) {
          failure = transferFailure(path_, t, error);
          break;  // the rest of the group depends on this one
        }
      }
      lock.lock();
      if (!failure.empty() && s.failure.empty()) s.failure = failure;
      s.busy = false;
      s.done.notify_all();
    }
  }
  int fd_;
  std::string path_;
  std::deque<Slot> slots_;  // deque: Slot is neither movable nor copyable
};

#ifdef CHORUS_HAVE_URING
// One io_uring; a group's transfers are linked (IOSQE_IO_LINK) so each starts after the previous.
class UringEngine final : public IoEngine {
 public:
  // Returns null (with why) where the kernel refuses io_uring (old kernels, seccomp filters).
  static std::unique_ptr<UringEngine> open(int fd, const std::string& path, int slots, std::string& why) {
    auto engine = std::unique_ptr<UringEngine>(new UringEngine(fd, path, slots));
    const int rc = io_uring_queue_init(static_cast<unsigned>(4 * slots), &engine->ring_, 0);
    if (rc < 0) {
      why = std::strerror(-rc);
      return nullptr;
    }
    engine->open_ = true;
    return engine;
  }
  ~UringEngine() override {
    if (!open_) return;
    for (int s = 0; s < static_cast<int>(groups_.size()); ++s) {
      try {
        wait(s);
      } catch (const Error&) {  // the buffers outlive the ring: nothing is left to write into them
      }
    }
    io_uring_queue_exit(&ring_);
  }
  void submit(int slot, std::vector<Transfer> group) override {
    wait(slot);
    for (size_t k = 0; k < group.size(); ++k) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) throw Error(chorusInternalError, "offload: io_uring submission queue full");
      const Transfer& t = group[k];
      if (t.write) {
        io_uring_prep_write(sqe, fd_, t.buffer, static_cast<unsigned>(t.bytes), static_cast<__u64>(t.offset));
      } else {
        io_uring_prep_read(sqe, fd_, t.buffer, static_cast<unsigned>(t.bytes), static_cast<__u64>(t.offset));
      }
      if (k + 1 < group.size()) sqe->flags |= IOSQE_IO_LINK;
      io_uring_sqe_set_data64(sqe, static_cast<__u64>(slot) * 8 + k);
    }
    groups_[slot] = Group{std::move(group), 0, {}};
    const int rc = io_uring_submit(&ring_);
    if (rc < 0) throw Error(chorusSystemError, fmt::format("offload: io_uring_submit on {}: {}", path_, strerror(-rc)));
  }
  void wait(int slot) override {
    Group& g = groups_[slot];
    while (g.completed < g.transfers.size()) {
      __kernel_timespec timeout{};
      timeout.tv_sec = kIoTimeout.count();
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &timeout);
      if (rc == -EINTR) continue;
      if (rc == -ETIME) {
        throw Error(chorusTimeout, fmt::format("offload: slot {}'s transfers on {} did not finish in {} s", slot, path_,
                                               kIoTimeout.count()));
      }
      if (rc < 0) throw Error(chorusSystemError, fmt::format("offload: io_uring wait on {}: {}", path_, strerror(-rc)));
      const __u64 data = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      Group& of = groups_[data / 8];
      const Transfer& t = of.transfers[data % 8];
      ++of.completed;
      if (of.failure.empty() && (res < 0 || static_cast<size_t>(res) != t.bytes)) {
        // A short count (not expected of a regular file of the full size) is finished by hand.
        if (res > 0) {
          Transfer rest = t;
          rest.buffer += res;
          rest.bytes -= static_cast<size_t>(res);
          rest.offset += res;
          if (const int error = transferAll(fd_, rest)) of.failure = transferFailure(path_, t, error);
        } else {
          of.failure = transferFailure(path_, t, res == -ECANCELED ? ECANCELED : -res);
        }
      }
    }
    throwFailure(g.failure);
  }
  const char* name() const override { return "io_uring"; }

 private:
  struct Group {
    std::vector<Transfer> transfers;
    size_t completed = 0;
    std::string failure;
  };
  UringEngine(int fd, std::string path, int slots) : fd_(fd), path_(std::move(path)), groups_(slots) {}
  int fd_;
  std::string path_;
  io_uring ring_{};
  bool open_ = false;
  std::vector<Group> groups_;
};
#endif

class FileStore final : public StateStore {
 public:
  FileStore(const OffloadSettings& settings, int arrays, size_t elements, const std::string& name)
      : StateStore(arrays, elements), path_((std::filesystem::path(settings.directory) / name).string()) {
    const StoreWindow shape = storeWindow(settings.windowBytes, arrays, elements);
    chunk_ = shape.chunk;
    chunks_ = shape.chunks;
    slots_ = shape.slots;
    chunkBytes_ = chunk_ * static_cast<size_t>(arrays) * sizeof(float);
    std::error_code ec;
    std::filesystem::create_directories(settings.directory, ec);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) throw Error(chorusSystemError, fmt::format("offload: cannot create {}: {}", path_, strerror(errno)));
    if (::ftruncate(fd_, static_cast<off_t>(chunks_ * chunkBytes_)) != 0) {
      const int error = errno;
      ::close(fd_);
      ::unlink(path_.c_str());
      throw Error(chorusSystemError, fmt::format("offload: cannot size {} to {} bytes: {}", path_,
                                                 chunks_ * chunkBytes_, strerror(error)));
    }
    window_.assign(static_cast<size_t>(slots_) * chunk_ * arrays, 0.0f);
    slotChunk_.assign(slots_, -1);
    dirty_.assign(slots_, false);
    std::string why = "not built with liburing";
#ifdef CHORUS_HAVE_URING
    if (settings.io != OffloadIo::kThreads) engine_ = UringEngine::open(fd_, path_, slots_, why);
#endif
    if (!engine_ && settings.io == OffloadIo::kUring) {
      ::close(fd_);
      ::unlink(path_.c_str());
      throw Error(chorusInvalidArgument, fmt::format("offload: io = io_uring for {}: unavailable ({})", path_, why));
    }
    if (!engine_) engine_ = std::make_unique<ThreadEngine>(fd_, path_, slots_);
  }

  ~FileStore() override {
    engine_.reset();  // joins its threads or drains its ring first
    ::close(fd_);
    ::unlink(path_.c_str());
  }

  void prefetch() override {
    if (prefetched_) return;
    prefetched_ = true;
    current_ = 0;
    for (long c = 0; c < slots_ && c < static_cast<long>(chunks_); ++c) {
      slotChunk_[c] = c;
      dirty_[c] = false;
      engine_->submit(static_cast<int>(c), {transfer(c, false)});
    }
  }

  Run at(size_t i) override {
    prefetch();
    const long c = static_cast<long>(i / chunk_);
    if (c < current_ || i >= elements()) {
      throw Error(chorusInternalError, fmt::format("offload: element {} asked for after chunk {} in a pass over {}", i,
                                                   current_, elements()));
    }
    while (current_ < c) release(current_++);
    const int slot = static_cast<int>(c % slots_);
    engine_->wait(slot);
    dirty_[slot] = true;
    const size_t within = i - static_cast<size_t>(c) * chunk_;
    Run r;
    float* base = window_.data() + static_cast<size_t>(slot) * chunk_ * arrays();
    for (int a = 0; a < arrays(); ++a) r.array[a] = base + a * chunk_ + within;
    r.count = std::min(chunk_, elements() - static_cast<size_t>(c) * chunk_) - within;
    return r;
  }

  void finish() override {
    if (!prefetched_) return;
    for (int s = 0; s < slots_; ++s) {
      if (slotChunk_[s] >= 0 && dirty_[s]) {
        engine_->wait(s);
        engine_->submit(s, {transfer(slotChunk_[s], true)});
      }
    }
    for (int s = 0; s < slots_; ++s) {
      engine_->wait(s);
      slotChunk_[s] = -1;
      dirty_[s] = false;
    }
    prefetched_ = false;
  }

  void read(int array, size_t lo, size_t count, float* out) const override {
    pieces(array, lo, count, [&](off_t offset, size_t n, size_t done) {
      const Transfer t{false, reinterpret_cast<char*>(out + done), n * sizeof(float), offset};
      if (const int error = transferAll(fd_, t)) throw Error(chorusSystemError, transferFailure(path_, t, error));
    });
  }

  void write(int array, size_t lo, size_t count, const float* in) override {
    finish();  // what the window holds would be stale
    pieces(array, lo, count, [&](off_t offset, size_t n, size_t done) {
      const Transfer t{true, reinterpret_cast<char*>(const_cast<float*>(in + done)), n * sizeof(float), offset};
      if (const int error = transferAll(fd_, t)) throw Error(chorusSystemError, transferFailure(path_, t, error));
    });
  }

  size_t residentBytes() const override { return window_.size() * sizeof(float); }
  size_t fileBytes() const override { return chunks_ * chunkBytes_; }
  std::string describe() const override {
    return fmt::format("file {} ({} slots of {} elements x {} arrays, {})", path_, slots_, chunk_, arrays(),
                       engine_->name());
  }

 private:
  Transfer transfer(long c, bool write) {
    const int slot = static_cast<int>(c % slots_);
    return Transfer{write, reinterpret_cast<char*>(window_.data() + static_cast<size_t>(slot) * chunk_ * arrays()),
                    chunkBytes_, static_cast<off_t>(static_cast<size_t>(c) * chunkBytes_)};
  }
  // The pass has moved past chunk c: its slot writes it back if touched, then reads chunk c + S.
  void release(long c) {
    const int slot = static_cast<int>(c % slots_);
    std::vector<Transfer> group;
    engine_->wait(slot);
    if (dirty_[slot]) group.push_back(transfer(c, true));
    const long next = c + slots_;
    slotChunk_[slot] = -1;
    dirty_[slot] = false;
    if (next < static_cast<long>(chunks_)) {
      group.push_back(transfer(next, false));
      slotChunk_[slot] = next;
    }
    if (!group.empty()) engine_->submit(slot, std::move(group));
  }
  // Calls fn(file offset, elements, elements done before) for each chunk's part of [lo, lo + count).
  template <typename Fn>
  void pieces(int array, size_t lo, size_t count, Fn fn) const {
    if (array < 0 || array >= arrays() || lo + count > elements()) {
      throw Error(chorusInvalidArgument, fmt::format("offload: elements [{}, {}) of array {} in a store of {} x {}", lo,
                                                     lo + count, array, arrays(), elements()));
    }
    size_t done = 0;
    while (done < count) {
      const size_t i = lo + done, c = i / chunk_, within = i - c * chunk_;
      const size_t n = std::min(count - done, chunk_ - within);
      fn(static_cast<off_t>(c * chunkBytes_ + (static_cast<size_t>(array) * chunk_ + within) * sizeof(float)), n, done);
      done += n;
    }
  }

  std::string path_;
  int fd_ = -1;
  size_t chunk_ = 0, chunks_ = 0, chunkBytes_ = 0;
  int slots_ = 1;
  std::vector<float> window_;
  std::vector<long> slotChunk_;  // the chunk each slot holds or is reading (-1: none)
  std::vector<bool> dirty_;      // whether the pass has touched the slot's chunk
  bool prefetched_ = false;      // a pass's reads have begun
  long current_ = 0;             // the pass's chunk
  std::unique_ptr<IoEngine> engine_;
};

}  // namespace

StoreWindow storeWindow(size_t windowBytes, int arrays, size_t elements) {
  const size_t perElement = static_cast<size_t>(std::max(arrays, 1)) * sizeof(float);
  StoreWindow w;
  w.chunk = windowBytes / kSlots / perElement / kChunkQuantum * kChunkQuantum;
  if (w.chunk == 0) {
    throw Error(chorusInvalidArgument,
                fmt::format("offload: a window of {} bytes for {} arrays; it holds {} chunks of at least {} elements "
                            "of each, so at least {} bytes",
                            windowBytes, arrays, kSlots, kChunkQuantum, kSlots * kChunkQuantum * perElement));
  }
  w.chunk = std::min(w.chunk, std::max(kChunkQuantum, (elements + kChunkQuantum - 1) / kChunkQuantum * kChunkQuantum));
  w.chunks = (elements + w.chunk - 1) / w.chunk;
  w.slots = static_cast<int>(std::min<size_t>(kSlots, std::max<size_t>(1, w.chunks)));
  return w;
}

std::unique_ptr<StateStore> makeStateStore(OffloadTarget target, const OffloadSettings& settings, int arrays,
                                           size_t elements, const std::string& name, Backend* memory) {
  if (arrays < 1 || arrays > StateStore::kMaxArrays) {
    throw Error(chorusInvalidArgument, fmt::format("offload: {} arrays (1 to {})", arrays, StateStore::kMaxArrays));
  }
  if (target != OffloadTarget::kFile) {
    return std::make_unique<MemoryStore>(arrays, elements, target == OffloadTarget::kNone ? memory : nullptr);
  }
  if (settings.directory.empty()) throw Error(chorusInvalidArgument, "offload: file without a directory");
  return std::make_unique<FileStore>(settings, arrays, elements, name);
}

}  // namespace chorus::training
