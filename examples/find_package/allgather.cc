// allgather.cc: a C++ program using the installed chorus through find_package and chorus.hpp: every
// rank gathers every rank's number and checks it. Start it with chorusrun (or torchrun, srun, mpiexec).
#include <chorus/chorus.hpp>
#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  try {
    chorus::Communicator comm = chorus::Communicator::fromEnvironment();
    std::vector<int> mine(5, comm.rank());
    std::vector<int> all(5 * comm.size());
    comm.allGather(std::span<const int>(mine), std::span<int>(all));
    for (int r = 0; r < comm.size(); ++r) {
      for (int i = 0; i < 5; ++i) {
        if (all[r * 5 + i] != r) {
          std::fprintf(stderr, "rank %d: all[%d] = %d\n", comm.rank(), r * 5 + i, all[r * 5 + i]);
          return 1;
        }
      }
    }
    std::printf("example ok (rank %d of %d)\n", comm.rank(), comm.size());
  } catch (const chorus::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
