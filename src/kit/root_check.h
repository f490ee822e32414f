// kit/root_check.h: telling a crashed index creation from a damaged root.
//
// An index's creation allocates its root object (zeroed) into the pool's
// root slot, stores its magic and configuration, allocates at most a few
// first blocks, and stores initialized = 1 last. On open, a root whose
// initialized word is 0 is either such a creation that crashed (it may be
// created again: nothing was ever acknowledged) or an initialised tree whose
// initialized word was damaged (creating it again would drop every record).
// ClassifyRoot separates them by what a crashed creation can leave: an
// initialized word of 0, a magic of 0 or the expected magic, and no more
// blocks in the allocator than the creation allocates (the allocator counts
// blocks at pool open). Anything else is Corrupt. The index adds its own
// checks for the words its creation stores (e.g. logs unused, the first leaf
// empty).
//
// Both words are u64 fields of the root object; magic is written before any
// block beyond the root is allocated, initialized last.
//
// Thread safety: open-time, single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::internal::kit {

enum class RootState {
  kAbsent,       // the root slot is 0: a new pool, or a creation that crashed before allocating the root
  kInitialized,  // magic and initialized == 1
  kCreating,     // initialized == 0, magic 0 or expected: a creation that crashed (CheckCreationBlocks decides)
};

struct RootSpec {
  std::string name;         // message prefix, e.g. "fptree"
  uint64_t magic;           // expected magic
  size_t root_bytes;        // size of the root object
  size_t magic_at;          // offsets of the u64 words inside the root object
  size_t initialized_at;
};

// Reads the pool's root slot and the root's magic/initialized words.
// Corrupt if the root object is not inside the pool, or its words are
// neither an initialised root nor a possible crashed creation.
inline Status ClassifyRoot(pm::Pool* pool, const RootSpec& spec, RootState* state) {
  *state = RootState::kAbsent;
  const uint64_t ro = *pool->root_slot();
  if (ro == 0) return Status::OK();
  if (ro % 8 || pool->size() < spec.root_bytes || ro > pool->size() - spec.root_bytes)
    return Status::Corrupt(spec.name + ": root object offset " + std::to_string(ro) + " outside the pool");
  uint64_t magic, init;
  std::memcpy(&magic, pool->base() + ro + spec.magic_at, 8);
  std::memcpy(&init, pool->base() + ro + spec.initialized_at, 8);
  if (magic == spec.magic && init == 1) {
    *state = RootState::kInitialized;
    return Status::OK();
  }
  if (init != 0 || (magic != 0 && magic != spec.magic))
    return Status::Corrupt(spec.name + ": root magic/initialized words damaged (initialized = " + std::to_string(init) +
                           ")");
  *state = RootState::kCreating;
  return Status::OK();
}

// For a kCreating root: the pool holds at most max_blocks blocks (the root
// and what the creation allocates before initialized = 1). `what` describes
// the root for the message ("root not initialised (initialized = 0, ...)").
inline Status CheckCreationBlocks(pm::Pool* pool, const RootSpec& spec, uint64_t max_blocks, const std::string& what) {
  const uint64_t blocks = pool->allocator().BlocksInUse();
  if (blocks > max_blocks)
    return Status::Corrupt(spec.name + ": " + what + " but the pool holds " + std::to_string(blocks) +
                           " blocks: more than a crashed creation allocates");
  return Status::OK();
}

}  // namespace pmindex::internal::kit
