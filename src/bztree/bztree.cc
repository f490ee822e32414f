// bztree/bztree.cc: BzTree's operations inside a leaf (PiBench VLDB'20 sec.
// 3.3; Arulraj et al., VLDB'18, sec. 4), the Index adapter and the
// registration of `bztree`. Class and concurrency: bztree_tree.h; layout:
// bztree_format.h.
//
// Persist order (every step is one PMwCAS, durable when Execute returns):
//   insert  1. reserve: status (count+1, block size+rec) and metadata slot
//              0 -> in-flight(epoch), one 2-word PMwCAS;
//           2. the key and payload are copied into the reserved block and
//              flushed (fault bztree.insert.skip_record_flush); the next
//              PMwCAS's descriptor fence orders them;
//           3. re-check uniqueness: every slot that was in flight when the
//              leaf was searched is waited for (the reserve's expected
//              status proves no other slot appeared since);
//           4. publish: status (unchanged: not frozen) and metadata
//              in-flight -> visible (with a u64 value's top 3 bits), one
//              2-word PMwCAS; a byte value is out of line: a third word, its
//              block allocated by the PMwCAS itself (owned by the
//              descriptor until it succeeds).
//   update  status (unchanged), metadata (version + 1, the new value's top
//           bits) and payload (its low 61 bits, or a new block): one 3-word
//           PMwCAS; an old out-of-line block is freed by the PMwCAS's
//           recycling after a grace period.
//   delete  status (delete size += rec) and metadata visible -> deleted: one
//           2-word PMwCAS (3 with an out-of-line value, freed on success).
// A crash between reserve and publish leaves an in-flight slot of an old
// epoch: dead once the open has bumped the epoch.
//
// Reads return only durable data: every metadata, status and payload word
// is read through PMwCAS::Read, which helps an operation in flight to its
// durable end and persists a dirty word before returning it; record blocks
// were flushed before the PMwCAS that made them visible. A reader pairs a
// payload word with the metadata word read before and after it (equal: no
// update in between, since every update moves the version).
//
// Thread safety: bztree_tree.h.
#include "bztree/bztree_tree.h"

#include <algorithm>

#include "pmindex/pm/fault.h"

namespace pmindex::internal::bztree {

Hooks hooks;

namespace {
constexpr int kMaxDepth = 48;
constexpr int kWaitRounds = 4096;  // backoff rounds before an in-flight slot is declared stale
Status Bad(const std::string& s) { return Status::Corrupt("bztree: " + s); }
Status Retry() { return Status::Busy("bztree: retry"); }
bool IsRetry(const Status& s) { return s.IsBusy() && s.ToString().find("retry") != std::string::npos; }
}  // namespace

// PMwCAS::Begin answers Busy when every descriptor is in preparation or held
// back by open guards (many more threads than cores, each insert taking
// four): the operation backs off and tries again, never hands that to the
// caller. Begin is never called inside a guard, so waiting holds nothing.
bool NoDescriptor(const Status& s) {
  return s.IsBusy() && s.ToString().find("no free PMwCAS descriptor") != std::string::npos;
}

BzTree::BzTree(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)) {
  pmw_ = pool_->pmwcas();
  base_ = pool_->base();
}

// u64 keys: BuildNode lays record i of a node's sorted records (every
// entry of an inner node but its last, +infinity; a leaf's sorted prefix) at
// bytes - 16 (i + 1), and those bytes never change while the node lives. So
// a binary search over them reads the key words alone, one line a probe;
// the entry it ends on is checked against its metadata (and on a mismatch
// the search runs again through the metadata).
namespace {
inline uint64_t SortedKeyU64(const char* n, uint32_t bytes, uint64_t i) {
  uint64_t k;
  std::memcpy(&k, n + bytes - 16 * (i + 1), 8);
  return k;
}
inline bool AtSortedSlot(uint64_t m, uint32_t bytes, uint64_t i) {
  return meta::KeyLen(m) == 8 && meta::Offset(m) == bytes - 16 * (i + 1);
}
// The appended records of a u64 leaf continue that layout: every record is
// 16 bytes, so while the status's block size is 16 * count, record j (sorted
// or appended) lives at bytes - 16 (j + 1). An appended record's key word is
// zero (free space) until its inserter stores the key with one 8-byte atomic
// store after its reserve, and never changes afterwards: a key word that is
// neither zero nor x proves the slot is not x, whatever its metadata says,
// so the unsorted tail is searched through its key words (consecutive, four
// to a line) and only a matching or unwritten slot's metadata is read.
inline bool TailByKeyWords(uint64_t s, uint64_t c, uint32_t bytes) {
  return status::BlockSize(s) == 16 * c && kNodeHeader + 24 * c <= bytes;
}
inline uint64_t KeyWordU64(const char* n, uint32_t bytes, uint64_t j) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(n + bytes - 16 * (j + 1)), __ATOMIC_RELAXED);
}
}  // namespace

