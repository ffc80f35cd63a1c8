// comm_worker.cc: the communication thread of comm_worker.h.
#include "src/training/comm_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>

namespace chorus::training {

CommWorker::CommWorker(Communicator& comm, int delayMs) : comm_(comm), delayMs_(delayMs), thread_([this] { loop(); }) {}

int CommWorker::delayFromEnvironment() {
  const char* delay = std::getenv("CHORUS_TRAIN_COMM_DELAY_MS");
  return delay ? std::atoi(delay) : 0;
}

CommWorker::~CommWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::future<void> CommWorker::submit(Task task, std::function<void()> then) {
  Item item{std::move(task), std::move(then), {}};
  auto future = item.done.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(item));
  }
  cv_.notify_all();
  return future;
}

void CommWorker::run(const std::function<void(Communicator&)>& fn) {
  submit([&fn](Communicator& c) -> std::optional<Request> {
    fn(c);
    return std::nullopt;
  }).get();
}

void CommWorker::loop() {
  struct InFlight {
    Request request;
    Item item;
  };
  std::deque<InFlight> inflight;
  auto finish = [](Item& item) {  // its collective (if any) is complete
    try {
      if (item.then) item.then();
      item.done.set_value();
    } catch (...) {
      item.done.set_exception(std::current_exception());
    }
  };
  // While collectives are in flight the thread polls them (chorus progresses only inside its
  // calls) and starts new tasks the moment they are queued, so that a bucket's reduction begins
  // while older ones are still moving. Between polls it sleeps on the queue, briefly at first,
  // then up to kLongestNap: the cores are shared with the compute threads.
  constexpr auto kLongestNap = std::chrono::microseconds(500);
  auto nap = std::chrono::microseconds(0);
  for (;;) {
    std::deque<Item> started;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (inflight.empty()) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      } else if (queue_.empty() && nap.count() > 0) {
        cv_.wait_for(lock, nap, [&] { return !queue_.empty(); });
      }
      if (queue_.empty() && inflight.empty() && stop_) return;
      started.swap(queue_);
    }
    for (auto& item : started) {
      if (delayMs_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delayMs_));
      try {
        auto request = item.task(comm_);
        if (request) {
          inflight.push_back(InFlight{std::move(*request), std::move(item)});
        } else {
          finish(item);
        }
      } catch (...) {
        item.done.set_exception(std::current_exception());
      }
    }
    // Complete, in order, those that are done; a failure goes to the task's future.
    bool completed = false;
    while (!inflight.empty()) {
      std::exception_ptr error;
      bool done = false;
      try {
        done = inflight.front().request.test();
      } catch (...) {
        error = std::current_exception();
      }
      if (!done && !error) break;
      InFlight oldest = std::move(inflight.front());
      inflight.pop_front();
      if (error) {
        oldest.item.done.set_exception(error);
      } else {
        finish(oldest.item);
      }
      completed = true;
    }
    nap = completed || !started.empty() ? std::chrono::microseconds(0)
                                        : std::min(kLongestNap, std::max(std::chrono::microseconds(20), nap * 2));
  }
}

}  // namespace chorus::training
