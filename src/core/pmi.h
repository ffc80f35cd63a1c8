// pmi.h: a minimal PMI-1 client (the wire protocol MPICH's hydra mpiexec speaks over PMI_FD),
// enough to publish a unique id from rank 0 and read it on the others. One thread.
#pragma once

#include <optional>
#include <string>

namespace chorus {

class PmiClient {
 public:
  // Returns a client when PMI_FD, PMI_RANK and PMI_SIZE are set, else nothing.
  static std::optional<PmiClient> fromEnvironment();

  int rank() const { return rank_; }
  int size() const { return size_; }

  void put(const std::string& key, const std::string& value);
  void barrier();
  std::string get(const std::string& key);
  void finalize();

 private:
  PmiClient(int fd, int rank, int size);
  std::string command(const std::string& line, const std::string& expectCmd);

  int fd_;
  int rank_;
  int size_;
  std::string kvsName_;
  std::string pending_;
};

}  // namespace chorus
