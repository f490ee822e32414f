// Concurrency stress for the concurrent `fptree`: threads mixing every
// operation (scans included) on disjoint and overlapping keys, both key kinds,
// small nodes (many splits, leaf deletions, inner splits) and defaults.
// Values encode their key, so a reader detects torn or misplaced values. A
// watchdog fails the test instead of hanging if anything deadlocks (the
// insert/scan deadlock of a public FPTree has its own test).
// PMINDEX_LONG=1 runs longer.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "kit/epoch.h"
#include "kit/test_watchdog.h"
#include "fptree/fptree.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

bool Long() { return std::getenv("PMINDEX_LONG") != nullptr; }

using test::TestWatchdog;

struct Cfg {
  bool bytes;
  bool small;
  std::string label;
};
std::string CfgName(const testing::TestParamInfo<Cfg>& i) { return i.param.label; }

class FPTreeConc : public testing::TestWithParam<Cfg> {
 protected:
  void SetUp() override {
    path_ = "/dev/shm/fptree-conc-" + std::to_string(getpid()) + "-" + GetParam().label + ".pool";
    Options o;
    o.pool_path = path_;
    o.pool_size = 64ull << 20;
    o.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    o.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    if (GetParam().small) o.params = {{"leaf_size", "6"}, {"inner_size", "4"}};
    o.num_threads = 4;
    ASSERT_TRUE(OpenIndex("fptree", o, &idx_).ok());
  }
  void TearDown() override {
    idx_.reset();
    pm::Pool::Remove(path_);
  }
  std::string Key(uint64_t id) const {
    if (!GetParam().bytes) return std::string(U64Slice(id));
    return "key/" + std::to_string(id * 7919 % 1009) + std::string(id % 5, 'z') + "/" + std::to_string(id);
  }
  uint64_t IdOf(Slice k) const {
    if (!GetParam().bytes) return SliceToU64(k);
    std::string s(k);
    return std::stoull(s.substr(s.rfind('/') + 1));
  }
  std::string Val(uint64_t id, uint64_t ver) const {
    if (!GetParam().bytes) {
      uint64_t v = (id << 20) | (ver & 0xfffff);
      return std::string(U64Slice(v));
    }
    std::string s = std::to_string(id) + ":" + std::to_string(ver) + ":";
    s.append(ver % 37, char('a' + id % 26));
    return s;
  }
  // True if v is a value some writer could have written for id.
  bool ValOk(uint64_t id, Slice v) const {
    if (!GetParam().bytes) return v.size() == 8 && (SliceToU64(v) >> 20) == id;
    std::string s(v);
    size_t a = s.find(':'), b = s.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) return false;
    if (std::stoull(s.substr(0, a)) != id) return false;
    uint64_t ver = std::stoull(s.substr(a + 1, b - a - 1));
    return s.size() == b + 1 + ver % 37 && (ver % 37 == 0 || s.back() == char('a' + id % 26));
  }
  bool Less(Slice a, Slice b) const {
    if (!GetParam().bytes) return SliceToU64(a) < SliceToU64(b);
    return a < b;
  }
  // A scan whose records are ascending and whose values belong to their
  // keys; counts violations in *errors.
  void CheckedScan(const std::string& start, size_t n, std::atomic<int>* errors) {
    std::string prev;
    bool have = false;
    idx_->Scan(start, n, [&](Slice a, Slice b) {
      if (have && !Less(prev, a)) ++*errors;
      if (!ValOk(IdOf(a), b)) ++*errors;
      prev.assign(a.data(), a.size());
      have = true;
      return true;
    });
  }

  std::string path_;
  std::unique_ptr<Index> idx_;
};

