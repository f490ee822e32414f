// fptree_node_test.cc: the pool-free pieces of the FPTree family on plain
// buffers: one leaf (fptree_leaf.h: fingerprint match, slot search, free
// slot and home line, the scan-order hint's encoding) and one DRAM inner
// node (fptree_inner.h: search, insert, remove, split, the OLC wrappers).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "fptree/fptree_inner.h"
#include "fptree/fptree_leaf.h"

namespace pmindex::internal::fptree {
namespace {

struct LeafBuf {
  explicit LeafBuf(const LeafLayout& lay) : lay(lay), p(static_cast<char*>(std::aligned_alloc(64, lay.bytes))) {
    std::memset(p, 0, lay.bytes);
  }
  ~LeafBuf() { std::free(p); }
  void Put(int slot, uint64_t key) {
    *lay.Key(p, slot) = key;
    if (lay.fp) *LeafLayout::Fp(p, slot) = FpU64(key);
    *LeafLayout::Bm(p) |= 1ull << slot;
  }
  LeafLayout lay;
  char* p;
};

TEST(FPTreeLeaf, GeometryMatchesTheFormat) {
  const LeafLayout f = LeafLayout::Of(true, 56), p = LeafLayout::Of(false, 64);
  EXPECT_EQ(f.bytes, 64u + 14 * 64 + 64);
  EXPECT_EQ(f.trailer, 64u + 14 * 64);
  EXPECT_EQ(f.home_lines, 14u);
  EXPECT_EQ(f.full, (1ull << 56) - 1);
  EXPECT_EQ(p.bytes, 64u + 8 * 64 + 8 * 64 + 64);
  EXPECT_EQ(p.val_off, 64u + 8 * 64);
  EXPECT_EQ(p.full, ~0ull);
  EXPECT_EQ(p.home_lines, 0u);
}

TEST(FPTreeLeaf, FindSlotProbesOnlyFingerprintMatches) {
  for (bool fp : {true, false}) {
    const LeafLayout lay = LeafLayout::Of(fp, fp ? 56 : 64);
    LeafBuf l(lay);
    for (int i = 0; i < int(lay.m); i += 3) l.Put(i, 1000 + uint64_t(i));
    const uint64_t bm = *LeafLayout::Bm(l.p);
    for (int i = 0; i < int(lay.m); i++) {
      const SKey k = MakeKey<false>(U64Slice(1000 + uint64_t(i)));
      int probes = 0;
      int s = FindSlot(lay, l.p, bm, k.fp, [&](int j) {
        probes++;
        return *lay.Key(l.p, j) == k.u;
      });
      EXPECT_EQ(s, i % 3 == 0 ? i : -1) << i;
      if (fp) {
        EXPECT_LE(probes, 3) << "fingerprints should filter almost every slot";
      }
    }
    if (fp) {
      const uint64_t m = FpMatch(l.p, FpU64(1000));
      EXPECT_TRUE(m & 1);
    }
  }
}

TEST(FPTreeLeaf, FreeSlotPrefersTheHomeLine) {
  const LeafLayout lay = LeafLayout::Of(true, 56);
  EXPECT_EQ(FreeSlotFor(lay, 0, 3), 12);
  EXPECT_EQ(FreeSlotFor(lay, 0xFull << 12, 3), 0);  // home line full: first free slot
  EXPECT_EQ(FreeSlotFor(lay, (0xFull << 12) ^ (1ull << 14), 3), 14);
  SKey k;
  k.home = 0xFFFF;
  EXPECT_EQ(HomeLine(lay, k), 13u);
  k.home = 0;
  EXPECT_EQ(HomeLine(lay, k), 0u);
}

TEST(FPTreeLeaf, HintRoundTripsAndRejectsWrongSlotSets) {
  const LeafLayout lay = LeafLayout::Of(false, 64);
  LeafBuf l(lay);
  for (int cnt : {2, 7, 8, 9, 33, 64}) {
    std::vector<uint8_t> ord(static_cast<size_t>(cnt), 0);
    uint64_t bm = 0;
    for (int j = 0; j < cnt; j++) {
      ord[size_t(j)] = uint8_t((j * 37 + 5) % 64);
      bm |= 1ull << ord[size_t(j)];
    }
    ASSERT_EQ(__builtin_popcountll(bm), cnt);
    StoreHint(lay, l.p, ord.data(), cnt);
    uint8_t got[64];
    ASSERT_TRUE(LoadHint(lay, l.p, bm, cnt, got)) << cnt;
    for (int j = 0; j < cnt; j++) EXPECT_EQ(got[j], ord[size_t(j)]);
    const uint64_t other = bm ^ (1ull << ord[0]) ^ (bm == ~0ull ? 0 : (1ull << __builtin_ctzll(~bm)));
    if (other != bm) {
      EXPECT_FALSE(LoadHint(lay, l.p, other, cnt, got)) << cnt;
    }
  }
}

struct InnerBuf {
  explicit InnerBuf(uint32_t cap, bool bottom) {
    n = static_cast<Inner*>(std::aligned_alloc(64, Inner::Bytes(cap)));
    std::memset(static_cast<void*>(n), 0, Inner::Bytes(cap));
    n->cap = cap;
    n->bottom = bottom;
  }
  ~InnerBuf() { std::free(n); }
  Inner* n;
};

SKey U(uint64_t k) {
  SKey s;
  s.u = k;
  return s;
}

TEST(FPTreeInner, InsertSearchRemoveSplit) {
  InnerBuf a(8, true), b(8, true);
  Inner* n = a.n;
  n->child()[0].store(100);
  for (uint64_t k : {50, 10, 30, 70, 20, 60, 40}) {
    const uint32_t i = UpperBound<false>(n, U(k));
    InsertAt(n, i, k, 100 + k);
  }
  ASSERT_EQ(n->count.load(), 7u);
  for (uint32_t i = 1; i < 7; i++) EXPECT_LT(n->keys()[i - 1].load(), n->keys()[i].load());
  EXPECT_EQ(UpperBound<false>(n, U(5)), 0u);
  EXPECT_EQ(UpperBound<false>(n, U(10)), 1u);
  EXPECT_EQ(UpperBound<false>(n, U(35)), 3u);
  EXPECT_EQ(UpperBound<false>(n, U(99)), 7u);
  EXPECT_EQ(n->child()[UpperBound<false>(n, U(35))].load(), 130u);
  EXPECT_EQ(RemoveAt(n, 3), 30u);  // child 130 and key 30: its range goes left
  EXPECT_EQ(n->child()[UpperBound<false>(n, U(35))].load(), 120u);
  const uint64_t sep = SplitInto(n, b.n);  // keys 10 20 40 50 60 70
  EXPECT_EQ(sep, 50u);
  EXPECT_EQ(n->count.load(), 3u);
  EXPECT_EQ(b.n->count.load(), 2u);
  EXPECT_EQ(b.n->child()[0].load(), 150u);
  EXPECT_EQ(b.n->keys()[0].load(), 60u);
}

TEST(FPTreeInner, OlcVersionsAndObsoleteNodes) {
  InnerBuf a(4, true);
  uint64_t v = 0;
  ASSERT_TRUE(Olc<true>::ReadLock(a.n, &v));
  ASSERT_TRUE(Olc<true>::Upgrade(a.n, v));
  uint64_t r = 0;
  EXPECT_FALSE(Olc<true>::ReadLock(a.n, &r));
  Olc<true>::WriteUnlock(a.n);
  EXPECT_FALSE(Olc<true>::Validate(a.n, v));
  ASSERT_TRUE(Olc<true>::ReadLock(a.n, &r));
  ASSERT_TRUE(Olc<true>::Upgrade(a.n, r));
  Olc<true>::ObsoleteUnlock(a.n);
  EXPECT_FALSE(Olc<true>::ReadLock(a.n, &r));
  // The single-threaded variants compile the protocol away.
  EXPECT_TRUE(Olc<false>::ReadLock(a.n, &r));
  EXPECT_TRUE(Olc<false>::Validate(a.n, 12345));
}

}  // namespace
}  // namespace pmindex::internal::fptree
