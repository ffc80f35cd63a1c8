// pmi.cc: PMI-1 wire protocol client: "cmd=NAME key=value ...\n" lines over PMI_FD.
#include "src/core/pmi.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <sstream>

#include "src/base/error.h"

namespace chorus {
namespace {

std::map<std::string, std::string> parseLine(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return fields;
}

int envInt(const char* name) {
  const char* text = std::getenv(name);
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 0) fail(chorusInvalidArgument, "{}='{}' is not a number", name, text);
  return static_cast<int>(value);
}

}  // namespace

std::optional<PmiClient> PmiClient::fromEnvironment() {
  if (std::getenv("PMI_FD") == nullptr || std::getenv("PMI_RANK") == nullptr || std::getenv("PMI_SIZE") == nullptr) {
    return std::nullopt;
  }
  PmiClient client(envInt("PMI_FD"), envInt("PMI_RANK"), envInt("PMI_SIZE"));
  client.command("cmd=init pmi_version=1 pmi_subversion=1\n", "response_to_init");
  auto reply = parseLine(client.command("cmd=get_my_kvsname\n", "my_kvsname"));
  client.kvsName_ = reply["kvsname"];
  return client;
}

PmiClient::PmiClient(int fd, int rank, int size) : fd_(fd), rank_(rank), size_(size) {}

std::string PmiClient::command(const std::string& line, const std::string& expectCmd) {
  size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + sent, line.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failErrno("PMI: write to PMI_FD");
    sent += static_cast<size_t>(n);
  }
  // Replies are single lines; the process manager answers each command in order.
  for (;;) {
    const size_t newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string reply = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      auto fields = parseLine(reply);
      if (fields["cmd"] != expectCmd) {
        fail(chorusSystemError, "PMI: expected '{}' in reply to '{}', got '{}'", expectCmd,
             line.substr(0, line.size() - 1), reply);
      }
      if (fields.count("rc") != 0 && fields["rc"] != "0") {
        fail(chorusSystemError, "PMI: '{}' failed: {}", line.substr(0, line.size() - 1), reply);
      }
      return reply;
    }
    char buffer[1024];
    const ssize_t n = ::read(fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(chorusSystemError, "PMI: the process manager closed PMI_FD");
    pending_.append(buffer, static_cast<size_t>(n));
  }
}

void PmiClient::put(const std::string& key, const std::string& value) {
  command("cmd=put kvsname=" + kvsName_ + " key=" + key + " value=" + value + "\n", "put_result");
}

void PmiClient::barrier() { command("cmd=barrier_in\n", "barrier_out"); }

std::string PmiClient::get(const std::string& key) {
  auto reply = parseLine(command("cmd=get kvsname=" + kvsName_ + " key=" + key + "\n", "get_result"));
  return reply["value"];
}

void PmiClient::finalize() { command("cmd=finalize\n", "finalize_ack"); }

}  // namespace chorus
