// fastfair_read.cc: the readers of the FAST & FAIR tree: Find, Scan, Size,
// lock-free (paper sec. 5, Algorithm 3) and under leaf read locks.
//
// Lock-free readers (read_committed=0) take no lock. Byte keys and
// values are read in place: a block an Update or Remove unlinks is freed
// only after the epoch grace period (fastfair_retire.cc), and a reader
// reads only blocks named by records it loaded inside its guard. A leaf search scans in the direction given by the node's switch
// counter `sw` (even: inserts, scan left to right; odd: deletes and left
// inserts, right to left), reads each candidate record as left key, key,
// value, left key, key (ReadValid, fastfair_tree.h), retries if `sw`
// changed, and checks the fence again before answering "not found". A
// range scan copies each leaf into a snapshot validated by `sw`, the lk and
// the sibling link read before and after the records, and emits records
// only from validated snapshots. A lock-free leaf search or snapshot that
// fails validation kLockFreeTries times in a row (a leaf that writers keep
// changing: the tail leaf of an ascending ingest) reads that leaf once under
// its read lock instead, so a reader's work is bounded. Locked readers
// (read_committed=1) hold one leaf's read lock at a
// time and restart from the root when a leaf was merged away (dead).
//
// Durable answers: a lock-free answer (a record found, a key found absent,
// a scanned leaf) is made durable before it is returned if a writer holds
// the leaf, which may have made its commit store visible before its fence
// (DurableAnswer, fastfair_tree.h; docs/fastfair.md "Durable reads"). With
// no writer on the leaf that costs one load of its DRAM lock word.
//
// Invariants relied on: the validity rule and I2 (fastfair_format.h); a
// valid record's value is never changed by a shift; splits store sibling
// before cutting count, merges grow count before storing sibling; every
// split and merge adds 2 to sw. Readers store nothing to PM (they may
// flush lines writers stored, see above).
//
// Thread safety: any number of readers concurrently with writers, each
// inside an epoch guard (nodes a merge unlinks are freed only after it).
#include "fastfair/fastfair_tree.h"

namespace pmindex::internal::fastfair {

// Failed validations of one leaf before a lock-free reader reads it under
// the leaf's read lock (writers hold the write lock for every store to a
// node, so what it reads then is consistent).
constexpr uint32_t kLockFreeTries = 32;

template <bool BK>
Status FastFair<BK>::Find(Slice key, std::string* value) {
  if (__builtin_expect(closed_, 0)) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, key));
  EpochGuard eg(epoch_);
  const SK sk = MakeSK(key);
  Node* n = Descend(0, sk, nullptr);
  if (__builtin_expect(n == Bad(), 0)) return CorruptWalk("descent");
  uint64_t v = 0;
  if (!locked_reads_) {
    bool bad = false;
    if (!SearchLeafLF(n, sk, &v, &bad)) return bad ? CorruptWalk("move right") : Status::NotFound();
    if (!value) return Status::OK();
    // A value block is read in place: the guard keeps it allocated even if
    // an Update or Remove unlinks it now (fastfair_retire.cc).
    if (bv_) return ReadBlockTo(v, value);
    value->assign(reinterpret_cast<const char*>(&v), 8);
    return Status::OK();
  }
  n = ReadLockLeaf(n, sk);
  if (n == Bad()) return CorruptWalk("leaf walk");
  uint32_t pos;
  Status st = FindInLocked(n, sk, &pos) ? Status::OK() : Status::NotFound();
  if (st.ok() && value) {
    v = n->ents()[pos].v;
    if (bv_) st = ReadBlockTo(v, value);
    else value->assign(reinterpret_cast<const char*>(&v), 8);
  }
  RUnlock(n);
  return st;
}

