// NVC-Hashmap link tags (format 6, docs/nvc_hashmap.md "Layout"): a tag's
// decision is sound (a search stops only before a node that sorts past its
// target) and decides most searches within a bucket; every link to a
// regular node carries a tag that matches it after inserts, removes and
// crash recovery; pools of format 5 (no tags) open, work and
// stay untagged; a format 6 pool whose links have tag 0 (unknown) works and
// gains tags; a wrong tag hides a node from searches and Check and recovery
// report it.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "nvc_hashmap/nvc_hashmap.h"
#include "nvc_hashmap/nvc_test_util.h"

namespace pmindex {
namespace {

namespace nvc = internal::nvc;
using nvc_test::ExpectNoLeak;
using nvc_test::MakeKey;
using nvc_test::MakeValue;
using nvc_test::MarkUnclean;
using nvc_test::Opts;
using nvc_test::PoolFile;

// Up to this many records the table keeps its 1024 initial buckets, all in
// segment 0 (load factor 2), which is all LinkWalk follows.
constexpr uint64_t kRecords = 1500;

// A closed pool opened raw, its root, and a walk over the link words of the
// list (bucket 0's slot first). fn(word, node): node is the regular node the
// word links to, nullptr for a bucket link (kEnd excluded).
struct RawPool {
  explicit RawPool(const std::string& path) {
    pm::PoolOptions po;
    EXPECT_TRUE(pm::Pool::Open(path, "", po, &p).ok());
    root = reinterpret_cast<nvc::Root*>(p->base() + *p->root_slot());
  }
  ~RawPool() { EXPECT_TRUE(p->Close().ok()); }
  void LinkWalk(const std::function<void(uint64_t* w, nvc::CompactNode* n)>& fn) {
    char* base = p->base();
    auto* seg0 = reinterpret_cast<uint64_t*>(base + root->seg[0]);
    uint64_t* w = seg0;
    for (;;) {
      const uint64_t raw = *w;
      if (raw & nvc::kBucketLink) {
        const uint64_t b = nvc::LinkBucket(raw);
        if (b == 0) return;
        ASSERT_LT(b, root->seg0) << "the walk follows segment 0 only";
        fn(w, nullptr);
        w = seg0 + b;
        continue;
      }
      auto* n = reinterpret_cast<nvc::CompactNode*>(base + (raw & ~(nvc::kLow | nvc::kTagMask)));
      fn(w, n);
      w = &n->next;
    }
  }
  std::unique_ptr<pm::Pool> p;
  nvc::Root* root = nullptr;
};

struct TagCounts {
  uint64_t tagged = 0, untagged = 0, wrong = 0, bucket_tagged = 0;
};
TagCounts CountTags(const std::string& path) {
  TagCounts c;
  RawPool rp(path);
  rp.LinkWalk([&](uint64_t* w, nvc::CompactNode* n) {
    const uint64_t tag = *w & nvc::kTagMask;
    if (!n) {
      c.bucket_tagged += tag != 0;
      return;
    }
    if (!tag) c.untagged++;
    else if (!nvc::TagMatches(*w, n->so)) c.wrong++;
    else c.tagged++;
  });
  return c;
}

uint32_t VersionOf(const std::string& path) { return RawPool(path).root->version; }

// Inserts ids [from, to), removes every 5th of them, checks every id below
// `to` (removed ones absent), Check and no leak.
void Exercise(Index* idx, ValueKind vk, uint64_t from, uint64_t to) {
  const KeyKind kk = KeyKind::kU64;
  for (uint64_t i = from; i < to; i++) ASSERT_TRUE(idx->Insert(MakeKey(kk, i), MakeValue(vk, i, 0)).ok()) << i;
  for (uint64_t i = from; i < to; i += 5) ASSERT_TRUE(idx->Remove(MakeKey(kk, i)).ok()) << i;
  std::string v;
  for (uint64_t i = 0; i < to; i++) {
    const Status s = idx->Find(MakeKey(kk, i), &v);
    if (i % 5 == 0) {
      EXPECT_TRUE(s.IsNotFound()) << i;
    } else {
      ASSERT_TRUE(s.ok()) << i << " " << s.ToString();
      EXPECT_EQ(v, MakeValue(vk, i, 0));
    }
  }
  const Status cs = idx->Check();
  ASSERT_TRUE(cs.ok()) << cs.ToString();
  ExpectNoLeak(idx);
}

Status CreateWithVersion(const Options& o, uint32_t version, std::unique_ptr<Index>* idx) {
  nvc_hashmap_testing::SetCreateFormatVersion(version);
  const Status s = OpenIndex("nvc_hashmap", o, idx);
  nvc_hashmap_testing::SetCreateFormatVersion(0);
  return s;
}

// Soundness: whenever TagAbove decides, the successor sorts past the target
// (random keys, every window start). Effect: for keys of one bucket of a
// table of 2^L buckets (top L bits shared), with the window an insert
// picks, nearly every successor above the target is decided.
TEST(NvcTagWindow, DecidesSoundlyAndWithinABucket) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 400000; i++) {
    uint64_t a = rng() | 1, b = rng() | 1, t = rng() | 1;
    if (a > b) std::swap(a, b);
    if (t < a) std::swap(t, a);
    if (a == b || a == t) continue;
    const int s = int(4 * (rng() % (nvc::kMaxTagJ + 1)));
    const uint64_t tag = nvc::TagOf(b, s);
    ASSERT_TRUE(nvc::TagMatches(tag, b));
    if (nvc::TagAbove(tag, a, t)) {
      ASSERT_GT(b, t) << a << " " << b << " " << t << " s=" << s;
    }
  }
  for (int l : {4, 10, 16, 19, 24, 31}) {
    const int s = nvc::TagShift(uint64_t(1) << l);
    EXPECT_LE(s, l);
    EXPECT_GT(s, l - 4);
    const uint64_t prefix = rng() & ~(~uint64_t(0) >> l);
    uint64_t above = 0, decided = 0;
    for (int i = 0; i < 100000; i++) {
      uint64_t a = prefix | ((rng() >> l) | 1), b = prefix | ((rng() >> l) | 1), t = prefix | ((rng() >> l) | 1);
      if (a > b) std::swap(a, b);
      if (t < a) std::swap(t, a);
      if (a == b || a == t || b <= t) continue;
      above++;
      const bool d = nvc::TagAbove(nvc::TagOf(b, s), a, t);
      decided += d;
    }
    EXPECT_GT(decided, above * 99 / 100) << "l=" << l << " s=" << s;
  }
}

