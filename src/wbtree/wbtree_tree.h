// wbtree_tree.h: the wBTree as an Index (PiBench sec. 3.1 and 5; docs/
// wbtree.md). One class for both key kinds (BK: byte keys through blocks),
// the value kind chosen at run time. Implemented in wbtree_read.cc (lock-free
// Find, Scan, Size), wbtree_write.cc (Insert, Update, Upsert, Remove),
// wbtree_smo.cc (splits with micro-logs, root growth), wbtree_recovery.cc
// (Format, open, lazy node repair, Check, ForEachOwnedBlock) and wbtree.cc
// (options, factory, registration).
//
// Concurrency: every node has a version lock (kit/version_lock.h) in a DRAM
// lock table (kit/lock_table.h), never in PM. Readers take no lock: they
// descend with optimistic lock coupling and validate each node's version
// after reading it; a writer holds a node's lock from before its first store
// until after the fence that makes the change durable, so a validated read
// saw only durable state (the read rule of include/pmindex/index.h).
// Writers lock the leaf only; a split or a leaf free runs under smo_mu_ (one structure
// change at a time, which is also why one set of micro-logs in Meta
// suffices) and locks every node it changes. A thread waits for a lock only
// while holding none, or holding smo_mu_ and the nodes of its split while
// waiting for a leaf or inner lock whose holder waits for nothing: no
// deadlock. A thread takes smo_mu_ only outside its epoch guards, so the
// grace period a leaf free waits for under smo_mu_ always ends.
//
// First touch: the lock table's second word per node says whether the node
// was checked since open (zero at open). The first operation to reach an
// unchecked node locks it and repairs it (spares, slot array): that is the
// lazy half of recovery, so open takes constant time in the records.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/index_util.h"
#include "kit/backoff.h"
#include "kit/epoch.h"
#include "kit/lock_table.h"
#include "kit/version_lock.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "wbtree/wbtree_node.h"

namespace pmindex::internal::wbtree {

struct LockWord {
  kit::VersionLock lock;
  uint64_t checked;  // 1 once repaired (or created) since open
};

class PMINDEX_WBTREE_HIDDEN WBTreeBase : public Index {
 public:
  virtual Status Format() = 0;
  virtual Status Recover() = 0;
  double recovery_seconds_ = 0;
  // Counters for tests (DRAM only).
  std::atomic<uint64_t> nodes_repaired_{0}, slot_rebuilds_{0}, splits_{0}, leaves_freed_{0};
};

template <bool BK>
class PMINDEX_WBTREE_HIDDEN WBTree final : public WBTreeBase {
 public:
  WBTree(std::unique_ptr<pm::Pool> pool, const Options& o, std::string name, ValueKind vk, uint32_t leaf_cap,
         uint32_t inner_cap, bool slot_only);
  ~WBTree() override { Close(); }

  std::string_view Name() const override { return name_; }
  KeyKind key_kind() const override { return BK ? KeyKind::kBytes : KeyKind::kU64; }
  ValueKind value_kind() const override { return vk_; }
  Status Insert(Slice key, Slice value) override { return Write(key, value, kInsert); }
  Status Update(Slice key, Slice value) override { return Write(key, value, kUpdate); }
  Status Upsert(Slice key, Slice value) override { return Write(key, value, kUpsert); }
  Status Find(Slice key, std::string* value) override;
  Status Remove(Slice key) override;
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override;
  uint64_t Size() override;
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }
  Status Close() override;

  Status Format() override;
  Status Recover() override;

 private:
  enum Mode { kInsert, kUpdate, kUpsert };
  static constexpr bool kBK = BK;

  bool closed() const { return closed_.load(std::memory_order_relaxed); }
  Node* N(uint64_t off) const { return reinterpret_cast<Node*>(base_ + off); }
  uint64_t Off(const Node* n) const { return uint64_t(reinterpret_cast<const char*>(n) - base_); }
  LockWord& LW(const Node* n) const { return *locks_.At(n); }
  KeyCtx Ctx() const { return KeyCtx{base_, pool_.get(), max_key_}; }
  bool vbytes() const { return vk_ == ValueKind::kBytes; }
  // The valid entries of n: its bitmap, or (slot-only variant) the entries
  // its slot word lists.
  uint64_t Valid(const Node* n) const {
    if (!slot_only_) return LdR(&n->bitmap);
    Slots s;
    LoadSlots(n, &s);
    return SlotBits(s);
  }
  uint32_t CapOf(uint32_t level) const { return level ? inner_cap_ : leaf_cap_; }
  // A node offset that can be dereferenced (inside the pool, aligned, room
  // for the larger node kind).
  bool NodeOk(uint64_t off) const {
    return off && off % 64 == 0 && off + NodeBytes(std::max(leaf_cap_, inner_cap_)) <= pool_->size();
  }

