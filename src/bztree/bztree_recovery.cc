// bztree/bztree_recovery.cc: creating and opening a BzTree pool, recovery
// (PiBench VLDB'20 sec. 5.9, table 3: constant time), Check, the owned-block
// enumeration, stats, options and the registration of `bztree`.
//
// Creation (Format), idempotent: the header is allocated zeroed into the
// pool's root slot, its configuration stored and persisted; the first leaf
// is allocated into header.tree and written empty (persisted, fenced);
// initialized = 1 last. A crashed creation is formatted again
// (kit/root_check.h tells it from a damaged header).
//
// Recovery: Pool::Open has already run PMwCAS recovery (every operation in
// flight rolled entirely forward or back, every block a descriptor owned
// freed or handed to its word, every replaced node freed). Open then bumps
// the header's epoch (stored, flushed, fenced), so in-flight metadata words
// of interrupted inserts are dead. Nothing else: no walk, no rebuild. Frozen
// nodes a crash left in the tree are replaced by the first operation that
// meets them (bztree_smo.cc).
//
// Thread safety: open is single-threaded; Check, ForEachOwnedBlock, Stats
// and GetShape must not run with writers.
#include <chrono>
#include <cstddef>
#include <set>

#include "bztree/bztree_tree.h"
#include "kit/root_check.h"