class Tags : public testing::TestWithParam<ValueKind> {};

// Links carry their node's tag after inserts and removes, after a clean
// reopen and after crash recovery; bucket links carry none.
TEST_P(Tags, EveryLinkToANodeCarriesItsTag) {
  const ValueKind vk = GetParam();
  PoolFile pf("tags");
  Options o = Opts(pf.path, KeyKind::kU64, vk, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  Exercise(idx.get(), vk, 0, kRecords / 2);
  idx.reset();
  o.create_if_missing = false;
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash);
    const TagCounts c = CountTags(pf.path);
    EXPECT_EQ(c.wrong, 0u);
    EXPECT_EQ(c.bucket_tagged, 0u);
    // Tables of >= 16 buckets write windows from bit 4 on: never tag 0.
    EXPECT_EQ(c.untagged, 0u);
    EXPECT_GT(c.tagged, kRecords / 3);
    if (crash) MarkUnclean(pf.path);
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    EXPECT_EQ(idx->Stats().recovery_seconds > 0, crash);
    ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
    idx.reset();
  }
  EXPECT_EQ(VersionOf(pf.path), 7u);
}

// A format 5 pool (links without tags) opens clean and after a crash,
// works, keeps its version and gets no tags (a version 5 build can still
// open it).
TEST_P(Tags, Version5PoolOpensAndStaysUntagged) {
  const ValueKind vk = GetParam();
  PoolFile pf("v5");
  Options o = Opts(pf.path, KeyKind::kU64, vk, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(CreateWithVersion(o, 5, &idx).ok());
  Exercise(idx.get(), vk, 0, kRecords / 3);
  idx.reset();
  o.create_if_missing = false;
  uint64_t next = kRecords / 3;
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash);
    if (crash) MarkUnclean(pf.path);
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    EXPECT_EQ(idx->Stats().recovery_seconds > 0, crash);
    Exercise(idx.get(), vk, next, next + kRecords / 3);
    next += kRecords / 3;
    idx.reset();
    EXPECT_EQ(VersionOf(pf.path), 5u);
    const TagCounts c = CountTags(pf.path);
    EXPECT_EQ(c.tagged + c.wrong + c.bucket_tagged, 0u);
    EXPECT_GT(c.untagged, kRecords / 3);
  }
}

