// fastfair_prefix_crash_test: every crash state of ONE operation in the pm
// model (docs/persistence.md: a crash keeps, for each cache line, a prefix
// of the 8-byte stores made to it since its last flush+fence), after
// pre-operations that are durable. The simulator of fastfair_crash_test only builds whole-line images at
// fences, which cannot reach the states of the count's lag (the count and
// the shift's last line share one fence; docs/fastfair.md, "The count's
// fence"). Each image is opened read-only (acknowledged keys, the operation
// in flight all-or-nothing, no phantom in a scan, Size == scan, Check) and
// read-write (the same, plus the leak check), then a write repairs the node
// and everything is checked again.
//
// The cases are the shapes where the lag rule (`Pushed`) meets lk: an
// insert at slot 0 of a one-record node (byte keys sorting below the pool
// header's bytes, u64 keys below a raised lk), an append into an emptied
// node whose lk is above the new key, the removal of slot 0 of a
// two-record node; and middle/end inserts and removals, both key kinds,
// 256- and 512-byte nodes.
#include <sys/stat.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fastfair/fastfair.h"
#include "fastfair/fastfair_line_prefix.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/pm/allocator.h"

namespace {

using namespace pmindex;
using fftest::U64;

struct Op {
  bool insert;
  std::string k, v;
};
struct Case {
  std::string name;
  bool bk, bv;
  int node_size;
  std::vector<Op> pre;
  Op fin;
  bool left = false;  // the final op must be a left insert (format 4)
};

uint64_t U64Of(const std::string& s) {
  uint64_t v = 0;
  std::memcpy(&v, s.data(), std::min<size_t>(8, s.size()));
  return v;
}

// Checks one opened image against the acknowledged records `must` (the
// state before the final operation `fin`). `post` is a key the caller
// inserted after the open (empty: none). Returns "" or what is wrong.
std::string CheckIndex(Index* idx, const Case& c, const std::map<std::string, std::string>& must,
                       const std::string& post, const std::string& post_v) {
  std::string err;
  for (const auto& [k, v] : must) {
    if (k == c.fin.k) continue;
    std::string got;
    Status f = idx->Find(k, &got);
    if (!f.ok() || got != v) err += " acknowledged key lost (" + f.ToString() + ");";
  }
  std::string got;
  Status f = idx->Find(c.fin.k, &got);
  auto it = must.find(c.fin.k);
  if (f.ok()) {
    const std::string& want = c.fin.insert ? c.fin.v : (it == must.end() ? std::string() : it->second);
    if (got != want) err += " the key in flight has a wrong value;";
  } else if (!f.IsNotFound()) {
    err += " Find of the key in flight: " + f.ToString() + ";";
  }
  size_t n = 0;
  std::string last;
  const std::string start = c.bk ? std::string(1, '\x01') : U64(0);
  Status s = idx->Scan(start, 1u << 20, [&](Slice k, Slice v) {
    const std::string ks(k), vs(v);
    auto m = must.find(ks);
    const bool ok = (m != must.end() && m->second == vs && ks != c.fin.k) ||
                    (ks == c.fin.k && vs == (c.fin.insert ? c.fin.v : (m == must.end() ? "" : m->second))) ||
                    (!post.empty() && ks == post && vs == post_v);
    if (!ok) err += " phantom or wrong record in the scan;";
    if (n && !(c.bk ? last < ks : U64Of(last) < U64Of(ks))) err += " scan not ascending;";
    last = ks;
    n++;
    return true;
  });
  if (!s.ok()) err += " Scan: " + s.ToString() + ";";
  if (idx->Size() != n) err += " Size " + std::to_string(idx->Size()) + " != scan " + std::to_string(n) + ";";
  Status ck = idx->Check();
  if (!ck.ok()) err += " Check: " + ck.ToString() + ";";
  return err;
}

std::string VerifyImage(const std::string& path, const Options& base, const Case& c,
                        const std::map<std::string, std::string>& must) {
  std::string err;
  Options o = base;
  o.pool_path = path;
  {
    Options ro = o;
    ro.read_only = true;
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("fastfair", ro, &idx);
    if (!s.ok()) return "read-only open: " + s.ToString();
    std::string e = CheckIndex(idx.get(), c, must, "", "");
    if (!e.empty()) err += " read-only:" + e;
  }
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("fastfair", o, &idx);
  if (!s.ok()) return err + " open: " + s.ToString();
  std::string e = CheckIndex(idx.get(), c, must, "", "");
  if (!e.empty()) err += " after open:" + e;
  testing::AssertionResult leak = fftest::NoLeak(idx.get());
  if (!leak) err += std::string(" after open: ") + leak.message();
  // A write repairs the node (and counts a record pushed past its count).
  const std::string post = c.bk ? std::string("\x7f-post") : U64(7777777);
  const std::string post_v = c.bv ? std::string("post-value") : U64(99);
  Status w = idx->Insert(post, post_v);
  if (!w.ok()) err += " post insert: " + w.ToString();
  e = CheckIndex(idx.get(), c, must, post, post_v);
  if (!e.empty()) err += " after a write:" + e;
  leak = fftest::NoLeak(idx.get());
  if (!leak) err += std::string(" after a write: ") + leak.message();
  return err;
}

// Runs the case; returns the number of crash images checked. Adds a test
// failure (at most a few messages) for every bad image.
int RunCase(const Case& c) {
  fftest::PoolGuard g("prefix");
  fftest::PoolGuard gi("prefix-img");
  Options o = fftest::MakeOptions(g.path, c.bk ? KeyKind::kBytes : KeyKind::kU64,
                                  c.bv ? ValueKind::kBytes : ValueKind::kU64, c.node_size);
  o.pool_size = 2ull << 20;
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("fastfair", o, &idx);
  if (!s.ok()) {
    ADD_FAILURE() << c.name << ": create: " << s.ToString();
    return 0;
  }
  std::map<std::string, std::string> must;
  for (const Op& p : c.pre) {
    Status ps = p.insert ? idx->Insert(p.k, p.v) : idx->Remove(p.k);
    EXPECT_TRUE(ps.ok()) << c.name << ": pre-op: " << ps.ToString();
    if (p.insert) must[p.k] = p.v;
    else must.erase(p.k);
  }
  pm::Pool* pool = idx->pool();
  std::string durable(pool->base(), pool->size());  // every pre-op is durable
  struct stat st;
  EXPECT_EQ(::stat(g.path.c_str(), &st), 0);
  const uint64_t left0 = internal::fastfair::GetDebugCounters(idx.get())->left_inserts;
  fftest::LineRecorder rec(pool);
  pm::SetObserver(&rec);
  Status fs = c.fin.insert ? idx->Insert(c.fin.k, c.fin.v) : idx->Remove(c.fin.k);
  pm::SetObserver(nullptr);
  EXPECT_TRUE(fs.ok()) << c.name << ": final op: " << fs.ToString();
  if (c.left) {
    EXPECT_EQ(internal::fastfair::GetDebugCounters(idx.get())->left_inserts, left0 + 1) << c.name;
  }

  const fftest::LinePrefixRun run = fftest::ForEachLinePrefixImage(
      durable, uint64_t(st.st_size), rec.events, gi.path, c.name, [&] { return VerifyImage(gi.path, o, c, must); });
  const int images = run.images, bad = run.bad;
  EXPECT_EQ(bad, 0) << c.name << ": " << bad << " of " << images << " crash images are bad";
  idx.reset();
  return images;
}

Op Ins(const std::string& k, const std::string& v) { return {true, k, v}; }
Op Rem(const std::string& k) { return {false, k, ""}; }
std::string UV(uint64_t k) { return U64(k * 1000 + 1); }
std::string BV(const std::string& k) { return "value-of-" + k; }

// u64 keys 0 and 1 raise lk to 2 (FixLk), then both are removed.
std::vector<Op> RaisedLkEmptied(bool bv) {
  auto v = [&](uint64_t k) { return bv ? BV(std::to_string(k)) : UV(k); };
  return {Ins(U64(0), v(0)), Ins(U64(1), v(1)), Rem(U64(0)), Rem(U64(1))};
}

TEST(FastFairPrefixCrash, InsertAtSlot0OfOneRecordNode) {
  int images = 0;
  for (int ns : {256, 512}) {
    for (bool bv : {false, true}) {
      // u64: lk (2) above the one record (1), then an insert at slot 0.
      auto pre = RaisedLkEmptied(bv);
      pre.push_back(Ins(U64(1), bv ? BV("1") : UV(1)));
      images += RunCase({"u64 slot0 lk>R ns=" + std::to_string(ns), false, bv, ns, pre,
                         Ins(U64(0), bv ? BV("0") : UV(0))});
    }
    // Byte keys sorting below the pool header's bytes ("MINDEX1...").
    images += RunCase({"bytes B then A ns=" + std::to_string(ns), true, true, ns, {Ins("B", "vB")}, Ins("A", "vA")});
    images += RunCase({"bytes binary ns=" + std::to_string(ns), true, false, ns,
                       {Ins(std::string("\x01\x09", 2), U64(9))}, Ins(std::string("\x01\x02", 2), U64(2))});
  }
  EXPECT_GT(images, 100);
}

TEST(FastFairPrefixCrash, AppendIntoEmptiedNodeBelowLk) {
  int images = 0;
  for (int ns : {256, 512})
    for (bool bv : {false, true})
      images += RunCase({"u64 append into empty, key < lk ns=" + std::to_string(ns), false, bv, ns,
                         RaisedLkEmptied(bv), Ins(U64(1), bv ? BV("1") : UV(1))});
  EXPECT_GT(images, 100);
}

TEST(FastFairPrefixCrash, RemoveSlot0OfTwoRecordNode) {
  int images = 0;
  for (int ns : {256, 512}) {
    images += RunCase({"bytes remove A of A,B ns=" + std::to_string(ns), true, true, ns,
                       {Ins("A", "vA"), Ins("B", "vB")}, Rem("A")});
    // u64: lk raised to 3 above both records.
    images += RunCase({"u64 remove slot0 of 2, lk>R ns=" + std::to_string(ns), false, false, ns,
                       {Ins(U64(0), UV(0)), Ins(U64(1), UV(1)), Ins(U64(2), UV(2)), Rem(U64(0))}, Rem(U64(1))});
  }
  EXPECT_GT(images, 50);
}

// Middle and end inserts and removals (shifts over several lines).
TEST(FastFairPrefixCrash, MiddleAndEndShifts) {
  int images = 0;
  for (int ns : {256, 512}) {
    for (bool bk : {false, true}) {
      std::vector<Op> pre;
      auto key = [&](int i) {
        char b[16];
        std::snprintf(b, sizeof b, "k%03d", i);
        return bk ? std::string(b) : U64(i);
      };
      auto val = [&](int i) { return bk ? BV(key(i)) : UV(i); };
      for (int i = 1; i <= 6; i++) pre.push_back(Ins(key(10 * i), val(10 * i)));
      const std::string t = (bk ? "bytes" : "u64") + std::string(" ns=") + std::to_string(ns);
      images += RunCase({"insert middle " + t, bk, bk, ns, pre, Ins(key(25), val(25))});
      images += RunCase({"insert slot0 " + t, bk, bk, ns, pre, Ins(key(5), val(5))});
      images += RunCase({"append " + t, bk, bk, ns, pre, Ins(key(70), val(70))});
      images += RunCase({"remove middle " + t, bk, bk, ns, pre, Rem(key(20))});
      images += RunCase({"remove slot0 " + t, bk, bk, ns, pre, Rem(key(10))});
      images += RunCase({"remove last " + t, bk, bk, ns, pre, Rem(key(60))});
      auto pre2 = pre;
      pre2.push_back(Rem(key(60)));  // I2 after a removal of the last record
      images += RunCase({"insert after remove last " + t, bk, bk, ns, pre2, Ins(key(35), val(35))});
    }
  }
  EXPECT_GT(images, 500);
}

// Format 4: inserts that shift records LEFT into the lk prefix of a split's
// new sibling (docs/fastfair.md, "Windows"). Ascending keys 10, 20, ...
// fill the root leaf; one below the last splits it (not an append, which
// would not centre), and the new sibling S gets the upper half behind an
// lk prefix of 5/8 of its free slots (256-byte nodes: keys 60-100 and 95
// in slots 3-8; 512: keys 140-260 and 255 in slots 8-21). Then:
// an insert moving one record left, one moving two, one moving several
// across a line, one into the prefix with nothing to move (after the first
// record was removed), a removal behind the prefix, and with no room behind
// the records (count == capacity), a short left shift. (A split of a node
// with a prefix writes a whole node between fences: too many line-prefix
// combinations here; the every-fence tests and pmcheck cover it.)
TEST(FastFairPrefixCrash, LeftShiftsIntoThePrefix) {
  int images = 0;
  for (int ns : {256, 512}) {
    const int cap = (ns - 96) / 16, m = cap / 2;
    const int moved = cap - m, o = moved * 5 / 8;  // as SplitAt
    const int fill = cap - (o + moved + 1);        // appends that fill S's slots
    // Both uniform kinds and the two mixed ones (u64 keys with byte values,
    // byte keys with u64 values).
    for (const auto& kinds : {std::pair{false, false}, {true, true}, {false, true}, {true, false}}) {
      // Plain copies: clang 14 cannot capture structured bindings in lambdas.
      const bool bk = kinds.first, bv = kinds.second;
      auto key = [&](int i) {
        char b[16];
        std::snprintf(b, sizeof b, "k%04d", i);
        return bk ? std::string(b) : U64(i);
      };
      auto val = [&](int i) { return bv ? BV(key(i)) : UV(i); };
      std::vector<Op> pre;
      for (int i = 1; i <= cap; i++) pre.push_back(Ins(key(10 * i), val(10 * i)));
      pre.push_back(Ins(key(10 * cap - 5), val(10 * cap - 5)));  // the split
      const int first = 10 * (m + 1);  // S's first key
      const std::string t = std::string(bk ? "bytes" : "u64") + (bv ? "/bytes" : "/u64") + " ns=" + std::to_string(ns);
      images += RunCase({"left one " + t, bk, bv, ns, pre, Ins(key(first + 5), val(first + 5)), true});
      images += RunCase({"left two " + t, bk, bv, ns, pre, Ins(key(first + 15), val(first + 15)), true});
      auto pre1 = pre;
      pre1.push_back(Ins(key(first + 1), val(first + 1)));  // a left insert: the prefix shrinks by one
      images += RunCase({"left after left " + t, bk, bv, ns, pre1, Ins(key(first + 2), val(first + 2)), true});
      if (ns == 512) images += RunCase({"left across lines " + t, bk, bv, ns, pre, Ins(key(first + 35), val(first + 35)), true});
      auto pre2 = pre;
      pre2.push_back(Rem(key(first)));
      images += RunCase({"left nothing to move " + t, bk, bv, ns, pre2, Ins(key(first), val(first)), true});
      images += RunCase({"remove first behind prefix " + t, bk, bv, ns, pre, Rem(key(first))});
      auto pre3 = pre;
      for (int i = cap + 2; i < cap + 2 + fill; i++) pre3.push_back(Ins(key(10 * i), val(10 * i)));
      images += RunCase({"left at capacity " + t, bk, bv, ns, pre3, Ins(key(first + 5), val(first + 5)), true});
    }
  }
  EXPECT_GT(images, 600);
}

}  // namespace