namespace pmindex::internal::bztree {

namespace {
std::string Num(uint64_t x) { return std::to_string(x); }
Status Bad(const std::string& s) { return Status::Corrupt("bztree: " + s); }
const kit::RootSpec kSpec{"bztree", kMagic, sizeof(Header), offsetof(Header, magic), offsetof(Header, initialized)};

uint32_t LimitKey(uint32_t node_size) { return uint32_t((node_size - kNodeHeader) / 4 - 16); }
}  // namespace

Status BzTree::Format(KeyKind kk, ValueKind vk, uint32_t node_size, uint32_t max_key, uint32_t max_value) {
  if (!pmw_) return Status::InvalidArgument("bztree needs a pool with a PMwCAS region (pool format 2, read-write)");
  if (pmw_->max_words() < kMinPmwcasWords)
    return Status::InvalidArgument("bztree needs PMwCAS operations of " + Num(kMinPmwcasWords) + " words, the pool has " +
                                   Num(pmw_->max_words()));
  uint64_t* rs = pool_->root_slot();
  if (*rs == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().AllocateZeroed(rs, sizeof(Header)));
  hdr_ = pool_->root<Header>();
  Header* h = hdr_;
  if (h->tree == 0) {
    pm::Store(&h->magic, kMagic);
    pm::Store(&h->format, kFormat);
    pm::Store(&h->node_size, node_size);
    pm::Store(&h->key_kind, uint8_t(kk));
    pm::Store(&h->value_kind, uint8_t(vk));
    pm::Store(&h->max_key, max_key);
    pm::Store(&h->max_value, max_value);
    pm::Store(&h->epoch, uint64_t(1));
    pm::Persist(h, 64);
  }
  kk_ = KeyKind(h->key_kind);
  vk_ = ValueKind(h->value_kind);
  node_size_ = h->node_size;
  max_key_ = h->max_key;
  max_value_ = h->max_value;
  epoch_ = uint32_t(h->epoch);
  if (h->tree == 0) PMINDEX_RETURN_IF_ERROR(pool_->allocator().Allocate(&h->tree, node_size_));
  BuildNode(N(h->tree), {}, true);
  pm::Fence();
  pm::StorePersist(&h->initialized, uint64_t(1));
  base_count_.store(0);
  return Status::OK();
}

Status BzTree::Open() {
  if (!pmw_) return Status::InvalidArgument("bztree needs a pool with a PMwCAS region (pool format 2, read-write)");
  const auto t0 = std::chrono::steady_clock::now();
  kit::RootState state;
  PMINDEX_RETURN_IF_ERROR(kit::ClassifyRoot(pool_.get(), kSpec, &state));
  if (state != kit::RootState::kInitialized) return Status::NotFound("bztree: no initialised index");
  hdr_ = pool_->root<Header>();
  const Header* h = hdr_;
  if (h->format != kFormat)
    return Status::Unsupported("bztree: the pool holds index format " + Num(h->format) + "; this build reads format " +
                               Num(kFormat) + " only (recreate the pool)");
  if (h->key_kind > 1 || h->value_kind > 1) return Bad("header key/value kind out of range");
  if (h->node_size < kMinNodeSize || h->node_size > kMaxNodeSize || h->node_size % 64)
    return Bad("header node size " + Num(h->node_size) + " out of range");
  if (h->max_key == 0 || h->max_key > LimitKey(h->node_size) || h->max_value > (64u << 20))
    return Bad("header key/value limits out of range");
  if (h->epoch == 0 || h->epoch >= 0xffffffffull) return Bad("header epoch " + Num(h->epoch) + " out of range");
  kk_ = KeyKind(h->key_kind);
  vk_ = ValueKind(h->value_kind);
  node_size_ = h->node_size;
  max_key_ = h->max_key;
  max_value_ = h->max_value;
  // The whole recovery of the tree: a new epoch.
  pm::Store(&hdr_->epoch, h->epoch + 1);
  pm::Persist(&hdr_->epoch, 8);
  epoch_ = uint32_t(hdr_->epoch);
  recovery_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::OK();
}

Status BzTree::Walk(const std::function<void(uint64_t node, bool leaf)>& fn) {
  pm::PMwCAS::Guard g(*pmw_);
  std::vector<std::pair<uint64_t, int>> stack{{Read(&hdr_->tree), 0}};
  uint64_t visited = 0;
  const uint64_t limit = PoolSize() / node_size_ + 1;
  while (!stack.empty()) {
    auto [off, depth] = stack.back();
    stack.pop_back();
    if (off == 0 || off % 8 || off < 4096 || off > PoolSize() - node_size_) return Bad("node offset " + Num(off) + " out of range");
    if (++visited > limit || depth > 48) return Bad("the tree has a cycle");
    char* n = N(off);
    const uint64_t nw = NodeWord(n);
    if (nodeword::Bytes(nw) != node_size_) return Bad("node " + Num(off) + " has a bad node word");
    const bool leaf = nodeword::Leaf(nw);
    fn(off, leaf);
    if (leaf) continue;
    std::vector<Rec> recs;
    bool bad = false;
    if (!Records(n, &recs, &bad)) return Bad("node " + Num(off) + " has bad metadata");
    for (auto it = recs.rbegin(); it != recs.rend(); ++it) stack.push_back({it->payload, depth + 1});
  }
  return Status::OK();
}

Status BzTree::CheckNode(uint64_t off, int depth, int* leaf_depth, const std::string* lo, const std::string* hi,
                         uint64_t* records, std::string* err) {
  auto fail = [&](const std::string& s) {
    *err = "node " + Num(off) + ": " + s;
    return Status::Corrupt("bztree: " + *err);
  };
  if (off == 0 || off % 8 || off < 4096 || off > PoolSize() - node_size_) return fail("offset out of range");
  if (depth > 48) return fail("tree too deep");
  if (!pool_->allocator().IsAllocated(off)) return fail("not an allocated block");
  char* n = N(off);
  const uint64_t s = Read(Status_(n));
  const uint64_t nw = NodeWord(n);
  if (nodeword::Bytes(nw) != node_size_) return fail("bad node word");
  const uint64_t c = status::Count(s);
  if (kNodeHeader + 8 * c + status::BlockSize(s) > node_size_) return fail("status count/block size overflow the node");
  if (nodeword::Sorted(nw) > c) return fail("sorted count above record count");
  const bool leaf = nodeword::Leaf(nw);
  uint64_t sum = 0;
  std::set<std::string> seen;
  std::string prev;
  for (uint64_t j = 0; j < c; j++) {
    const uint64_t m = Read(Meta(n, j));
    if (meta::InFlight(m)) {
      if (j < nodeword::Sorted(nw) || !leaf) return fail("in-flight slot outside a leaf's unsorted suffix");
      continue;
    }
    if (meta::KeyLen(m) == 0 && meta::Offset(m) == 0 && leaf) continue;  // killed slot
    if (!MetaOk(m, node_size_, c)) return fail("metadata " + Num(j) + " out of range");
    sum += meta::Total(m);
    const std::string key(n + meta::Offset(m), meta::KeyLen(m));
    if (leaf && j < nodeword::Sorted(nw)) {
      if (j > 0 && Cmp(prev, key) >= 0) return fail("sorted prefix out of order at " + Num(j));
      prev = key;
    }
    const bool inf = !leaf && key.empty();
    if (!inf) {
      if (lo && Cmp(key, *lo) <= 0) return fail("key below the node's range");
      if (hi && Cmp(key, *hi) > 0) return fail("key above the node's range");
    }
    if (leaf) {
      if (!meta::Visible(m)) continue;
      if (!seen.insert(key).second) return fail("a key visible twice");
      (*records)++;
      const uint64_t p = Read(Payload(n, m));
      if (meta::OutOfLine(m)) {
        std::string v;
        if (!kit::TryReadBlock(base_, PoolSize(), p, max_value_, &v) || !pool_->allocator().IsAllocated(p))
          return fail("value block " + Num(p) + " unreadable");
      }
    } else {
      if (inf != (j + 1 == c)) return fail("+infinity not exactly the last entry");
    }
  }
  if (sum > status::BlockSize(s)) return fail("records exceed the block size");
  if (leaf) {
    if (*leaf_depth < 0) *leaf_depth = depth;
    if (*leaf_depth != depth) return fail("leaves at different depths");
    return Status::OK();
  }
  if (c == 0) return fail("inner node without entries");
  std::vector<Rec> recs;
  bool bad = false;
  if (!Records(n, &recs, &bad)) return fail("bad metadata");
  for (size_t j = 0; j < recs.size(); j++) {
    const std::string* clo = j == 0 ? lo : &recs[j - 1].key;
    const std::string* chi = recs[j].inf ? hi : &recs[j].key;
    if (j > 0 && !recs[j].inf && Cmp(recs[j - 1].key, recs[j].key) >= 0) return fail("inner keys out of order");
    PMINDEX_RETURN_IF_ERROR(CheckNode(recs[j].payload, depth + 1, leaf_depth, clo, chi, records, err));
  }
  return Status::OK();
}

Status BzTree::Check() {
  if (closed_) return IndexClosed();
  pm::PMwCAS::Guard g(*pmw_);
  int leaf_depth = -1;
  uint64_t records = 0;
  std::string err;
  PMINDEX_RETURN_IF_ERROR(CheckNode(Read(&hdr_->tree), 0, &leaf_depth, nullptr, nullptr, &records, &err));
  const int64_t b = base_count_.load();
  if (b >= 0 && uint64_t(b + delta_.load()) != records)
    return Bad("Size() " + Num(uint64_t(b + delta_.load())) + " != " + Num(records) + " records");
  return Status::OK();
}

Status BzTree::ForEachOwnedBlock(const std::function<void(uint64_t offset)>& fn) {
  if (closed_) return IndexClosed();
  pmw_->Reclaim();  // replaced nodes stay allocated until their descriptors are recycled
  fn(*pool_->root_slot());
  std::vector<Rec> recs;
  return Walk([&](uint64_t node, bool leaf) {
    fn(node);
    if (!leaf) return;
    bool bad = false;
    if (!Records(N(node), &recs, &bad)) return;
    for (const Rec& r : recs)
      if (r.ool) fn(r.payload);
  });
}

Status BzTree::GetShape(Shape* sh) {
  *sh = Shape{};
  return Walk([&](uint64_t node, bool leaf) {
    (leaf ? sh->leaves : sh->inner)++;
    if (status::Frozen(Read(Status_(N(node))))) sh->frozen++;
  });
}

Status BzTree::FreezeLeafForTest(Slice key) {
  pm::PMwCAS::Op op;
  PMINDEX_RETURN_IF_ERROR(pmw_->Begin(&op));
  pm::PMwCAS::Guard g(*pmw_);
  std::vector<Step> path;
  PMINDEX_RETURN_IF_ERROR(Descend(key, &path));
  const Step& x = path.back();
  PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(N(x.node)), x.status, x.status | status::kFrozen));
  bool ok = false;
  PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
  return ok ? Status::OK() : Status::Busy("bztree: the leaf changed meanwhile");
}

