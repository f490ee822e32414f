// fastfair_retire_test: fastfair's removed and replaced key/value blocks
// (fastfair_retire.cc) stay readable while a lock-free reader may be in
// them, and a crash anywhere between the retire steps leaks nothing.
//
// ScanKeepsTheBlocksItHandsOut: a Scan's callback (inside the scan's epoch
// guard, holding Slices into PM blocks) has another thread remove one
// record it was handed and replace another's value, then insert records
// whose blocks have the same sizes: the handed-out bytes must stay intact
// until the scan ends, and the blocks be freed by the next write after it.
//
// WritesFromAScanCallbackDoNotWaitForTheirOwnScan: a Scan callback removes
// more byte records than there are block retire slots; the writes past the
// slots answer Busy instead of waiting for their own scan's grace period.
//
// ReadersWhileWritersReplace (label concurrency; TSan and ASan): lock-free
// Find, Scan and FindMany of byte keys and values while writers update,
// remove and re-insert the same keys with same-sized blocks (a freed block
// is reused at once). Every answer must be a well-formed value of its own
// key.
//
// CrashBetweenRetireStepsLeaksNothing: removes and updates, inside a
// scan's guard (blocks wait in retire slots) and outside it (blocks freed),
// with a crash image at every fence: each image recovers to a tree that
// passes Check, owns exactly the allocated blocks, and holds every record
// the writes did not touch, and the touched ones old or new.
//
// Failure model: kit/test_observer.h's DurableImage.
// Thread safety: each test drives its own pool.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fastfair/fastfair_test_util.h"
#include "kit/test_observer.h"
#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

struct Kinds {
  KeyKind kk;
  ValueKind vk;
};

class FastFairRetire : public testing::TestWithParam<Kinds> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/fastfair-retire-" + std::to_string(getpid()) + "-" + std::to_string(n_++);
    opts_ = fftest::MakeOptions(tag_ + ".pool", GetParam().kk, GetParam().vk, 512);
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
  }
  void TearDown() override {
    sim_.reset();
    idx_.reset();
    pm::Pool::Remove(opts_.pool_path);
    for (auto& f : files_) pm::Pool::Remove(f);
  }
  bool bk() const { return GetParam().kk == KeyKind::kBytes; }
  bool bv() const { return GetParam().vk == ValueKind::kBytes; }
  // Keys of one size and order: a freed key block is reused by the next one.
  std::string Key(uint64_t i) const {
    if (!bk()) return fftest::U64(1000 + i);
    return "key" + std::to_string(100000 + i);
  }
  // Values of one size, naming their key id and version.
  std::string Val(uint64_t i, uint64_t ver) const {
    if (!bv()) return fftest::U64(i << 32 | ver);
    std::string s = "id=" + std::to_string(100000 + i) + ";ver=" + std::to_string(100000 + ver) + ";";
    return s + std::string(64 - s.size(), char('a' + i % 26));
  }
  bool ValOf(uint64_t i, const std::string& v) const {
    if (!bv()) return v.size() == 8 && SliceToU64(v) >> 32 == i;
    const std::string id = "id=" + std::to_string(100000 + i) + ";ver=";
    if (v.size() != 64 || v.compare(0, id.size(), id) != 0 || v[id.size() + 6] != ';') return false;
    return v.find_first_not_of(char('a' + i % 26), id.size() + 7) == std::string::npos;
  }
  std::set<uint64_t> Allocated() const { return testutil::AllocatedBlocks(idx_.get()); }
  void Load(uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
      ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
      model_[Key(i)] = Val(i, 0);
    }
  }
  // The writes under test: another thread removes record 3 and replaces
  // record 5's value; then this thread, whose allocator runs the old blocks
  // came from, inserts records 100.. with blocks of the same sizes (a
  // block freed at once is handed out again here).
  void Writes() {
    std::thread t([&] {
      EXPECT_TRUE(idx_->Remove(Key(3)).ok());
      model_.erase(Key(3));
      EXPECT_TRUE(idx_->Update(Key(5), Val(5, 1)).ok());
      model_[Key(5)] = Val(5, 1);
    });
    t.join();
    for (uint64_t i = 100; i < 116; i++) {
      EXPECT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
      model_[Key(i)] = Val(i, 0);
    }
  }

  static inline std::atomic<int> n_{0};
  std::string tag_;
  Options opts_;
  std::unique_ptr<DurableImage> sim_;
  std::unique_ptr<Index> idx_;
  std::map<std::string, std::string> model_;
  std::vector<std::string> files_;
};