// A format 6 pool (whose free slab slots may hold unlinked unmarked nodes)
// is recovered by the list walk, never the slab scan, works after it and
// keeps its version (a version 6 build can still open it).
TEST(NvcHashmapTags, Version6PoolIsWalkedAndKeepsItsVersion) {
  PoolFile pf("v6walk");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(CreateWithVersion(o, 6, &idx).ok());
  Exercise(idx.get(), ValueKind::kU64, 0, kRecords / 3);
  const uint64_t size = idx->Size();
  idx.reset();
  o.create_if_missing = false;
  MarkUnclean(pf.path);
  ASSERT_TRUE(OpenIndex("", o, &idx).ok());
  EXPECT_GT(idx->Stats().recovery_seconds, 0);
  EXPECT_FALSE(nvc_hashmap_testing::RecoveryScanned(idx.get()));
  EXPECT_EQ(idx->Size(), size);
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  Exercise(idx.get(), ValueKind::kU64, kRecords / 3, 2 * kRecords / 3);
  idx.reset();
  EXPECT_EQ(VersionOf(pf.path), 6u);
}

// A format 6 pool whose links all have tag 0 (unknown): searches load the
// nodes, Check accepts it, and new links are tagged.
TEST_P(Tags, UntaggedLinksInAVersion6PoolWork) {
  const ValueKind vk = GetParam();
  PoolFile pf("v6untagged");
  Options o = Opts(pf.path, KeyKind::kU64, vk, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(CreateWithVersion(o, 5, &idx).ok());
  Exercise(idx.get(), vk, 0, kRecords / 2);
  idx.reset();
  {
    RawPool rp(pf.path);
    pm::Store(&rp.root->version, 6u);
    pm::Persist(&rp.root->version, 4);
  }
  o.create_if_missing = false;
  ASSERT_TRUE(OpenIndex("", o, &idx).ok());
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  Exercise(idx.get(), vk, kRecords / 2, kRecords);
  idx.reset();
  const TagCounts c = CountTags(pf.path);
  EXPECT_EQ(c.wrong + c.bucket_tagged, 0u);
  EXPECT_GT(c.tagged, kRecords / 4);
  EXPECT_GT(c.untagged, kRecords / 4);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Tags, testing::Values(ValueKind::kU64, ValueKind::kBytes),
                         [](const auto& info) { return std::string(info.param == ValueKind::kU64 ? "U64" : "Bytes"); });

// Picks the first link to a regular node with a tag whose window is not all
// ones.
uint64_t* FirstTaggedLink(RawPool& rp, nvc::CompactNode** node) {
  uint64_t* found = nullptr;
  rp.LinkWalk([&](uint64_t* w, nvc::CompactNode* n) {
    if (!found && n && (*w & nvc::kTagMask) && ((*w >> nvc::kTagShift) & 0xfff) != 0xfff) {
      found = w;
      *node = n;
    }
  });
  return found;
}

// A tag whose window is above its node's makes searches stop before the node
// (it is not loaded: the key is not found); Check reports the tag, and so
// does crash recovery by the list walk (the slab scan reads no tags). A tag on a bucket link, and any tag in a format 5
// pool, are reported too.
TEST(NvcHashmapTags, WrongTagsAreReported) {
  PoolFile pf("wrongtag");
  Options o = Opts(pf.path, KeyKind::kU64, ValueKind::kU64, {});
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
  for (uint64_t i = 0; i < 1000; i++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, i), nvc_test::U64(i)).ok());
  idx.reset();
  o.create_if_missing = false;
  // Check (after a clean open) and recovery (the pool marked unclean) both
  // report `what`; the pool is left clean.
  auto expect_reported = [&](const std::string& what) {
    ASSERT_TRUE(OpenIndex("", o, &idx).ok());
    Status s = idx->Check();
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    EXPECT_NE(s.ToString().find(what), std::string::npos) << s.ToString();
    idx.reset();
    MarkUnclean(pf.path);
    nvc_hashmap_testing::SetForceWalkRecovery(true);
    s = OpenIndex("", o, &idx);
    nvc_hashmap_testing::SetForceWalkRecovery(false);
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    EXPECT_NE(s.ToString().find(what), std::string::npos) << s.ToString();
    idx.reset();
    RawPool rp(pf.path);
    pm::StoreAtomic(&rp.root->clean, uint64_t(1));
    pm::Persist(&rp.root->clean, 8);
  };
  auto persist_all = [](RawPool& rp) { pm::Persist(rp.p->base(), rp.p->size()); };
  std::string key;
  uint64_t good = 0, wrong = 0;
  {
    RawPool rp(pf.path);
    nvc::CompactNode* n = nullptr;
    uint64_t* w = FirstTaggedLink(rp, &n);
    ASSERT_NE(w, nullptr);
    key = nvc_test::U64(n->key);
    good = *w;
    wrong = good | (uint64_t(0xfff) << nvc::kTagShift);  // the window all ones
    pm::Store(w, wrong);
    persist_all(rp);
  }
  ASSERT_TRUE(OpenIndex("", o, &idx).ok());
  EXPECT_TRUE(idx->Find(key, nullptr).IsNotFound()) << "the search stops on the tag without loading the node";
  idx.reset();
  expect_reported("carries tag " + std::to_string(wrong >> nvc::kTagShift) + ", not a window");
  // The right tag back, then a tag on a bucket link.
  {
    RawPool rp(pf.path);
    uint64_t* restored = nullptr;
    uint64_t* bucket_link = nullptr;
    rp.LinkWalk([&](uint64_t* w, nvc::CompactNode* n) {
      if (n && nvc_test::U64(n->key) == key) restored = w;
      if (!n && !bucket_link) bucket_link = w;
    });
    ASSERT_NE(restored, nullptr);
    ASSERT_NE(bucket_link, nullptr);
    pm::Store(restored, good);
    pm::Store(bucket_link, *bucket_link | (uint64_t(1) << nvc::kTagShift));
    persist_all(rp);
  }
  ASSERT_TRUE(OpenIndex("", o, &idx).ok());
  EXPECT_TRUE(idx->Find(key, nullptr).ok());
  idx.reset();
  expect_reported("bucket link");
  // No tag on bucket links again, and version 5: its (right) tags would be
  // misread by a version 5 build.
  {
    RawPool rp(pf.path);
    rp.LinkWalk([&](uint64_t* w, nvc::CompactNode* n) {
      if (!n) pm::Store(w, *w & ~nvc::kTagMask);
    });
    pm::Store(&rp.root->version, 5u);
    persist_all(rp);
  }
  expect_reported("version without tags");
}

}  // namespace
}  // namespace pmindex
