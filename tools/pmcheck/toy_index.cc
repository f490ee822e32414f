// pmcheck_toy: pmcheck's private persistent index, used to prove the checker
// before (and independently of) the real indexes. Not registered in the
// library: only pmcheck and tests/pmcheck can open it.
//
// Follows no paper; it borrows FPTree's (SIGMOD'16, section 4) leaf idea: a
// node is a bitmap plus unsorted key/value slots, and setting the bitmap bit
// with one aligned 8-byte store is the commit point of an insert.
//
// Layout of the 64 KiB region:
//   [0, 64)     header line: magic, alloc_bits (node i allocated), head (node
//               index + 1 of the first node), log_node / log_prev (allocation
//               micro-log: the node being allocated and its predecessor).
//   [4096, ...) 63 nodes of 320 bytes: a line with bitmap and next (node index
//               + 1), then 16 slots of {key, value} (4 per line).
// Invariants: every node reachable from head is allocated; no cycles; no key
//   appears in two valid slots; a valid slot's key/value are durable.
// Persist ordering:
//   create:  zero words, then magic; persist the header line.
//   insert:  write key/value, persist the slot; then set the bitmap bit with
//            one atomic store and persist it (commit).
//   update:  one aligned atomic 8-byte store of the value, persisted.
//   remove:  clear the bitmap bit, persisted.
//   new node: log {node, prev} and persist; init the node and persist; set its
//            alloc bit and persist; link it behind prev and persist; clear the
//            log and persist. Recovery frees a logged node that is not linked.
// Fault switches (each must be caught by pmcheck; tests/pmcheck asserts it):
//   pmcheck_toy.create.skip_meta_flush   header not persisted at creation
//   pmcheck_toy.insert.skip_kv_flush     slot not flushed before the commit
//   pmcheck_toy.insert.skip_kv_fence     slot flushed but not fenced before the
//                                        commit (the op still ends fenced)
//   pmcheck_toy.insert.bitmap_before_kv  commit persisted before the slot (swap)
//   pmcheck_toy.alloc.skip_log           no allocation micro-log (leak)
//   pmcheck_toy.update.skip_flush        update value never flushed
//   pmcheck_toy.update.unlock_before_persist  update releases the lock between
//                                        storing the value and persisting it (and
//                                        sleeps 1 ms there): a Find in that window
//                                        returns a value a crash may still lose
//                                        (the read rule, --shared-keys)
//   pmcheck_toy.insert.unlogged_store    value written with memcpy, bypassing pm::
//   pmcheck_toy.remove.redundant_flush   flushes the bitmap twice (perf lint)
//   pmcheck_toy.recover.lose_data        recovery drops the node list (kill mode)
//   pmcheck_toy.recover.clear_log_first  recovery persists the cleared log before
//                                        freeing the logged node: a crash during
//                                        recovery leaks it (--recovery-crashes)
//   pmcheck_toy.scan.skip_first          a scan leaves out its first record
//   pmcheck_toy.insert.spin_forever      an insert spins forever under the
//                                        lock without a pm:: call (a hang the
//                                        --pct-timeout backstop must abort)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "target.h"

namespace pmcheck {
namespace {

using pmindex::Slice;
using pmindex::Status;
namespace pm = pmindex::pm;

constexpr uint64_t kMagic = 0x31594f544b434850ull;  // "PHCKTOY1"
constexpr int kSlots = 16;
constexpr int kMaxNodes = 63;
constexpr uint64_t kNodesOff = 4096;

struct alignas(64) Header {
  uint64_t magic;
  uint64_t alloc_bits;
  uint64_t head;
  uint64_t log_node;
  uint64_t log_prev;
  uint64_t pad[3];
};
struct Slot {
  uint64_t key;
  uint64_t value;
};
struct alignas(64) Node {
  uint64_t bitmap;
  uint64_t next;
  uint64_t pad[6];
  Slot slot[kSlots];
};
static_assert(sizeof(Header) == 64 && sizeof(Node) == 320);
static_assert(kNodesOff + kMaxNodes * sizeof(Node) <= kToyRegionSize);

class Toy final : public pmindex::Index {
 public:
  Toy(char* base) : base_(base), h_(reinterpret_cast<Header*>(base)) {}

  std::string_view Name() const override { return kToyName; }
  pmindex::KeyKind key_kind() const override { return pmindex::KeyKind::kU64; }
  pmindex::ValueKind value_kind() const override { return pmindex::ValueKind::kU64; }

