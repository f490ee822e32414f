// bztree/bztree_smo.cc: BzTree's structure changes (PiBench VLDB'20 sec.
// 3.3; Arulraj et al., VLDB'18, sec. 5): freeze, consolidate, split, merge.
//
// Every change replaces frozen nodes by new ones, copy-on-write:
//   freeze   one PMwCAS sets the frozen bit in the status word of the nodes
//            involved (a leaf; a leaf and its parent for a split or a drop;
//            a leaf, its sibling and their parent for a merge). A frozen
//            node never changes again: every insert, update and delete
//            names its node's status word with the unfrozen value.
//   replace  the topmost frozen node X on a path is rebuilt: a leaf from its
//            visible records (sorted: consolidation), an inner node from its
//            entries, absorbing up to kAbsorb frozen children among the
//            path's child and its two neighbours (their records
//            re-laid: a frozen leaf is consolidated, split in two when its
//            records fill more than 3/4 of a node, merged with an adjacent
//            frozen leaf when both fit in one, dropped when empty; a frozen
//            inner child is copied, or split in two when it lacks room for
//            kAbsorb more entries, what its own rebuild may add). The
//            new nodes are written and persisted (fault
//            bztree.smo.skip_node_flush), then ONE PMwCAS installs them: the
//            word that points to X changes to the new top node
//            (AddAllocation: the descriptor owns the block until success,
//            X is freed on success), each new child is allocated into its
//            parent's fresh child word (also owned by the descriptor), each
//            absorbed child's word in X goes to 0 (freed on success), and
//            X's parent's status word is named unchanged (not frozen). So a
//            crash at any instant leaks nothing, and replaced nodes are freed
//            after the PMwCAS epoch's grace period (readers hold a guard).
//            A change X cannot make alone (a leaf split needs a new parent
//            entry, an inner node overflowing needs a split) freezes X's
//            parent instead; the parent's rebuild then absorbs X. The root
//            splits into a new root; an inner root left with one child is
//            replaced by that child.
// Whoever meets a frozen node helps: Smo always works on the topmost frozen
// node of the key's path, so frozen nodes left by a crash or by a thread
// that stopped are replaced by the next operation that needs them.
//
// Thread safety: bztree_tree.h. Smo runs outside any guard; each round
// takes its descriptor, then a guard.
#include <algorithm>

#include "bztree/bztree_tree.h"
#include "pmindex/pm/fault.h"

