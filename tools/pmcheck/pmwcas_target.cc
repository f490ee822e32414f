// pmcheck target "pmwcas": a small lock-free hash map built only on the
// pool's PMwCAS (docs/pmwcas.md), so that pmcheck's crash images, lint and
// kill rounds exercise the primitive, its recovery and its recycling under
// single- and multi-threaded workloads. u64 keys and values; unordered.
//
// Layout (in the pool; the root block): {magic, nslots, count, pad to a
// line, slots[nslots]}. A slot is a PMwCAS target word: 0 (empty), kTomb
// (removed), or the pool offset of an immutable 16-byte record block
// {key, value} (out of line: keys and values use all 64 bits).
// Operations (every change is one PMwCAS, so it is atomic and durable):
//   Insert: probe from hash(key) to the first empty slot; AlreadyExists if
//     a record holds the key; otherwise one PMwCAS that re-checks every
//     probed slot (expected == desired), turns the first tomb or the empty
//     slot into a fresh record (AddAllocation, freed on failure) and bumps
//     count. A concurrent change of any probed slot makes it fail: retry.
//   Update: the record's slot: old record -> fresh record (old freed on
//     success, after the grace period). Remove: record -> kTomb (freed),
//     count - 1. Upsert: Update, else Insert.
// Invariants: no key in two slots; count == live records; each record block
// owned by exactly one slot; after recovery no slot and not count holds a
// descriptor or RDCSS pointer (Open checks it: such a word would make every
// Read of it help a free descriptor forever).
// Thread safety: every operation may run concurrently; Check and
// ForEachOwnedBlock need quiescence.

#include <cstring>
#include <set>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pmwcas.h"
#include "pmindex/pm/pool.h"
#include "pool_target.h"