template <bool BK>
Status FastFair<BK>::Scan(Slice start, size_t limit, ScanCallback cb, size_t* count) {
  if (count) *count = 0;
  if (__builtin_expect(closed_, 0)) return IndexClosed();
  PMINDEX_RETURN_IF_ERROR(ValidateKey(key_kind(), opts_.max_key_size, start));
  if (limit == 0) return Status::OK();
  EpochGuard eg(epoch_);
  // A write from the callback must not wait for this guard to end
  // (ClaimBlocks): only trees with blocks to retire.
  ScanMark mark(this, BK || bv_);
  SK sk = MakeSK(start);
  size_t c = 0;
  if (!locked_reads_) return bv_ ? ScanLF<true>(sk, limit, cb, count) : ScanLF<false>(sk, limit, cb, count);
  Node* n = ReadLockLeaf(Descend(0, sk, nullptr), sk);
  if (n == Bad()) return CorruptWalk("descent");
  std::vector<std::pair<std::string, std::string>> buf;
  bool emitted = false;  // the last key handed out, across leaves
  uint64_t last_emitted = 0;  // (u64 keys)
  std::string last_key;       // (byte keys)
  std::string restart_key;    // (byte keys) sk's storage after a restart
  bool excl = false;          // skip keys <= sk (restart after last_key)
  kit::BoundedWalk walk = Walk();
  for (uint64_t leaves = 0; c < limit;) {
    buf.clear();
    Entry* e = n->ents();
    const uint32_t cnt = LiveCount(n);
    Status bad;  // a key or value block out of range (kit/pm_block.h)
    for (uint32_t j = 0; j < cnt && buf.size() < limit - c; j++) {
      if (Ignored(n, j)) continue;
      std::string ks, vs;
      int c0;
      if constexpr (BK) {
        if (!(bad = ReadBlockTo(e[j].k, &ks)).ok()) break;
        c0 = CompareKeys(KeyKind::kBytes, ks, sk);
      } else {
        c0 = Cmp(e[j].k, sk);
        ks.assign(reinterpret_cast<const char*>(&e[j].k), 8);
      }
      if (c0 < 0 || (excl && c0 == 0)) continue;
      if (!bv_) vs.assign(reinterpret_cast<const char*>(&e[j].v), 8);
      else if (!(bad = ReadBlockTo(e[j].v, &vs)).ok()) break;
      buf.emplace_back(std::move(ks), std::move(vs));
    }
    uint64_t next = n->sibling;
    RUnlock(n);
    if (!bad.ok()) {
      if (count) *count = c;
      return bad;
    }
    for (auto& [k, v] : buf) {
      ++c;
      emitted = true;
      if constexpr (!BK) last_emitted = SliceToU64(k);
      else last_key = k;
      if (!cb(k, v)) {
        if (count) *count = c;
        return Status::OK();
      }
    }
    if (!next || c >= limit) break;
    // Leaves visited, restarts included: each leaf once, and a restart
    // (on a distinct dead leaf) revisits at most one: <= 2x the nodes, so
    // one step of the bound per two leaves.
    if ((++leaves & 1) == 0 && !Step(walk)) {
      if (count) *count = c;
      return CorruptWalk("leaf chain");
    }
    n = At(next);
    RLock(n);
    if (Ld(&n->dead)) {
      // Merged into its left sibling since we read the link: continue
      // strictly after the last key handed out by ANY leaf so far (u64:
      // from its successor; byte keys have no successor word, so from the
      // key itself, exclusive). (The leaf just read may have been empty:
      // restarting from its last key, or from the start key, would return
      // records twice and out of order.)
      RUnlock(n);
      if (emitted) {
        if constexpr (!BK) {
          if (last_emitted == UINT64_MAX) break;
          sk = last_emitted + 1;
        } else {
          restart_key = last_key;
          sk = Slice(restart_key);
          excl = true;
        }
      }
      n = ReadLockLeaf(Descend(0, sk, nullptr), sk);
      if (n == Bad()) {
        if (count) *count = c;
        return CorruptWalk("descent");
      }
    }
  }
  if (count) *count = c;
  return Status::OK();
}

