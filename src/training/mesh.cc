// mesh.cc: mesh coordinates, groups, and the communicators split from the world.
#include "src/training/mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "chorus/error.hpp"

namespace chorus::training {

std::string MeshShape::describe() const {
  return fmt::format("dp{} tp{} pp{} cp{}", dp, tp, pp, cp) + (ep > 1 ? fmt::format(" ep{}", ep) : "");
}

MeshCoords coordsOf(int rank, const MeshShape& s) {
  MeshCoords c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.cp = rank % s.cp;
  rank /= s.cp;
  c.dp = rank % s.dp;
  c.pp = rank / s.dp;
  return c;
}

int rankOf(const MeshCoords& c, const MeshShape& s) { return ((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.tp + c.tp; }

namespace {

// Every group kind, in the order the constructor splits them (embedding's own split comes last).
constexpr std::array<const char*, 8> kGroupKinds = {"dp", "tp", "pp", "cp", "dpcp", "embedding", "ep", "edpcp"};

// For each kind: how many ranks its group has, and the rank of member i given this rank's coords.
std::vector<int> members(const MeshCoords& at, const MeshShape& s, const std::string& kind) {
  std::vector<int> ranks;
  auto vary = [&](int count, auto set) {
    for (int i = 0; i < count; ++i) {
      MeshCoords c = at;
      set(c, i);
      ranks.push_back(rankOf(c, s));
    }
  };
  if (kind == "dp") {
    vary(s.dp, [](MeshCoords& c, int i) { c.dp = i; });
  } else if (kind == "tp") {
    vary(s.tp, [](MeshCoords& c, int i) { c.tp = i; });
  } else if (kind == "pp") {
    vary(s.pp, [](MeshCoords& c, int i) { c.pp = i; });
  } else if (kind == "cp") {
    vary(s.cp, [](MeshCoords& c, int i) { c.cp = i; });
  } else if (kind == "dpcp") {
    vary(s.dp * s.cp, [&](MeshCoords& c, int i) {
      c.dp = i / s.cp;
      c.cp = i % s.cp;
    });
  } else if (kind == "ep") {
    vary(s.ep, [&](MeshCoords& c, int i) { c.dp = at.dp - at.dp % s.ep + i; });
  } else if (kind == "edpcp") {
    vary(s.dp / s.ep * s.cp, [&](MeshCoords& c, int i) {
      c.dp = i / s.cp * s.ep + at.dp % s.ep;
      c.cp = i % s.cp;
    });
  } else if (kind == "embedding") {
    if (at.pp == 0 || at.pp == s.pp - 1) {
      vary(s.pp > 1 ? 2 : 1, [&](MeshCoords& c, int i) { c.pp = i * (s.pp - 1); });
    }
  } else {
    throw Error(chorusInvalidArgument,
                fmt::format("device mesh: no group kind '{}' ({})", kind, fmt::join(kGroupKinds, ", ")));
  }
  return ranks;
}

}  // namespace

std::vector<int> groupOf(int rank, const MeshShape& shape, const std::string& kind) {
  return members(coordsOf(rank, shape), shape, kind);
}

DeviceMesh::DeviceMesh(Communicator& world, const MeshShape& shape) : shape_(shape) {
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1 || shape.cp < 1 || shape.size() != world.size()) {
    throw Error(chorusInvalidArgument, fmt::format("device mesh {}: its product {} is not the world's {} ranks",
                                                   shape.describe(), shape.size(), world.size()));
  }
  if (shape.ep < 1 || shape.dp % shape.ep != 0) {
    throw Error(chorusInvalidArgument,
                fmt::format("device mesh {}: expert parallelism is carved from the {} data-parallel ranks, which "
                            "ep = {} must divide",
                            shape.describe(), shape.dp, shape.ep));
  }
  worldRank_ = world.rank();
  coords_ = coordsOf(worldRank_, shape);
  // One split per kind, every rank taking part; the color is the group's lowest world rank, the
  // key the rank's place in the group.
  for (const char* kind : kGroupKinds) {
    const std::string k = kind;
    if (k == "embedding") continue;  // below: the middle stages take part in its split with no color
    const std::vector<int> ranks = groupOf(worldRank_, shape, kind);
    // Every rank has the same shape: all skip alike. Without cp, dp x cp is the dp group, whose
    // communicator serves. With cp it has its own even when dp = 1 (the same ranks as cp): data
    // parallelism's thread reduces over it while the model's thread runs ring attention over cp.
    if (ranks.size() < 2 || (k == "dpcp" && shape.cp == 1) || ((k == "ep" || k == "edpcp") && shape.ep == 1)) continue;
    const int place = static_cast<int>(std::find(ranks.begin(), ranks.end(), worldRank_) - ranks.begin());
    *slotOf(kind) = world.split(*std::min_element(ranks.begin(), ranks.end()), place);
  }
  // The pipeline's first and last stages (the tied embedding's two copies): the middle stages
  // belong to no such group but take part in the split.
  if (shape.pp > 1) {
    const std::vector<int> ranks = groupOf(worldRank_, shape, "embedding");
    embedding_ = world.split(ranks.empty() ? CHORUS_SPLIT_NOCOLOR : ranks.front(), coords_.pp);
  }
}

Communicator* DeviceMesh::slotOf(const std::string& kind) {
  if (kind == "dp") return &dp_;
  if (kind == "tp") return &tp_;
  if (kind == "pp") return &pp_;
  if (kind == "cp") return &cp_;
  if (kind == "dpcp") return &dpcp_;
  if (kind == "embedding") return &embedding_;
  if (kind == "ep") return &ep_;
  if (kind == "edpcp") return &edpcp_;
  throw Error(chorusInvalidArgument,
              fmt::format("device mesh: no group kind '{}' ({})", kind, fmt::join(kGroupKinds, ", ")));
}

void checkCommunicator(Communicator& comm, const std::string& name) {
  if (!comm) return;
  try {
    comm.checkAsyncError();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", name, e.what()));
  }
}

void DeviceMesh::checkAsyncErrors() {
  for (const char* kind : kGroupKinds) {
    checkCommunicator(*slotOf(kind), fmt::format("the {} group", kind));
  }
}

Communicator* DeviceMesh::group(const std::string& kind) {
  if (kind == "dpcp" && shape_.cp == 1) return group("dp");
  Communicator* slot = slotOf(kind);
  return *slot ? slot : nullptr;
}

}  // namespace chorus::training