namespace pmcheck {
namespace {

using pmindex::Slice;
using pmindex::Status;
namespace pm = pmindex::pm;

constexpr uint64_t kMagic = 0x50574d4150303031ull;  // "PWMAP001"
constexpr uint64_t kSlots = 2048;
constexpr uint64_t kTomb = 1;   // never a block offset
constexpr int kMaxProbe = 12;   // + target + count <= 16 words

struct Root {
  uint64_t magic, nslots, count, pad[5];
  uint64_t slots[kSlots];
};
struct Record {
  uint64_t key, value;
};

uint64_t HashKey(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

class PwMap final : public pmindex::Index {
 public:
  explicit PwMap(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)), pm_(pool_->pmwcas()) {}

  static Status Create(std::unique_ptr<pm::Pool> pool, std::unique_ptr<pmindex::Index>* out) {
    if (!pool->pmwcas()) return Status::Unsupported("pool has no PMwCAS (format 1)");
    PMINDEX_RETURN_IF_ERROR(pool->allocator().AllocateZeroed(pool->root_slot(), sizeof(Root)));
    Root* r = pool->root<Root>();
    pm::Store(&r->nslots, kSlots);
    pm::Store(&r->magic, kMagic);
    pm::Persist(r, 64);
    out->reset(new PwMap(std::move(pool)));
    return Status::OK();
  }
  static Status Open(std::unique_ptr<pm::Pool> pool, std::unique_ptr<pmindex::Index>* out) {
    if (!pool->pmwcas()) return Status::Unsupported("pool has no PMwCAS (format 1)");
    Root* r = pool->root<Root>();
    if (!r || r->magic != kMagic || r->nslots != kSlots) return Status::Corrupt("pmwcas map: bad root (creation interrupted?)");
    // Recovery (at Pool::Open) took every pointer of a descriptor in flight
    // out of its target words. A word that still holds one names a
    // descriptor recovery found free: its pointer reached PM before the
    // descriptor did (H3 broken, e.g. a dropped phase-1 fence). A Read of
    // it would help that free descriptor and read the word again, forever.
    for (uint64_t i = 0; i <= kSlots; i++) {
      const uint64_t v = i < kSlots ? r->slots[i] : r->count;
      if (v & (pm::pmwcas::kDescriptorBit | pm::pmwcas::kRdcssBit))
        return Status::Corrupt("pmwcas map: word " + std::to_string(i) + " still points to a descriptor after recovery");
    }
    out->reset(new PwMap(std::move(pool)));
    return Status::OK();
  }

  std::string_view Name() const override { return kPmwcasTargetName; }
  pmindex::KeyKind key_kind() const override { return pmindex::KeyKind::kU64; }
  pmindex::ValueKind value_kind() const override { return pmindex::ValueKind::kU64; }

  Status Insert(Slice key, Slice value) override { return Put(key, value, true, false); }
  Status Update(Slice key, Slice value) override { return Put(key, value, false, true); }
  Status Upsert(Slice key, Slice value) override { return Put(key, value, true, true); }

  Status Find(Slice key, std::string* value) override {
    const uint64_t k = pmindex::SliceToU64(key);
    pm::PMwCAS::Guard g(*pm_);
    uint64_t slot, rec;
    if (!Locate(k, &slot, &rec)) return Status::NotFound();
    if (value) *value = std::string(pmindex::U64Slice(pool_->At<Record>(rec)->value));
    return Status::OK();
  }

  Status Remove(Slice key) override {
    const uint64_t k = pmindex::SliceToU64(key);
    for (;;) {
      uint64_t slot, rec;
      {
        pm::PMwCAS::Guard g(*pm_);
        if (!Locate(k, &slot, &rec)) return Status::NotFound();
      }
      pm::PMwCAS::Op op;
      PMINDEX_RETURN_IF_ERROR(pm_->Begin(&op));
      const uint64_t c = pm_->Read(&root()->count);
      PMINDEX_RETURN_IF_ERROR(op.AddWord(&root()->slots[slot], rec, kTomb, pm::Recycle::kFreeOldOnSuccess));
      PMINDEX_RETURN_IF_ERROR(op.AddWord(&root()->count, c, c - 1));
      bool ok = false;
      PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
      if (ok) return Status::OK();
    }
  }

  Status Scan(Slice, size_t, pmindex::ScanCallback, size_t*) override {
    return Status::Unsupported("pmwcas map is unordered");
  }
  uint64_t Size() override { return pm_->Read(&root()->count); }

  Status Check() override {
    std::set<uint64_t> keys;
    uint64_t live = 0;
    for (uint64_t i = 0; i < kSlots; i++) {
      const uint64_t s = pm_->Read(&root()->slots[i]);
      if (s == 0 || s == kTomb) continue;
      if (!pool_->allocator().IsAllocated(s)) return Status::Corrupt("slot " + std::to_string(i) + " holds a free block");
      if (!keys.insert(pool_->At<Record>(s)->key).second) return Status::Corrupt("a key is in two slots");
      live++;
    }
    if (live != pm_->Read(&root()->count))
      return Status::Corrupt("count " + std::to_string(pm_->Read(&root()->count)) + " != " + std::to_string(live) + " records");
    return Status::OK();
  }
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override {
    pm_->Reclaim();  // retired records are still allocated until recycled
    fn(*pool_->root_slot());
    for (uint64_t i = 0; i < kSlots; i++) {
      const uint64_t s = pm_->Read(&root()->slots[i]);
      if (s != 0 && s != kTomb) fn(s);
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

  // Under a guard: the slot holding key k and its record.
  bool Locate(uint64_t k, uint64_t* slot, uint64_t* rec) {
    const uint64_t h = HashKey(k);
    for (int p = 0; p < kMaxProbe + 1; p++) {
      const uint64_t i = (h + uint64_t(p)) % kSlots;
      const uint64_t s = pm_->Read(&root()->slots[i]);
      if (s == 0) return false;
      if (s != kTomb && pool_->At<Record>(s)->key == k) {
        *slot = i;
        *rec = s;
        return true;
      }
    }
    return false;
  }

  Status Put(Slice key, Slice value, bool insert, bool update) {
    const uint64_t k = pmindex::SliceToU64(key), v = pmindex::SliceToU64(value);
    for (;;) {
      pm::PMwCAS::Op op;
      PMINDEX_RETURN_IF_ERROR(pm_->Begin(&op));
      uint64_t seen[kMaxProbe + 1], found = kSlots, target = kSlots;
      int n = 0;
      {
        pm::PMwCAS::Guard g(*pm_);
        const uint64_t h = HashKey(k);
        for (; n < kMaxProbe + 1; n++) {
          const uint64_t i = (h + uint64_t(n)) % kSlots;
          seen[n] = pm_->Read(&root()->slots[i]);
          if (seen[n] == 0 || (seen[n] != kTomb && pool_->At<Record>(seen[n])->key == k)) break;
        }
        if (n == kMaxProbe + 1) return Status::PoolFull("pmwcas map: probe sequence full");
        if (seen[n] != 0) found = uint64_t(n);
      }
      const uint64_t h = HashKey(k);
      void* blk = nullptr;
      if (found != kSlots) {
        if (!update) return Status::AlreadyExists();
        uint64_t* w = &root()->slots[(h + found) % kSlots];
        PMINDEX_RETURN_IF_ERROR(op.AddAllocation(w, seen[found], sizeof(Record), &blk,
                                                 pm::Recycle::kFreeOldOnSuccessNewOnFailure));
      } else {
        if (!insert) return Status::NotFound();
        for (int j = 0; j <= n; j++)
          if (target == kSlots && (seen[j] == kTomb || seen[j] == 0)) target = uint64_t(j);
        for (int j = 0; j <= n; j++) {
          uint64_t* w = &root()->slots[(h + uint64_t(j)) % kSlots];
          if (uint64_t(j) == target)
            PMINDEX_RETURN_IF_ERROR(op.AddAllocation(w, seen[j], sizeof(Record), &blk, pm::Recycle::kFreeNewOnFailure));
          else
            PMINDEX_RETURN_IF_ERROR(op.AddWord(w, seen[j], seen[j]));  // re-checked: the key is absent
        }
        const uint64_t c = pm_->Read(&root()->count);
        PMINDEX_RETURN_IF_ERROR(op.AddWord(&root()->count, c, c + 1));
      }
      Record* r = static_cast<Record*>(blk);
      pm::Store(&r->key, k);
      pm::Store(&r->value, v);
      pm::Persist(r, sizeof(Record));
      bool ok = false;
      PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
      if (ok) return Status::OK();
    }
  }

  std::unique_ptr<pm::Pool> pool_;
  pm::PMwCAS* pm_;
};

}  // namespace

Status MakePmwcasTarget(const Config& c, std::unique_ptr<Target>* out) {
  if (c.key_kind != pmindex::KeyKind::kU64 || c.value_kind != pmindex::ValueKind::kU64)
    return Status::InvalidArgument(std::string(kPmwcasTargetName) + " supports u64 keys and values only");
  pm::PoolOptions po;
  po.size = c.pool_size;
  out->reset(new PoolTarget(kPmwcasTargetName, po, po, PwMap::Create, PwMap::Open));
  return Status::OK();
}

}  // namespace pmcheck
