// comm_worker.h: a thread that owns a communicator and runs its collectives in submission order,
// so that they move while the training thread computes (chorus progresses only inside its calls).
// Used by data parallelism (bucket reductions, ZeRO gathers) and by the MoE layer's exchanges.
#pragma once

#include <chorus/chorus.hpp>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

namespace chorus::training {

// One thread that owns a communicator: tasks run in submission order; a task may start a
// non-blocking collective and return its Request, which the thread polls (Request::test) until it
// is complete, starting later tasks as soon as they are queued. Requests complete in submission
// order. A task's future reports its completion or its error.
class CommWorker {
 public:
  using Task = std::function<std::optional<Request>(Communicator&)>;
  // delayMs > 0: sleep that long before starting each task (a slow link, for tests).
  explicit CommWorker(Communicator& comm, int delayMs = 0);
  // The test hook's delay: CHORUS_TRAIN_COMM_DELAY_MS, else 0.
  static int delayFromEnvironment();
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;
  // Queues task; `then` (may be empty) runs on the worker once its collective is complete.
  std::future<void> submit(Task task, std::function<void()> then = {});
  // Runs fn on the worker and waits for it.
  void run(const std::function<void(Communicator&)>& fn);

 private:
  struct Item {
    Task task;
    std::function<void()> then;
    std::promise<void> done;
  };
  void loop();
  Communicator& comm_;
  int delayMs_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace chorus::training
