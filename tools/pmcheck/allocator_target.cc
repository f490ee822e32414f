// pmcheck target "allocator": the crash-safe allocator (src/pm/, docs/
// allocator.md) driven directly, so that crash images hold allocations and
// frees of every kind: small and 32 KiB run blocks, 100 KiB blocks (a
// medium-class run: two blocks per chunk), large blocks of two and three
// chunks, pool growth (Pool::Grow), Reclaim of free runs when the pool
// reaches its maximum size, and frees of blocks another thread allocated.
// Index paths reach only small size classes; this target reaches the rest.
//
// The allocator's contract is FPTree's (SIGMOD'16, section 2): the store of
// a block's offset into a persistent destination word commits the
// allocation, and a free zeroes that word durably.
//
// It is a u64 key/value map so that pmcheck's rules apply unchanged: each
// record is an allocator block of a size derived from its key and value
// (32 bytes to 700 KiB; 32 when the pool is full), {key, value, size} at
// its start and a check word in its last 8 bytes; a slot of an
// open-addressing table holds its offset.
// Every record write allocates a fresh block; every overwrite and remove
// frees the old one. After every crash image pmcheck's leak check holds the
// allocator to exactly the owned blocks: nothing leaked, nothing owned twice,
// nothing owned but free.
//
// Layout (the root block): {magic, nslots, pad to a line; logs[kLogs] (one
// line each); spares[kSpares]; slots[kSlots]}. A slot is 0 (never used),
// kTomb (free, keeps probe chains intact) or a record block. A log belongs
// to one thread: {expect (the slot's word before the commit), old (the
// block the op frees), slot + 1, staging (the block the op allocated)}.
// Spares are blocks owned by the root that any thread allocates or frees
// (under a DRAM lock per spare), so blocks are freed by threads other than
// their allocator; when the pool is full, spares are freed to make room.
//
// Persist order of a write (insert, update, upsert; remove skips 2 and 3):
//   0. insert into a never-used slot: slot = kTomb, Persist (so a chain
//      never ends at a slot an unfinished insert left empty);
//   1. log {expect, old, slot + 1} (in this order, one line), Persist;
//   2. Allocate(&log.staging, size) (the allocator's commit point);
//   3. the record's header and check word, Persist;
//   4. commit: slot = staging (remove: kTomb), Persist;
//   5. Free(&log.old) (the allocator zeroes log.old durably);
//   6. log.staging = 0, Persist; log {slot + 1, expect} = 0, Persist.
// Recovery, per log with slot + 1 != 0: committed iff the slot no longer
// holds expect; committed: Free(&old), staging = 0; not committed:
// Free(&staging), old = 0; then the log is cleared. With slot + 1 == 0 a
// log holds at most a stale expect/old of step 1 (a line persists a
// prefix), which is cleared. Every step is idempotent.
//
// Invariants (Check): logs clear; each record block allocated, its header
// matching its size and check word, its key reachable from its hash without
// crossing a 0 slot, no key twice; spares allocated.
// Thread safety: every operation may run concurrently (a DRAM mutex guards
// the slot table, allocator calls run outside it; at most kLogs threads);
// Check and ForEachOwnedBlock need quiescence.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "kit/hash.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "pool_target.h"

