// fastfair_prefix_repair_test: crash-made lk prefixes (format 4,
// docs/fastfair.md "Windows") and the writers' lazy repair after a reopen.
//
// A crash makes an lk prefix in ANY leaf: one that kept only the commit
// store of a removal of a leaf's first record (k[s] = lk), or the store
// k[0] = lk of a right insert at slot 0, leaves a leading run of lk slots,
// which Repair keeps as a prefix, also in a leaf that was never centred and
// in a u64 leaf whose lk an earlier FixLk raised into its key range. So
// after a reopen FixLk -> DropPrefix (an insert of a key equal to lk, the
// position moved by Start), left inserts into such a prefix, and merges
// whose left node has one (DropPrefix when a key of the right node equals
// lk, or when the prefix leaves too little room) are reached in leaves the
// live tree never gives a prefix. Each case crashes an operation that
// makes a prefix at every state of the pm model (fastfair_line_prefix.h:
// every prefix of each line's stores since its last fence), opens each
// image read-only, then read-write, and runs writes that must repair or
// drop the prefix (scripted, then a fixed pseudo-random tail), checking
// the contents against a std::map model, Check and the leak check after
// every step. The counters summed over a case's images must show the
// paths were taken (DropPrefix, left inserts, merges).
//
// FixLkCrashStates and MergeDroppingCrashMadePrefixCrashStates start from a
// crash-made prefix made by patching the closed pool (the state a removal
// of the leaf's first record leaves after its commit store, with the
// blocks parked in the spare words as RemoveIn does) and crash the write
// that drops it at every pm-model state: the DropPrefix shift inside FixLk
// and inside a merge (after its separator left the parent, under its limbo
// slot), which fastfair_crash_test's whole-line images cannot split.
// SplitOfLeafWithPrefixCrashStates does the same (sampled) for a split of
// a leaf with a prefix. FFDUMP=1 appends the leaves of a bad image to its
// message.
//
// FastFairPathCrashStates uses the same harness for paths the
// whole-line every-fence tests reached only: a rebalance (split, then
// merge), a byte-key merge whose DropPrefix is for room, and a split whose
// insert goes into the cut node (the fence of its I2 copies).
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/index_util.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_line_prefix.h"
#include "fastfair/fastfair_test_util.h"
#include "pmindex/pm/allocator.h"