  // wbtree_recovery.cc
  Status EnsureChecked(Node* n);
  Status Repair(Node* n);
  Status Rebuild(Node* n);
  bool SpareReferenced(const Node* n, uint64_t w) const;
  Status RecoverLog(int level);
  Status WalkLevels(const std::function<Status(Node*, uint32_t level)>& fn);
  Status CheckLevel(Node* first, uint32_t level, std::vector<uint64_t>* children, std::vector<std::string>* bounds);

  // wbtree_read.cc
  // Descends to the leaf for key; on OK, *leaf and *v (its validated
  // version at the time it was reached).
  Status DescendToLeaf(Slice key, Node** leaf, uint64_t* v);
  Status ReadValue(const Entry* e, std::string* out) const;

  // wbtree_write.cc
  Status Write(Slice key, Slice value, Mode mode);
  // Descends to key's leaf and locks it (the upgrade of the version the
  // descent validated; retried with backoff); *s its slot array, *pos and
  // *eq key's lower bound in it. On OK the caller holds *leaf's lock; on an
  // error nothing is locked. Caller inside an epoch guard.
  Status LockLeafFor(Slice key, Node** leaf, Slots* s, uint32_t* pos, bool* eq);
  void LockNode(Node* n);
  void UnlockNode(Node* n) { LW(n).lock.Unlock(); }
  // Node-local steps; caller holds n's lock, n checked.
  // Inserts key at slot position pos: in a leaf with value, in an inner
  // node with child (the last argument is unused).
  Status InsertEntry(Node* n, const Slots& s, uint32_t pos, Slice key, uint64_t child, Slice value, uint64_t);
  void RemoveEntry(Node* n, const Slots& s, uint32_t pos);
  Status UpdateValue(Node* n, Entry* e, Slice value);

  // wbtree_smo.cc
  // Splits the leaf for key if it is full (under smo_mu_).
  Status SplitForKey(Slice key);
  // Splits n (locked by the caller; path[0..depth) its ancestors, all
  // stable under smo_mu_), inserting the separator above. *right gets the
  // new node, *sep its separator key. Nodes to unlock at the end go to
  // *locked.
  Status SplitNode(std::vector<Node*>& path, size_t depth, Node* n, Node** right, std::string* sep,
                   std::vector<Node*>* locked);
  Status InsertIntoParent(std::vector<Node*>& path, size_t depth, Node* left, Slice sep, Node* right,
                          std::vector<Node*>* locked);
  Status GrowRoot(Node* left, Slice sep, Node* right, std::vector<Node*>* locked);
  // Frees the leaf for key if it is empty, not the first leaf and not its
  // parent's only child. Called outside every epoch guard.
  Status FreeEmptyLeaf(Slice key);
  // The leaf left of `leaf` (path: its ancestors), 0 if it is the first.
  Status LeftNeighbour(const std::vector<Node*>& path, uint64_t leaf, uint64_t* prev);
  // Recovery: finishes a free recorded in Meta::free_leaf.
  Status RecoverFreeLeaf();
  Status PathTo(Slice key, uint32_t level, std::vector<Node*>* path, Node** node);
  void ClearLog(SplitLog* l);

  std::string name_;
  std::unique_ptr<pm::Pool> pool_;
  char* base_ = nullptr;
  pm::Allocator* alloc_ = nullptr;
  Meta* meta_ = nullptr;
  ValueKind vk_;
  uint32_t leaf_cap_, inner_cap_, min_cap_;
  // wbtree_slot: nodes of at most 7 entries, no bitmap; slot word 0 (count
  // and seven indices) is the commit word.
  bool slot_only_;
  size_t max_key_, max_value_;
  kit::LockTable<LockWord> locks_;
  // Guards every operation that reads nodes without their lock; a freed
  // leaf goes back to the allocator only after a grace period.
  EpochManager epoch_;
  std::mutex smo_mu_;
  std::atomic<bool> closed_{false};
};

}  // namespace pmindex::internal::wbtree