namespace pmcheck {
namespace {

using pmindex::Slice;
using pmindex::Status;
namespace pm = pmindex::pm;

constexpr uint64_t kMagic = 0x414c4c4f434d3031ull;  // "ALLOCM01"
constexpr uint64_t kSlots = 2048;
constexpr uint64_t kLogs = 16;
constexpr uint64_t kSpares = 32;
constexpr uint64_t kTomb = 1;  // never a block offset
constexpr uint64_t kHeapChunk = pm::Allocator::kChunkSize;
constexpr uint64_t kDefaultMaxChunks = 20;  // heap chunks the pool may grow to

struct alignas(64) Log {
  uint64_t expect, old, slot1, staging, pad[4];
};
struct Root {
  uint64_t magic, nslots, pad[6];
  Log logs[kLogs];
  uint64_t spares[kSpares];
  uint64_t slots[kSlots];
};
struct Header {
  uint64_t key, value, size;
};
constexpr size_t kMinRecord = sizeof(Header) + 8;  // the header and the check word

using pmindex::internal::kit::Fmix64;
uint64_t CheckWord(const Header& h) { return Fmix64(h.key ^ Fmix64(h.value) ^ (h.size << 1)); }

// Block sizes: three run classes of small blocks, the largest run class
// (32 KiB), a medium class (100 KiB: 130944-byte blocks) and large blocks
// of two and three chunks.
size_t SizeFor(uint64_t h) {
  switch (h % 16) {
    case 0: case 1: case 2: case 3: case 4: return kMinRecord;
    case 5: case 6: case 7: return 200;
    case 8: case 9: case 10: return 3000;
    case 11: case 12: return pm::Allocator::kMaxRunBlock;
    case 13: return 100 * 1024;
    case 14: return 400 * 1024;
    default: return (h >> 4) % 4 == 0 ? 700 * 1024 : pm::Allocator::kMaxRunBlock;
  }
}

std::atomic<uint64_t> g_instances{0};

class AllocMap final : public pmindex::Index {
 public:
  explicit AllocMap(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)), id_(++g_instances) {}

  static Status Create(std::unique_ptr<pm::Pool> pool, std::unique_ptr<pmindex::Index>* out) {
    PMINDEX_RETURN_IF_ERROR(pool->allocator().AllocateZeroed(pool->root_slot(), sizeof(Root)));
    Root* r = pool->root<Root>();
    pm::Store(&r->nslots, kSlots);
    pm::Store(&r->magic, kMagic);
    pm::Persist(r, 64);
    out->reset(new AllocMap(std::move(pool)));
    return Status::OK();
  }
  static Status Open(std::unique_ptr<pm::Pool> pool, std::unique_ptr<pmindex::Index>* out) {
    Root* r = pool->root<Root>();
    if (!r || r->magic != kMagic || r->nslots != kSlots) return Status::Corrupt("allocator map: bad root (creation interrupted?)");
    std::unique_ptr<AllocMap> m(new AllocMap(std::move(pool)));
    for (uint64_t t = 0; t < kLogs; t++) PMINDEX_RETURN_IF_ERROR(m->RecoverLog(t));
    *out = std::move(m);
    return Status::OK();
  }

  std::string_view Name() const override { return kAllocatorTargetName; }
  pmindex::KeyKind key_kind() const override { return pmindex::KeyKind::kU64; }
  pmindex::ValueKind value_kind() const override { return pmindex::ValueKind::kU64; }

  Status Insert(Slice key, Slice value) override { return Put(key, value, true, false); }
  Status Update(Slice key, Slice value) override { return Put(key, value, false, true); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, true, true); }

  Status Find(Slice key, std::string* value) override {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t idx;
    if (!Locate(pmindex::SliceToU64(key), &idx)) return Status::NotFound();
    if (value) *value = std::string(pmindex::U64Slice(Rec(root()->slots[idx])->value));
    return Status::OK();
  }

