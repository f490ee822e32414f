// pmcheck --shared-writes: which versions a crash may recover for a key that
// every thread writes (docs/pmcheck.md, "Shared writes").
//
// Keys a single thread owns have totally ordered histories: the committed
// version, or the one an op in flight writes. A key every thread writes has
// no such order; what a durably linearizable index must recover follows from
// the ops' real-time order alone. Writes are the ops that took effect in the
// recording (insert/update/upsert that returned OK: their version; remove
// that returned OK: absent, 0), each with the event interval [begin, end)
// of its op (end unknown while in flight). At a crash point:
//   - a write is a candidate once it has begun (it may have linearized);
//   - a completed write W is superseded if some other write must linearize
//     after it: a completed write, or a write whose version a completed read
//     returned (that write linearized), that began after W ended; or a
//     completed read that began after W ended and returned another write's
//     version (W linearized before the read, and the read saw the last write
//     before it, so that write is after W);
//   - absent (the initial state) is allowed only while no write is known to
//     have linearized (no completed write, no write a completed read saw).
// The recovered version must be a candidate that is not superseded. This
// is sound for any durably linearizable index (every allowed version is the
// last write of some linearization of the completed ops and a subset of the
// in-flight ones) and weaker than exact linearizability checking: writes
// ordered only through failed ops or reads of absent are not used.
//
// Thread-safety: one SharedHistory per replay, used by one thread.
#pragma once

#include <cstdint>
#include <vector>

namespace pmcheck {

// What a crash may leave for one shared-write key.
struct SharedAllowed {
  uint32_t kid = 0;
  std::vector<uint32_t> allowed;     // versions (0: absent)
  std::vector<uint32_t> superseded;  // versions a completed op has overwritten
};

class SharedHistory {
 public:
  // Shared-write keys are the key ids [first, first + n).
  SharedHistory(uint32_t first, uint32_t n) : first_(first), keys_(n) {}

  // At the begin event of a write that took effect (version 0: a remove).
  void WriteBegan(uint32_t kid, uint32_t version, int64_t begin);
  // At its end event.
  void WriteEnded(uint32_t kid, int64_t begin, int64_t end);
  // At the end event of a read (that began at event `begin`) that returned
  // version (> 0) of kid.
  void ReadEnded(uint32_t kid, uint32_t version, int64_t begin);

  // Per shared-write key: the versions a crash now may recover.
  std::vector<SharedAllowed> Allowed() const;

 private:
  struct Write {
    uint32_t version;
    int64_t begin, end;  // end -1: in flight
  };
  struct Read {
    int64_t begin;
    uint32_t version;
  };
  struct Key {
    std::vector<Write> writes;
    std::vector<Read> reads;
    // The latest begin of a write known to have linearized: completed, or
    // read by a completed read. -1: none.
    int64_t floor = -1;
  };
  Key* At(uint32_t kid) { return kid >= first_ && kid - first_ < keys_.size() ? &keys_[kid - first_] : nullptr; }

  uint32_t first_;
  std::vector<Key> keys_;
};

}  // namespace pmcheck