int BzTree::RouteInner(char* n, uint64_t s, Slice key, bool after, uint64_t* meta_out) {
  const uint64_t c = status::Count(s);
  const uint32_t bytes = nodeword::Bytes(NodeWord(n));
  if (c == 0 || kNodeHeader + 8 * c > bytes) return -1;
  if (kk_ == KeyKind::kU64 && 16 * c <= bytes - kNodeHeader - 8 * c) {
    const uint64_t x = SliceToU64(key);
    uint64_t lo = 0, hi = c - 1;  // entry c - 1 is +infinity
    while (lo < hi) {
      const uint64_t mid = (lo + hi) / 2;
      const uint64_t k = SortedKeyU64(n, bytes, mid);
      if (after ? k <= x : k < x) lo = mid + 1;
      else hi = mid;
    }
    const uint64_t m = __atomic_load_n(Meta(n, lo), __ATOMIC_RELAXED);
    if (MetaOk(m, bytes, c) && (lo + 1 == c ? meta::KeyLen(m) == 0 : AtSortedSlot(m, bytes, lo))) {
      *meta_out = m;
      return int(lo);
    }
  }
  // First entry whose key is >= key (after: > key); +infinity, key length
  // 0, is last.
  int64_t lo = 0, hi = int64_t(c) - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const uint64_t m = __atomic_load_n(Meta(n, uint64_t(mid)), __ATOMIC_RELAXED);
    if (!MetaOk(m, bytes, c)) return -1;
    if (meta::KeyLen(m) != 0 && Cmp(KeyOf(n, m), key) < (after ? 1 : 0)) lo = mid + 1;
    else hi = mid;
  }
  const uint64_t m = __atomic_load_n(Meta(n, uint64_t(lo)), __ATOMIC_RELAXED);
  if (!MetaOk(m, bytes, c)) return -1;
  *meta_out = m;
  return int(lo);
}

Status BzTree::Descend(Slice key, std::vector<Step>* path, bool after) {
  path->clear();
  uint64_t* slot = &hdr_->tree;
  uint64_t hi_node = 0, hi_meta = 0;
  uint64_t pool_size = PoolSize();  // read again before an offset is found out of range: the pool grows
  for (int depth = 0;; depth++) {
    if (depth > kMaxDepth) return Bad("tree deeper than " + std::to_string(kMaxDepth));
    const uint64_t off = Read(slot);
    if (off == 0) return Retry();  // the parent is being replaced
    if (off > pool_size - node_size_) pool_size = PoolSize();
    if (off % 8 || off < 4096 || off > pool_size - node_size_) return Bad("node offset " + std::to_string(off) + " out of range");
    char* n = N(off);
    // All of the node's lines at once: its search reads the header, the
    // metadata array and the key blocks at the far end in a dependent
    // chain, each of which would otherwise miss on its own.
    for (uint64_t o = 0; o < node_size_; o += 64) __builtin_prefetch(n + o);
    const uint64_t s = Read(Status_(n));
    const uint64_t nw = NodeWord(n);
    if (nodeword::Bytes(nw) != node_size_) return Bad("node " + std::to_string(off) + " has a bad node word");
    path->push_back(Step{slot, off, s, hi_meta, hi_node, -1});
    if (nodeword::Leaf(nw)) return Status::OK();
    uint64_t m = 0;
    const int i = RouteInner(n, s, key, after, &m);
    if (i < 0) return Bad("inner node " + std::to_string(off) + " has bad metadata");
    if (meta::KeyLen(m) != 0) {
      hi_node = off;
      hi_meta = m;
    }
    slot = Payload(n, m);
    path->back().index = i;
  }
}

