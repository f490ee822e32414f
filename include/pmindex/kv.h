// pmindex/kv.h: a key-value store over any registered index (the "engine"),
// in the manner of pmemkv: open by engine name and configuration, then get,
// put, remove, exists, counts and range reads with callbacks, batched gets and
// an iterator. docs/kv.md is the full description.
//
// Keys and values are byte strings (Slice). On an engine opened with
// KeyKind::kU64 a key is 8 native-endian bytes (U64Slice) and keys order
// numerically; with kBytes they order by memcmp and may not be empty. Range
// calls name their bounds exclusively, as pmemkv does: count_above(k) and
// get_above(k) cover keys > k, *_below(k) keys < k, *_between(lo, hi) keys with
// lo < key < hi. Hash engines (IndexInfo::ordered false) answer every range
// call, get_all and iterators with Status::Unsupported; count_all works on all.
//
// Consistency under concurrent writers (concurrent engines only):
//  - get/put/remove/exists are the engine's own operations (linearizable on
//    every built-in engine); an OK put or remove on a persistent engine is
//    durable.
//  - Range calls, counts and iterators read the engine in batches through
//    Index::Scan and re-seek after the last key of a batch. They return keys
//    in strictly ascending order, each at most once. A key present and
//    unchanged for the whole call is returned with its value; a key inserted,
//    updated or removed during the call may or may not be seen, and if seen
//    its value is one the key held at some instant during the call. There is
//    no snapshot: two keys returned together may come from different moments.
//  - Callbacks run outside the engine's locks (on a copy of the batch), so a
//    callback may call back into the same KV, including writes.
//
// Thread safety: a KV may be used by many threads at once when its engine is
// concurrent (IndexInfo::concurrent); close() and the destructor must not run
// concurrently with anything else. A KVIterator belongs to one thread; it
// must not outlive its KV. After close() every call returns InvalidArgument.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/options.h"
#include "pmindex/status.h"

namespace pmindex {

struct KVConfig {
  // Pool file; empty: a temporary pool in /dev/shm removed on close.
  std::string path;
  // Initial pool size in bytes (the pool grows in place when full).
  uint64_t size = 64ull << 20;
  // Create the pool if missing; fail instead if error_if_exists and present.
  bool create_if_missing = true;
  bool error_if_exists = false;
  // Kinds for a new store; an existing pool keeps its own.
  KeyKind key_kind = KeyKind::kBytes;
  ValueKind value_kind = ValueKind::kBytes;
  // Engine parameters by name (Options::params), e.g. {"leaf_size", "56"}.
  std::map<std::string, std::string> params;

  // The Options OpenIndex receives.
  Options ToOptions() const;
};

// Visits one record; return false to stop. The slices are valid during the
// call only.
using KVCallback = FunctionRef<bool(Slice key, Slice value)>;

class KVIterator;

class KV {
 public:
  // Opens (creating if allowed) the store at config.path with the named
  // engine; an empty engine name accepts whatever engine owns the pool.
  static Status Open(std::string_view engine, const KVConfig& config, std::unique_ptr<KV>* out);
  // Takes over an open index.
  explicit KV(std::unique_ptr<Index> index);
  ~KV();  // closes
  KV(const KV&) = delete;
  KV& operator=(const KV&) = delete;

  // Copies the value of key into *value; NotFound if absent.
  Status get(Slice key, std::string* value);
  // Inserts or replaces.
  Status put(Slice key, Slice value);
  // NotFound if absent.
  Status remove(Slice key);
  // OK if present, NotFound if absent.
  Status exists(Slice key);

  // Batched get: (*values)[i] and (*statuses)[i] answer keys[i]. Returns OK
  // when every lookup ran (each may still be NotFound), else the first error
  // other than NotFound.
  Status get_many(const std::vector<Slice>& keys, std::vector<std::string>* values, std::vector<Status>* statuses);

  Status count_all(uint64_t* n);
  Status count_above(Slice key, uint64_t* n);
  Status count_below(Slice key, uint64_t* n);
  Status count_between(Slice lo, Slice hi, uint64_t* n);

  Status get_all(KVCallback cb);
  Status get_above(Slice key, KVCallback cb);
  Status get_below(Slice key, KVCallback cb);
  Status get_between(Slice lo, Slice hi, KVCallback cb);

  // A new iterator, unpositioned (valid() false until a seek).
  Status new_iterator(std::unique_ptr<KVIterator>* out);

  // Flushes and closes the store. Idempotent.
  Status close();

  bool is_open() const { return index_ != nullptr; }
  // The engine's name and facts (empty if closed).
  const IndexInfo& info() const { return info_; }
  KeyKind key_kind() const { return key_kind_; }
  ValueKind value_kind() const { return value_kind_; }
  // Records, PM and DRAM bytes of the engine.
  Status stats(IndexStats* out);
  // The engine itself, for what KV does not cover (nullptr if closed).
  Index* index() { return index_.get(); }

 private:
  friend class KVIterator;
  // Visits keys in (lo, hi) in order (null bound: unbounded), in batches.
  Status Range(const Slice* lo, const Slice* hi, KVCallback cb);
  Status CheckOpen() const;
  Status CheckOrdered() const;

  std::unique_ptr<Index> index_;
  IndexInfo info_;
  KeyKind key_kind_ = KeyKind::kBytes;
  ValueKind value_kind_ = ValueKind::kBytes;
};

// Forward iteration over an ordered engine in batches of Index::Scan (see the
// consistency guarantee above). prev() steps back within the batch at hand
// and, at its first record, re-reads the engine from the smallest key to find
// the predecessor (cost proportional to the position).
class KVIterator {
 public:
  ~KVIterator();
  // Positions at the first key >= key.
  Status seek(Slice key);
  Status seek_to_first();
  // Moves to the next (previous) key; invalid past the end (before the start).
  Status next();
  Status prev();
  bool valid() const { return pos_ < batch_.size(); }
  // The current record; valid() must hold. Valid until the iterator moves.
  Slice key() const { return batch_[pos_].first; }
  Slice value() const { return batch_[pos_].second; }
  // The error that stopped the iterator, OK otherwise.
  const Status& status() const { return status_; }

 private:
  friend class KV;
  explicit KVIterator(KV* kv) : kv_(kv) {}
  // Loads the batch starting at key (inclusive unless skip_equal).
  Status Fill(Slice start, bool skip_equal);

  KV* kv_;
  std::vector<std::pair<std::string, std::string>> batch_;
  size_t pos_ = 0;
  bool at_end_ = true;  // the engine has no keys after the batch
  Status status_;
};

}  // namespace pmindex
