// fastfair_check.cc: Check and the owned-block enumeration of the FAST &
// FAIR tree (what tests, pmcheck and the leak check use; the paper has no
// checker: this one states the invariants of fastfair_format.h and of
// FAIR's B-link fences, sec. 4).
//
// Check walks every level's sibling chain from its leftmost node and
// verifies: levels and capacity; each level's chain lists exactly the
// children the level above lists, in order; fences chain (a node's low is
// its left sibling's effective high); records sorted within [low, high);
// a separator equals its child's low key; repaired nodes hold no ignored
// slot past a leaf's lk prefix; every record is reached by a descent to
// its key (or is a copy left by a split a crash interrupted before its
// cut); key, low-key and value blocks lie inside the pool (kit/pm_block.h);
// the record count matches Size().
// ForEachOwnedBlock reports every block the tree owns, each once: Meta,
// the spare root, the retire-slot array and the unlinked nodes it owns
// (with a byte-key leaf's low key block), the block retire-slot array and
// the unlinked key/value blocks it owns, every node, a split's unlinked
// spare sibling, the key and value blocks of live records, and spare
// blocks no record references (what Repair would free).
//
// Both store nothing to PM and bound every walk (Corrupt on a cycle).
// Thread safety: quiescent callers only (no concurrent writer).
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

template <bool BK>
Status FastFair<BK>::Check() {
  if (closed_) return IndexClosed();
  auto corrupt = [](const std::string& m) { return Status::Corrupt("fastfair: " + m); };
  Node* root = At(Ld(&meta_->root));
  if (!root) return corrupt("no root");
  std::vector<uint64_t> upper;  // children listed by the level above, in order
  uint64_t records = 0;
  for (Node* first = root;;) {
    const uint32_t level = first->level;
    if (first->low != 0) return corrupt("leftmost node of level " + std::to_string(level) + " has a low key");
    std::vector<uint64_t> children;
    size_t up = 0;  // next expected parent-listed node in this chain
    Node* prev = nullptr;
    kit::BoundedWalk nodes = Walk();
    for (Node* n = first; n; prev = n, n = At(n->sibling)) {
      if (!Step(nodes)) return corrupt("sibling cycle on level " + std::to_string(level));
      const std::string where = "node " + std::to_string(Off(n)) + " (level " + std::to_string(level) + ")";
      if (n->level != level) return corrupt(where + " on the wrong level chain");
      if (n->count > cap_) return corrupt(where + " count exceeds capacity");
      if (up < upper.size() && upper[up] == Off(n)) up++;
      else if (n == first && !upper.empty()) return corrupt(where + " is not the leftmost child of the level above");
      Slice lowblk;
      if (BK && n->low && !ViewBlock(n->low, &lowblk)) return corrupt(where + " low key block out of range");
      if (prev && n->low != EffectiveHigh(prev)) return corrupt(where + " low key differs from its left sibling's high key");
      Entry* e = n->ents();
      bool have_prev = false;
      uint64_t prevk = 0;
      if (level > 0) children.push_back(n->leftmost);
      const uint32_t live = LiveCount(n);
      if (live != CountOf(n) && n->spare_node != n->sibling && !UndoPending(n))
        return corrupt(where + " has records at or above its high key outside a split");
      // A node repaired in this (read-write) run holds no ignored slot
      // except a leaf's leading lk run (Repair compacts the rest,
      // shifts complete under the lock): what Start and FindInLocked's
      // binary search rely on. Other nodes may hold a crash's half-done
      // shift until a writer repairs them.
      const bool repaired = !read_only_ && n->gen == gen_;
      uint32_t run = 0;
      if (repaired && level == 0)
        while (run < live && e[run].k == n->lk) run++;
      for (uint32_t j = 0; j < live; j++) {
        if (Ignored(n, j)) {
          if (repaired && j >= run)
            return corrupt(where + " (repaired) has an ignored slot " + std::to_string(j) + " past its lk prefix");
          continue;
        }
        if (BK && e[j].k == kBytesLk) return corrupt(where + " has a record with the byte-key lk");
        Slice blk;
        if (BK && !ViewBlock(e[j].k, &blk)) return corrupt(where + " key block " + std::to_string(e[j].k) + " out of range");
        if (bv_ && level == 0 && !ViewBlock(e[j].v, &blk))
          return corrupt(where + " value block " + std::to_string(e[j].v) + " out of range");
        if (have_prev && Cmp(prevk, KeyOf(e[j].k)) >= 0) return corrupt(where + " records not sorted at " + std::to_string(j));
        if (n->low && Cmp(n->low, KeyOf(e[j].k)) > 0) return corrupt(where + " record below the low key");
        if (n->sibling && Cmp(EffectiveHigh(n), KeyOf(e[j].k)) <= 0) return corrupt(where + " record at or above the high key");
        have_prev = true;
        prevk = e[j].k;
        if (level > 0) {
          Node* c = At(e[j].v);
          if (!c || c->level + 1 != level) return corrupt(where + " child on the wrong level");
          if (Cmp(c->low, KeyOf(e[j].k)) != 0) return corrupt(where + " separator differs from the child's low key");
          children.push_back(e[j].v);
        } else {
          records++;
        }
      }
    }
    if (up != upper.size())
      return corrupt("level " + std::to_string(level) + ": child " + std::to_string(upper[up]) +
                     " listed by the parents is missing from the sibling chain, out of order or listed twice");
    if (level == 0) break;
    upper = std::move(children);
    first = At(first->leftmost);
    if (!first) return corrupt("internal node without leftmost child");
    if (first->level + 1 != level) return corrupt("leftmost child of level " + std::to_string(level) + " on the wrong level");
  }
  // Every record reachable from the root exactly where the chain has it.
  for (Node* n = LeftmostAt(0); n; n = At(n->sibling)) {
    Entry* e = n->ents();
    const uint32_t live = LiveCount(n);
    for (uint32_t j = 0; j < live; j++) {
      if (Ignored(n, j)) continue;
      const SK key = KeyOf(e[j].k);
      Node* l = Descend(0, key, nullptr);
      if (l == Bad()) return corrupt("descent to a record fails (a cycle of links, or a child on the wrong level)");
      while (l->sibling && Cmp(EffectiveHigh(l), key) <= 0) l = At(l->sibling);
      if (l != n) {
        // Only allowed where a crash interrupted a split before the old
        // node's high key moved: readers find the copy there.
        uint32_t pos;
        const bool copy = l->spare_node == l->sibling && l->sibling && l->gen != gen_ && FindInLocked(l, key, &pos) &&
                          l->ents()[pos].v == e[j].v;
        if (!copy) return corrupt("record in node " + std::to_string(Off(n)) + " is reached in node " + std::to_string(Off(l)));
      }
    }
  }
  if (records != Size()) return corrupt("record count mismatch");
  return Status::OK();
}