  Status Remove(Slice key) override {
    const uint64_t k = pmindex::SliceToU64(key);
    Log* L;
    PMINDEX_RETURN_IF_ERROR(MyLog(&L));
    uint64_t idx;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!Locate(k, &idx)) return Status::NotFound();
    }
    const uint64_t old = root()->slots[idx];  // only this thread changes it
    WriteIntent(L, idx, old, old);
    {
      std::lock_guard<std::mutex> g(mu_);
      pm::StoreAtomic(&root()->slots[idx], kTomb);
      pm::Persist(&root()->slots[idx], 8);
    }
    Release(L);
    Spare(k, 0);
    return Status::OK();
  }

  Status Scan(Slice, size_t, pmindex::ScanCallback, size_t*) override {
    return Status::Unsupported("allocator map is unordered");
  }
  uint64_t Size() override {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t n = 0;
    for (uint64_t i = 0; i < kSlots; i++) n += root()->slots[i] > kTomb;
    return n;
  }

  Status Check() override {
    const pm::Allocator& a = pool_->allocator();
    for (uint64_t t = 0; t < kLogs; t++) {
      const Log& L = root()->logs[t];
      if (L.expect || L.old || L.slot1 || L.staging) return Status::Corrupt("log " + std::to_string(t) + " is not clear");
    }
    std::set<uint64_t> keys;
    for (uint64_t i = 0; i < kSlots; i++) {
      const uint64_t s = root()->slots[i];
      if (s <= kTomb) continue;
      const std::string at = "slot " + std::to_string(i) + " (block " + std::to_string(s) + "): ";
      if (!a.IsAllocated(s)) return Status::Corrupt(at + "a free block");
      const Header* h = Rec(s);
      if (h->size < sizeof(Header) + 8 || a.UsableSize(s) < h->size) return Status::Corrupt(at + "bad size");
      uint64_t check;
      std::memcpy(&check, pool_->At<char>(s) + h->size - 8, 8);
      if (check != CheckWord(*h)) return Status::Corrupt(at + "bad check word (torn record)");
      if (!keys.insert(h->key).second) return Status::Corrupt(at + "a key in two slots");
      uint64_t found;
      if (!Locate(h->key, &found) || found != i) return Status::Corrupt(at + "key not reachable from its hash");
    }
    for (uint64_t s = 0; s < kSpares; s++)
      if (root()->spares[s] && !a.IsAllocated(root()->spares[s]))
        return Status::Corrupt("spare " + std::to_string(s) + " holds a free block");
    return Status::OK();
  }
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override {
    fn(*pool_->root_slot());
    for (uint64_t i = 0; i < kSlots; i++)
      if (root()->slots[i] > kTomb) fn(root()->slots[i]);
    for (uint64_t s = 0; s < kSpares; s++)
      if (root()->spares[s]) fn(root()->spares[s]);
    for (uint64_t t = 0; t < kLogs; t++) {
      if (root()->logs[t].old) fn(root()->logs[t].old);
      if (root()->logs[t].staging) fn(root()->logs[t].staging);
    }
    return Status::OK();
  }
  pmindex::IndexStats Stats() override {
    pmindex::IndexStats st;
    st.records = Size();
    st.pm_bytes = pool_->allocator().BytesInUse();
    return st;
  }
  pm::Pool* pool() override { return pool_.get(); }
  Status Close() override {
    if (pool_) pool_->Close();
    return Status::OK();
  }

 private:
  Root* root() const { return pool_->root<Root>(); }
  const Header* Rec(uint64_t off) const { return pool_->At<Header>(off); }

  // This thread's log (assigned on first use, per map instance).
  Status MyLog(Log** out) {
    thread_local uint64_t tl_id = 0;
    thread_local uint64_t tl_log = 0;
    if (tl_id != id_) {
      const uint64_t n = next_log_.fetch_add(1);
      if (n >= kLogs) return Status::Busy("allocator map: more than " + std::to_string(kLogs) + " threads");
      tl_id = id_;
      tl_log = n;
    }
    *out = &root()->logs[tl_log];
    return Status::OK();
  }

  // Under mu_: the slot holding key k. A chain ends at a 0 slot.
  bool Locate(uint64_t k, uint64_t* idx) const {
    const uint64_t h = Fmix64(k);
    for (uint64_t p = 0; p < kSlots; p++) {
      const uint64_t i = (h + p) % kSlots;
      const uint64_t s = root()->slots[i];
      if (s == 0) return false;
      if (s != kTomb && Rec(s)->key == k) {
        *idx = i;
        return true;
      }
    }
    return false;
  }

  void WriteIntent(Log* L, uint64_t idx, uint64_t expect, uint64_t old) {
    pm::Store(&L->expect, expect);
    pm::Store(&L->old, old);
    pm::Store(&L->slot1, idx + 1);
    pm::Persist(L, 64);
  }
  // Steps 5 and 6: free the old block, clear the log.
  void Release(Log* L) {
    if (L->old) pool_->allocator().FreeOrAbort(&L->old);
    if (L->staging) {
      pm::Store(&L->staging, uint64_t(0));
      pm::Persist(&L->staging, 8);
    }
    pm::Store(&L->slot1, uint64_t(0));
    pm::Store(&L->expect, uint64_t(0));
    pm::Persist(L, 64);
  }

  Status Put(Slice key, Slice value, bool insert, bool update) {
    const uint64_t k = pmindex::SliceToU64(key), v = pmindex::SliceToU64(value);
    Log* L;
    PMINDEX_RETURN_IF_ERROR(MyLog(&L));
    uint64_t idx = kSlots;
    bool found;
    {
      std::lock_guard<std::mutex> g(mu_);
      found = Locate(k, &idx);
      if (found && !update) return Status::AlreadyExists();
      if (!found) {
        if (!insert) return Status::NotFound();
        const uint64_t h = Fmix64(k);
        for (uint64_t p = 0; p < kSlots && idx == kSlots; p++) {
          const uint64_t i = (h + p) % kSlots;
          if (root()->slots[i] <= kTomb && !reserved_.count(i)) idx = i;
        }
        if (idx == kSlots) return Status::PoolFull("allocator map: table full");
        reserved_.insert(idx);
        if (root()->slots[idx] == 0) {
          pm::StoreAtomic(&root()->slots[idx], kTomb);
          pm::Persist(&root()->slots[idx], 8);
        }
      }
    }
    const uint64_t expect = root()->slots[idx];  // only this thread changes it now
    WriteIntent(L, idx, expect, found ? expect : 0);
    Header hd{k, v, SizeFor(Fmix64(k ^ Fmix64(v)))};
    // A full pool (Reclaim found nothing) costs the spares first, then the
    // record's size: the smallest class has room in a partial run.
    Status s = pool_->allocator().Allocate(&L->staging, hd.size);
    for (uint64_t sp = 0; s.IsPoolFull() && sp < kSpares; sp++)
      if (DropSpare(sp)) s = pool_->allocator().Allocate(&L->staging, hd.size);
    if (s.IsPoolFull() && hd.size > kMinRecord) hd.size = kMinRecord;
    // Other threads' current runs may hold the free space: let them run.
    for (int tries = 0; s.IsPoolFull() && tries < 20; tries++) {
      std::this_thread::yield();
      s = pool_->allocator().Allocate(&L->staging, hd.size);
    }
    if (!s.ok()) {
      pm::Store(&L->old, uint64_t(0));
      Release(L);
      std::lock_guard<std::mutex> g(mu_);
      reserved_.erase(idx);
      return s;
    }
    char* b = pool_->At<char>(L->staging);
    pm::Copy(b, &hd, sizeof hd);
    pm::Persist(b, sizeof hd);
    const uint64_t check = CheckWord(hd);
    pm::Copy(b + hd.size - 8, &check, 8);
    pm::Persist(b + hd.size - 8, 8);
    {
      std::lock_guard<std::mutex> g(mu_);
      pm::StoreAtomic(&root()->slots[idx], L->staging);
      pm::Persist(&root()->slots[idx], 8);
      reserved_.erase(idx);
    }
    Release(L);
    Spare(k, v);
    return Status::OK();
  }

  // A spare chosen by the op: allocate it if empty, free it if not (often
  // a block another thread allocated).
  void Spare(uint64_t k, uint64_t v) {
    const uint64_t h = Fmix64(k * 31 + v + 7);
    const uint64_t sp = h % kSpares;
    std::lock_guard<std::mutex> g(spare_mu_[sp % kSpareLocks]);
    uint64_t* w = &root()->spares[sp];
    if (*w) {
      pool_->allocator().FreeOrAbort(w);
    } else {
      // A full pool leaves the spare empty. The fence orders the lane
      // clear, which Allocate leaves to its caller.
      (void)pool_->allocator().Allocate(w, SizeFor(h >> 8));
      pm::Fence();
    }
  }
  bool DropSpare(uint64_t sp) {
    std::lock_guard<std::mutex> g(spare_mu_[sp % kSpareLocks]);
    if (!root()->spares[sp]) return false;
    pool_->allocator().FreeOrAbort(&root()->spares[sp]);
    return true;
  }

  Status RecoverLog(uint64_t t) {
    Log* L = &root()->logs[t];
    pm::Allocator& a = pool_->allocator();
    if (L->slot1 == 0) {
      if (L->staging) return Status::Corrupt("allocator map: log " + std::to_string(t) + " holds a block without an op");
      if (L->old || L->expect) {
        pm::Store(&L->old, uint64_t(0));
        pm::Store(&L->expect, uint64_t(0));
        pm::Persist(L, 64);
      }
      return Status::OK();
    }
    const uint64_t idx = L->slot1 - 1;
    if (idx >= kSlots) return Status::Corrupt("allocator map: log " + std::to_string(t) + " names no slot");
    if (root()->slots[idx] != L->expect) {
      if (L->old) PMINDEX_RETURN_IF_ERROR(a.Free(&L->old));
      if (L->staging) {
        pm::Store(&L->staging, uint64_t(0));
        pm::Persist(&L->staging, 8);
      }
    } else {
      if (L->staging) PMINDEX_RETURN_IF_ERROR(a.Free(&L->staging));
      if (L->old) {
        pm::Store(&L->old, uint64_t(0));
        pm::Persist(&L->old, 8);
      }
    }
    pm::Store(&L->slot1, uint64_t(0));
    pm::Store(&L->expect, uint64_t(0));
    pm::Persist(L, 64);
    return Status::OK();
  }

  static constexpr uint64_t kSpareLocks = 8;
  std::unique_ptr<pm::Pool> pool_;
  const uint64_t id_;
  std::atomic<uint64_t> next_log_{0};
  std::mutex mu_;
  std::set<uint64_t> reserved_;  // mu_: never-used or free slots an insert has chosen
  std::mutex spare_mu_[kSpareLocks];
};