// The lock-free scan, for byte values (kBV) or u64 values: each leaf is
// copied into a snapshot validated by its switch counter (SnapshotLeafLF),
// then its records are handed out from the snapshot, outside the node.
// Byte keys and values are handed out in place (the guard keeps their
// blocks allocated: fastfair_retire.cc).
template <bool BK>
template <bool kBV>
Status FastFair<BK>::ScanLF(const SK& sk, size_t limit, ScanCallback& cb, size_t* count) {
  size_t c = 0;
  auto done = [&](Status st) {
    if (count) *count = c;
    return st;
  };
  // On the stack (a thread_local vector cost a __tls_get_addr call per
  // leaf: 3.7% of a pmbench scan profile).
  Entry buf[kMaxCap];
  // Records handed out so far are < lo; keys >= lo come next (u64: the
  // successor of the last key handed out, or the start key). Byte keys:
  // keys >= lo_key come next, > lo_key once one was handed out (excl).
  uint64_t lo = 0;
  Slice lo_key;
  bool excl = false;
  if constexpr (BK) lo_key = sk;
  else lo = sk;
  Node* n = DescendForScan(sk, limit);
  if (__builtin_expect(n == Bad(), 0)) return done(CorruptWalk("descent"));
  for (kit::BoundedWalk walk = Walk(); n && c < limit;) {
    // Every leaf goes through a validated snapshot before anything is
    // emitted. (Emitting records while scanning would lose records: a
    // delete that starts during the scan flips sw and shifts records
    // left past the reader, and the records emitted already cannot be
    // taken back, so a rescan would skip the shifted ones as <= last.)
    uint32_t nbuf;
    uint64_t left;  // the snapshot's lk: slot 0 is ignored if equal
    Node* next = SnapshotLeafLF(n, buf, &nbuf, &left);
    // Filter and emit in one pass: skip ignored records (equal to their
    // left neighbour) and keys below lo.
    for (uint32_t i = 0; i < nbuf; i++) {
      const uint64_t k = buf[i].k;
      Slice ks;
      if constexpr (BK) {
        const bool skip = k == left || k == kBytesLk;
        left = k;
        if (skip) continue;
        if (!ViewBlock(k, &ks)) return done(kit::BlockOutOfRange(k, pool_->size()));
        const int c0 = CompareKeys(KeyKind::kBytes, ks, lo_key);
        if (c0 < 0 || (excl && c0 == 0)) continue;
      } else {
        const bool skip = k == left || k < lo;
        left = k;
        if (skip) continue;
        ks = U64Slice(buf[i].k);
      }
      Slice vs;
      if constexpr (kBV) {
        if (!ViewBlock(buf[i].v, &vs)) return done(kit::BlockOutOfRange(buf[i].v, pool_->size()));
      } else {
        vs = U64Slice(buf[i].v);
      }
      ++c;
      if constexpr (BK) {
        if (!cb(ks, vs) || c >= limit) return done(Status::OK());
        lo_key = ks;
        excl = true;
      } else {
        if (!cb(ks, vs) || c >= limit || k == UINT64_MAX) return done(Status::OK());
        lo = k + 1;
      }
    }
    if (__builtin_expect(!Step(walk), 0)) return done(CorruptWalk("leaf chain"));
    n = next;
  }
  return done(Status::OK());
}

template <bool BK>
uint64_t FastFair<BK>::Size() {
  if (closed_) return 0;
  EpochGuard eg(epoch_);  // walks nodes a concurrent merge may retire
  uint64_t total = 0;
  // Each leaf under its read lock, as the locked scan reads it: LiveCount
  // reads the links, the high key and keys with plain loads (written for
  // quiescent or locked callers) and compares byte keys. Unlocked, a
  // Size() (or Stats()) concurrent with writers would race with the
  // writers' stores (conformance_concurrency_test,
  // SizeDuringSplitsAndDeletions). A count taken while writers run is
  // approximate; a quiescent one is exact. On a corrupt pool whose leaf
  // chain cannot be walked (no leftmost leaf, a cycle: BoundedWalk) it
  // is 0: Size() has no error channel, Check() reports the corruption.
  Node* n = LeftmostAt(0);
  if (n == Bad()) return 0;
  for (kit::BoundedWalk walk = Walk(); n;) {
    if (!Step(walk)) return 0;
    RLock(n);
    const uint32_t c = LiveCount(n);
    for (uint32_t j = 0; j < c; j++) total += !Ignored(n, j);
    Node* next = At(n->sibling);
    RUnlock(n);
    n = next;
  }
  return total;
}

// Descend(0, key) for a lock-free scan of `limit` records. The scan
// walks the leaf chain, and each leaf's header is a dependent load (its
// address is the previous leaf's sibling word): with the next leaf
// prefetched only once the current one is reached, 79% of the scan's own
// samples sat on that load (perf, fastfair_interleave). So the leaves the
// level-1 node lists after the chosen one are prefetched now, all at
// once (their first two lines: header and first records; the snapshot
// prefetches the rest of the next leaf). The parent's words are read
// with acquire loads but used as prefetch addresses only: a stale or
// torn word costs a useless prefetch (prefetches never fault).
template <bool BK>
Node* FastFair<BK>::DescendForScan(const SK& key, size_t limit) {
  Node* n = At(Ld(&meta_->root));
  kit::BoundedWalk walk = Walk();
  for (uint32_t lv = n->level; lv > 0; lv--) {
    Node* from = n;
    Node* c = NavChild(n, key, nullptr, walk, &from);
    if (__builtin_expect(!c || c->level != lv - 1, 0)) return Bad();
    if (from->level == 1) {
      Entry* e = from->ents();
      const uint32_t cnt = std::min(Ld(&from->count), cap_);
      const uint64_t co = Off(c);
      uint32_t j = 0;
      if (Ld(&from->leftmost) != co) {
        while (j < cnt && Ld(&e[j].v) != co) j++;
        j++;
      }
      // Leaves needed at a fill of a third (the merge threshold keeps
      // most leaves above it), at most kScanHints.
      const uint32_t want = std::min<size_t>(kScanHints, limit / std::max<uint32_t>(1, cap_ / 3) + 1);
      for (uint32_t h = 0; j < cnt && h < want; j++, h++) {
        const uint64_t v = Ld(&e[j].v);
        if (v && v < max_off_) {  // (no pointer past the mapping)
          const char* p = base_ + v;
          __builtin_prefetch(p);
          __builtin_prefetch(p + 64);
        }
      }
    }
    n = c;
  }
  return n;
}