Status BzTree::PathForTest(Slice key, std::vector<std::pair<uint64_t, uint64_t>>* nodes) {
  pm::PMwCAS::Guard g(*pmw_);
  std::vector<Step> path;
  PMINDEX_RETURN_IF_ERROR(Descend(key, &path));
  nodes->clear();
  for (const Step& x : path) nodes->push_back({x.node, status::Count(x.status)});
  return Status::OK();
}

IndexStats BzTree::Stats() {
  IndexStats s;
  if (closed_) return s;
  s.records = Size();
  s.pm_bytes = pool_->allocator().BytesInUse();
  s.recovery_seconds = recovery_seconds_;
  return s;
}

Status BzTree::Close() {
  if (closed_) return Status::OK();
  closed_ = true;
  return pool_ ? pool_->Close() : Status::OK();
}

// ---- options, factories, registration ----------------------------------------
namespace {

Status Make(std::unique_ptr<pm::Pool> pool, const Options& o, std::unique_ptr<Index>* out, bool create) {
  if (o.read_only) return Status::Unsupported("bztree bumps its epoch at open and cannot open a pool read-only");
  Params p(o.params);
  PMINDEX_RETURN_IF_ERROR(p.Expect({"node_size"}));
  if (o.max_key_size == 0 || o.max_key_size > (1u << 16) - 64) return Status::InvalidArgument("max_key_size out of range");
  if (o.max_value_size > (64u << 20)) return Status::InvalidArgument("max_value_size out of range");
  uint32_t max_key = o.key_kind == KeyKind::kU64 ? 8 : uint32_t(o.max_key_size);
  // Default node: 1 KiB, or the smallest power of two that holds four
  // records of the longest key (byte keys store keys in the node). An
  // explicit node_size caps the key length at four records per node.
  uint32_t def = 1024;
  while (LimitKey(def) < max_key) def *= 2;
  long long ns = 0;
  PMINDEX_RETURN_IF_ERROR(p.GetInt("node_size", def, kMinNodeSize, kMaxNodeSize, &ns));
  if (ns % 64) return Status::InvalidArgument("bztree node_size must be a multiple of 64");
  if (LimitKey(uint32_t(ns)) < max_key) {
    if (o.key_kind == KeyKind::kU64) return Status::InvalidArgument("bztree node_size too small");
    max_key = LimitKey(uint32_t(ns));
  }
  auto t = std::make_unique<BzTree>(std::move(pool));
  Status st;
  if (create) {
    st = t->Format(o.key_kind, o.value_kind, uint32_t(ns), max_key, uint32_t(o.max_value_size));
  } else {
    st = t->Open();
    if (st.IsNotFound()) {  // a creation that crashed: nothing was acknowledged
      kit::RootState state;
      st = kit::ClassifyRoot(t->pool(), kSpec, &state);
      if (st.ok()) {
        const Header* h = t->pool()->root<Header>();
        const uint64_t blocks = state == kit::RootState::kAbsent ? 0 : (h->tree ? 2 : 1);
        if (state == kit::RootState::kCreating)
          st = kit::CheckCreationBlocks(t->pool(), kSpec, blocks, "header not initialised");
        if (st.ok() && state == kit::RootState::kCreating && h->tree && h->magic != kMagic)
          st = Bad("header not initialised, without magic, but a leaf allocated");
        if (st.ok()) {
          KeyKind kk = o.key_kind;
          ValueKind vk = o.value_kind;
          uint32_t nsz = uint32_t(ns), mk = max_key, mv = uint32_t(o.max_value_size);
          if (state == kit::RootState::kCreating && h->tree) {  // its configuration is durable: keep it
            if (h->key_kind > 1 || h->value_kind > 1 || h->node_size < kMinNodeSize || h->node_size > kMaxNodeSize ||
                h->node_size % 64 || h->max_key == 0 || h->max_key > LimitKey(h->node_size))
              st = Bad("header not initialised, with a damaged configuration");
            kk = KeyKind(h->key_kind);
            vk = ValueKind(h->value_kind);
            nsz = h->node_size;
            mk = h->max_key;
            mv = h->max_value;
          }
          if (st.ok()) st = t->Format(kk, vk, nsz, mk, mv);
        }
      }
    }
  }
  return HandOutOrClose(std::move(st), std::move(t), out);
}

}  // namespace
}  // namespace pmindex::internal::bztree

namespace pmindex::internal {

void RegisterBzTree(std::vector<IndexFactory>* r) {
  AddIndexType<&bztree::Make>(r, {"bztree", true, true, true,
                                 "BzTree (PiBench VLDB'20 sec. 3.3): lock-free PM B+-tree on PMwCAS, copy-on-write "
                                 "structure changes, constant-time recovery"});
}

}  // namespace pmindex::internal