// Each thread owns the keys id % T == t and keeps its own model; all threads
// also scan and find across the whole key space.
TEST_P(FPTreeConc, DisjointKeysMatchModel) {
  TestWatchdog wd("DisjointKeysMatchModel", 240);
  const int T = 4;
  const int ops = Long() ? 200000 : (GetParam().small ? 20000 : 30000);
  const uint64_t space = 4000;
  std::vector<std::map<uint64_t, uint64_t>> models(T);
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < T; t++) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t * 977 + 1);
      auto& m = models[t];
      for (int i = 0; i < ops && errors == 0; i++) {
        uint64_t id = (rng() % (space / T)) * T + t;
        uint64_t ver = rng() % 100000;
        std::string k = Key(id), v = Val(id, ver);
        int op = rng() % 100;
        if (op < 25) {
          Status s = idx_->Insert(k, v);
          if (s.ok() != !m.count(id)) errors++;
          if (s.ok()) m[id] = ver;
        } else if (op < 35) {
          Status s = idx_->Update(k, v);
          if (s.ok() != (m.count(id) == 1)) errors++;
          if (s.ok()) m[id] = ver;
        } else if (op < 42) {
          if (!idx_->Upsert(k, v).ok()) errors++;
          m[id] = ver;
        } else if (op < 65) {
          Status s = idx_->Remove(k);
          if (s.ok() != (m.erase(id) == 1)) errors++;
        } else if (op < 85) {
          std::string out;
          Status s = idx_->Find(k, &out);
          auto it = m.find(id);
          if (it == m.end() ? !s.IsNotFound() : (!s.ok() || out != Val(id, it->second))) errors++;
          // Someone else's key: any value must belong to that key.
          uint64_t oid = rng() % space;
          Status s2 = idx_->Find(Key(oid), &out);
          if (s2.ok() && !ValOk(oid, out)) errors++;
        } else {
          CheckedScan(Key(rng() % space), rng() % 120, &errors);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(errors.load(), 0);
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  std::map<std::string, std::string> want;
  for (auto& m : models)
    for (auto& [id, ver] : m) want[Key(id)] = Val(id, ver);
  size_t n = 0;
  std::string start = GetParam().bytes ? std::string("\x01", 1) : std::string(U64Slice(0));
  idx_->Scan(start, SIZE_MAX, [&](Slice k, Slice v) {
    auto it = want.find(std::string(k));
    EXPECT_TRUE(it != want.end() && it->second == v);
    n++;
    return true;
  });
  EXPECT_EQ(n, want.size());
  EXPECT_EQ(idx_->Size(), want.size());
  EXPECT_EQ(testutil::LeakReport(idx_.get()), "");
}

// All threads hammer the same small key range (high contention, skew).
TEST_P(FPTreeConc, OverlappingKeysStayConsistent) {
  TestWatchdog wd("OverlappingKeysStayConsistent", 240);
  const int T = 4;
  const int ops = Long() ? 200000 : 25000;
  const uint64_t space = GetParam().small ? 300 : 2000;
  std::atomic<int> errors{0};
  std::mutex emu;
  std::string first_error;
  auto fail = [&](const std::string& what) {
    std::lock_guard l(emu);
    if (first_error.empty()) first_error = what;
    errors++;
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < T; t++) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(t + 100);
      for (int i = 0; i < ops && errors == 0; i++) {
        // Skewed: half the operations go to 5% of the keys.
        uint64_t id = (rng() & 1) ? rng() % (space / 20) : rng() % space;
        std::string k = Key(id), v = Val(id, rng() % 100000);
        int op = rng() % 100;
        std::string out;
        if (op < 30) {
          Status s = idx_->Insert(k, v);
          if (!s.ok() && !s.IsAlreadyExists()) fail("insert: " + s.ToString());
        } else if (op < 50) {
          Status s = idx_->Upsert(k, v);
          if (!s.ok()) fail("upsert: " + s.ToString());
        } else if (op < 60) {
          Status s = idx_->Update(k, v);
          if (!s.ok() && !s.IsNotFound()) fail("update: " + s.ToString());
        } else if (op < 80) {
          Status s = idx_->Remove(k);
          if (!s.ok() && !s.IsNotFound()) fail("remove: " + s.ToString());
        } else if (op < 92) {
          Status s = idx_->Find(k, &out);
          if (s.ok() ? !ValOk(id, out) : !s.IsNotFound()) fail("find: " + s.ToString() + " value " + out);
        } else {
          std::string prev;
          bool have = false;
          idx_->Scan(k, 50, [&](Slice a, Slice b) {
            if (have && !Less(prev, a)) fail("scan order: " + prev + " then " + std::string(a));
            if (!ValOk(IdOf(a), b)) fail("scan value: " + std::string(a) + " -> " + std::string(b));
            prev.assign(a.data(), a.size());
            have = true;
            return true;
          });
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(errors.load(), 0) << first_error;
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  EXPECT_EQ(testutil::LeakReport(idx_.get()), "");
}

// The public-FPTree deadlock: one thread inserts (splitting leaves) while
// another scans. Ours takes no lock in scans, so this must finish.
TEST_P(FPTreeConc, InsertsAndScansDoNotDeadlock) {
  TestWatchdog wd("InsertsAndScansDoNotDeadlock", 120);
  const uint64_t n = Long() ? 400000 : 40000;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> scanned{0};
  std::atomic<int> errors{0};
  std::thread ins([&] {
    for (uint64_t i = 0; i < n; i++)
      if (!idx_->Insert(Key(i * 2654435761ull % n), Val(i * 2654435761ull % n, i)).ok()) errors++;
    done = true;
  });
  std::thread scan([&] {
    std::mt19937_64 rng(3);
    while (!done) {
      size_t cnt = 0;
      std::string prev;
      bool have = false;
      idx_->Scan(Key(rng() % n), 100, [&](Slice a, Slice b) {
        if (have && !Less(prev, a)) errors++;
        if (!ValOk(IdOf(a), b)) errors++;
        prev.assign(a.data(), a.size());
        have = true;
        return true;
      }, &cnt);
      scanned += cnt;
    }
  });
  ins.join();
  scan.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(idx_->Size(), n);
  EXPECT_TRUE(idx_->Check().ok());
  // Scans hand back records, not only a count.
  std::vector<std::string> got;
  size_t cnt = 0;
  idx_->Scan(Key(0), 100, [&](Slice a, Slice) {
    got.emplace_back(a);
    return true;
  }, &cnt);
  EXPECT_EQ(cnt, got.size());
  EXPECT_GT(got.size(), 0u);
}

// Delete-heavy concurrency (alg. 5-6 under contention): each cycle, every
// thread inserts its own keys and then removes all of them in random order,
// while finding and scanning across the whole key space. Every remove must
// succeed exactly once and nothing may be found after its removal. After each
// cycle the tree must be back, without a reopen, to one leaf, one DRAM inner
// node and the PM blocks it had when created (allocator enumeration), and
// pass Check(): empty leaves are removed even when they are the only child
// of their parent, removed inner nodes are freed (ASan/TSan see any use after
// the grace period), and deletions deferred under lock contention are carried
// out by later Removes (a few Removes of absent keys drain the queue).
TEST_P(FPTreeConc, EmptyAndRefillFallsBack) {
  TestWatchdog wd("EmptyAndRefillFallsBack", 300);
  const int T = 4;
  const int cycles = Long() ? 12 : 3;
  const uint64_t space = GetParam().small ? 4000 : 12000;
  auto blocks = [&] {
    size_t n = 0;
    idx_->pool()->allocator().ForEachAllocated([&](uint64_t, size_t) { n++; });
    return n;
  };
  const size_t blocks0 = blocks();
  for (int cycle = 0; cycle < cycles; cycle++) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    uint64_t deferred0 = internal::FPTreeDeferredLeafDeletions();
    std::atomic<int> errors{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < T; t++) {
      ts.emplace_back([&, t] {
        std::mt19937_64 rng(cycle * 131 + t);
        std::vector<uint64_t> mine;
        for (uint64_t id = t; id < space; id += T) mine.push_back(id);
        std::shuffle(mine.begin(), mine.end(), rng);
        for (uint64_t id : mine)
          if (!idx_->Insert(Key(id), Val(id, cycle)).ok()) errors++;
        std::shuffle(mine.begin(), mine.end(), rng);
        for (size_t i = 0; i < mine.size() && errors == 0; i++) {
          uint64_t id = mine[i];
          if (!idx_->Remove(Key(id)).ok()) errors++;
          if (!idx_->Find(Key(id), nullptr).IsNotFound()) errors++;
          if (i % 4 == 0) {
            uint64_t oid = rng() % space;
            std::string out;
            Status s = idx_->Find(Key(oid), &out);
            if (s.ok() && !ValOk(oid, out)) errors++;
          }
          if (i % 16 == 0) {
            CheckedScan(Key(rng() % space), rng() % 50, &errors);
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    ASSERT_EQ(errors.load(), 0);
    // Deletions deferred under contention are done by later Removes.
    uint64_t deferred = internal::FPTreeDeferredLeafDeletions() - deferred0;
    for (uint64_t i = 0; i <= deferred; i++) EXPECT_TRUE(idx_->Remove(Key(space + 1)).IsNotFound());
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    EXPECT_EQ(idx_->Size(), 0u);
    uint64_t inner = 0, leaves = 0;
    ASSERT_TRUE(internal::FPTreeShape(idx_.get(), &inner, &leaves));
    EXPECT_EQ(leaves, 1u);
    EXPECT_EQ(inner, 1u);
    EXPECT_EQ(blocks(), blocks0);
    EXPECT_EQ(testutil::LeakReport(idx_.get()), "");
  }
}

// Value 0 stored concurrently reads back as found.
TEST_P(FPTreeConc, ZeroValuesAreFound) {
  if (GetParam().bytes) GTEST_SKIP();
  TestWatchdog wd("ZeroValuesAreFound", 60);
  std::vector<std::thread> ts;
  std::atomic<int> errors{0};
  for (int t = 0; t < 2; t++)
    ts.emplace_back([&, t] {
      uint64_t zero = 0;
      for (uint64_t i = t; i < 20000; i += 2) {
        if (!idx_->Insert(U64Slice(i), U64Slice(zero)).ok()) errors++;
        std::string out;
        if (!idx_->Find(U64Slice(i), &out).ok() || SliceToU64(out) != 0) errors++;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors.load(), 0);
}

// A scan prefetching the records of the next leaf loads that leaf's bitmap,
// so it must load the next pointer with acquire: the bitmap written by the
// split (plain stores, published by a release store of the next pointer)
// would otherwise be a data race. One writer inserting and
// removing with 8-slot leaves (many splits and leaf deletions), two threads
// scanning u64 keys; a bounded number of operations. Under TSan the relaxed
// load was reported in 2 of 3 runs at 200,000 operations (checked); this
// runs 400,000 (about 6 s under TSan).
TEST(FPTreeConcMisc, ScansRacingSplitsU64) {
  TestWatchdog wd("ScansRacingSplitsU64", 300);
  std::string path = "/dev/shm/fptree-conc-" + std::to_string(getpid()) + "-scansplit.pool";
  Options o;
  o.pool_path = path;
  o.key_kind = KeyKind::kU64;
  o.value_kind = ValueKind::kU64;
  o.params = {{"leaf_size", "8"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fptree", o, &idx).ok());
  const uint64_t ops = Long() ? 2000000 : 400000, space = 4000;
  std::atomic<bool> done{false};
  std::atomic<int> errors{0};
  std::thread w([&] {
    std::mt19937_64 rng(1);
    for (uint64_t i = 0; i < ops; i++) {
      uint64_t k = rng() % space;
      if (rng() % 3) idx->Upsert(U64Slice(k), U64Slice(k * 2));
      else idx->Remove(U64Slice(k));
    }
    done = true;
  });
  std::vector<std::thread> scanners;
  for (int t = 0; t < 2; t++)
    scanners.emplace_back([&, t] {
      std::mt19937_64 rng(7 + t);
      int rounds = 0;
      while (!done || rounds < 10) {
        rounds++;
        uint64_t prev = 0;
        bool have = false;
        idx->Scan(U64Slice(rng() % space), 200, [&](Slice k, Slice v) {
          uint64_t kk = SliceToU64(k);
          if ((have && kk <= prev) || SliceToU64(v) != kk * 2) errors++;
          prev = kk;
          have = true;
          return true;
        });
      }
    });
  w.join();
  for (auto& t : scanners) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(idx->Check().ok());
  idx.reset();
  pm::Pool::Remove(path);
}

// Finds under slot reuse: a find must return a value its key has actually
// had, and successive finds of one key by one reader must never go back in
// time. Two writers, each owning every other key (k % 2); the stable keys
// (k / 2 even: 0, 1, 4, 5, ...) are never removed (only updated), the others
// are removed, reinserted and updated over and over, so slots are freed and
// reused by other keys (the ABA case that makes a find without the leaf
// version wrong) and leaves of 8 slots split and
// are deleted when they empty. Stable and churned keys share every leaf, so
// "never NotFound" is checked across those splits and leaf deletions too
// (with separate ranges the stable leaves would never change). A value is (key << 32) | version; a
// writer's versions of a key only grow, and it publishes the version it is
// about to write before writing it. Readers check: never NotFound for a
// never-removed key, the value's key part is the key, its version is at most
// the published one, and not below the last version this reader saw for the
// key. Both update modes (in place and algorithm 8's bitmap flip).
TEST(FPTreeConcMisc, FindsSeeOnlyValuesTheKeyHad) {
  TestWatchdog wd("FindsSeeOnlyValuesTheKeyHad", 300);
  for (const char* mode : {"inplace", "flip"}) {
    SCOPED_TRACE(mode);
    std::string path = "/dev/shm/fptree-conc-" + std::to_string(getpid()) + "-findaba.pool";
    Options o;
    o.pool_path = path;
    o.key_kind = KeyKind::kU64;
    o.value_kind = ValueKind::kU64;
    o.params = {{"leaf_size", "8"}, {"update", mode}};
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fptree", o, &idx).ok());
    constexpr uint64_t kKeys = 2000;
    auto stable = [](uint64_t k) { return (k / 2) % 2 == 0; };
    const uint64_t ops = Long() ? 1000000 : 150000;
    std::vector<std::atomic<uint64_t>> published(kKeys);
    auto val = [](uint64_t k, uint64_t ver) { return (k << 32) | ver; };
    for (uint64_t k = 0; k < kKeys; k++) {
      published[k] = 1;
      ASSERT_TRUE(idx->Insert(U64Slice(k), U64Slice(val(k, 1))).ok());
    }
    std::atomic<int> writers_left{2};
    std::atomic<int> errors{0};
    std::vector<std::thread> th;
    for (int t = 0; t < 2; t++)
      th.emplace_back([&, t] {
        std::mt19937_64 rng(100 + t);
        std::vector<bool> present(kKeys, true);
        for (uint64_t i = 0; i < ops; i++) {
          uint64_t k = (rng() % (kKeys / 2)) * 2 + t;
          uint64_t ver = published[k].load() + 1;
          published[k].store(ver);  // before the write: readers may see it from now on
          Status st;
          if (stable(k) || rng() % 3 == 0) {
            st = present[k] ? idx->Update(U64Slice(k), U64Slice(val(k, ver))) : idx->Insert(U64Slice(k), U64Slice(val(k, ver)));
            present[k] = true;
          } else if (present[k]) {
            st = idx->Remove(U64Slice(k));
            present[k] = false;
          } else {
            st = idx->Insert(U64Slice(k), U64Slice(val(k, ver)));
            present[k] = true;
          }
          if (!st.ok()) errors++;
        }
        writers_left--;
      });
    for (int t = 0; t < 2; t++)
      th.emplace_back([&, t] {
        std::mt19937_64 rng(200 + t);
        std::vector<uint64_t> seen(kKeys, 0);
        std::string v;
        for (int rounds = 0; writers_left.load() > 0 || rounds < 1000; rounds++) {
          uint64_t k = rng() % kKeys;
          Status st = idx->Find(U64Slice(k), &v);
          if (st.IsNotFound()) {
            if (stable(k)) errors++;
            continue;
          }
          if (!st.ok() || v.size() != 8) {
            errors++;
            continue;
          }
          uint64_t x = SliceToU64(v), ver = x & 0xffffffffu;
          if ((x >> 32) != k || ver > published[k].load() || ver < seen[k]) errors++;
          seen[k] = ver;
        }
      });
    for (auto& x : th) x.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_TRUE(idx->Check().ok());
    idx.reset();
    pm::Pool::Remove(path);
  }
}

// thread_local destructors run in reverse order of
// construction, so a thread_local constructed before the thread's first
// tree operation can call the tree after the epoch slot's releaser ran. The
// slot taken then must be given back: with 300 sequential threads (more
// than the 256 slots) a leaked slot per exit makes the later threads wait
// forever (the watchdog fails the test) or fail with Busy.
// The destructor's operations do not allocate PM (an in-place update and a
// find): the pm allocator's own thread cache is a thread_local with a
// destructor, constructed after this one, so it is gone by then.
struct ExitUser {
  Index* idx = nullptr;
  std::string key;
  Status* out = nullptr;
  ~ExitUser() {
    if (!idx) return;
    *out = idx->Update(key, U64Slice(7));
    std::string v;
    if (out->ok()) *out = idx->Find(key, &v);
    if (out->ok() && SliceToU64(v) != 7) *out = Status::Corrupt("update from exit destructor lost");
  }
};
thread_local ExitUser tl_exit_user;
TEST(FPTreeConcMisc, OperationsFromThreadExitDestructors) {
  TestWatchdog wd("OperationsFromThreadExitDestructors", 300);
  std::string path = "/dev/shm/fptree-conc-" + std::to_string(getpid()) + "-exit.pool";
  Options o;
  o.pool_path = path;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fptree", o, &idx).ok());
  const int kThreads = 300;
  std::vector<Status> st(kThreads);
  for (int i = 0; i < kThreads; i++) {
    std::thread t([&, i] {
      tl_exit_user.idx = idx.get();  // constructed first: destroyed last
      tl_exit_user.key = std::string(U64Slice(i));
      tl_exit_user.out = &st[i];
      if (!idx->Insert(U64Slice(i), U64Slice(i)).ok()) st[i] = Status::Corrupt("insert failed");
    });
    t.join();
    ASSERT_TRUE(st[i].ok()) << "thread " << i << ": " << st[i].ToString();
  }
  // The sequential threads reused one slot of the tree's epoch manager (the
  // only live one): a slot not given back at exit (after the exit-destructor
  // operation) makes the count grow with every thread.
  for (uint32_t n : internal::EpochManager::LiveSlotCounts()) EXPECT_LE(n, 2u);
  std::string v;
  for (int i = 0; i < kThreads; i++) {
    ASSERT_TRUE(idx->Find(U64Slice(i), &v).ok()) << i;
    EXPECT_EQ(SliceToU64(v), 7u) << i;
  }
  EXPECT_EQ(idx->Size(), uint64_t(kThreads));
  EXPECT_TRUE(idx->Check().ok());
  idx.reset();
  pm::Pool::Remove(path);
}

// More threads using a tree at once than the former fixed epoch slots (256,
// process-wide; the surplus got Busy): the shared epoch manager
// (kit/epoch.h) has no thread limit, so every operation succeeds. Each
// thread does one insert and then waits (keeping its slot) until all have
// done theirs. Then the slots come back when the threads exit: as many
// sequential threads again do not raise the manager's slot count.
TEST(FPTreeConcMisc, MoreLiveThreadsThanOldEpochSlotLimit) {
  TestWatchdog wd("MoreLiveThreadsThanOldEpochSlotLimit", 300);
  std::string path = "/dev/shm/fptree-conc-" + std::to_string(getpid()) + "-busy.pool";
  Options o;
  o.pool_path = path;
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("fptree", o, &idx).ok());
  const int kThreads = 300;
  std::vector<Status> st(kThreads);
  std::atomic<int> finished{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; i++)
    ts.emplace_back([&, i] {
      st[i] = idx->Insert(U64Slice(i), U64Slice(i));
      finished++;
      while (finished.load() < kThreads) std::this_thread::yield();
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kThreads; i++) EXPECT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
  EXPECT_EQ(idx->Size(), uint64_t(kThreads));
  // The slots are free again: sequential threads reuse them (a leaked slot
  // would make every one of them take a new one).
  uint32_t before = 0;
  for (uint32_t n : internal::EpochManager::LiveSlotCounts()) before = std::max(before, n);
  EXPECT_GE(before, uint32_t(kThreads));
  for (int i = 0; i < kThreads; i++)
    std::thread([&, i] { EXPECT_TRUE(idx->Insert(U64Slice(100000 + i), U64Slice(1)).ok()); }).join();
  uint32_t after = 0;
  for (uint32_t n : internal::EpochManager::LiveSlotCounts()) after = std::max(after, n);
  EXPECT_EQ(after, before);
  EXPECT_TRUE(idx->Check().ok());
  idx.reset();
  pm::Pool::Remove(path);
}

INSTANTIATE_TEST_SUITE_P(Kinds, FPTreeConc,
                         testing::Values(Cfg{false, false, "u64"}, Cfg{false, true, "u64_small"}, Cfg{true, false, "bytes"},
                                         Cfg{true, true, "bytes_small"}),
                         CfgName);

}  // namespace
}  // namespace pmindex