int64_t BzTree::FindInLeaf(char* n, uint64_t s, Slice key, uint64_t* m_out, bool tail) {
  const uint64_t c = status::Count(s);
  const uint64_t nw = NodeWord(n);
  const uint32_t bytes = nodeword::Bytes(nw);
  const uint64_t sorted = std::min<uint64_t>(nodeword::Sorted(nw), c);
  if (kNodeHeader + 8 * c > bytes) return -2;
  // The unsorted suffix, newest first: a key deleted in the sorted prefix
  // and inserted again lives here.
  bool by_meta = tail;
  if (tail && kk_ == KeyKind::kU64 && TailByKeyWords(s, c, bytes)) {
    by_meta = false;
    const uint64_t x = SliceToU64(key);
    for (uint64_t j = c; j-- > sorted;) {
      if (KeyWordU64(n, bytes, j) != x) continue;
      const uint64_t m = Read(Meta(n, j));
      if (!meta::Visible(m)) continue;
      if (!MetaOk(m, bytes, c)) return -2;
      if (!AtSortedSlot(m, bytes, j)) {  // not the layout above: search by metadata
        by_meta = true;
        break;
      }
      *m_out = m;
      return int64_t(j);
    }
  }
  for (uint64_t j = c; by_meta && j-- > sorted;) {
    const uint64_t m = Read(Meta(n, j));
    if (!meta::Visible(m)) continue;
    if (!MetaOk(m, bytes, c)) return -2;
    if (meta::KeyLen(m) == key.size() && Cmp(KeyOf(n, m), key) == 0) {
      *m_out = m;
      return int64_t(j);
    }
  }
  if (kk_ == KeyKind::kU64 && 16 * sorted <= bytes - kNodeHeader - 8 * c) {
    const uint64_t x = SliceToU64(key);
    uint64_t lo = 0, hi = sorted;
    while (lo < hi) {
      const uint64_t mid = (lo + hi) / 2;
      const uint64_t k = SortedKeyU64(n, bytes, mid);
      if (k == x) {
        const uint64_t m = Read(Meta(n, mid));
        if (!MetaOk(m, bytes, c) || !AtSortedSlot(m, bytes, mid)) break;  // not BuildNode's layout: search by metadata
        if (!meta::Visible(m)) return -1;
        *m_out = m;
        return int64_t(mid);
      }
      if (k < x) lo = mid + 1;
      else hi = mid;
    }
    if (lo >= hi) return -1;
  }
  int64_t lo = 0, hi = int64_t(sorted);
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    const uint64_t m = Read(Meta(n, uint64_t(mid)));
    if (!MetaOk(m, bytes, c)) return -2;
    const int r = Cmp(KeyOf(n, m), key);
    if (r == 0) {
      if (!meta::Visible(m)) return -1;
      *m_out = m;
      return mid;
    }
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

Status BzTree::Find(Slice key, std::string* value) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  // Reused: no allocation per operation; initial-exec: no __tls_get_addr.
  static thread_local std::vector<Step> path __attribute__((tls_model("initial-exec")));
  kit::Backoff b;
  for (int tries = 0; tries < kMaxRetries; tries++) {
    {
      pm::PMwCAS::Guard g(*pmw_);
      const Status st = Descend(key, &path);
      if (st.ok()) {
        char* n = N(path.back().node);
        uint64_t m = 0;
        const int64_t j = FindInLeaf(n, path.back().status, key, &m);
        if (j == -2) return Bad("leaf " + std::to_string(path.back().node) + " has bad metadata");
        if (j < 0) return Status::NotFound();
        // The metadata word may have gained the out-of-line bit since.
        for (;;) {
          const uint64_t p = Read(Payload(n, m));
          const uint64_t m2 = Read(Meta(n, uint64_t(j)));
          if (m2 == m) {
            if (!value) return Status::OK();
            if (meta::OutOfLine(m)) return kit::ReadBlock(base_, PoolSize(), p, max_value_, value);
            const uint64_t v = meta::Value(m, p);
            value->assign(reinterpret_cast<const char*>(&v), 8);
            return Status::OK();
          }
          if (!meta::Visible(m2)) return Status::NotFound();
          m = m2;
        }
      }
      if (!IsRetry(st)) return st;
    }
    b.Wait();
  }
  return Status::Busy("bztree: find kept meeting replaced nodes");
}

