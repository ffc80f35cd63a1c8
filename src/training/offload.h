// offload.h: where a rank keeps the state its optimizer step reads and writes (AdamW's m and v,
// and under ZeRO-3 the parameter shard): in memory, or in a file streamed through a bounded
// window of memory with asynchronous reads and writes (io_uring where the kernel allows it, else
// threads), as ZeRO-Infinity does with NVMe. The optimizer step visits the state in one increasing
// pass; the file keeps it chunk by chunk, so the pass reads each chunk once and writes it back once
// while the next chunks are being read. Used by one thread (the training thread), except read(),
// which other threads may call outside a pass (ZeRO-3's gathers, on the communication thread).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>

namespace chorus::training {

class Backend;

// Where state lives. On a CPU-only run host memory is where the training computes, so kHost is
// kMemory under another name; the GPU training keeps its state in host memory with it.
enum class OffloadTarget { kNone, kHost, kFile };
// "none", "host" or "file"; throws chorus::Error naming the text otherwise.
OffloadTarget parseOffloadTarget(const std::string& text);
const char* offloadTargetName(OffloadTarget target);

// How a file's reads and writes run: io_uring (liburing, when built with it and the kernel
// allows), or a thread per window slot doing pread/pwrite; kAuto: io_uring where it works.
enum class OffloadIo { kAuto, kUring, kThreads };
OffloadIo parseOffloadIo(const std::string& text);  // "auto", "io_uring", "threads"

struct OffloadSettings {
  OffloadTarget optimizer = OffloadTarget::kNone;
  OffloadTarget params = OffloadTarget::kNone;  // ZeRO-3's parameter shard (only with optimizer = file)
  std::string directory;                        // the files' directory (kFile): one file per rank
  size_t windowBytes = 64u << 20;               // memory for the streamed state, all arrays together
  OffloadIo io = OffloadIo::kAuto;
};

// `arrays` float arrays of `elements` each, indexed alike (element i of m and of v belong to the
// same parameter). A pass visits the elements in increasing order through at(); outside a pass,
// read() and write() reach any range.
class StateStore {
 public:
  static constexpr int kMaxArrays = 3;
  // The resident run of elements from the index asked for: each array's pointer at it, and how
  // many elements follow there (up to the end of its chunk).
  struct Run {
    std::array<float*, kMaxArrays> array{};
    size_t count = 0;
  };

  virtual ~StateStore() = default;
  int arrays() const { return arrays_; }
  size_t elements() const { return elements_; }

  // Starts reading the first chunks a pass will need (a no-op in memory, and when already started).
  virtual void prefetch() {}
  // Within a pass, at increasing i (i < elements()): the run holding element i, its chunk read
  // first if need be (waiting for it). Chunks wholly before i are written back (asynchronously) and
  // their memory used for the chunks ahead. Writes through the pointers are kept.
  virtual Run at(size_t i) = 0;
  // Ends the pass: writes back what is resident and waits for every read and write. Throws
  // chorus::Error naming the file, offset and errno when one failed.
  virtual void finish() {}
  // Outside a pass: count elements of one array from lo, out of or into the store.
  virtual void read(int array, size_t lo, size_t count, float* out) const = 0;
  virtual void write(int array, size_t lo, size_t count, const float* in) = 0;

  // Memory the store holds for the state (the window's buffers for a file), and bytes in the file.
  virtual size_t residentBytes() const = 0;
  virtual size_t fileBytes() const { return 0; }
  // For the banner: "memory", or "file <path> (window W, C chunks of E elements, io_uring)".
  virtual std::string describe() const = 0;

 protected:
  StateStore(int arrays, size_t elements) : arrays_(arrays), elements_(elements) {}

 private:
  int arrays_;
  size_t elements_;
};

// How a file store cuts its window: chunks of `chunk` elements of every array (a multiple of 1024),
// `chunks` of them for the state, `slots` of them resident (four, fewer for a smaller state).
// Throws chorus::Error when windowBytes cannot hold four chunks of 1024 elements of every array.
struct StoreWindow {
  size_t chunk = 0, chunks = 0;
  int slots = 0;
  size_t residentBytes(int arrays) const { return static_cast<size_t>(slots) * chunk * arrays * sizeof(float); }
};
StoreWindow storeWindow(size_t windowBytes, int arrays, size_t elements);

// A store of `arrays` zeroed arrays of `elements`: in memory for kNone (the backend `memory`'s,
// host memory when null; at() then gives pointers in it, read() and write() copy from and to the
// host) and in host memory for kHost; for kFile, the
// file <directory>/<name> (created or truncated, and removed when the store is destroyed), streamed
// through windowBytes of memory. Throws chorus::Error when the window cannot hold four chunks of
// 1024 elements of every array, or the file cannot be created (naming the path and errno).
std::unique_ptr<StateStore> makeStateStore(OffloadTarget target, const OffloadSettings& settings, int arrays,
                                           size_t elements, const std::string& name, Backend* memory = nullptr);

}  // namespace chorus::training