  void Format() {
    pm::Store(&h_->alloc_bits, uint64_t(0));
    pm::Store(&h_->head, uint64_t(0));
    pm::Store(&h_->log_node, uint64_t(0));
    pm::Store(&h_->log_prev, uint64_t(0));
    pm::Store(&h_->magic, kMagic);
    if (!PMINDEX_FAULT("pmcheck_toy.create.skip_meta_flush")) pm::Persist(h_, sizeof(Header));
  }

  Status Recover() {
    if (pm::LoadRelaxed(&h_->magic) != kMagic) return Status::Corrupt("pmcheck_toy: no magic (not formatted)");
    if (PMINDEX_FAULT("pmcheck_toy.recover.lose_data") && h_->head) {
      pm::Store(&h_->head, uint64_t(0));
      pm::Persist(&h_->head, 8);
    }
    uint64_t ln = h_->log_node;
    if (ln) {
      if (ln > kMaxNodes) return Status::Corrupt("pmcheck_toy: bad log");
      bool linked = false;
      for (uint64_t n = h_->head, steps = 0; n && steps <= kMaxNodes; n = node(n)->next, ++steps)
        if (n == ln) linked = true;
      if (PMINDEX_FAULT("pmcheck_toy.recover.clear_log_first")) {
        pm::Store(&h_->log_node, uint64_t(0));
        pm::Persist(&h_->log_node, 8);
      }
      if (!linked && (h_->alloc_bits >> (ln - 1) & 1)) {
        pm::Store(&h_->alloc_bits, h_->alloc_bits & ~(uint64_t(1) << (ln - 1)));
      }
      pm::Store(&h_->log_node, uint64_t(0));
      pm::Persist(h_, sizeof(Header));
    }
    return Status::OK();
  }

  Status Insert(Slice key, Slice value) override {
    PMINDEX_RETURN_IF_ERROR(Validate(key, &value));
    std::lock_guard<std::mutex> g(mu_);
    if (PMINDEX_FAULT("pmcheck_toy.insert.spin_forever"))
      for (volatile bool spin = true; spin;) {
      }
    return InsertLocked(pmindex::SliceToU64(key), pmindex::SliceToU64(value));
  }
  Status Update(Slice key, Slice value) override {
    PMINDEX_RETURN_IF_ERROR(Validate(key, &value));
    std::unique_lock<std::mutex> g(mu_);
    Slot* s = FindSlot(pmindex::SliceToU64(key));
    if (!s) return Status::NotFound();
    UpdateSlot(s, pmindex::SliceToU64(value), g);
    return Status::OK();
  }
  Status Upsert(Slice key, Slice value) override {
    PMINDEX_RETURN_IF_ERROR(Validate(key, &value));
    std::unique_lock<std::mutex> g(mu_);
    Slot* s = FindSlot(pmindex::SliceToU64(key));
    if (s) {
      UpdateSlot(s, pmindex::SliceToU64(value), g);
      return Status::OK();
    }
    return InsertLocked(pmindex::SliceToU64(key), pmindex::SliceToU64(value));
  }
  Status Find(Slice key, std::string* value) override {
    PMINDEX_RETURN_IF_ERROR(Validate(key, nullptr));
    std::lock_guard<std::mutex> g(mu_);
    Slot* s = FindSlot(pmindex::SliceToU64(key));
    if (!s) return Status::NotFound();
    if (value) value->assign(reinterpret_cast<const char*>(&s->value), 8);
    return Status::OK();
  }
  Status Remove(Slice key) override {
    PMINDEX_RETURN_IF_ERROR(Validate(key, nullptr));
    std::lock_guard<std::mutex> g(mu_);
    Node* n = nullptr;
    int i = -1;
    if (!FindSlot(pmindex::SliceToU64(key), &n, &i)) return Status::NotFound();
    pm::StoreAtomic(&n->bitmap, n->bitmap & ~(uint64_t(1) << i));
    pm::Persist(&n->bitmap, 8);
    if (PMINDEX_FAULT("pmcheck_toy.remove.redundant_flush")) pm::Persist(&n->bitmap, 8);
    return Status::OK();
  }
  Status Scan(Slice start, size_t count, pmindex::ScanCallback cb, size_t* visited) override {
    PMINDEX_RETURN_IF_ERROR(Validate(start, nullptr));
    std::vector<Slot> all;
    {
      std::lock_guard<std::mutex> g(mu_);
      uint64_t lo = pmindex::SliceToU64(start);
      ForEach([&](Node*, int, Slot* s) {
        if (s->key >= lo) all.push_back(*s);
      });
    }
    std::sort(all.begin(), all.end(), [](const Slot& a, const Slot& b) { return a.key < b.key; });
    if (PMINDEX_FAULT("pmcheck_toy.scan.skip_first") && !all.empty()) all.erase(all.begin());
    size_t c = 0;
    for (const Slot& s : all) {
      if (c >= count) break;
      ++c;
      if (!cb(pmindex::U64Slice(s.key), pmindex::U64Slice(s.value))) break;
    }
    if (visited) *visited = c;
    return Status::OK();
  }
  uint64_t Size() override {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t n = 0;
    ForEach([&](Node*, int, Slot*) { ++n; });
    return n;
  }
  Status Check() override {
    std::lock_guard<std::mutex> g(mu_);
    if (h_->magic != kMagic) return Status::Corrupt("pmcheck_toy: bad magic");
    uint64_t seen = 0, steps = 0;
    for (uint64_t n = h_->head; n; n = node(n)->next) {
      if (n > kMaxNodes) return Status::Corrupt("pmcheck_toy: node index out of range");
      if (++steps > kMaxNodes || (seen >> (n - 1) & 1)) return Status::Corrupt("pmcheck_toy: cycle in node list");
      seen |= uint64_t(1) << (n - 1);
      if (!(h_->alloc_bits >> (n - 1) & 1)) return Status::Corrupt("pmcheck_toy: linked node not allocated");
    }
    std::vector<uint64_t> keys;
    ForEach([&](Node*, int, Slot* s) { keys.push_back(s->key); });
    std::sort(keys.begin(), keys.end());
    for (size_t i = 1; i < keys.size(); ++i)
      if (keys[i] == keys[i - 1]) return Status::Corrupt("pmcheck_toy: duplicate key " + std::to_string(keys[i]));
    return Status::OK();
  }
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override {
    std::lock_guard<std::mutex> g(mu_);
    uint64_t steps = 0;
    for (uint64_t n = h_->head; n && n <= kMaxNodes && steps++ < kMaxNodes; n = node(n)->next)
      fn(kNodesOff + (n - 1) * sizeof(Node));
    return Status::OK();
  }
  Status LeakCheck() {
    uint64_t owned = 0;
    PMINDEX_RETURN_IF_ERROR(ForEachOwnedBlock([&](uint64_t off) { owned |= uint64_t(1) << ((off - kNodesOff) / sizeof(Node)); }));
    uint64_t alloc = h_->alloc_bits;
    if (owned == alloc) return Status::OK();
    return Status::Corrupt("pmcheck_toy: allocated nodes 0x" + Hex(alloc) + " but owned 0x" + Hex(owned) +
                           (alloc & ~owned ? " (leaked)" : " (owned but free)"));
  }
  pmindex::IndexStats Stats() override {
    pmindex::IndexStats s;
    s.records = Size();
    s.pm_bytes = uint64_t(__builtin_popcountll(h_->alloc_bits)) * sizeof(Node);
    return s;
  }
  Status Close() override { return Status::OK(); }