Status BzTree::Insert(Slice key, Slice value) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, max_value_, value));
  kit::Backoff b;
  bool spares = false;
  for (int tries = 0; tries < kMaxRetries; tries++) {
    bool done = false, dup = false, smo = false, need_spares = false;
    Status st = InsertOnce(key, value, spares, &done, &dup, &smo, &need_spares);
    spares = spares || need_spares;
    if (!st.ok()) {
      if (!NoDescriptor(st)) return st;
      b.Wait();
      continue;
    }
    if (done) {
      delta_.fetch_add(1, std::memory_order_relaxed);
      return Status::OK();
    }
    if (dup) return Status::AlreadyExists();
    if (smo) {
      PMINDEX_RETURN_IF_ERROR(Smo(key, RecordBytes(key.size()) + 8, false));
      continue;
    }
    b.Wait();
  }
  return Status::Busy("bztree: insert retried too often");
}

// Byte values go out of line: AddAllocation into the payload word, block
// filled and flushed here (the PMwCAS's descriptor fence orders it). A u64
// value is inline: its low 61 bits into the payload word here, its top 3
// bits into the metadata word by the caller (*inline_value).
Status BzTree::WriteValue(pm::PMwCAS::Op* op, uint64_t* payload_word, uint64_t old, bool old_ool, Slice value,
                          bool* ool, uint64_t* inline_value) {
  *ool = vk_ == ValueKind::kBytes || old_ool;
  if (!*ool) {
    *inline_value = SliceToU64(value);
    return op->AddWord(payload_word, old, *inline_value & pm::pmwcas::kValueMask, pm::Recycle::kNone);
  }
  void* blk = nullptr;
  PMINDEX_RETURN_IF_ERROR(op->AddAllocation(payload_word, old, 8 + value.size(), &blk,
                                            old_ool ? pm::Recycle::kFreeOldOnSuccessNewOnFailure
                                                    : pm::Recycle::kFreeNewOnFailure));
  auto* w = static_cast<uint64_t*>(blk);
  pm::Store(w, uint64_t(value.size()));
  if (!value.empty()) pm::Copy(w + 1, value.data(), value.size());
  if (!PMINDEX_FAULT("bztree.insert.skip_value_flush")) pm::Flush(w, 8 + value.size());
  return Status::OK();
}

