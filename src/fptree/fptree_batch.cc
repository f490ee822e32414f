// fptree/fptree_batch.cc: FPTree::FindMany, the batched lookup behind
// KV::get_many. Not in the FPTree paper: it is group prefetching (Chen,
// Ailamaki, Gibbons, Mowry, "Improving hash join performance through
// prefetching", ICDE 2004) applied to the find of sec. 4.3 / alg. 5.
//
// A batch is cut into groups of kGroup keys. The lookups of a group advance
// in lock step, one tree level per pass: in each pass every lane searches
// the node it stands on (whose lines the previous pass prefetched) and
// prefetches the child it goes to next, so the misses of up to kGroup
// descents are in flight together instead of one after another. At the
// bottom a lane prefetches its leaf's line 0, the key's home line and
// (fptree) the leaf's version word; the next pass probes the leaves. Byte
// values take one more pass: the probe prefetches the value block, the last
// pass copies it.
//
// Each lane follows the protocol of a single Find (fptree_tree.h's Descend
// and FindLeafT, fptree.cc's Find) step for step: a node is read-locked
// before it is searched and validated after its child's version has been
// read; the leaf's version is read while the bottom node is still valid and
// validated after the slot and value have been read. The whole group runs
// under one epoch guard, so no node or leaf a lane holds can be freed under
// it. The lanes differ from Find only in what happens on a conflict: a lane
// that meets a locked or obsolete node or leaf, or fails a validation, drops
// out of the group and is answered by a plain Find afterwards (which waits
// and retries as usual). So every answer is one a Find could have given at
// some instant during the call: each lookup is linearizable on its own; the
// batch is not a snapshot.
//
// Persist order: none; nothing here writes to PM (or to DRAM state other
// than this thread's probe counter).
//
// Thread safety: as Find. fptree: any thread, concurrently with every other
// operation; fptree_single and ptree: one thread at a time.
#include <algorithm>

#include "fptree/fptree_tree.h"