template <bool BK>
Status FastFair<BK>::ForEachOwnedBlock(const std::function<void(uint64_t)>& fn) {
  if (closed_) return IndexClosed();
  fn(*pool_->root_slot());
  if (meta_->spare_root && meta_->spare_root != meta_->root) fn(meta_->spare_root);
  if (meta_->limbo) {
    fn(meta_->limbo);
    limbo_->ForEachUsed([&](const kit::RetireSlot& s) {
      if (LimboLinked(s)) return;
      fn(s.block);
      if (const uint64_t k = LimboKeyBlock(s)) fn(k);
    });
  }
  if (meta_->blocks) {
    fn(meta_->blocks);
    blocks_->ForEachUsed([&](const kit::RetireSlot& s) {
      if (s.tag && BlockLinked(s)) return;  // (a read-only open: the record owns it)
      fn(s.block);
    });
  }
  std::vector<uint64_t> blocks;
  for (Node* first = At(meta_->root); first;) {
    const uint32_t level = first->level;
    kit::BoundedWalk steps = Walk();
    for (Node* n = first; n; n = At(n->sibling)) {
      if (!Step(steps) || n->level != level) return CorruptWalk("block enumeration");
      fn(Off(n));
      if (n->spare_node && n->spare_node != n->sibling) fn(n->spare_node);
      blocks.clear();
      Entry* e = n->ents();
      if (n->level == 0) {
        if (BK && n->low) blocks.push_back(n->low);
        const uint32_t live = LiveCount(n);
        for (uint32_t j = 0; j < live; j++) {
          if (Ignored(n, j)) continue;
          if (BK) blocks.push_back(e[j].k);
          if (bv_) blocks.push_back(e[j].v);
        }
      }
      for (uint64_t sp : {n->spare_a, n->spare_b})
        if (sp && !Referenced(n, sp)) blocks.push_back(sp);
      std::sort(blocks.begin(), blocks.end());
      blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
      for (uint64_t b : blocks) fn(b);
    }
    first = level ? At(first->leftmost) : nullptr;
    if (first && first->level + 1 != level) return CorruptWalk("block enumeration");
  }
  return Status::OK();
}

template Status FastFair<false>::Check();
template Status FastFair<true>::Check();
template Status FastFair<false>::ForEachOwnedBlock(const std::function<void(uint64_t)>&);
template Status FastFair<true>::ForEachOwnedBlock(const std::function<void(uint64_t)>&);

}  // namespace pmindex::internal::fastfair
