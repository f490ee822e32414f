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

std::string VerifyImage(const std::string& path, const Options& base, const Case& c, const Model& must, Sums* sums) {
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
  if (!step("after open")) return err;
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

// The crash state of Remove(key) of a leaf's first record (slot s, right
// behind its lk prefix [0, s)) that kept its parked spare words (byte
// kinds: persisted before the commit) and the commit store k[s] = lk only.
[[maybe_unused]] std::vector<std::string> PatchRemoveCommitOnly(char* base, char* meta, const std::string& key, bool bk, bool bv,
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
    // (u64 keys with byte values at 512 only, to keep the test short.)
    for (const Kinds k : {Kinds{false, false}, Kinds{true, true}, Kinds{false, true}}) {
      if (k.bv && !k.bk && ns == 256) continue;
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

}  // namespace
