// self.cc: the self transport, a rank's messages to itself.
#include <cstring>
#include <deque>

#include "src/base/error.h"
#include "src/transport/transport.h"

namespace chorus {

namespace {

// A rank's messages to itself: a send waits for the matching receive and is copied at once.
class SelfTransport final : public Transport {
 public:
  explicit SelfTransport(int rank) : rank_(rank) {}
  const char* name() const override { return "self"; }

  void postSend(int, uint64_t tag, const void* data, size_t bytes, Request* request) override {
    sends_.push_back({tag, const_cast<void*>(data), bytes, request});
    match();
  }
  void postRecv(int, uint64_t tag, void* data, size_t bytes, Request* request) override {
    recvs_.push_back({tag, data, bytes, request});
    match();
  }
  bool progress() override { return false; }
  void wait(int) override {}
  bool busy() const override { return !sends_.empty() || !recvs_.empty(); }
  void cancelAll() override {
    sends_.clear();
    recvs_.clear();
  }

 private:
  struct Pending {
    uint64_t tag;
    void* data;
    size_t bytes;
    Request* request;
  };

  void match() {
    while (!sends_.empty() && !recvs_.empty()) {
      Pending send = sends_.front();
      Pending recv = recvs_.front();
      if (send.tag != recv.tag || send.bytes != recv.bytes) {
        fail(chorusRemoteError,
             "message from rank {} to itself is {} with {} bytes, but the posted receive expects {} with {} bytes",
             rank_, describeTag(send.tag), send.bytes, describeTag(recv.tag), recv.bytes);
      }
      if (send.bytes > 0 && send.data != recv.data) std::memmove(recv.data, send.data, send.bytes);
      send.request->done = true;
      recv.request->done = true;
      sends_.pop_front();
      recvs_.pop_front();
    }
  }

  int rank_;
  std::deque<Pending> sends_;
  std::deque<Pending> recvs_;
};

}  // namespace

std::unique_ptr<Transport> createSelfTransport(TransportContext& context, const std::vector<int>&) {
  return std::make_unique<SelfTransport>(context.rank);
}

}  // namespace chorus