namespace pmindex::internal::bztree {

namespace {
constexpr size_t kAbsorb = 2;  // frozen children absorbed per rebuild (bounds the PMwCAS's words)
Status Bad(const std::string& s) { return Status::Corrupt("bztree: " + s); }
bool IsRetry(const Status& s) { return s.IsBusy() && s.ToString().find("retry") != std::string::npos; }
}  // namespace

uint64_t BzTree::LiveBytes(const std::vector<Rec>& r) const {
  uint64_t b = 0;
  for (const Rec& x : r) b += EntryBytes(x);
  return b;
}

std::vector<uint64_t*> BzTree::BuildNode(char* blk, const std::vector<Rec>& recs, bool leaf) {
  std::string buf(node_size_, '\0');
  std::vector<uint64_t*> payloads;
  uint64_t end = node_size_, total = 0;
  for (size_t i = 0; i < recs.size(); i++) {
    const Rec& r = recs[i];
    const uint64_t klen = r.inf ? 0 : r.key.size();
    const uint64_t tot = RecordBytes(klen);
    end -= tot;
    total += tot;
    std::memcpy(buf.data() + end, r.key.data(), klen);
    // A leaf's inline u64 value: low 61 bits in the payload word, the top
    // 3 in the metadata (bztree_format.h).
    const bool split = leaf && !r.ool && vk_ == ValueKind::kU64;
    const uint64_t pw = split ? r.payload & pm::pmwcas::kValueMask : r.payload;
    std::memcpy(buf.data() + end + Pad8(klen), &pw, 8);
    uint64_t m = meta::Make(true, leaf && r.ool, end, klen);
    if (split) m = meta::WithHigh(m, r.payload);
    std::memcpy(buf.data() + kNodeHeader + 8 * i, &m, 8);
    payloads.push_back(reinterpret_cast<uint64_t*>(blk + end + Pad8(klen)));
  }
  const uint64_t s = status::Make(false, recs.size(), total, 0);
  const uint64_t nw = nodeword::Make(node_size_, uint32_t(recs.size()), leaf);
  std::memcpy(buf.data(), &s, 8);
  std::memcpy(buf.data() + 8, &nw, 8);
  pm::Copy(blk, buf.data(), node_size_);
  if (!PMINDEX_FAULT("bztree.smo.skip_node_flush")) pm::Flush(blk, node_size_);
  return payloads;
}

Status BzTree::Install(pm::PMwCAS::Op* op, uint64_t* slot, uint64_t expected, const std::vector<Plan>& plan, int top) {
  void* blk = nullptr;
  PMINDEX_RETURN_IF_ERROR(op->AddAllocation(slot, expected, node_size_, &blk, expected
                                                ? pm::Recycle::kFreeOldOnSuccessNewOnFailure
                                                : pm::Recycle::kFreeNewOnFailure));
  const Plan& p = plan[size_t(top)];
  const std::vector<uint64_t*> words = BuildNode(static_cast<char*>(blk), p.recs, p.leaf);
  for (size_t i = 0; i < p.recs.size(); i++)
    if (p.child[i] >= 0) PMINDEX_RETURN_IF_ERROR(Install(op, words[i], 0, plan, p.child[i]));
  return Status::OK();
}

// Splits recs (sorted) into k chunks of about equal bytes.
static std::vector<std::pair<size_t, size_t>> Chunks(const std::vector<uint64_t>& sizes, uint64_t k) {
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  std::vector<std::pair<size_t, size_t>> out;
  size_t from = 0;
  uint64_t acc = 0;
  for (size_t i = 0; i < sizes.size(); i++) {
    acc += sizes[i];
    if (out.size() + 1 < k && acc * k >= total * (out.size() + 1) && i + 1 < sizes.size()) {
      out.push_back({from, i + 1});
      from = i + 1;
    }
  }
  out.push_back({from, sizes.size()});
  return out;
}

// Adds to e (entries of the node being built) the nodes for recs, sorted
// records of a run of frozen leaves (leaf) or the entries of a frozen inner
// node: 0 nodes if empty, else as many as keep each under `fill`. The last
// node's entry takes key `last`.
void BzTree::AddNodes(std::vector<Plan>* plan, std::vector<Rec>&& recs, bool leaf, const Rec& last, uint64_t fill) {
  std::vector<uint64_t> sizes;
  uint64_t bytes = 0;
  for (const Rec& r : recs) {
    sizes.push_back(EntryBytes(r));
    bytes += sizes.back();
  }
  if (recs.empty()) return;
  const uint64_t k = (bytes + fill - 1) / fill;
  for (auto [a, b] : Chunks(sizes, k)) {
    Plan node;
    node.leaf = leaf;
    node.recs.assign(recs.begin() + long(a), recs.begin() + long(b));
    node.child.assign(node.recs.size(), -1);
    Rec sep = b == recs.size() ? last : node.recs.back();
    if (!leaf) {  // the node's own last entry routes everything up to sep
      node.recs.back().inf = true;
      node.recs.back().key.clear();
    }
    plan->push_back(std::move(node));
    sep.payload = 0;
    (*plan)[0].recs.push_back(sep);  // plan[0]: the entries being built
    (*plan)[0].child.push_back(int(plan->size() - 1));
  }
}

Status BzTree::Replace(pm::PMwCAS::Op* op, const std::vector<Step>& path, size_t at) {
  const Step& x = path[at];
  char* xn = N(x.node);
  const bool xleaf = nodeword::Leaf(NodeWord(xn));
  const Step* parent = at > 0 ? &path[at - 1] : nullptr;
  const uint64_t fill = Capacity() * 3 / 4;
  std::vector<Plan> plan(1);  // plan[0]: the entries replacing x
  plan[0].leaf = false;
  bool bad = false;
  std::vector<Rec> recs;
  struct Absorbed {
    uint64_t* slot;   // its word in x: to 0, the child freed on success
    uint64_t child;
    uint64_t status;  // its frozen status, named unchanged
  };
  std::vector<Absorbed> frees;
  if (!Records(xn, &recs, &bad)) return Bad("node " + std::to_string(x.node) + " has bad metadata");
  if (xleaf) {
    const uint64_t bytes = LiveBytes(recs);
    if (parent && (bytes == 0 || bytes > fill)) {
      // A drop or a split changes the parent: freeze it; its rebuild absorbs x.
      PMINDEX_RETURN_IF_ERROR(op->AddWord(Status_(N(parent->node)), parent->status, parent->status | status::kFrozen));
      bool ok;
      return op->Execute(&ok);
    }
    Rec inf;
    inf.inf = true;
    inf.payload = 0;
    inf.ool = false;
    if (bytes == 0) {  // the root leaf, empty
      Plan leaf;
      leaf.leaf = true;
      plan.push_back(leaf);
      plan[0].recs.push_back(inf);
      plan[0].child.push_back(1);
    } else {
      AddNodes(&plan, std::move(recs), true, inf, fill);
    }
  } else {
    // Entries of x, absorbing frozen children.
    std::vector<Rec> run;
    bool in_run = false, last_dropped = false;
    Rec run_key;
    size_t absorbed = 0;
    auto flush_run = [&]() {
      if (!in_run) return;
      in_run = false;
      if (LiveBytes(run) == 0) {
        last_dropped = run_key.inf;
      } else {
        last_dropped = false;
        AddNodes(&plan, std::move(run), true, run_key, fill);
      }
      run.clear();
    };
    const uint64_t c = recs.size();
    // Only the child on the path and its two neighbours are looked at for
    // absorption: every freeze that names x freezes one of those (a split
    // or a drop: the path's leaf or inner child; a merge: the path's leaf
    // and an adjacent sibling). Reading every child's status would cost a
    // cache miss per entry. A frozen child elsewhere (another thread's
    // change, a crash) is copied as it is and replaced by the next
    // operation whose path meets it, as a child beyond kAbsorb is.
    const int64_t via = at + 1 < path.size() ? x.index : -1;
    for (uint64_t i = 0; i < c; i++) {
      const uint64_t m = __atomic_load_n(Meta(xn, i), __ATOMIC_RELAXED);
      uint64_t* slot = Payload(xn, m);
      const uint64_t child = Read(slot);
      if (child == 0 || child % 8 || child < 4096 || child > PoolSize() - node_size_) {
        if (child == 0) return Status::OK();  // x was replaced meanwhile
        return Bad("child offset " + std::to_string(child) + " out of range");
      }
      char* cn = N(child);
      const bool near = via < 0 || (int64_t(i) + 1 >= via && int64_t(i) <= via + 1);
      const uint64_t cs = near ? Read(Status_(cn)) : 0;
      Rec entry = recs[i];
      entry.payload = child;
      if (status::Frozen(cs) && absorbed < kAbsorb) {
        absorbed++;
        frees.push_back({slot, child, cs});
        std::vector<Rec> cr;
        if (!Records(cn, &cr, &bad)) return Bad("node " + std::to_string(child) + " has bad metadata");
        if (nodeword::Leaf(NodeWord(cn))) {
          // Merge with the run only if both fit in one node.
          if (in_run && LiveBytes(run) + LiveBytes(cr) > fill) flush_run();
          run.insert(run.end(), std::make_move_iterator(cr.begin()), std::make_move_iterator(cr.end()));
          run_key = entry;
          in_run = true;
          continue;
        }
        flush_run();
        last_dropped = false;
        // Split unless the copy has room for its own rebuild, which absorbs
        // up to kAbsorb frozen children, each adding at most one entry (a
        // leaf split in two, an inner node split in two). A copy without
        // that room overflows in its own rebuild, freezes this node's
        // replacement, is copied again, and so on: its frozen children are
        // never replaced and every operation on them ends Busy.
        const uint64_t cb = LiveBytes(cr);
        const bool split = cb + kAbsorb * (8 + RecordBytes(max_key_)) > Capacity();
        AddNodes(&plan, std::move(cr), false, entry, split ? (cb + 1) / 2 + 1 : Capacity());
        continue;
      }
      flush_run();
      last_dropped = false;
      plan[0].recs.push_back(entry);
      plan[0].child.push_back(-1);
    }
    flush_run();
    Plan& top = plan[0];
    if (top.recs.empty()) {
      Rec inf;
      inf.inf = true;
      inf.payload = 0;
      inf.ool = false;
      Plan leaf;
      leaf.leaf = true;
      plan.push_back(leaf);
      plan[0].recs.push_back(inf);
      plan[0].child.push_back(int(plan.size() - 1));
    } else if (last_dropped) {
      top.recs.back().inf = true;
      top.recs.back().key.clear();
    }
  }
  // plan[0] holds the entries that replace x. Install them.
  Plan& top = plan[0];
  bool ok = false;
  if (parent && !xleaf && LiveBytes(top.recs) > Capacity()) {
    // x must split: freeze its parent, whose rebuild splits x.
    PMINDEX_RETURN_IF_ERROR(op->AddWord(Status_(N(parent->node)), parent->status, parent->status | status::kFrozen));
    return op->Execute(&ok);
  }
  // Every node copied is named with its frozen status: an unfreeze (below)
  // makes a stale install fail.
  PMINDEX_RETURN_IF_ERROR(op->AddWord(Status_(xn), x.status, x.status));
  for (const Absorbed& a : frees) {
    PMINDEX_RETURN_IF_ERROR(op->AddWord(a.slot, a.child, 0, pm::Recycle::kFreeOldOnSuccess));
    PMINDEX_RETURN_IF_ERROR(op->AddWord(Status_(N(a.child)), a.status, a.status));
  }
  if (!parent && top.recs.size() == 1) {
    // x is the root and one node remains: it becomes the root.
    if (top.child[0] >= 0) {
      PMINDEX_RETURN_IF_ERROR(Install(op, x.slot, x.node, plan, top.child[0]));
    } else {
      PMINDEX_RETURN_IF_ERROR(op->AddWord(x.slot, x.node, top.recs[0].payload, pm::Recycle::kFreeOldOnSuccess));
    }
    return op->Execute(&ok);
  }
  if (xleaf && !parent) {  // a root leaf split: plan[0] is the new root
    PMINDEX_RETURN_IF_ERROR(Install(op, x.slot, x.node, plan, 0));
    return op->Execute(&ok);
  }
  if (LiveBytes(top.recs) > Capacity()) {
    // The root splits: a new root over two halves of the entries.
    std::vector<Rec> entries = std::move(top.recs);
    std::vector<int> kids = std::move(top.child);
    std::vector<uint64_t> sizes;
    for (const Rec& r : entries) sizes.push_back(EntryBytes(r));
    Plan root;
    root.leaf = false;
    for (auto [a, b] : Chunks(sizes, 2)) {
      Plan half;
      half.leaf = false;
      half.recs.assign(entries.begin() + long(a), entries.begin() + long(b));
      half.child.assign(kids.begin() + long(a), kids.begin() + long(b));
      Rec sep = half.recs.back();
      sep.payload = 0;
      if (b < entries.size()) {
        half.recs.back().inf = true;
        half.recs.back().key.clear();
      }
      plan.push_back(std::move(half));
      root.recs.push_back(sep);
      root.child.push_back(int(plan.size() - 1));
    }
    plan[0] = std::move(root);
    PMINDEX_RETURN_IF_ERROR(Install(op, x.slot, x.node, plan, 0));
    return op->Execute(&ok);
  }
  // One node replaces x under an unfrozen parent (named unchanged).
  top.leaf = false;
  if (xleaf) {
    // A consolidation: the single leaf built by AddNodes replaces x.
    PMINDEX_RETURN_IF_ERROR(Install(op, x.slot, x.node, plan, top.child[0]));
  } else {
    PMINDEX_RETURN_IF_ERROR(Install(op, x.slot, x.node, plan, 0));
  }
  if (parent) PMINDEX_RETURN_IF_ERROR(op->AddWord(Status_(N(parent->node)), parent->status, parent->status));
  return op->Execute(&ok);
}

Status BzTree::Smo(Slice key, uint64_t want, bool merge) {
  kit::Backoff b;
  std::vector<Step> path;
  std::vector<Rec> recs;
  for (int tries = 0; tries < kMaxRetries; tries++) {
    {
      pm::PMwCAS::Op op, undo;
      Status bs = pmw_->Begin(&op);
      if (bs.ok()) bs = pmw_->Begin(&undo);
      if (!bs.ok()) {  // descriptors all taken: back off (see NoDescriptor)
        if (!NoDescriptor(bs)) return bs;
        b.Wait();
        continue;
      }
      pm::PMwCAS::Guard g(*pmw_);
      Status st = Descend(key, &path);
      if (st.ok()) {
        size_t at = path.size();
        for (size_t i = 0; i < path.size(); i++)
          if (status::Frozen(path[i].status)) {
            at = i;
            break;
          }
        if (at < path.size()) {
          st = Replace(&op, path, at);
          if (st.IsPoolFull()) {
            // No room for the copy: unfreeze the frozen nodes from here down
            // so that updates and deletes (which need no room) go on. An
            // unfreeze adds 8 to the delete size, which only grows in a
            // node's life, so the status never takes a value it had before:
            // an install built from the frozen node fails.
            op.Abandon();
            for (size_t i = at; i < path.size(); i++) {
              const uint64_t s = path[i].status;
              if (!status::Frozen(s) || status::DeleteSize(s) + 8 > 0x3fffff) continue;
              PMINDEX_RETURN_IF_ERROR(undo.AddWord(Status_(N(path[i].node)), s,
                                                   status::Make(false, status::Count(s), status::BlockSize(s),
                                                                status::DeleteSize(s) + 8)));
            }
            bool ok;
            if (undo.size()) PMINDEX_RETURN_IF_ERROR(undo.Execute(&ok));
            return st;
          }
          PMINDEX_RETURN_IF_ERROR(st);
        } else {
          const Step& x = path.back();
          char* xn = N(x.node);
          const uint64_t s = x.status;
          if (want) {
            if (status::Count(s) + 1 <= status::kMaxCount &&
                kNodeHeader + 8 * status::Count(s) + status::BlockSize(s) + want <= node_size_)
              return Status::OK();
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(xn), s, s | status::kFrozen));
            // A leaf whose live records may fill more than 3/4 of a node
            // (an upper bound from its status: every slot's metadata word
            // and every block not deleted) must split, which changes its
            // parent: the parent is frozen in the same PMwCAS, so its
            // rebuild absorbs the leaf at once (a round, a PMwCAS and a
            // read of the leaf's records fewer than freezing the leaf,
            // finding it over 3/4 and freezing the parent). Should the
            // bound overshoot (dead slots), the parent's rebuild merely
            // consolidates the leaf.
            const uint64_t live_max = 8 * status::Count(s) + (status::BlockSize(s) > status::DeleteSize(s)
                                                                  ? status::BlockSize(s) - status::DeleteSize(s) : 0);
            if (path.size() > 1 && live_max > Capacity() * 3 / 4) {
              const Step& p = path[path.size() - 2];
              PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(N(p.node)), p.status, p.status | status::kFrozen));
            }
            bool ok;
            PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
          } else if (merge && path.size() > 1) {
            merge = false;
            bool bad = false;
            if (!Records(xn, &recs, &bad)) return Bad("leaf " + std::to_string(x.node) + " has bad metadata");
            const uint64_t live = LiveBytes(recs);
            const Step& p = path[path.size() - 2];
            char* pn = N(p.node);
            const uint64_t c = status::Count(p.status);
            if (live * 4 >= Capacity() || c < 2) return Status::OK();
            bool ok;
            if (live == 0) {  // an empty leaf: its parent's rebuild drops it
              PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(xn), s, s | status::kFrozen));
              PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(pn), p.status, p.status | status::kFrozen));
              PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
              if (!ok) merge = true;
              continue;
            }
            const uint64_t si = uint64_t(p.index) + 1 < c ? uint64_t(p.index) + 1 : uint64_t(p.index) - 1;
            const uint64_t sm = __atomic_load_n(Meta(pn, si), __ATOMIC_RELAXED);
            if (!MetaOk(sm, node_size_, c)) return Bad("inner node " + std::to_string(p.node) + " has bad metadata");
            const uint64_t sib = Read(Payload(pn, sm));
            if (sib == 0 || sib % 8 || sib < 4096 || sib > PoolSize() - node_size_) return Status::OK();
            char* sn = N(sib);
            const uint64_t ss = Read(Status_(sn));
            if (status::Frozen(ss) || !nodeword::Leaf(NodeWord(sn))) return Status::OK();
            if (!Records(sn, &recs, &bad)) return Bad("leaf " + std::to_string(sib) + " has bad metadata");
            if (live + LiveBytes(recs) > Capacity() * 3 / 4) return Status::OK();
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(xn), s, s | status::kFrozen));
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(sn), ss, ss | status::kFrozen));
            PMINDEX_RETURN_IF_ERROR(op.AddWord(Status_(pn), p.status, p.status | status::kFrozen));
            PMINDEX_RETURN_IF_ERROR(op.Execute(&ok));
            if (!ok) merge = true;
          } else {
            return Status::OK();
          }
        }
      } else if (!IsRetry(st)) {
        return st;
      }
    }
    if (tries > 2) b.Wait();
  }
  return Status::Busy("bztree: structure change retried too often");
}

}  // namespace pmindex::internal::bztree