namespace {

using namespace pmindex;
using internal::fastfair::DebugCounters;
using internal::fastfair::GetDebugCounters;

struct Op {
  bool insert;
  std::string k, v;
};
using Model = std::map<std::string, std::string>;

struct Case {
  std::string name;
  bool bk, bv;
  int node_size;
  std::vector<Op> pre;
  // Optional: a crash state made by patching the closed pool after `pre`
  // (returns the keys it removed, or an error in *err).
  std::function<std::vector<std::string>(char* base, char* meta, std::string* err)> patch;
  Op fin;                          // crashed at every pm-model state
  std::vector<Op> then;            // after the reopen, checked one by one
  std::vector<std::string> tail_keys;  // a pseudo-random tail of writes on these keys
  int tail_ops = 0;
  uint64_t max_per_point = 0;  // see ForEachLinePrefixImage
  // If >= 0: prefixes the final operation must drop / merges it must make
  // (asserts that the crashed operation takes the path under test).
  int fin_drops = -1, fin_merges = -1, fin_prefix_splits = -1;
  // Optional: more about the final operation's path ("" if it was taken).
  std::function<std::string(const DebugCounters&)> fin_path = nullptr;
};

// Counters summed over the images of a case (after each read-write open).
struct Sums {
  uint64_t images = 0, prefix_drops = 0, left_inserts = 0, merges = 0;
};

std::string Hex(const std::string& k) {
  static const char* d = "0123456789abcdef";
  std::string r;
  for (unsigned char c : k) r += std::string(1, d[c >> 4]) + d[c & 15];
  return r;
}

// The contents of idx equal the model (scan, finds, Size), Check holds.
std::string Compare(Index* idx, const Case& c, const Model& m) {
  std::string err;
  Model got;
  bool asc = true;
  std::string last;
  const std::string start = c.bk ? std::string(1, '\x01') : fftest::U64(0);
  Status s = idx->Scan(start, 1u << 20, [&](Slice k, Slice v) {
    const std::string ks(k);
    if (!got.empty() && !(c.bk ? last < ks : SliceToU64(last) < SliceToU64(ks))) asc = false;
    last = ks;
    got[ks] = std::string(v);
    return true;
  });
  if (!s.ok()) err += " Scan: " + s.ToString() + ";";
  if (!asc) err += " scan not ascending;";
  if (got != m) {
    for (const auto& [k, v] : m) {
      auto it = got.find(k);
      if (it == got.end()) err += " key " + Hex(k) + " missing from the scan;";
      else if (it->second != v) err += " key " + Hex(k) + " has a wrong value in the scan;";
    }
    for (const auto& [k, v] : got)
      if (!m.count(k)) err += " phantom key " + Hex(k) + " in the scan;";
  }
  for (const auto& [k, v] : m) {
    std::string fv;
    Status f = idx->Find(k, &fv);
    if (!f.ok() || fv != v) err += " Find(" + Hex(k) + "): " + (f.ok() ? "wrong value" : f.ToString()) + ";";
  }
  if (idx->Size() != m.size()) err += " Size " + std::to_string(idx->Size()) + " != " + std::to_string(m.size()) + ";";
  Status ck = idx->Check();
  if (!ck.ok()) err += " Check: " + ck.ToString() + ";";
  return err;
}

// The model of an opened image: `must` with the operation in flight applied
// if the image shows it (all-or-nothing is checked by Compare).
Model Outcome(Index* idx, const Case& c, const Model& must) {
  Model m = must;
  std::string v;
  const bool found = idx->Find(c.fin.k, &v).ok();
  if (c.fin.insert && found) m[c.fin.k] = c.fin.v;
  if (!c.fin.insert && !found) m.erase(c.fin.k);
  return m;
}

// Applies op to idx and the model; "" or what went wrong.
std::string Apply(Index* idx, Model* m, const Op& op) {
  const bool present = m->count(op.k) > 0;
  Status s = op.insert ? idx->Insert(op.k, op.v) : idx->Remove(op.k);
  const bool want_ok = op.insert ? !present : present;
  if (s.ok() != want_ok || (!s.ok() && !(op.insert ? s.IsAlreadyExists() : s.IsNotFound())))
    return std::string(op.insert ? " Insert(" : " Remove(") + Hex(op.k) + "): " + s.ToString() + ";";
  if (op.insert && !present) (*m)[op.k] = op.v;
  if (!op.insert) m->erase(op.k);
  return "";
}

std::string DumpLeaves(const std::string& path);
std::string VerifyImage(const std::string& path, const Options& base, const Case& c, const Model& must, Sums* sums) {
  const std::string dump = std::getenv("FFDUMP") ? DumpLeaves(path) : "";
  Options o = base;
  o.pool_path = path;
  std::string err;
  {
    Options ro = o;
    ro.read_only = true;
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("fastfair", ro, &idx);
    if (!s.ok()) return " read-only open: " + s.ToString();
    const std::string e = Compare(idx.get(), c, Outcome(idx.get(), c, must));
    if (!e.empty()) err += " read-only:" + e;
  }
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("fastfair", o, &idx);
  if (!s.ok()) return err + " open: " + s.ToString();
  Model m = Outcome(idx.get(), c, must);
  auto step = [&](const std::string& what) {
    std::string e = Compare(idx.get(), c, m);
    testing::AssertionResult leak = fftest::NoLeak(idx.get());
    if (!leak) e += std::string(" ") + leak.message();
    if (!e.empty()) err += " " + what + ":" + e;
    return e.empty();
  };
  if (!step("after open")) return err + dump;
  for (size_t i = 0; i < c.then.size(); i++) {
    const std::string e = Apply(idx.get(), &m, c.then[i]);
    if (!e.empty()) return err + " write " + std::to_string(i) + ":" + e;
    if (!step("after write " + std::to_string(i))) return err;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < c.tail_ops; i++) {
    const std::string& k = c.tail_keys[rng() % c.tail_keys.size()];
    // Mostly removes of present keys and inserts of absent ones.
    const bool ins = m.count(k) ? rng() % 4 == 0 : rng() % 4 != 0;
    const Op op{ins, k, c.bv ? "tail-value-" + std::to_string(i) : fftest::U64(100000 + i)};
    const std::string e = Apply(idx.get(), &m, op);
    if (!e.empty()) return err + " tail write " + std::to_string(i) + ":" + e;
    if (!step("after tail write " + std::to_string(i))) return err;
  }
  const DebugCounters* d = GetDebugCounters(idx.get());
  sums->images++;
  sums->prefix_drops += d->prefix_drops;
  sums->left_inserts += d->left_inserts;
  sums->merges += d->merges;
  return err;
}

// Walks the leaves of a closed pool (Meta: root at +64; Node: sibling at 0,
// count at +16, level at +20, leftmost at +72, lk at +80, records at +96).
template <typename F>
void ForEachLeaf(char* base, char* meta, F&& fn) {
  char* n = base + *reinterpret_cast<uint64_t*>(meta + 64);
  while (*reinterpret_cast<uint32_t*>(n + 20) != 0) n = base + *reinterpret_cast<uint64_t*>(n + 72);
  for (;;) {
    fn(n);
    const uint64_t sib = *reinterpret_cast<uint64_t*>(n);
    if (!sib) return;
    n = base + sib;
  }
}

// Diagnostics (FFDUMP=1 in the environment): the limbo slots and leaves of
// an image, appended to its error message.
std::string DumpLeaves(const std::string& path) {
  std::unique_ptr<pm::Pool> pool;
  pm::PoolOptions po;
  po.read_only = true;
  if (!pm::Pool::Open(path, "fastfair", po, &pool).ok()) return "cannot open";
  char* base = pool->base();
  char* meta = base + *pool->root_slot();
  std::string out = "root " + std::to_string(*reinterpret_cast<uint64_t*>(meta + 64));
  const uint64_t limbo = *reinterpret_cast<uint64_t*>(meta + 80);
  if (limbo)
    for (int i = 0; i < 1024; i++) {
      uint64_t* ls = reinterpret_cast<uint64_t*>(base + limbo + 16 * i);
      if (ls[0] || ls[1]) out += " limbo[" + std::to_string(i) + "]={r " + std::to_string(ls[0]) + ", l " + std::to_string(ls[1]) + "}";
    }
  ForEachLeaf(base, meta, [&](char* n) {
    auto w = [&](size_t off) { return *reinterpret_cast<uint64_t*>(n + off); };
    const uint32_t count = *reinterpret_cast<uint32_t*>(n + 16);
    out += "\n leaf " + std::to_string(n - base) + " sib " + std::to_string(w(0)) + " high " + std::to_string(w(8)) +
           " count " + std::to_string(count) + " sw " + std::to_string(w(24)) + " gen " + std::to_string(w(56)) +
           " low " + std::to_string(w(64)) + " lk " + std::to_string(w(80)) + " dead " + std::to_string(w(88)) + " k:";
    for (uint32_t j = 0; j < count + 2 && j < 26; j++) out += " " + std::to_string(w(96 + 16 * j));
  });
  return out;
}

// The crash state of Remove(key) of a leaf's first record (slot s, right
// behind its lk prefix [0, s)) that kept its parked spare words (byte
// kinds: persisted before the commit) and the commit store k[s] = lk only.
std::vector<std::string> PatchRemoveCommitOnly(char* base, char* meta, const std::string& key, bool bk, bool bv,
                                               std::string* err) {
  bool done = false;
  ForEachLeaf(base, meta, [&](char* n) {
    if (done) return;
    auto w = [&](size_t off) { return reinterpret_cast<uint64_t*>(n + off); };
    const uint32_t count = *reinterpret_cast<uint32_t*>(n + 16);
    const uint64_t lk = *w(80);
    uint32_t s = 0;
    while (s < count && *w(96 + 16 * s) == lk) s++;
    if (s == count) return;
    const uint64_t kw = *w(96 + 16 * s);
    bool match;
    if (bk) {
      uint32_t len;
      std::memcpy(&len, base + kw, 4);
      match = std::string(base + kw + 4, len) == key;
    } else {
      match = kw == SliceToU64(key);
    }
    if (!match) return;
    if (bk) pm::StorePersist(w(40), kw);                    // spare_a
    if (bv) pm::StorePersist(w(48), *w(96 + 16 * s + 8));  // spare_b
    pm::StorePersist(w(96 + 16 * s), lk);
    done = true;
  });
  if (!done) *err = "no leaf starts with key " + Hex(key);
  return {key};
}

Sums RunCase(const Case& c) {
  Sums sums;
  fftest::PoolGuard g("prefrep");
  fftest::PoolGuard gi("prefrep-img");
  Options o = fftest::MakeOptions(g.path, c.bk ? KeyKind::kBytes : KeyKind::kU64,
                                  c.bv ? ValueKind::kBytes : ValueKind::kU64, c.node_size);
  o.pool_size = 2ull << 20;
  Model must;
  {
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("fastfair", o, &idx);
    if (!s.ok()) {
      ADD_FAILURE() << c.name << ": create: " << s.ToString();
      return sums;
    }
    for (const Op& p : c.pre) {
      const std::string e = Apply(idx.get(), &must, p);
      EXPECT_TRUE(e.empty()) << c.name << ": pre-op" << e;
    }
  }
  if (c.patch) {
    std::unique_ptr<pm::Pool> pool;
    EXPECT_TRUE(pm::Pool::Open(g.path, "fastfair", pm::PoolOptions{}, &pool).ok());
    if (!pool) return sums;
    std::string perr;
    for (const std::string& k : c.patch(pool->base(), pool->base() + *pool->root_slot(), &perr)) must.erase(k);
    EXPECT_TRUE(perr.empty()) << c.name << ": patch: " << perr;
  }
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("fastfair", o, &idx);
  if (!s.ok()) {
    ADD_FAILURE() << c.name << ": reopen: " << s.ToString();
    return sums;
  }
  pm::Pool* pool = idx->pool();
  const std::string durable(pool->base(), pool->size());
  struct stat st;
  EXPECT_EQ(::stat(g.path.c_str(), &st), 0);
  fftest::LineRecorder rec(pool);
  pm::SetObserver(&rec);
  Status fs = c.fin.insert ? idx->Insert(c.fin.k, c.fin.v) : idx->Remove(c.fin.k);
  pm::SetObserver(nullptr);
  EXPECT_TRUE(fs.ok()) << c.name << ": final op: " << fs.ToString();
  if (c.fin_drops >= 0) {
    EXPECT_EQ(GetDebugCounters(idx.get())->prefix_drops, uint64_t(c.fin_drops)) << c.name;
  }
  if (c.fin_prefix_splits >= 0) {
    EXPECT_EQ(GetDebugCounters(idx.get())->prefix_splits, uint64_t(c.fin_prefix_splits)) << c.name;
  }
  if (c.fin_merges >= 0) {
    EXPECT_EQ(GetDebugCounters(idx.get())->merges, uint64_t(c.fin_merges)) << c.name;
  }
  if (c.fin_path) {
    const std::string e = c.fin_path(*GetDebugCounters(idx.get()));
    EXPECT_TRUE(e.empty()) << c.name << ": the final operation did not take the path under test: " << e;
  }
  const fftest::LinePrefixRun run = fftest::ForEachLinePrefixImage(
      durable, uint64_t(st.st_size), rec.events, gi.path, c.name,
      [&] { return VerifyImage(gi.path, o, c, must, &sums); }, c.max_per_point);
  EXPECT_EQ(run.bad, 0) << c.name << ": " << run.bad << " of " << run.images << " crash images are bad";
  std::printf("%s: %d images, prefix drops %llu, left inserts %llu, merges %llu\n", c.name.c_str(), run.images,
              (unsigned long long)sums.prefix_drops, (unsigned long long)sums.left_inserts,
              (unsigned long long)sums.merges);
  return sums;
}

Op Ins(const std::string& k, const std::string& v) { return {true, k, v}; }
Op Rem(const std::string& k) { return {false, k, ""}; }

// Keys and values of one kind: u64 key i, or the byte key "k%04d" (memcmp
// order = numeric order).
struct Kinds {
  bool bk, bv;
  std::string K(int i) const {
    if (!bk) return fftest::U64(uint64_t(i));
    char b[16];
    std::snprintf(b, sizeof b, "k%04d", i);
    return b;
  }
  std::string V(int i) const { return bv ? "value-of-" + std::to_string(i) : fftest::U64(uint64_t(i) * 1000 + 1); }
  Op I(int i) const { return Ins(K(i), V(i)); }
  Op R(int i) const { return Rem(K(i)); }
  std::string Tag(int ns) const {
    return std::string(bk ? "bytes" : "u64") + (bv ? "/bytes" : "/u64") + " ns=" + std::to_string(ns);
  }
  std::vector<std::string> Keys(int lo, int hi) const {
    std::vector<std::string> r;
    for (int i = lo; i <= hi; i++) r.push_back(K(i));
    return r;
  }
};

// One leaf (the leftmost: never centred). u64: keys 0, 1, 2 inserted and
// removed raise its lk to 3 (FixLk), inside its key range; then records
// 10..60. The crashed operation makes a prefix: the removal of the first
// record (10), or an insert at slot 0 (5, a right shift: its last stores
// are k[0] = lk, then the record). Writes after the reopen: an insert of
// the key equal to lk (FixLk drops the crash-made prefix, the insert
// position moves by its length), inserts into the left part (left inserts
// into the prefix, moving records), removals, a tail.
TEST(FastFairPrefixRepair, CrashMadePrefixInOneLeaf) {
  Sums u64s, all;
  for (int ns : {256, 512}) {
    // (Byte keys at 256, u64 keys with byte values at 512 only: time.)
    for (const Kinds k : {Kinds{false, false}, Kinds{true, true}, Kinds{false, true}}) {
      if ((k.bv && !k.bk && ns == 256) || (k.bk && ns == 512)) continue;
      std::vector<Op> pre;
      if (!k.bk) pre = {k.I(0), k.I(1), k.I(2), k.R(0), k.R(1), k.R(2)};
      for (int i = 10; i <= 60; i += 10) pre.push_back(k.I(i));
      // Left inserts first (records 10 or 20 move into the prefix), then lk.
      const std::vector<Op> left_first = {k.I(15), k.I(17), k.I(3), k.I(4), k.R(20), k.I(25), k.R(3)};
      // lk first (FixLk -> DropPrefix), then the left part.
      const std::vector<Op> lk_first = {k.I(3), k.I(4), k.I(15), k.R(30), k.I(12), k.R(3), k.I(1)};
      const auto tail = k.Keys(0, 70);
      for (const Op& fin : {k.R(10), k.I(5)}) {
        for (const auto* then : {&left_first, &lk_first}) {
          const std::string name = std::string(fin.insert ? "insert at slot 0" : "remove first") +
                                   (then == &left_first ? ", left inserts first " : ", lk first ") + k.Tag(ns);
          Sums s = RunCase({name, k.bk, k.bv, ns, pre, nullptr, fin, *then, tail, 25});
          (k.bk ? all : u64s).prefix_drops += s.prefix_drops;
          all.left_inserts += s.left_inserts;
          all.images += s.images;
        }
      }
    }
  }
  EXPECT_GT(u64s.prefix_drops, 0u) << "no FixLk dropped a crash-made prefix";
  EXPECT_GT(all.left_inserts, 0u) << "no left insert into a crash-made prefix";
  EXPECT_GT(all.images, 200u);
}

// Two leaves from an ascending load of keys 0..cap (u64: each append
// raised the rightmost leaf's lk by FixLk, so the left leaf l kept lk =
// cap, a key of its right sibling r), r thinned so that the pair fits one
// node. The crashed operation removes l's first record (a crash-made
// prefix in l); the writes after the reopen underfill l, which merges r
// into l: r's key cap equals l's lk, so l's prefix is dropped first
// (DoMerge), then lk changes; the root collapses. Then inserts (one at the
// new lk) and a tail. Byte keys: no lk clash, r's records go behind l's
// prefix.
// A tree of keys 1000.. grown to 3 * cap records and emptied again
// (merges, root collapses): the limbo block (16 KiB, zeroed at the first
// merge) exists before the crashed operation, whose stores would otherwise
// be mostly its zeroing (150,000 images instead of a few thousand). Leaves
// one empty root leaf, the first one (never centred: no lk prefix).
std::vector<Op> LimboFirst(const Kinds& k, int cap) {
  std::vector<Op> pre;
  for (int i = 1000; i < 1000 + 3 * cap; i++) pre.push_back(k.I(i));
  for (int i = 1000; i < 1000 + 3 * cap; i++) pre.push_back(k.R(i));
  return pre;
}

struct MergeSetup {
  std::vector<Op> pre, removes;  // removes: those that underfill l after the first record's
  std::vector<std::string> tail;
  int cap;
};
MergeSetup TwoLeaves(const Kinds& k, int ns) {
  MergeSetup s;
  const int cap = (ns - 96) / 16, m = cap / 2;  // the append split cuts at m
  const int thr = std::max(1, cap / 3), limit = cap * 3 / 4;
  const int rn = cap - m + 1, keep = std::min(rn, limit - thr + 1);
  s.pre = LimboFirst(k, cap);
  for (int i = 0; i <= cap; i++) s.pre.push_back(k.I(i));
  for (int i = m + 1; i < m + 1 + (rn - keep); i++) s.pre.push_back(k.R(i));  // (not cap: l's lk)
  for (int i = 1; i <= m - thr; i++) s.removes.push_back(k.R(i));
  s.removes.push_back(k.R(m - 1));  // underfull also if the crashed removal did not happen
  s.tail = k.Keys(0, cap + 3);
  s.cap = cap;
  return s;
}

TEST(FastFairPrefixRepair, CrashMadePrefixMerges) {
  Sums u64s, all;
  for (int ns : {256, 512}) {
    for (const Kinds k : {Kinds{false, false}, Kinds{true, true}}) {
      if (k.bk && ns == 512) continue;  // (time)
      const MergeSetup ms = TwoLeaves(k, ns);
      std::vector<Op> then = ms.removes;
      for (const Op& op : {k.I(0), k.I(ms.cap + 1), k.I(ms.cap / 2 + 1), k.I(1)}) then.push_back(op);
      Sums s = RunCase({"merge after remove first " + k.Tag(ns), k.bk, k.bv, ns, ms.pre, nullptr, k.R(0), then, ms.tail, 20});
      (k.bk ? all : u64s).prefix_drops += s.prefix_drops;
      all.merges += s.merges;
    }
  }
  EXPECT_GT(u64s.prefix_drops, 0u) << "no merge dropped a crash-made prefix";
  EXPECT_GT(all.merges, 0u);
}

// FixLk's DropPrefix crashed at every pm-model state: the leftmost leaf
// (lk raised to 3, records 10..60) with a crash-made prefix (patched: the
// removal of 10 kept only its commit store), reopened; the crashed write
// inserts 3 (= lk): its repair keeps the prefix, FixLk drops it (one left
// shift of every record) and raises lk, then the insert at slot 0.
TEST(FastFairPrefixRepair, FixLkCrashStates) {
  for (int ns : {256, 512}) {
    for (const Kinds k : {Kinds{false, false}, Kinds{false, true}}) {
      std::vector<Op> pre = {k.I(0), k.I(1), k.I(2), k.R(0), k.R(1), k.R(2)};
      for (int i = 10; i <= 60; i += 10) pre.push_back(k.I(i));
      auto patch = [k](char* base, char* meta, std::string* err) {
        return PatchRemoveCommitOnly(base, meta, k.K(10), k.bk, k.bv, err);
      };
      Case c{"FixLk drops a crash-made prefix " + k.Tag(ns), k.bk, k.bv, ns, pre, patch, k.I(3),
             {k.I(10), k.I(4), k.R(20), k.I(15)}, k.Keys(0, 70), 15};
      c.fin_drops = 1;
      RunCase(c);
    }
  }
}

// A merge whose DropPrefix (r's key equals l's lk) crashes at every
// pm-model state (a sample where a point has more than 64 combinations):
// TwoLeaves with l's crash-made prefix patched in (the removal of its first
// record kept only its commit store), then all but the last removal that
// underfills l; the crashed write is that removal, which merges r into l
// (limbo slot, separator out of the parent, DropPrefix, new lk, append,
// commit line) and collapses the root. Open undoes or completes the merge.
TEST(FastFairPrefixRepair, MergeDroppingCrashMadePrefixCrashStates) {
  for (int ns : {256, 512}) {
    const Kinds k{false, false};
    MergeSetup ms = TwoLeaves(k, ns);
    ms.removes.pop_back();  // l's last removal below: the merge
    const Op fin = ms.removes.back();
    ms.removes.pop_back();
    std::vector<Op> pre = ms.pre;
    for (const Op& op : ms.removes) pre.push_back(op);
    auto patch = [k](char* base, char* meta, std::string* err) {
      return PatchRemoveCommitOnly(base, meta, k.K(0), k.bk, k.bv, err);
    };
    Case c{"merge drops a crash-made prefix " + k.Tag(ns), k.bk, k.bv, ns, pre, patch, fin,
           {k.I(0), k.I(ms.cap + 1), k.I(1)}, ms.tail, 15, 64};
    c.fin_drops = 1;
    c.fin_merges = 1;
    RunCase(c);
  }
}

// A split of a leaf with an lk prefix (the cut node keeps it) at
// pm-model states, sampled (16 combinations where a point has more: the
// new node is written whole between fences): ascending keys fill the root
// leaf, one below the last splits it and centres the new sibling S (a
// prefix of 5/8 of its free slots), appends fill S to capacity, and the
// crashed insert near S's end splits it (Full: its prefix is too far for
// a left shift). Then writes in both halves and a tail.
TEST(FastFairPrefixRepair, SplitOfLeafWithPrefixCrashStates) {
  for (int ns : {256, 512}) {
    for (const Kinds k : {Kinds{false, false}, Kinds{true, true}}) {
      if (k.bk && ns == 512) continue;  // (time)
      const int cap = (ns - 96) / 16, m = cap / 2;
      const int moved = cap - m, o = moved * 5 / 8;  // as SplitAt
      const int fill = cap - (o + moved + 1);
      std::vector<Op> pre;
      for (int i = 1; i <= cap; i++) pre.push_back(k.I(10 * i));
      pre.push_back(k.I(10 * cap - 5));  // the centring split
      for (int i = cap + 2; i < cap + 2 + fill; i++) pre.push_back(k.I(10 * i));
      const int first = 10 * (m + 1);
      Case c{"split of a leaf with a prefix " + k.Tag(ns), k.bk, k.bv, ns, pre, nullptr, k.I(10 * cap + 1),
             {k.I(first + 1), k.I(10 * cap + 2), k.R(first), k.I(10 * (cap + 1) + 3)}, k.Keys(first - 5, 10 * (cap + fill + 2)),
             15, 16};
      c.fin_prefix_splits = 1;
      RunCase(c);
    }
  }
}

// ---- Split, merge and rebalance paths at pm-model states ------------------
// (paths the every-fence tests of fastfair_crash_test reach only with whole
// lines). Same harness: the final operation crashed
// at every pm-model state (sampled where a point has more combinations),
// each image opened read-only, then read-write, checked against the model
// with the operation in flight applied or not, then scripted writes and a
// pseudo-random tail with the checks after every write.

// A rebalance (Rebalance: a split of the donor at the balancing point, its
// separator into the parent, then a merge of the pair that is now small),
// crashed at pm-model states. 10-record leaves: keys 10..100 fill the root
// leaf, 95 splits it (L = 10..50, S centred: an lk prefix of 3, then
// 60..100 and 95). From the right: L loses 10 and 20, the crashed removal
// of 30 underfills it (2 records), L + S = 8 > 7 records: S is cut after
// 70 (S keeps 60, 70, the new node 80..100), then S merges into L. From
// the left: L gets 11..13 (8 records), S loses 60..80, the crashed removal
// of 90 underfills S (95, 100 left): L is cut after its 5th record, then S
// merges into the new node.
TEST(FastFairPathCrashStates, RebalanceCrashStates) {
  const int ns = 256;
  for (const Kinds k : {Kinds{false, false}, Kinds{true, true}}) {
    for (const bool from_right : {true, false}) {
      if (k.bk && !from_right) continue;  // (time)
      std::vector<Op> pre = LimboFirst(k, 10);
      for (int i = 10; i <= 100; i += 10) pre.push_back(k.I(i));
      pre.push_back(k.I(95));
      Op fin;
      std::vector<Op> then;
      if (from_right) {
        pre.push_back(k.R(10));
        pre.push_back(k.R(20));
        fin = k.R(30);
        then = {k.I(75), k.I(65), k.R(80), k.I(30), k.R(60), k.I(101)};
      } else {
        for (int i : {11, 12, 13, 60, 70, 80}) pre.push_back(i > 50 ? k.R(i) : k.I(i));
        fin = k.R(90);
        then = {k.I(45), k.I(96), k.R(40), k.I(90), k.R(11), k.I(60)};
      }
      Case c{std::string("rebalance from the ") + (from_right ? "right " : "left ") + k.Tag(ns), k.bk, k.bv, ns, pre,
             nullptr, fin, then, k.Keys(5, 105), 10, 64};
      c.fin_merges = 1;  // (a rebalance's merge counts)
      c.fin_path = [from_right](const DebugCounters& d) {
        std::string e;
        if (d.rebalances != 1) e += " rebalances " + std::to_string(d.rebalances) + " != 1;";
        if (d.rebalances_from_right != (from_right ? 1u : 0u)) e += " wrong donor;";
        return e;
      };
      RunCase(c);
    }
  }
}

// DoMerge's room-based DropPrefix (l->count + n > cap: l's lk prefix leaves
// too little room behind its records, so they move to the front first)
// with byte keys (no lk clash: the prefix is dropped only for room),
// crashed at pm-model states. 26-record leaves: keys 10..260 fill the root
// leaf, 255 splits it (S centred: a prefix of 8, then 140..260 and 255),
// appends 270..300 fill S, 310 splits it at its middle record (S keeps its
// prefix and 140..220; R = 230..310, no prefix), 221..223 go to S (count
// 20: 8 + 12 records), R loses 230 and 240, and the crashed removal of 250
// underfills R (7 records): S + R = 19 records fit (3/4 of 26) but S's
// count 20 + 7 > 26, so S's prefix is dropped before R's records are
// appended.
TEST(FastFairPathCrashStates, MergeRoomDropWithByteKeysCrashStates) {
  const int ns = 512;
  {
    const Kinds k{true, true};  // (bytes/u64 took the same path and failed the same mutations: time)
    std::vector<Op> pre = LimboFirst(k, 26);
    for (int i = 10; i <= 260; i += 10) pre.push_back(k.I(i));
    for (int i : {255, 270, 280, 290, 300, 310, 221, 222, 223}) pre.push_back(k.I(i));
    pre.push_back(k.R(230));
    pre.push_back(k.R(240));
    Case c{"merge room drop " + k.Tag(ns), k.bk, k.bv, ns, pre, nullptr, k.R(250),
           {k.I(250), k.I(135), k.R(221), k.I(315), k.I(139)}, k.Keys(130, 320), 10, 64};
    c.fin_drops = 1;
    c.fin_merges = 1;
    c.fin_path = [](const DebugCounters& d) {
      return d.rebalances ? std::string(" a rebalance, not a plain merge") : std::string();
    };
    RunCase(c);
  }
}

// The cut node's I2 copies (SplitAt: slots m and m+1 of the cut node get
// copies of record m-1, with their own fence after the link). The crashed
// insert splits the full root leaf (10..100, 10-record leaves: the cut
// node keeps 10..50) and goes into the cut node right below its last
// record (45: a right shift from slot 5, on the line of the copy at slot
// 5, under the count's fence). Without the copies' fence a crash keeps the
// grown count but not that line: slot 5 still holds the median 60 (the
// cut node's new high) inside the count.
TEST(FastFairPathCrashStates, SplitThenInsertIntoCutNodeCrashStates) {
  const int ns = 256;
  for (const Kinds k : {Kinds{false, false}, Kinds{true, true}}) {
    std::vector<Op> pre;
    for (int i = 10; i <= 100; i += 10) pre.push_back(k.I(i));
    Case c{"split, insert into the cut node " + k.Tag(ns), k.bk, k.bv, ns, pre, nullptr, k.I(45),
           {k.I(46), k.I(55), k.R(50), k.I(47), k.R(60), k.I(44)}, k.Keys(5, 105), 10, 64};
    c.fin_path = [](const DebugCounters& d) {
      return d.root_grows == 1 ? std::string() : " root grows " + std::to_string(d.root_grows) + " (no split)";
    };
    RunCase(c);
  }
}

}  // namespace
