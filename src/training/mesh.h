// mesh.h: the device mesh of hybrid-parallel training: the world's ranks laid out as
// (pp, dp, cp, tp), tensor parallel fastest (its ranks are neighbours, so on one host), pipeline
// slowest, as Megatron-LM orders them. Expert parallelism (MoE) is carved from data parallelism:
// of the dp ranks, each ep consecutive ones (neighbours in dp) hold the experts between them, and
// the dp ranks ep apart hold the same experts. Each rank finds its coordinates and holds one
// communicator per group it belongs to, made by splitting the world (Communicator::split).
#pragma once

#include <chorus/chorus.hpp>
#include <string>
#include <vector>

namespace chorus::training {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int ep = 1;  // divides dp
  int size() const { return dp * tp * pp * cp; }
  std::string describe() const;  // "dp2 tp2 pp2 cp1", then " ep2" with expert parallelism
};

struct MeshCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0;
  bool operator==(const MeshCoords&) const = default;
};

// rank = ((pp * dp + d) * cp + c) * tp + t.
MeshCoords coordsOf(int rank, const MeshShape& shape);
int rankOf(const MeshCoords& coords, const MeshShape& shape);
// The world ranks of each group of one kind that `rank` belongs to, in group-rank order:
// "dp", "tp", "pp", "cp", "dpcp" (the ranks that hold the same parameter shard: gradients are
// averaged over data and context parallel together), or "embedding" (the first and the last
// pipeline stage's ranks of the same dp, cp and tp coordinates, which hold the tied token
// embedding; empty for the stages between), "ep" (the dp ranks d - d % ep .. + ep - 1: the
// experts' all-to-all) or "edpcp" (the ranks that hold the same experts: the dp ranks of the same
// d % ep, with every cp rank; expert gradients are averaged over them).
std::vector<int> groupOf(int rank, const MeshShape& shape, const std::string& kind);

// Throws chorus::Error, naming `name`, where the communicator has failed, a device call that
// failed on its stream included (the stream went on, and the call's buffers hold what it left):
// chorusCommGetAsyncError. For the moments no other thread uses it (a step's end).
void checkCommunicator(Communicator& comm, const std::string& name);

class DeviceMesh {
 public:
  // Collective over world. Throws chorus::Error (kInvalidArgument) when the shape's product is
  // not world's size, naming both. A dimension of size 1 gets no communicator.
  DeviceMesh(Communicator& world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  int worldRank() const { return worldRank_; }
  // The group's communicator, or null for a group of one rank (or none: "embedding" in the middle
  // of the pipeline). Without cp, "dpcp" is the "dp" communicator; with cp it is one of its own,
  // apart from "cp" even when dp = 1 (the same ranks), so that two threads may use the two.
  // "ep" and "edpcp" are communicators of their own (the model's thread uses the one, data
  // parallelism's the other), and null without expert parallelism (ep = 1).
  Communicator* group(const std::string& kind);
  // checkCommunicator of every group's communicator, each named by its kind ("the dp group").
  void checkAsyncErrors();

 private:
  Communicator* slotOf(const std::string& kind);  // throws for an unknown kind
  MeshShape shape_;
  MeshCoords coords_;
  int worldRank_ = 0;
  Communicator dp_, tp_, pp_, cp_, dpcp_, embedding_, ep_, edpcp_;
};

}  // namespace chorus::training