namespace pmindex::internal::fptree {

namespace {
// Lookups in flight together. Each lane's leaf step costs two or three
// prefetched lines, so 16 lanes stay within what a core's miss buffers and
// the L2 prefetch queue absorb.
constexpr size_t kGroup = 16;

enum class Lane : uint8_t {
  kDescend,  // n read-locked at v; next: enter cn (if set), search n
  kLeaf,     // leaf chosen under bottom node n (at v) and prefetched
  kValue,    // byte value: slot found, its block prefetched
  kDone,     // answered
  kSlow,     // conflict: answered by Find after the group
};
}  // namespace

template <bool kConc, bool kBytes>
void FPTree<kConc, kBytes>::FindMany(const Slice* keys, size_t n, std::string* values, Status* statuses) {
  if (closed_) {
    for (size_t i = 0; i < n; i++) statuses[i] = Status::InvalidArgument("index closed");
    return;
  }
  struct State {
    SKey k;
    Inner* n;    // node read-locked at v (kDescend), bottom node (kLeaf)
    Inner* cn;   // child to enter before searching (kDescend; nullptr: none)
    uint64_t v;  // version of n
    uint64_t leaf;
    uint64_t lv;  // leaf version (kValue)
    uint64_t w;   // value word (kValue)
    Lane s;
  };
  State st[kGroup];
  for (size_t base = 0; base < n; base += kGroup) {
    const size_t m = std::min(kGroup, n - base);
    const Slice* ks = keys + base;
    std::string* vs = values + base;
    Status* ss = statuses + base;
    bool slow = false;
    {
      EpochGuard g(epoch_, kConc);
      Inner* root = root_inner_.load(std::memory_order_acquire);
      uint64_t rv = 0;
      const bool root_ok = Olc::ReadLock(root, &rv) && (!kConc || root == root_inner_.load(std::memory_order_acquire));
      size_t descending = 0;
      for (size_t j = 0; j < m; j++) {
        State& x = st[j];
        Status vk = ValidateKey(key_kind(), max_key_, ks[j]);
        if (!vk.ok()) {
          ss[j] = vk;
          x.s = Lane::kDone;
          continue;
        }
        x.k = MakeKey(ks[j]);
        x.n = root;
        x.cn = nullptr;
        x.v = rv;
        x.s = root_ok ? Lane::kDescend : Lane::kSlow;
        descending += root_ok;
      }
      // The descents, one level per pass.
      while (descending > 0) {
        for (size_t j = 0; j < m; j++) {
          State& x = st[j];
          if (x.s != Lane::kDescend) continue;
          if (x.cn) {
            uint64_t cv = 0;
            if (!Olc::ReadLock(x.cn, &cv) || !Olc::Validate(x.n, x.v)) {
              x.s = Lane::kSlow;
              descending--;
              continue;
            }
            x.n = x.cn;
            x.v = cv;
            x.cn = nullptr;
          }
          const uint32_t i = UpperBound<kBytes>(x.n, x.k);
          const uint64_t c = x.n->child()[i].load(std::memory_order_acquire);
          if (x.n->bottom) {
            char* l = L(c);
            __builtin_prefetch(l);
            if (lay_.home_lines > 1) __builtin_prefetch(HomeLineAddr(l, x.k));
            if constexpr (kConc) __builtin_prefetch(Ver(l));
            x.leaf = c;
            x.s = Lane::kLeaf;
            descending--;
          } else {
            x.cn = reinterpret_cast<Inner*>(c);
            PrefetchInner(x.cn);
          }
        }
      }
      // The leaf probes (Find's loop body, once).
      bool values_pending = false;
      for (size_t j = 0; j < m; j++) {
        State& x = st[j];
        if (x.s != Lane::kLeaf) continue;
        char* l = L(x.leaf);
        const uint64_t lv = LeafVersion(l);
        if ((kConc && kit::VersionLock::Busy(lv)) || !Olc::Validate(x.n, x.v)) {
          x.s = Lane::kSlow;
          continue;
        }
        const int slot = FindSlot(l, Ld(Bm(l)), x.k);
        if (slot < 0) {
          if (LeafValidate(l, lv)) {
            ss[j] = Status::NotFound();
            x.s = Lane::kDone;
          } else {
            x.s = Lane::kSlow;
          }
          continue;
        }
        const uint64_t w = Ld(Val(l, slot));
        if (vbytes_) {
          // The block is read in the next pass; a stale w from a racing
          // writer only costs a useless prefetch (and fails validation).
          __builtin_prefetch(base_ + w);
          x.lv = lv;
          x.w = w;
          x.s = Lane::kValue;
          values_pending = true;
          continue;
        }
        if (!LeafValidate(l, lv)) {
          x.s = Lane::kSlow;
          continue;
        }
        vs[j].resize(8);
        std::memcpy(vs[j].data(), &w, 8);
        ss[j] = Status::OK();
        x.s = Lane::kDone;
      }
      if (values_pending) {
        for (size_t j = 0; j < m; j++) {
          State& x = st[j];
          if (x.s != Lane::kValue) continue;
          char* l = L(x.leaf);
          std::string tmp;
          const bool ok = ReadBlock(x.w, max_value_, &tmp);
          if (!LeafValidate(l, x.lv)) {
            x.s = Lane::kSlow;
            continue;
          }
          ss[j] = ok ? Status::OK() : Status::Corrupt("fptree: bad value block");
          if (ok) vs[j] = std::move(tmp);
          x.s = Lane::kDone;
        }
      }
      for (size_t j = 0; j < m; j++) slow |= st[j].s == Lane::kSlow;
    }
    if (slow) {
      for (size_t j = 0; j < m; j++)
        if (st[j].s == Lane::kSlow) ss[j] = Find(ks[j], &vs[j]);
    }
  }
}

#define FPT_INSTANTIATE(C, B) template void FPTree<C, B>::FindMany(const Slice*, size_t, std::string*, Status*);
FPT_INSTANTIATE_ALL(FPT_INSTANTIATE)
#undef FPT_INSTANTIATE

}  // namespace pmindex::internal::fptree
