// kit/bounded_walk.h: the bound on a walk over a persistent list on a pool
// that may be damaged.
//
// A list or sibling walk that trusts PM words spins forever on a cycle. In a
// pool of S bytes there are at most S / node_bytes distinct nodes, so a walk
// that visits more is on a cycle (or on garbage): it stops and reports
// Corrupt. Recovery and Check walk with a bound; an open tree whose lists
// were checked at open may walk without one.
//
// Thread safety: a BoundedWalk is a local of one walk.
#pragma once

#include <cstdint>
#include <string>

#include "pmindex/status.h"

namespace pmindex::internal::kit {

class BoundedWalk {
 public:
  BoundedWalk(uint64_t pool_bytes, uint64_t node_bytes) : bound_(node_bytes ? pool_bytes / node_bytes : 0) {}
  // Counts one more node; false if that is more nodes than the pool can hold.
  bool Step() { return ++visited_ <= bound_; }
  // For a pool that grows in place while the walk runs: raises the bound to
  // what pool_bytes holds (never lowers it); true if the nodes visited so
  // far are within it. A walker whose Step failed calls it with the pool's
  // current size before it reports a cycle.
  bool Regrow(uint64_t pool_bytes, uint64_t node_bytes) {
    const uint64_t b = node_bytes ? pool_bytes / node_bytes : 0;
    if (b > bound_) bound_ = b;
    return visited_ <= bound_;
  }
  uint64_t bound() const { return bound_; }
  uint64_t visited() const { return visited_; }
  // The Corrupt status of a walk that failed Step: "<what> has a cycle (more
  // than N <unit>)".
  Status CycleError(const std::string& what, const std::string& unit) const {
    return Status::Corrupt(what + " has a cycle (more than " + std::to_string(bound_) + " " + unit + ")");
  }

 private:
  uint64_t bound_;
  uint64_t visited_ = 0;
};

}  // namespace pmindex::internal::kit
