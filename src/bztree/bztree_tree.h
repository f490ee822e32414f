// bztree/bztree_tree.h: the BzTree class (PiBench VLDB'20 sec. 3.3; Arulraj
// et al., VLDB'18): every node in PM (bztree_format.h), every change one
// persistent multi-word CAS (pmindex/pm/pmwcas.h), recovery nothing but
// PMwCAS recovery and an epoch bump.
//
// Files: bztree.cc (find, insert, update, delete, scan inside a leaf; the
// adapter and registration), bztree_smo.cc (freeze, consolidate, split,
// merge: node rebuilds installed by one PMwCAS), bztree_recovery.cc
// (create, open, Check, owned blocks, stats).
//
// Concurrency: lock-free. Readers and writers hold a PMwCAS::Guard while
// they use nodes: a replaced node is freed by the recycle policy of the
// PMwCAS that unlinked it, after that PMwCAS's epoch grace period. Begin is
// never called inside a guard (the substrate's rule): an operation takes its
// descriptors first, then enters the guard. A node is frozen (status bit)
// before it is rebuilt; a frozen node never changes again, and whoever meets
// one on its path helps replace it (bztree_smo.cc), so nothing waits on a
// frozen node for longer than a rebuild. Retries of a failed PMwCAS back off
// (kit::Backoff) and are bounded: an operation that keeps failing returns
// Busy after kMaxRetries rounds.
//
// Thread safety: every Index call may run concurrently except Check,
// ForEachOwnedBlock and Close (quiescent).
#pragma once

#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bztree/bztree_format.h"
#include "core/index_util.h"
#include "kit/backoff.h"
#include "kit/pm_block.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pmwcas.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::bztree {

// The fault switches of bztree's persist steps (docs/bztree.md "Fault
// switches"): each is caught by pmcheck.
inline constexpr const char* kFaultSwitches[] = {
    "bztree.insert.skip_record_flush",  // the key/payload block before the publishing PMwCAS
    "bztree.insert.skip_value_flush",   // an out-of-line value block before its PMwCAS
    "bztree.smo.skip_node_flush",       // a rebuilt node before the PMwCAS that installs it
};

// Test hooks (tests only; null in production).
// True for PMwCAS::Begin's Busy when no descriptor is free (bztree.cc):
// retried with backoff, never returned to the caller.
bool NoDescriptor(const Status& s);

struct Hooks {
  void (*after_reserve)(const void* tree) = nullptr;  // an insert's slot reserved, not yet published
};
extern Hooks hooks;

class BzTree final : public Index {
 public:
  static constexpr int kMaxRetries = 1 << 20;

  BzTree(std::unique_ptr<pm::Pool> pool);
  ~BzTree() override { Close(); }

  std::string_view Name() const override { return "bztree"; }
  KeyKind key_kind() const override { return kk_; }
  ValueKind value_kind() const override { return vk_; }