// Bad() (nothing locked) on a corrupt pool, or if n is Bad().
template <bool BK>
Node* FastFair<BK>::ReadLockLeaf(Node* n, const SK& key) {
  if (__builtin_expect(n == Bad(), 0)) return n;
  RLock(n);
  // Restarts (each on a distinct node merged away) and the moves right
  // of one attempt are bounded separately.
  for (kit::BoundedWalk restarts = Walk(), steps = Walk();;) {
    if (Ld(&n->dead)) {
      RUnlock(n);
      n = Descend(0, key, nullptr);
      if (n == Bad() || !Step(restarts)) return Bad();
      steps = Walk();
      RLock(n);
      continue;
    }
    // (high == 0 with a sibling: only a read-only open after a crash that
    // kept count and high of a merge's commit line but not the sibling,
    // r being rightmost; n holds r's records then. As in MoveRight.)
    uint64_t s = n->sibling;
    if (s && n->high && Cmp(n->high, key) <= 0) {
      RUnlock(n);
      if (!Step(steps)) return Bad();
      n = At(s);
      RLock(n);
      continue;
    }
    return n;
  }
}

// Lock-free leaf search, Algorithm 3 with the
// mirrored validity rule. Returns with the value of key, or false (and
// *bad set if the moves right went round a cycle: kit::BoundedWalk).
template <bool BK>
bool FastFair<BK>::SearchLeafLF(Node* n, const SK& key, uint64_t* out, bool* bad) {
  kit::BoundedWalk walk = Walk();
  // Moves n right if key >= its high key: true if it moved, or if the walk
  // went round a cycle (*bad).
  auto right = [&] {
    uint64_t s;
    if (!MoveRight(n, key, &s)) return false;
    if (Step(walk)) n = At(s);
    else *bad = true;
    return true;
  };
  for (uint32_t tries = 0;;) {
    if (__builtin_expect(++tries > kLockFreeTries, 0)) {
      // Under the read lock no writer holds the leaf: the answer is durable.
      lf_lock_fallbacks_.fetch_add(1, std::memory_order_relaxed);
      n = ReadLockLeaf(n, key);
      if (n == Bad()) {
        *bad = true;
        return false;
      }
      uint32_t pos;
      const bool found = FindInLocked(n, key, &pos);
      if (found) *out = n->ents()[pos].v;
      RUnlock(n);
      return found;
    }
    if (right()) {
      if (*bad) return false;
      continue;
    }
    const uint64_t sw = Ld(&n->sw);
    Entry* e = n->ents();
    const bool lag = MayLag(n);
    bool found = false;
    uint64_t val = 0;
    uint32_t at = 0;  // the found record's slot
    // Slot j holds key (loaded as k1): take it if it is valid (ReadValid).
    auto take = [&](uint32_t j, uint64_t k1) {
      found = ReadValid(n, e, j, k1, &val);
      at = j;
      return found;
    };
    if (!(sw & 1)) {
      // Byte keys: a slot equal to the key loaded in the previous step is
      // skipped, unless that key matched and failed ReadValid (see below;
      // it is only a filter; a match is confirmed with fresh
      // loads, ReadValid; a word that is no block, e.g. a torn view of
      // the prefix's kBytesLk, compares as the empty key, below every
      // key, and bounds-checked). u64 keys (the same
      // answers as testing each key against the previous one, with fewer
      // instructions on the common path): a key below `key` is passed, a slot holding lk (the
      // prefix, or slot 0 ignored in flight; a u64 lk may sort above key)
      // is passed, any other larger key ends the scan. An ignored slot
      // other than lk equals the key just read before it, which did not
      // end the scan, so it is below key (passed) or a copy of key, which
      // ReadValid refuses (the scan goes on to the record itself). The
      // count is re-read per slot: an insert shift moves the last record
      // past the count it had when the scan began.
      uint64_t prev = Ld(&n->lk);
      const uint64_t lk = prev;
      const fastfair::TestHooks* const hooks = hooks_;
      if (__builtin_expect(hooks != nullptr, 0) && hooks->lf_forward_start) hooks->lf_forward_start(n);
      for (uint32_t j = 0; j < CountLF(n, lag); j++) {
        uint64_t k1 = Ld(&e[j].k);
        if (__builtin_expect(hooks != nullptr, 0) && hooks->lf_forward_key) hooks->lf_forward_key(n, j);
        if constexpr (BK) {
          const bool dup = k1 == prev;
          prev = k1;
          if (dup) continue;  // (locked: a real ignored record)
        } else {
          if (k1 < key) continue;
          if (k1 != key) {
            if (k1 == lk) continue;  // (a u64 lk may sort above key)
            break;
          }
        }
        const int c = Cmp(k1, key);
        if (c == 0 ? take(uint32_t(j), k1) : c > 0) break;
        // Byte keys: the key matched but its record was not valid any
        // more (take failed): a right shift moved it on, k[j] = k[j-1]
        // after our load of k[j], so slot j+1 now holds the very block we
        // loaded, and it is the record itself, valid. The filter above
        // would skip it as a copy of slot j (and a NotFound would follow,
        // with sw unchanged: the shift is an insert in insert mode). So
        // the next slot is not filtered: 0 is never a key word (offset 0
        // is the pool header; lk is kBytesLk).
        if constexpr (BK) {
          if (c == 0) prev = 0;
        }
      }
      // lk is loaded once, before the scan: an insert of a key equal to
      // lk (FixLk raises lk to a free value, with no shift and so no sw
      // flip when the leaf has no prefix, then the right shift stores
      // k[0] = the new lk before its commit) can show slot 0 holding a
      // new lk above key, which the loop above took for a larger key and
      // stopped at, with sw unchanged: Find(3) in {1, 2, 3, 5} while 0 is
      // inserted would answer NotFound. FixLk's release
      // store of lk precedes that k[0] store, so a reader that saw it
      // sees the new lk here, and scans again.
      if (!found && Ld(&n->lk) != lk) continue;
    } else {
      for (int64_t j = int64_t(CountLF(n, lag)) - 1; j >= 0; j--) {
        uint64_t k1 = Ld(&e[j].k);
        uint64_t p = j ? Ld(&e[j - 1].k) : Ld(&n->lk);
        if (k1 == p) continue;
        const int c = Cmp(k1, key);
        if (c == 0 ? take(uint32_t(j), k1) : c < 0) break;
      }
    }
    if (Ld(&n->sw) != sw) continue;
    if (found) {
      DurableAnswer(n, &e[at], sizeof(Entry));  // the record's line
      *out = val;
      return true;
    }
    // Fence re-check before answering "not found". The check at the top
    // ran before sw was loaded, and a split bumps sw only after its cut
    // (sibling/high, then count, then sw, all release stores), so a split
    // can complete between that check and the sw load, or be seen half
    // done (count cut, or slot m made an ignored copy, with sw not yet
    // bumped): the scan then misses the upper half and sw validates. Every
    // split store a scan can observe comes after the split's stores of
    // sibling and high, so these later acquire loads see the new fence,
    // and key >= high sends the reader right (without this re-check a
    // never-touched key can be reported missing: SplitRacingWithDelete).
    if (right()) {
      if (*bad) return false;
      continue;
    }
    // Absent: a delete's commit may be what hid the key. The node's header
    // (count) and every slot up to the count's I2 copies.
    DurableAnswer(n, n, sizeof(Node) + std::min(Ld(&n->count) + 2, cap_) * sizeof(Entry));
    return false;
  }
}