 private:
  static std::string Hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }
  Node* node(uint64_t n) const { return reinterpret_cast<Node*>(base_ + kNodesOff + (n - 1) * sizeof(Node)); }

  static Status Validate(Slice key, Slice* value) {
    if (key.size() != 8) return Status::InvalidArgument("pmcheck_toy keys are 8 bytes");
    if (value && value->size() != 8) return Status::InvalidArgument("pmcheck_toy values are 8 bytes");
    return Status::OK();
  }

  template <typename F>
  void ForEach(F f) {
    uint64_t steps = 0;
    for (uint64_t n = h_->head; n && n <= kMaxNodes && steps++ < kMaxNodes; n = node(n)->next) {
      Node* nd = node(n);
      for (int i = 0; i < kSlots; ++i)
        if (nd->bitmap >> i & 1) f(nd, i, &nd->slot[i]);
    }
  }

  Slot* FindSlot(uint64_t key, Node** np = nullptr, int* ip = nullptr) {
    Slot* found = nullptr;
    ForEach([&](Node* n, int i, Slot* s) {
      if (!found && s->key == key) {
        found = s;
        if (np) *np = n;
        if (ip) *ip = i;
      }
    });
    return found;
  }

  // The slot stays valid across the faulty unlock: only the key's owner
  // thread updates or removes it.
  void UpdateSlot(Slot* s, uint64_t v, std::unique_lock<std::mutex>& g) {
    pm::StoreAtomic(&s->value, v);
    if (PMINDEX_FAULT("pmcheck_toy.update.unlock_before_persist")) {
      g.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      g.lock();
    }
    if (!PMINDEX_FAULT("pmcheck_toy.update.skip_flush")) pm::Persist(&s->value, 8);
  }

