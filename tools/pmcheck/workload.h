// pmcheck workloads: seeded op sequences whose keys and values are
// self-describing, so a recovered image can be judged without the log.
//
// Every value encodes its key and a version number (u64 values: a 32-bit
// hash of the key in the high half, the version in the low half; byte values:
// version, key hash, then a pattern derived from both, 8..104 bytes). A
// value that does not decode for its key is torn. Each key belongs to one
// thread, and each mutating op on a key carries the key's next version, so
// the state of a key is one number (0: absent) and per-key histories are
// totally ordered even when threads run concurrently. With shared keys
// (Config::shared_keys) Finds and Scans pick keys of every thread, so
// threads read what other threads write; writes stay with the owner. With
// shared writes (Config::shared_writes, on top of shared keys) every thread
// also writes kSharedWriteKeys more keys, which no thread owns: their
// versions are unique per key but their order is the ops' real-time order,
// which the replay reconstructs (shared_history.h). With
// key sweeps (Config::sweep) each thread runs over its whole key range in
// key order, ascending and descending, alternately filling and emptying it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pmcheck.h"
#include "pmindex/index.h"

namespace pmcheck {

enum class OpType : uint8_t { kCreate, kInsert, kUpdate, kUpsert, kRemove, kFind, kScan };
const char* OpName(OpType t);

struct Op {
  OpType type = OpType::kFind;
  int tid = 0;
  uint32_t kid = 0;      // key id
  uint32_t version = 0;  // the version a successful insert/update/upsert writes
};

class Workload {
 public:
  Workload(const Config& c, int threads, uint64_t ops_per_thread, uint64_t seed);

  const std::vector<std::vector<Op>>& ops() const { return ops_; }
  size_t num_keys() const { return keys_.size(); }
  const std::string& key(uint32_t kid) const { return keys_[kid]; }
  std::string Value(uint32_t kid, uint32_t version) const;
  // The version encoded in `value` for key kid, or -1 if it is torn / not
  // a value of this key.
  int64_t Decode(uint32_t kid, pmindex::Slice value) const;
  // Key id of a key, -1 if it is not one of the workload's keys.
  int64_t KeyId(pmindex::Slice key) const;
  // The thread that writes key kid (for a shared-write key: the thread
  // count, i.e. no thread).
  int Owner(uint32_t kid) const { return int(kid / per_thread_); }
  // True if every thread writes key kid (Config::shared_writes).
  bool SharedWrite(uint32_t kid) const { return kid >= per_thread_ * ops_.size(); }
  // Keys every thread writes, after the threads' own keys.
  static constexpr uint32_t kSharedWriteKeys = 4;
  // The (key id, version) pairs a successful Find or Scan returned in `got`
  // (values that decode for their key only).
  std::vector<std::pair<uint32_t, uint32_t>> Reads(const Op& op, const std::string& got) const;
  // Empty if a Find of another thread's key (shared keys) is plausible: OK
  // with a value of that key, or NotFound.
  std::string CheckSharedFind(const Op& op, pmindex::Status::Code result, const std::string& got) const;
  // Empty if `result` is a plausible result of op on a shared-write key
  // (whatever the other threads did): what the op could return from some
  // state, with a value of that key for a Find.
  std::string CheckSharedWrite(const Op& op, pmindex::Status::Code result, const std::string& got) const;
  // Keys used after recovery to check the index still works (disjoint).
  std::string PostKey(int j) const;
  std::string MinKey() const;
  pmindex::KeyKind key_kind() const { return kk_; }
  pmindex::ValueKind value_kind() const { return vk_; }

  // Records per scan op (a scan starts at its op's key).
  static constexpr size_t kScanCount = 12;

  // Runs op on index; *got receives the value a Find returned, or a Scan's
  // records (each `[u32 key len][key][u32 value len][value]`).
  pmindex::Status Apply(pmindex::Index* index, const Op& op, std::string* got) const;
  // Empty if a scan by thread `tid` that returned `got` is consistent:
  // ascending workload keys with values of their own key; the thread's own
  // keys (no other thread writes them) exactly as `state` has them, none
  // missing in the range the scan covered. Scans of indexes without order
  // (Unsupported) are not checked.
  std::string CheckScan(const Op& op, const std::string& got, const std::vector<uint32_t>& state) const;
  // The key's new state (version, 0 = absent) after op returned `result`.
  static uint32_t After(const Op& op, pmindex::Status::Code result, uint32_t before);
  // Empty if `result` is what a correct index returns from state `before`;
  // otherwise a description.
  std::string CheckResult(const Op& op, pmindex::Status::Code result, uint32_t before, const std::string& got) const;

 private:
  uint32_t Hash(uint32_t kid) const { return hashes_[kid]; }
  static std::vector<std::pair<std::string, std::string>> ParseScan(const std::string& got);
  uint64_t per_thread_ = 1;
  pmindex::KeyKind kk_;
  pmindex::ValueKind vk_;
  std::vector<std::string> keys_;
  std::vector<uint32_t> hashes_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::vector<Op>> ops_;
};

}  // namespace pmcheck