// Lock-free snapshot of the record slots of leaf n, in order; returns the
// next leaf. One pass copies count, lk and every
// (k, v); a second pass re-reads every key, count, lk, sw and the link,
// and the snapshot is taken only if nothing changed. Why that suffices
// (instead of validating each record with five loads, ReadValid):
// writers hold the node's lock, so one operation at a time changes it.
// A right insert grows count and a delete shrinks it; a delete leaves sw
// odd and a right insert (append included) after it makes sw even, so
// count back at its old value with sw unchanged would need no delete and
// no right insert in between; splits and merges add 2 to sw, FixLk
// changes lk, a repair adds 2 to sw. What remains with count, sw and lk
// equal in both passes are left inserts (InsertLeft changes
// neither count nor sw once sw is odd), any number of them: each stores
// into a slot's key word only a key above the one it replaces (a moved
// record's key over the ignored copy of its left neighbour, or over lk
// in the prefix; the new key over the copy of the record before it), and
// lk is written back only by deletes and right inserts; byte-key blocks
// are freed only by deletes. So no key word returns to an earlier value
// (no ABA), within one shift or across several. Equal keys in both
// passes therefore mean no key store hit
// the node in between, and a value read in the first pass belongs to the
// record its key names: a value rewritten by a shift is rewritten while
// the slot is ignored, and making it valid again stores a key (in the
// slot or its left neighbour) after the value (release), which the
// second pass sees. Values changed by an update are the record's own.
// The link is loaded before AND after the records, and must not change:
// a split stores sibling before it cuts count (a new count read implies
// the new link after it), a merge grows count before it stores sibling
// (a new link read before implies the grown count). Reading it only
// after the records, a scan could take the old count of a merge's left
// node and its new link, and skip the merged node's records.
// `snap` has room for cap_ records; *nout gets the number of slots
// copied, *lk_out the lk they go with (the caller skips ignored records:
// equal to their left neighbour, slot 0's being lk).
template <bool BK>
Node* FastFair<BK>::SnapshotLeafLF(Node* n, Entry* snap, uint32_t* nout, uint64_t* lk_out) {
  Entry* e = n->ents();
  for (uint32_t tries = 0;;) {
    if (__builtin_expect(++tries > kLockFreeTries, 0)) {
      // Under the read lock no writer stores to n: one pass is a snapshot.
      lf_lock_fallbacks_.fetch_add(1, std::memory_order_relaxed);
      RLock(n);
      const uint32_t c = std::min(CountLF(n, MayLag(n)), cap_);
      for (uint32_t j = 0; j < c; j++) snap[j] = e[j];
      *nout = c;
      *lk_out = n->lk;
      const uint64_t next = n->sibling;
      RUnlock(n);
      return At(next);
    }
    const uint64_t sw = Ld(&n->sw);
    const uint64_t next1 = Ld(&n->sibling);
    if (next1) PrefetchNode(At(next1));  // the scan goes on there next
    const uint64_t lk = Ld(&n->lk);
    const bool lag = MayLag(n);
    const uint32_t c = std::min(CountLF(n, lag), cap_);
    for (uint32_t j = 0; j < c; j++) {
      snap[j].k = Ld(&e[j].k);
      snap[j].v = Ld(&e[j].v);
    }
    const fastfair::TestHooks* const hooks = hooks_;
    if (__builtin_expect(hooks != nullptr, 0) && hooks->lf_snapshot_copied) hooks->lf_snapshot_copied(n);
    // Second pass: any difference (no early exit: a branch-free OR of
    // the differences is cheaper than a test per key).
    uint64_t diff = (std::min(CountLF(n, lag), cap_) ^ c) | (Ld(&n->lk) ^ lk);
    for (uint32_t j = 0; j < c; j++) diff |= Ld(&e[j].k) ^ snap[j].k;
    const uint64_t next = Ld(&n->sibling);
    if (diff || next != next1 || Ld(&n->sw) != sw) continue;
    // The snapshot's records and what hid any others: the header and the
    // slots read (docs/fastfair.md, "Durable reads").
    DurableAnswer(n, n, sizeof(Node) + std::min(c + 2, cap_) * sizeof(Entry));
    *nout = c;
    *lk_out = lk;
    return At(next);
  }
}
#define PMINDEX_FASTFAIR_READ(BK)                                                                  \
  template Status FastFair<BK>::Find(Slice, std::string*);                                         \
  template Status FastFair<BK>::Scan(Slice, size_t, ScanCallback, size_t*);                        \
  template uint64_t FastFair<BK>::Size();                                                          \
  template Node* FastFair<BK>::ReadLockLeaf(Node*, const SK&);

PMINDEX_FASTFAIR_READ(false)
PMINDEX_FASTFAIR_READ(true)
#undef PMINDEX_FASTFAIR_READ

}  // namespace pmindex::internal::fastfair