  Status Insert(Slice key, Slice value) override;
  Status Update(Slice key, Slice value) override { return Write(key, value, Mode::kUpdate); }
  Status Upsert(Slice key, Slice value) override;
  Status Find(Slice key, std::string* value) override;
  Status Remove(Slice key) override { return Write(key, Slice(), Mode::kRemove); }
  Status Scan(Slice start, size_t n, ScanCallback cb, size_t* count) override;
  uint64_t Size() override;
  Status Check() override;
  Status ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) override;
  IndexStats Stats() override;
  pm::Pool* pool() override { return closed_ ? nullptr : pool_.get(); }
  Status Close() override;

  Status Format(KeyKind kk, ValueKind vk, uint32_t node_size, uint32_t max_key, uint32_t max_value);
  Status Open();

  // Tests and figures (quiescent).
  struct Shape {
    uint64_t leaves = 0, inner = 0, height = 0, frozen = 0;
  };
  Status GetShape(Shape* s);
  // Freezes the leaf holding key, as a structure change that stopped after
  // its freeze would leave it (tests: operations must help, not spin).
  Status FreezeLeafForTest(Slice key);
  // The nodes on key's path, root first: offset and record count (tests).
  Status PathForTest(Slice key, std::vector<std::pair<uint64_t, uint64_t>>* nodes);
  uint32_t epoch() const { return epoch_; }
  uint32_t node_size() const { return node_size_; }

 private:
  enum class Mode { kUpdate, kRemove };
  struct Step {        // one node on a root-to-leaf path
    uint64_t* slot;    // the word that points to it (root: hdr_->tree)
    uint64_t node;     // its offset
    uint64_t status;   // its status word as read
    uint64_t hi_meta;  // metadata of the ancestor record holding its upper bound
    uint64_t hi_node;  // node holding that record (0: +infinity)
    int index;         // its entry in the parent (-1: root)
  };
  struct Rec {  // a record copied out of a node
    std::string key;
    uint64_t payload = 0;  // value, block offset or child offset
    bool ool = false;      // leaf: payload is an out-of-line block
    bool inf = false;      // inner: the +infinity entry
  };

  // ---- node access
  char* N(uint64_t off) const { return base_ + off; }
  static uint64_t* Status_(char* n) { return reinterpret_cast<uint64_t*>(n); }
  static uint64_t NodeWord(const char* n) { return __atomic_load_n(reinterpret_cast<const uint64_t*>(n + 8), __ATOMIC_RELAXED); }
  static uint64_t* Meta(char* n, uint64_t i) { return reinterpret_cast<uint64_t*>(n + kNodeHeader + 8 * i); }
  static uint64_t* Payload(char* n, uint64_t m) {
    return reinterpret_cast<uint64_t*>(n + meta::Offset(m) + Pad8(meta::KeyLen(m)));
  }
  Slice KeyOf(char* n, uint64_t m) const { return Slice(n + meta::Offset(m), meta::KeyLen(m)); }
  uint64_t Read(uint64_t* w) const { return pmw_->Read(w); }
  uint64_t PoolSize() const { return pool_->size(); }  // the pool grows: never cached
  int Cmp(Slice a, Slice b) const {
    if (kk_ == KeyKind::kU64) {
      const uint64_t x = SliceToU64(a), y = SliceToU64(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return CompareKeys(KeyKind::kBytes, a, b);
  }
  // A metadata word is sane for node n (offsets inside it): false on damage.
  bool MetaOk(uint64_t m, uint32_t bytes, uint64_t count) const {
    const uint64_t off = meta::Offset(m), tot = meta::Total(m);
    return off >= kNodeHeader + 8 * count && off + tot <= bytes && tot == RecordBytes(meta::KeyLen(m)) && off % 8 == 0;
  }
  bool LiveInFlight(uint64_t m) const { return meta::InFlight(m) && meta::Epoch(m) == epoch_; }

  // ---- reads (bztree.cc)
  // Descends to the leaf for key (after: for the smallest key above it)
  // under the caller's guard; Busy "retry" when a node was replaced meanwhile.
  Status Descend(Slice key, std::vector<Step>* path, bool after = false);
  // The visible record for key in leaf n (status s): its metadata index, -1
  // (none) or -2 (damaged metadata). tail = false: the sorted prefix only.
  int64_t FindInLeaf(char* n, uint64_t s, Slice key, uint64_t* m_out, bool tail = true);
  // Inner node routing: the entry index for key and its child word.
  int RouteInner(char* n, uint64_t s, Slice key, bool after, uint64_t* meta_out);
  Status Write(Slice key, Slice value, Mode mode);
  // One attempt; spares: take every descriptor it may need up front.
  Status InsertOnce(Slice key, Slice value, bool spares, bool* done, bool* dup, bool* smo, bool* need_spares);
  Status WriteValue(pm::PMwCAS::Op* op, uint64_t* payload_word, uint64_t old, bool old_ool, Slice value, bool* ool,
                    uint64_t* inline_value);

  // ---- structure changes (bztree_smo.cc)
  // Makes progress on the structure around key: helps replace the topmost
  // frozen node on its path, or (want > 0) freezes the leaf so that it is
  // rebuilt with room for want more bytes. Called outside any guard.
  Status Smo(Slice key, uint64_t want, bool merge);
  struct Plan {  // a node to build: its records; child[i] >= 0: record i's child is plan[child[i]]
    bool leaf = true;
    std::vector<Rec> recs;
    std::vector<int> child;
  };
  // Rebuilds the frozen node path[at] (or freezes its parent) with op.
  Status Replace(pm::PMwCAS::Op* op, const std::vector<Step>& path, size_t at);
  void AddNodes(std::vector<Plan>* plan, std::vector<Rec>&& recs, bool leaf, const Rec& last, uint64_t fill);
  // Allocates plan[top] into *slot (expected: its old value) and its new
  // children into their child words, all owned by op until it succeeds.
  Status Install(pm::PMwCAS::Op* op, uint64_t* slot, uint64_t expected, const std::vector<Plan>& plan, int top);
  // The records of a node (a leaf's visible ones, sorted); false if damaged.
  bool Records(char* n, std::vector<Rec>* out, bool* bad) const;
  uint64_t LiveBytes(const std::vector<Rec>& r) const;
  uint64_t Capacity() const { return node_size_ - kNodeHeader; }
  uint64_t EntryBytes(const Rec& r) const { return 8 + RecordBytes(r.inf ? 0 : r.key.size()); }
  // Writes a sorted node into a fresh block and flushes it (no fence: the
  // installing PMwCAS's descriptor fence orders it); returns its payload words.
  std::vector<uint64_t*> BuildNode(char* blk, const std::vector<Rec>& recs, bool leaf);

  // ---- recovery, check (bztree_recovery.cc)
  Status CheckNode(uint64_t off, int depth, int* leaf_depth, const std::string* lo, const std::string* hi,
                   uint64_t* records, std::string* err);
  Status Walk(const std::function<void(uint64_t node, bool leaf)>& fn);

  std::unique_ptr<pm::Pool> pool_;
  pm::PMwCAS* pmw_ = nullptr;
  char* base_ = nullptr;
  Header* hdr_ = nullptr;
  KeyKind kk_ = KeyKind::kU64;
  ValueKind vk_ = ValueKind::kU64;
  uint32_t node_size_ = 1024;
  uint32_t max_key_ = 8, max_value_ = 8;
  uint32_t epoch_ = 0;
  bool closed_ = false;
  double recovery_seconds_ = 0;
  std::atomic<int64_t> delta_{0};  // records added since open
  std::atomic<int64_t> base_count_{-1};
};

}  // namespace pmindex::internal::bztree