uint64_t ParamU64(const Config& c, const char* name, uint64_t dflt) {
  auto it = c.params.find(name);
  return it == c.params.end() ? dflt : std::strtoull(it->second.c_str(), nullptr, 10);
}

}  // namespace

Status MakeAllocatorTarget(const Config& c, std::unique_ptr<Target>* out) {
  if (c.key_kind != pmindex::KeyKind::kU64 || c.value_kind != pmindex::ValueKind::kU64)
    return Status::InvalidArgument(std::string(kAllocatorTargetName) + " supports u64 keys and values only");
  for (const auto& [name, value] : c.params)
    if (name != "max_chunks") return Status::InvalidArgument(std::string(kAllocatorTargetName) + ": unknown parameter " + name);
  if (ParamU64(c, "max_chunks", kDefaultMaxChunks) < 4) return Status::InvalidArgument("max_chunks must be at least 4");
  // The smallest pool (one heap chunk), so that the workload grows it up to
  // max_chunks heap chunks and then reclaims.
  pm::PoolOptions po;
  po.size = kHeapChunk * 2;
  po.max_size = kHeapChunk * (1 + ParamU64(c, "max_chunks", kDefaultMaxChunks));
  out->reset(new PoolTarget(kAllocatorTargetName, po, pm::PoolOptions(), AllocMap::Create, AllocMap::Open));
  return Status::OK();
}

}  // namespace pmcheck