TEST_P(FastFairRetire, ScanKeepsTheBlocksItHandsOut) {
  ASSERT_TRUE(OpenIndex("fastfair", opts_, &idx_).ok());
  Load(8);  // one leaf: the scan's snapshot holds every record
  struct Held {
    Slice s;
    std::string bytes;
  };
  std::vector<Held> held;  // slices into PM blocks (byte keys and values)
  std::vector<std::string> got;
  const char* base = idx_->pool()->base();
  size_t n = 0;
  Status st = idx_->Scan(Key(0), 100, [&](Slice k, Slice v) {
    got.emplace_back(k);
    EXPECT_TRUE(ValOf(n, std::string(v))) << "record " << n;
    // Keep the blocks of records 3 (removed) and 5 (updated) below.
    if (n == 3 && bk()) held.push_back({k, std::string(k)});
    if ((n == 3 || n == 5) && bv()) held.push_back({v, std::string(v)});
    if (n == 5) {
      Writes();
      std::set<uint64_t> a = Allocated();
      for (const Held& h : held) {
        const uint64_t off = uint64_t(h.s.data() - base) - 4;  // {u32 len, bytes}
        EXPECT_EQ(a.count(off), 1u) << "block " << off << " freed while the scan's guard is held";
        EXPECT_EQ(std::string(h.s), h.bytes) << "block " << off << " rewritten under the scan";
      }
    }
    n++;
    return true;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(n, 8u);
  ASSERT_EQ(held.size(), size_t(bk()) + 2 * size_t(bv()));
  // The guard ended: the next write frees them.
  ASSERT_TRUE(idx_->Remove(Key(7)).ok());
  model_.erase(Key(7));
  std::set<uint64_t> a = Allocated();
  for (const Held& h : held) EXPECT_EQ(a.count(uint64_t(h.s.data() - base) - 4), 0u) << "not freed after the grace period";
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_TRUE(fftest::NoLeak(idx_.get()));
  for (auto& [k, v] : model_) {
    std::string out;
    ASSERT_TRUE(idx_->Find(k, &out).ok());
    EXPECT_EQ(out, v);
  }
}

// A Scan callback that removes every record it is handed: each Remove
// retires blocks (1 or 2 retire slots) that its own scan's epoch guard
// keeps from being freed, so once the 1024 block retire slots are taken no
// slot comes back before the scan ends. The Remove must not wait for one
// (it would wait for its own scan: a hang, turned into a failure by the
// watchdog): it answers Busy; after the scan every write works again and
// the blocks are freed.
TEST_P(FastFairRetire, WritesFromAScanCallbackDoNotWaitForTheirOwnScan) {
  ASSERT_TRUE(OpenIndex("fastfair", opts_, &idx_).ok());
  constexpr uint64_t kN = 1100;  // more records than retire slots
  Load(kN);
  test::TestWatchdog dog("Removes from inside a Scan callback past the 1024 block retire slots", 60);
  const uint64_t per = uint64_t(bk()) + uint64_t(bv());  // slots per Remove
  size_t removed = 0, visited = 0;
  std::vector<std::string> busy;
  Status other;
  Status st = idx_->Scan(Key(0), kN, [&](Slice k, Slice) {
    visited++;
    const std::string key(k);
    const Status s = idx_->Remove(key);
    if (s.ok()) {
      removed++;
      model_.erase(key);
    } else if (s.IsBusy()) {
      busy.push_back(key);
    } else if (other.ok()) {
      other = s;
    }
    return true;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(other.ok()) << other.ToString();
  EXPECT_EQ(visited, kN);
  EXPECT_EQ(removed + busy.size(), kN);
  EXPECT_LE(removed, 1024 / per);
  EXPECT_FALSE(busy.empty()) << "every Remove found a retire slot (the test needs more records)";
  EXPECT_TRUE(idx_->Check().ok());
  // The scan ended: its guard no longer holds the blocks back.
  for (const std::string& key : busy) {
    ASSERT_TRUE(idx_->Remove(key).ok());
    model_.erase(key);
  }
  EXPECT_EQ(idx_->Size(), 0u);
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_TRUE(fftest::NoLeak(idx_.get()));
}

TEST_P(FastFairRetire, ReadersWhileWritersReplace) {
  test::TestWatchdog dog("fastfair ReadersWhileWritersReplace", 300);
  opts_.pool_size = opts_.max_pool_size = 32ull << 20;
  opts_.params["node_size"] = "256";
  ASSERT_TRUE(OpenIndex("fastfair", opts_, &idx_).ok());
  constexpr uint64_t kIds = 400;  // even ids stay, odd ids are rewritten
  for (uint64_t i = 0; i < kIds; i++) ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 0)).ok());
  std::atomic<int> writers{2};
  std::atomic<uint64_t> errors{0}, reads{0};
  std::string first_error;
  std::mutex mu;
  auto bad = [&](const std::string& what) {
    if (errors++ == 0) {
      std::lock_guard<std::mutex> g(mu);
      first_error = what;
    }
  };
  auto writer = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (uint64_t op = 1; op <= 4000; op++) {
      const uint64_t id = rng() % (kIds / 2) * 2 + 1;
      Status s;
      switch (rng() % 3) {
        case 0: s = idx_->Update(Key(id), Val(id, op)); break;
        case 1: s = idx_->Remove(Key(id)); break;
        default: s = idx_->Upsert(Key(id), Val(id, op)); break;
      }
      if (!s.ok() && !s.IsNotFound()) bad("write: " + s.ToString());
    }
    writers--;
  };
  auto reader = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (uint64_t r = 0; writers.load() > 0 || r < 200; r++) {
      const uint64_t id = rng() % kIds;
      std::string v;
      Status s = idx_->Find(Key(id), &v);
      reads++;
      if (id % 2 == 0 && !s.ok()) bad("stable key not found: " + s.ToString());
      if (s.ok() && !ValOf(id, v)) bad("find: foreign or torn value for id " + std::to_string(id));
      if (r % 8 == 0) {
        std::string prev;
        Status sc = idx_->Scan(Key(id), 30, [&](Slice k, Slice val) {
          std::string ks(k);
          if (!prev.empty() && !(bk() ? prev < ks : SliceToU64(prev) < SliceToU64(ks))) bad("scan out of order");
          prev = ks;
          const uint64_t kid = bk() ? std::stoull(ks.substr(3)) - 100000 : SliceToU64(ks) - 1000;
          const std::string vs(val);
          if (!ValOf(kid, vs)) bad("scan: foreign or torn value for id " + std::to_string(kid));
          // The handed-out bytes stay as they were for the whole callback
          // (in place in PM: a block freed and reused now would change).
          std::this_thread::yield();
          if (std::string(k) != ks || std::string(val) != vs) bad("scan: a record's bytes changed under the callback");
          return true;
        });
        if (!sc.ok()) bad("scan: " + sc.ToString());
      }
      if (r % 8 == 4) {
        std::string ks[4];
        Slice keys[4];
        for (int j = 0; j < 4; j++) keys[j] = ks[j] = Key((id + uint64_t(j)) % kIds);
        std::string vals[4];
        Status sts[4];
        idx_->FindMany(keys, 4, vals, sts);
        for (int j = 0; j < 4; j++)
          if (sts[j].ok() && !ValOf((id + uint64_t(j)) % kIds, vals[j])) bad("find_many: foreign or torn value");
      }
    }
  };
  std::vector<std::thread> ts;
  ts.emplace_back(writer, 1);
  ts.emplace_back(writer, 2);
  ts.emplace_back(reader, 3);
  ts.emplace_back(reader, 4);
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors.load(), 0u) << first_error;
  EXPECT_GT(reads.load(), 0u);
  Status c = idx_->Check();
  EXPECT_TRUE(c.ok()) << c.ToString();
  EXPECT_TRUE(fftest::NoLeak(idx_.get()));
}