Status BzTree::InsertOnce(Slice key, Slice value, bool spares, bool* done, bool* dup, bool* smo, bool* need_spares) {
  // Descriptors first (never Begin inside a guard): ops[0] reserves, ops[1]
  // publishes (or, unused, marks our slot dead when we give up while
  // waiting), ops[3] marks our slot dead after failed publishes. ops[3] is
  // always taken up front: a reserved slot left in flight makes every later
  // insert into the leaf wait kWaitRounds before killing it (with many more
  // threads than cores that stalled whole test runs). The spare ops[2], for
  // a second publish or killing a stalled slot, is rarely needed: it comes
  // from the thread's descriptor cache inside the guard (TryBegin never
  // waits), or up front (spares) once an attempt found the cache empty
  // (*need_spares).
  pm::PMwCAS::Op ops[4];
  for (int i : {0, 1, 3}) PMINDEX_RETURN_IF_ERROR(pmw_->Begin(&ops[i]));
  if (spares) PMINDEX_RETURN_IF_ERROR(pmw_->Begin(&ops[2]));
  auto spare = [&](int i) { return ops[i].valid() || pmw_->TryBegin(&ops[i]); };
  bool spare_used = false;
  pm::PMwCAS::Guard g(*pmw_);
  // Reused: no allocation per operation; initial-exec: no __tls_get_addr.
  static thread_local std::vector<Step> path __attribute__((tls_model("initial-exec")));
  const Status st = Descend(key, &path);
  if (!st.ok()) return IsRetry(st) ? Status::OK() : st;
  char* n = N(path.back().node);
  const uint64_t s = path.back().status;
  if (status::Frozen(s)) {
    *smo = true;
    return Status::OK();
  }
  const uint64_t c = status::Count(s);
  if (kNodeHeader + 8 * c > node_size_) return Bad("leaf " + std::to_string(path.back().node) + " has bad metadata");
  // One pass over the unsorted suffix: a visible slot holding key is a
  // duplicate; a slot in flight is re-checked after our reserve (its key
  // may be ours). With u64 keys a slot whose key word is written and is not
  // key is neither (TailByKeyWords), so its metadata is not read.
  std::vector<uint64_t> pending;
  const bool by_key = kk_ == KeyKind::kU64 && TailByKeyWords(s, c, node_size_);
  const uint64_t x = by_key ? SliceToU64(key) : 0;
  for (uint64_t j = c; j-- > std::min<uint64_t>(nodeword::Sorted(NodeWord(n)), c);) {
    if (by_key) {
      const uint64_t k = KeyWordU64(n, node_size_, j);
      if (k != x && k != 0) continue;
    }
    const uint64_t m = Read(Meta(n, j));
    if (LiveInFlight(m)) {
      pending.push_back(j);
    } else if (meta::Visible(m) && MetaOk(m, node_size_, c) && meta::KeyLen(m) == key.size() &&
               Cmp(KeyOf(n, m), key) == 0) {
      *dup = true;
      return Status::OK();
    }
  }
  // Then the sorted prefix.
  uint64_t m0 = 0;
  const int64_t found = FindInLeaf(n, s, key, &m0, /*tail=*/false);
  if (found == -2) return Bad("leaf " + std::to_string(path.back().node) + " has bad metadata");
  if (found >= 0) {
    *dup = true;
    return Status::OK();
  }
  const uint64_t rec = RecordBytes(key.size());
  const uint64_t blk = status::BlockSize(s) + rec;
  if (c + 1 > status::kMaxCount || kNodeHeader + 8 * (c + 1) + blk > node_size_) {
    *smo = true;
    return Status::OK();
  }
  const uint64_t off = node_size_ - blk;
  uint64_t* mw = Meta(n, c);
  PMINDEX_RETURN_IF_ERROR(ops[0].AddWord(Status_(n), s, status::Make(false, c + 1, blk, status::DeleteSize(s))));
  PMINDEX_RETURN_IF_ERROR(ops[0].AddWord(mw, 0, meta::Reserved(epoch_)));
  bool ok = false;
  PMINDEX_RETURN_IF_ERROR(ops[0].Execute(&ok));
  if (!ok) return Status::OK();  // the status moved: search again
  // The reserved block: key, payload (inline value or 0 until published).
  char* r = n + off;
  if (kk_ == KeyKind::kU64) {
    // One atomic store: concurrent searches read the key word before its
    // metadata (TailByKeyWords).
    pm::StoreAtomic(reinterpret_cast<uint64_t*>(r), SliceToU64(key), __ATOMIC_RELAXED);
  } else {
    pm::Copy(r, key.data(), key.size());
    if (Pad8(key.size()) != key.size()) pm::Set(r + key.size(), 0, Pad8(key.size()) - key.size());
  }
  uint64_t* pw = reinterpret_cast<uint64_t*>(r + Pad8(key.size()));
  const bool inl = vk_ == ValueKind::kU64;
  pm::StoreAtomic(pw, inl ? SliceToU64(value) & pm::pmwcas::kValueMask : uint64_t(0), __ATOMIC_RELAXED);
  if (!PMINDEX_FAULT("bztree.insert.skip_record_flush")) pm::Flush(r, rec);
  if (hooks.after_reserve) hooks.after_reserve(this);
  const uint64_t mine = meta::Reserved(epoch_);
  // Giving up the slot before any PMwCAS of ours ran (the leaf froze, or a
  // waiter killed the slot): the record's flush is still unfenced. The slot
  // is dead, so nothing depends on its bytes, but an op returns with its
  // flushes fenced (pmcheck's lint; found by --shared-writes under PCT:
  // an insert that lost its slot, retried and returned already-exists).
  auto abandon = [] {
    pm::Fence();
    return Status::OK();
  };
  // Re-check uniqueness against the slots that were in flight at the search.
  for (uint64_t j : pending) {
    kit::Backoff w;
    int rounds = 0;
    for (;;) {
      const uint64_t m = Read(Meta(n, j));
      if (!LiveInFlight(m)) {
        if (meta::Visible(m) && MetaOk(m, node_size_, c) && meta::KeyLen(m) == key.size() && Cmp(KeyOf(n, m), key) == 0) {
          // Our slot dies (kept out of every rebuild); the unused publish
          // descriptor marks it.
          PMINDEX_RETURN_IF_ERROR(ops[1].AddWord(mw, mine, meta::Make(false, false, off, key.size())));
          PMINDEX_RETURN_IF_ERROR(ops[1].Execute(&ok));
          *dup = true;
          return Status::OK();
        }
        break;
      }
      // A frozen leaf: our publish cannot succeed; a killed slot: ours is
      // dead. Either way, start over.
      if (status::Frozen(Read(Status_(n))) || Read(mw) != mine) return abandon();
      if (++rounds > kWaitRounds && (spare_used || !spare(2))) {
        // A second stalled slot, or no spare to kill this one with: give
        // ours up (the unused publish descriptor marks it dead) and start
        // over, with the spares taken up front.
        (void)ops[1].AddWord(mw, mine, meta::Make(false, false, off, key.size()));
        (void)ops[1].Execute(&ok);
        *need_spares = true;
        return Status::OK();
      }
      if (rounds > kWaitRounds) {
        // Its owner stalled or gave up: kill the slot (its publish then fails).
        pm::PMwCAS::Op& k = ops[2];
        spare_used = true;
        PMINDEX_RETURN_IF_ERROR(k.AddWord(Meta(n, j), m, meta::Deleted(0)));
        PMINDEX_RETURN_IF_ERROR(k.Execute(&ok));
        continue;
      }
      w.Wait();
    }
  }
  // Publish; a status that moved (another reserve or delete) is retried once
  // with the spare, then the slot is marked dead and the insert restarts.
  for (int i = 1; i < (spare_used ? 2 : 3); i++) {
    if (i == 2 && !spare(2)) break;
    pm::PMwCAS::Op& op = ops[i];
    const uint64_t s2 = Read(Status_(n));
    // (From the second attempt on, ops[1]'s PMwCAS has fenced the flush.)
    if (status::Frozen(s2)) return i == 1 ? abandon() : Status::OK();
    if (Read(mw) != mine) return i == 1 ? abandon() : Status::OK();  // killed by a waiter
    PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(n), s2, s2));
    bool ool = !inl;
    if (!inl) {
      uint64_t unused = 0;
      PMINDEX_RETURN_IF_ERROR(WriteValue(&op, pw, 0, false, value, &ool, &unused));
    }
    const uint64_t pub = meta::Make(true, ool, off, key.size());
    PMINDEX_RETURN_IF_ERROR(op.AddWord(mw, mine, inl ? meta::WithHigh(pub, SliceToU64(value)) : pub));
    PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
    if (ok) {
      *done = true;
      return Status::OK();
    }
  }
  // Out of publish attempts: our slot dies (best effort; a waiter kills it
  // otherwise) and the insert starts over.
  if (ops[3].AddWord(mw, mine, meta::Make(false, false, off, key.size())).ok()) (void)ops[3].Execute(&ok);
  return Status::OK();
}