  Status AllocNode(Node** out) {
    uint64_t free = ~h_->alloc_bits & ((uint64_t(1) << kMaxNodes) - 1);
    if (!free) return Status::PoolFull("pmcheck_toy: all 63 nodes in use");
    uint64_t idx = uint64_t(__builtin_ctzll(free)) + 1;
    uint64_t last = 0;
    for (uint64_t n = h_->head; n; n = node(n)->next) last = n;
    if (!PMINDEX_FAULT("pmcheck_toy.alloc.skip_log")) {
      pm::Store(&h_->log_prev, last);
      pm::Store(&h_->log_node, idx);
      pm::Persist(h_, sizeof(Header));
    }
    Node* nd = node(idx);
    pm::Store(&nd->bitmap, uint64_t(0));
    pm::Store(&nd->next, uint64_t(0));
    pm::Persist(nd, 64);
    pm::Store(&h_->alloc_bits, h_->alloc_bits | (uint64_t(1) << (idx - 1)));
    pm::Persist(&h_->alloc_bits, 8);
    uint64_t* link = last ? &node(last)->next : &h_->head;
    pm::StoreAtomic(link, idx);
    pm::Persist(link, 8);
    if (h_->log_node) {
      pm::Store(&h_->log_node, uint64_t(0));
      pm::Persist(&h_->log_node, 8);
    }
    *out = nd;
    return Status::OK();
  }

  Status InsertLocked(uint64_t key, uint64_t value) {
    if (FindSlot(key)) return Status::AlreadyExists();
    Node* target = nullptr;
    for (uint64_t n = h_->head; n && !target; n = node(n)->next)
      if (node(n)->bitmap != (uint64_t(1) << kSlots) - 1) target = node(n);
    if (!target) PMINDEX_RETURN_IF_ERROR(AllocNode(&target));
    int i = __builtin_ctzll(~target->bitmap);
    Slot* s = &target->slot[i];
    const uint64_t bit = uint64_t(1) << i;
    const bool swapped = PMINDEX_FAULT("pmcheck_toy.insert.bitmap_before_kv");
    if (swapped) {
      pm::StoreAtomic(&target->bitmap, target->bitmap | bit);
      pm::Persist(&target->bitmap, 8);
    }
    pm::Store(&s->key, key);
    if (PMINDEX_FAULT("pmcheck_toy.insert.unlogged_store")) std::memcpy(&s->value, &value, 8);  // the bug
    else pm::Store(&s->value, value);
    if (!PMINDEX_FAULT("pmcheck_toy.insert.skip_kv_flush")) pm::Flush(s, sizeof(Slot));
    if (!PMINDEX_FAULT("pmcheck_toy.insert.skip_kv_fence")) pm::Fence();
    if (!swapped) {
      pm::StoreAtomic(&target->bitmap, target->bitmap | bit);
      pm::Persist(&target->bitmap, 8);
    }
    return Status::OK();
  }

  char* base_;
  Header* h_;
  std::mutex mu_;
};

}  // namespace

Status ToyCreate(char* base, uint64_t size, std::unique_ptr<pmindex::Index>* out) {
  if (size < kToyRegionSize) return Status::InvalidArgument("pmcheck_toy needs a 64 KiB region");
  auto t = std::make_unique<Toy>(base);
  t->Format();
  *out = std::move(t);
  return Status::OK();
}

Status ToyOpen(char* base, uint64_t size, std::unique_ptr<pmindex::Index>* out) {
  if (size < kToyRegionSize) return Status::Corrupt("pmcheck_toy region too small");
  auto t = std::make_unique<Toy>(base);
  PMINDEX_RETURN_IF_ERROR(t->Recover());
  *out = std::move(t);
  return Status::OK();
}

Status ToyCheckLeaks(pmindex::Index* index) { return static_cast<Toy*>(index)->LeakCheck(); }

}  // namespace pmcheck

// The fault switches of this folder (pmindex/pm/fault.h; docs/CONTRIBUTING.md).
PMINDEX_FAULT_SWITCHES(pmcheck_toy,
                       "pmcheck_toy.alloc.skip_log",
                       "pmcheck_toy.create.skip_meta_flush",
                       "pmcheck_toy.insert.bitmap_before_kv",
                       "pmcheck_toy.insert.skip_kv_fence",
                       "pmcheck_toy.insert.skip_kv_flush",
                       "pmcheck_toy.insert.spin_forever",
                       "pmcheck_toy.insert.unlogged_store",
                       "pmcheck_toy.recover.clear_log_first",
                       "pmcheck_toy.recover.lose_data",
                       "pmcheck_toy.remove.redundant_flush",
                       "pmcheck_toy.scan.skip_first",
                       "pmcheck_toy.update.skip_flush",
                       "pmcheck_toy.update.unlock_before_persist");
