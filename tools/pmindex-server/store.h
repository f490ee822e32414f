// store.h: the item store behind pmindex-server, memcached's item semantics
// (flags, expiry, CAS, flush_all) over a pmindex::KV on any engine
// (docs/server.md). Not tied to any paper section: the FPTree paper (6.4)
// runs its tree under memcached; this is the same idea as a separate server.
//
// Item format, one engine record per memcached key (byte keys):
//   value = ItemHeader (16 bytes, native endian) | data bytes
//   ItemHeader { u32 flags; u32 exptime (absolute unix seconds, 0 = never);
//                u64 cas }
// One reserved record, key kFlushKey ("\n" can never be in a text-protocol
// key), holds the flush_all threshold in its cas field: every item whose
// cas is <= it is invalid (flushed).
//
// Invariants:
//  - An item is visible iff it is present, not expired (exptime 0 or >
//    now) and its cas > the flush threshold. Invisible records are removed
//    lazily (by the read that meets them) and by Sweep.
//  - CAS values handed out by one process increase strictly; a new process
//    starts its counter at max(wall clock in microseconds, threshold + 1),
//    so a restarted server's CAS values exceed the old ones unless the old
//    process averaged more than one write per microsecond of wall time
//    between the two starts.
//
// Persist order: none of its own. Every write is one engine Upsert or
// Remove, durable when it returns OK (pmindex/index.h); a reply (STORED,
// DELETED, OK ...) is produced only after that call returned.
//
// Thread safety: every method may be called from any number of threads.
// Writers of one key serialize on a striped key lock (kStripes mutexes,
// chosen by key hash), so the read-modify-write commands (add, replace,
// append, prepend, cas, incr, decr, touch, delete, and the lazy and swept
// reclamation) are atomic per key; readers take no lock and rely on the
// engine's linearizable Find. On an engine that is not concurrent
// (IndexInfo::concurrent false) one mutex serializes every engine call.
// Close must not race with anything else.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pmindex/kv.h"

namespace pmindex::server {

struct ItemHeader {
  uint32_t flags;
  uint32_t exptime;
  uint64_t cas;
};
static_assert(sizeof(ItemHeader) == 16);

struct Item {
  uint32_t flags = 0;
  uint32_t exptime = 0;
  uint64_t cas = 0;
  std::string data;
};

enum class Mode { kSet, kAdd, kReplace, kAppend, kPrepend, kCas };

enum class Reply {
  kStored,
  kNotStored,
  kExists,
  kNotFound,
  kDeleted,
  kTouched,
  kTooLarge,     // the result would exceed max_item_size
  kOutOfMemory,  // the pool is full; nothing changed
  kNonNumeric,   // incr/decr on a value that is not a decimal number
  kError,        // another engine error; error() says which
};

struct StoreConfig {
  std::string engine = "fptree";
  std::string pool;              // pool file (ignored by transient engines)
  uint64_t pool_size = 64ull << 20;   // initial size of a new pool
  uint64_t max_pool_size = 0;         // growth limit (0: the library's default)
  size_t max_item_size = 1 << 20;     // data bytes of one item
  int threads = 4;                    // callers, a hint for the engine
  std::map<std::string, std::string> params;  // engine parameters
};

struct StoreCounters {
  std::atomic<uint64_t> reclaimed{0};  // invisible records removed
  std::atomic<uint64_t> sweeps{0};
};

class Store {
 public:
  static constexpr char kFlushKey[] = "\npmindex-server/flush";
  static constexpr size_t kStripes = 4096;

  static Status Open(const StoreConfig& config, std::unique_ptr<Store>* out);
  ~Store();

  // Converts a protocol exptime (0 never, <= 30 days relative, larger
  // absolute unix time, negative already expired) to the stored form.
  static uint32_t AbsoluteExptime(int64_t exptime);
  static uint32_t Now();

  // The visible item, or false.
  bool Get(Slice key, Item* out);
  // One answer per key (found[i] says whether items[i] holds one).
  void GetMany(const std::vector<Slice>& keys, std::vector<Item>* items, std::vector<bool>* found);

  // A storage command. cas_in is used by kCas only. kAppend/kPrepend keep the
  // item's flags and exptime. *cas_out (if not null) receives the new CAS.
  Reply Write(Mode mode, Slice key, uint32_t flags, uint32_t exptime, Slice data, uint64_t cas_in,
              uint64_t* cas_out = nullptr);
  // cas_in != 0: only if the item's CAS is cas_in (else kExists).
  Reply Delete(Slice key, uint64_t cas_in = 0);
  // incr (or decr) by delta: *result receives the new value.
  Reply Arith(Slice key, bool incr, uint64_t delta, uint64_t* result);
  // New exptime for a visible item; *out (if not null) receives it (gat).
  Reply Touch(Slice key, uint32_t exptime, Item* out);
  // Invalidates every item stored so far (durable when it returns OK).
  Status FlushAll();
  // One pass over an ordered engine removing invisible records; Unsupported
  // on a hash engine (those reclaim lazily only).
  Status Sweep();

  // Engine error of the last kError on this thread.
  static const std::string& error();

  const IndexInfo& info() const { return kv_->info(); }
  KV* kv() { return kv_.get(); }
  uint64_t Items();
  size_t max_item_size() const { return max_item_size_; }
  StoreCounters& counters() { return counters_; }
  Status Close();

 private:
  Store() = default;
  std::mutex& StripeOf(Slice key);
  bool Visible(const ItemHeader& h, uint32_t now) const;
  // Reads and decodes key's record (under its stripe lock when writing):
  // 1 visible, 0 absent, -1 present but invisible. Engine errors count absent.
  int Read(Slice key, Item* out);
  Reply Put(Slice key, const ItemHeader& h, Slice a, Slice b);
  // Removes key if its record is still invisible (takes the stripe lock).
  void Reclaim(Slice key);
  // Engine calls, serialized when the engine is not concurrent.
  Status EFind(Slice key, std::string* v);
  Status EPut(Slice key, Slice v);
  Status ERemove(Slice key);

  std::unique_ptr<KV> kv_;
  size_t max_item_size_ = 0;
  std::atomic<uint64_t> next_cas_{1};
  std::atomic<uint64_t> flush_cas_{0};
  bool serialize_ = false;
  std::mutex engine_mu_;
  std::unique_ptr<std::mutex[]> stripes_;
  StoreCounters counters_;
};

}  // namespace pmindex::server