Status BzTree::Write(Slice key, Slice value, Mode mode) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  if (mode == Mode::kUpdate) PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, max_value_, value));
  kit::Backoff b;
  // Reused: no allocation per operation; initial-exec: no __tls_get_addr.
  static thread_local std::vector<Step> path __attribute__((tls_model("initial-exec")));
  int pool_full = 0;
  for (int tries = 0; tries < kMaxRetries; tries++) {
    bool frozen = false, merge = false;
    {
      pm::PMwCAS::Op op;
      if (Status bs = pmw_->Begin(&op); !bs.ok()) {
        if (!NoDescriptor(bs)) return bs;
        b.Wait();
        continue;
      }
      pm::PMwCAS::Guard g(*pmw_);
      const Status st = Descend(key, &path);
      if (!st.ok() && !IsRetry(st)) return st;
      if (st.ok()) {
        char* n = N(path.back().node);
        const uint64_t s = path.back().status;
        uint64_t m = 0;
        const int64_t j = status::Frozen(s) ? -1 : FindInLeaf(n, s, key, &m);
        if (j == -2) return Bad("leaf " + std::to_string(path.back().node) + " has bad metadata");
        if (status::Frozen(s)) {
          frozen = true;
        } else if (j < 0) {
          return Status::NotFound();
        } else {
          uint64_t* pw = Payload(n, m);
          const uint64_t p = Read(pw);
          const bool old_ool = meta::OutOfLine(m);
          bool ok = false;
          if (old_ool && p == 0) {
            // Removed since m was read: a remove zeroes an out-of-line
            // payload in the PMwCAS that marks the metadata deleted, so m
            // is stale (the PMwCAS would fail on it) and a null expected
            // block is no error of the caller's: search again.
            // (BzTreeConcurrency.SharedKeysBalance/bytes, about 1 run in 30.)
          } else if (mode == Mode::kRemove) {
            const uint64_t s2 = status::Make(false, status::Count(s), status::BlockSize(s),
                                             std::min<uint64_t>(status::DeleteSize(s) + meta::Total(m), 0x3fffff));
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(n), s, s2));
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Meta(n, uint64_t(j)), m, meta::Deleted(m)));
            if (old_ool) PMINDEX_RETURN_IF_ERROR(op.AddWord(pw, p, 0, pm::Recycle::kFreeOldOnSuccess));
            PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
            if (ok) {
              delta_.fetch_sub(1, std::memory_order_relaxed);
              // (The delete size may exceed the block size: unfreezes add
              // 8 phantom bytes, bztree_smo.cc.)
              const uint64_t live = status::BlockSize(s2) > status::DeleteSize(s2)
                                        ? status::BlockSize(s2) - status::DeleteSize(s2) : 0;
              merge = path.size() > 1 && live * 4 < Capacity();
            }
          } else {
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(n), s, s));
            bool ool = false;
            uint64_t v = 0;
            PMINDEX_RETURN_IF_ERROR(WriteValue(&op, pw, p, old_ool, value, &ool, &v));
            // The version moves on every update (readers' pair check).
            PMINDEX_RETURN_IF_ERROR(
                op.AddWord(Meta(n, uint64_t(j)), m, ool ? (meta::Updated(m, 0) | meta::kOutOfLine) : meta::Updated(m, v)));
            PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
          }
          if (ok && !merge) return Status::OK();
        }
      }
    }
    if (merge) {  // best effort: the delete is done
      const Status ms = Smo(key, 0, true);
      if (!ms.ok() && !ms.IsBusy() && !ms.IsPoolFull()) return ms;
      return Status::OK();
    }
    if (frozen) {
      // PoolFull: the frozen node could not be copied and was unfrozen
      // instead; try again a few times.
      const Status ss = Smo(key, 0, false);
      if (ss.IsPoolFull() && ++pool_full < 4) continue;
      PMINDEX_RETURN_IF_ERROR(ss);
      continue;
    }
    b.Wait();
  }
  return Status::Busy("bztree: write retried too often");
}