TEST_P(FastFairRetire, CrashBetweenRetireStepsLeaksNothing) {
  ASSERT_TRUE(internal::kit::CreateObservedIndex("fastfair", opts_, &sim_, &idx_));
  Load(40);
  const std::map<std::string, std::string> before = model_;
  sim_->on_fence = [&](uint64_t) {
    std::string img = tag_ + ".img" + std::to_string(files_.size());
    pm::Pool::Remove(img);
    sim_->Write(img);
    files_.push_back(img);
  };
  // Inside a scan's guard the retired blocks wait in their slots; the last
  // image has them owned by the slots only.
  ASSERT_TRUE(idx_->Scan(Key(0), 1, [&](Slice, Slice) {
                     Writes();
                     sim_->Write(tag_ + ".last");
                     return true;
                   }).ok());
  files_.push_back(tag_ + ".last");
  // Outside any guard: the slots' blocks are freed (the free step too).
  ASSERT_TRUE(idx_->Remove(Key(7)).ok());
  ASSERT_TRUE(idx_->Update(Key(9), Val(9, 2)).ok());
  sim_->on_fence = nullptr;
  ASSERT_GT(files_.size(), 20u);
  for (const std::string& img : files_) {
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    std::unique_ptr<Index> rec;
    Status s = OpenIndex("", o, &rec);
    ASSERT_TRUE(s.ok()) << img << ": " << s.ToString();
    Status c = rec->Check();
    ASSERT_TRUE(c.ok()) << img << ": " << c.ToString();
    ASSERT_TRUE(fftest::NoLeak(rec.get())) << img;
    for (auto& [k, v] : before) {
      std::string out;
      Status f = rec->Find(k, &out);
      if (k == Key(3) || k == Key(7)) {
        ASSERT_TRUE(f.IsNotFound() || (f.ok() && out == v)) << img;
      } else if (k == Key(5) || k == Key(9)) {
        ASSERT_TRUE(f.ok()) << img;
        ASSERT_TRUE(ValOf(k == Key(5) ? 5 : 9, out)) << img;
      } else {
        ASSERT_TRUE(f.ok()) << img << ": " << f.ToString();
        ASSERT_EQ(out, v) << img;
      }
    }
    // A write after the recovery reuses what it freed without a conflict.
    ASSERT_TRUE(rec->Upsert(Key(3), Val(3, 9)).ok()) << img;
    ASSERT_TRUE(fftest::NoLeak(rec.get())) << img;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, FastFairRetire,
                         testing::Values(Kinds{KeyKind::kBytes, ValueKind::kBytes},
                                         Kinds{KeyKind::kU64, ValueKind::kBytes},
                                         Kinds{KeyKind::kBytes, ValueKind::kU64}),
                         [](const testing::TestParamInfo<Kinds>& i) {
                           return std::string(i.param.kk == KeyKind::kBytes ? "bytes" : "u64") + "_" +
                                  (i.param.vk == ValueKind::kBytes ? "bytes" : "u64");
                         });

}  // namespace
}  // namespace pmindex