Status BzTree::Upsert(Slice key, Slice value) {
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, key));
  PMINDEX_RETURN_IF_ERROR(ValidateValue(vk_, max_value_, value));
  for (int tries = 0; tries < kMaxRetries; tries++) {
    Status st = Write(key, value, Mode::kUpdate);
    if (!st.IsNotFound()) return st;
    st = Insert(key, value);
    if (!st.IsAlreadyExists()) return st;
  }
  return Status::Busy("bztree: upsert retried too often");
}

bool BzTree::Records(char* n, std::vector<Rec>* out, bool* bad) const {
  out->clear();
  *bad = false;
  const uint64_t s = pmw_->Read(Status_(n));
  const uint64_t nw = NodeWord(n);
  const bool leaf = nodeword::Leaf(nw);
  const uint64_t c = status::Count(s);
  if (kNodeHeader + 8 * c > node_size_) {
    *bad = true;
    return false;
  }
  const uint64_t sorted = std::min<uint64_t>(nodeword::Sorted(nw), c);
  size_t prefix = 0;  // out[0, prefix): records of the sorted prefix, in order
  out->reserve(c);
  for (uint64_t j = 0; j < c; j++) {
    if (j == sorted) prefix = out->size();
    uint64_t m = pmw_->Read(Meta(n, j)), p = 0;
    // A leaf that is not frozen may see updates: the metadata read again
    // around the payload gives a consistent pair (format.h).
    for (;;) {
      if (leaf && !meta::Visible(m)) break;
      if (!MetaOk(m, node_size_, c)) {
        *bad = true;
        return false;
      }
      p = pmw_->Read(Payload(n, m));
      const uint64_t m2 = pmw_->Read(Meta(n, j));
      if (m2 == m || !leaf) break;
      m = m2;
    }
    if (leaf && !meta::Visible(m)) continue;
    Rec r;
    r.inf = !leaf && meta::KeyLen(m) == 0;
    r.key.assign(n + meta::Offset(m), meta::KeyLen(m));
    r.ool = meta::OutOfLine(m);
    r.payload = leaf && !r.ool && vk_ == ValueKind::kU64 ? meta::Value(m, p) : p;
    out->push_back(std::move(r));
  }
  if (leaf && sorted < c && kk_ == KeyKind::kU64) {
    // u64 keys: the appended records' (key, index) pairs are sorted, not
    // the records (a Rec holds a std::string: sorting and merging them
    // moved each several times), then merged with the prefix by key, each
    // record moved once. At most one visible record per key: no ties.
    static thread_local std::vector<std::pair<uint64_t, uint32_t>> tail __attribute__((tls_model("initial-exec")));
    static thread_local std::vector<Rec> merged __attribute__((tls_model("initial-exec")));
    tail.clear();
    for (size_t i = prefix; i < out->size(); i++) tail.push_back({SliceToU64((*out)[i].key), uint32_t(i)});
    std::sort(tail.begin(), tail.end());
    merged.clear();
    merged.reserve(out->size());
    size_t a = 0, t = 0;
    while (a < prefix || t < tail.size()) {
      if (t == tail.size() || (a < prefix && SliceToU64((*out)[a].key) <= tail[t].first))
        merged.push_back(std::move((*out)[a++]));
      else
        merged.push_back(std::move((*out)[tail[t++].second]));
    }
    out->swap(merged);
  } else if (leaf && sorted < c) {
    // Only the appended records need sorting; then one merge with the
    // prefix (at most one visible record per key: no ties between them).
    auto less = [this](const Rec& a, const Rec& b) { return Cmp(a.key, b.key) < 0; };
    std::sort(out->begin() + ptrdiff_t(prefix), out->end(), less);
    std::inplace_merge(out->begin(), out->begin() + ptrdiff_t(prefix), out->end(), less);
  }
  return true;
}

Status BzTree::Scan(Slice start, size_t n, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (closed_) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(kk_, max_key_, start));
  std::string from(start);
  bool inclusive = true;
  size_t done = 0;
  std::vector<Step> path;
  std::vector<Rec> recs;
  std::vector<std::pair<std::string, std::string>> batch;
  kit::Backoff b;
  int retries = 0;
  while (done < n) {
    bool last = false;
    batch.clear();
    {
      pm::PMwCAS::Guard g(*pmw_);
      Status st = Descend(from, &path, !inclusive);
      if (IsRetry(st)) {
        if (++retries > kMaxRetries) return Status::Busy("bztree: scan kept meeting replaced nodes");
        b.Wait();
        continue;
      }
      PMINDEX_RETURN_IF_ERROR(st);
      char* leaf = N(path.back().node);
      bool bad = false;
      // A frozen leaf is stable: reading it is as good as reading its copy.
      if (!Records(leaf, &recs, &bad)) return Bad("leaf " + std::to_string(path.back().node) + " has bad metadata");
      for (const Rec& r : recs) {
        if (batch.size() + done >= n) break;
        const int c = Cmp(r.key, from);
        if (c < 0 || (c == 0 && !inclusive)) continue;
        std::string v;
        if (r.ool) PMINDEX_RETURN_IF_ERROR(kit::ReadBlock(base_, PoolSize(), r.payload, max_value_, &v));
        else v.assign(reinterpret_cast<const char*>(&r.payload), 8);
        batch.emplace_back(r.key, std::move(v));
      }
      const Step& st0 = path.back();
      if (st0.hi_node == 0) {
        last = true;
      } else {
        from.assign(N(st0.hi_node) + meta::Offset(st0.hi_meta), meta::KeyLen(st0.hi_meta));
        inclusive = false;
      }
    }
    for (auto& [k, v] : batch) {
      done++;
      if (!cb(k, v)) {
        if (count) *count = done;
        return Status::OK();
      }
    }
    if (last) break;
  }
  if (count) *count = done;
  return Status::OK();
}

uint64_t BzTree::Size() {
  if (closed_) return 0;
  if (base_count_.load(std::memory_order_acquire) < 0) {
    // Counted once after open (recovery stays constant-time): a walk of the
    // leaves; writes that run meanwhile are in delta_ and may be off by the
    // ones the walk also saw.
    int64_t total = 0;
    const int64_t d0 = delta_.load();
    Walk([&](uint64_t node, bool leaf) {
      if (!leaf) return;
      std::vector<Rec> r;
      bool bad = false;
      if (Records(N(node), &r, &bad)) total += int64_t(r.size());
    });
    int64_t expect = -1;
    base_count_.compare_exchange_strong(expect, total - d0);
  }
  const int64_t v = base_count_.load() + delta_.load(std::memory_order_relaxed);
  return v < 0 ? 0 : uint64_t(v);
}

PMINDEX_FAULT_SWITCH_ARRAY(bztree, kFaultSwitches);

}  // namespace pmindex::internal::bztree
