// fptree_retire_test: fptree's removed and replaced key/value blocks
// (fptree_retire.cc) stay readable while a lock-free reader may be in them,
// and a crash while they wait for their grace period leaks nothing.
//
// ReaderInsideAGuardKeepsRemovedBlocks: with an epoch guard held (as a Find
// or Scan holds it while it reads blocks), another thread removes a record
// and replaces another one's value, then writes many records of the same
// sizes: the old blocks must stay allocated and byte-identical until the
// guard ends, and be freed by the next write after it.
//
// CrashWhileBlocksWaitLeaksNothing: the same writes with the guard held, a
// crash image at every fence and once more after the writes (blocks owned
// by retire slots only); every image must recover to a consistent tree that
// owns exactly the allocated blocks (no leak, no double owner), with every
// acknowledged record.
//
// WritesFromAScanCallbackDoNotWaitForTheirOwnScan: a Scan callback removes
// every record it is handed and replaces the value of another, retiring
// far more blocks than there are retire slots (512). The callback runs
// outside the scan's epoch guard, so the slots' grace periods pass and no
// write waits for its own scan; the watchdog turns such a wait into a
// failure.
//
// Failure model: kit/test_observer.h's DurableImage.
// Thread safety: each test drives its own pool.
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fptree/fptree.h"
#include "kit/test_observer.h"
#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

class FPTreeRetire : public testing::Test {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/fptree-retire-" + std::to_string(getpid());
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = KeyKind::kBytes;
    opts_.value_kind = ValueKind::kBytes;
    opts_.params = {{"leaf_size", "8"}, {"inner_size", "4"}};
  }
  void TearDown() override {
    sim_.reset();
    idx_.reset();
    pm::Pool::Remove(opts_.pool_path);
    for (auto& f : files_) pm::Pool::Remove(f);
  }
  static std::string Key(uint64_t i) { return "key" + std::to_string(1000 + i); }
  static std::string Val(uint64_t i, char c) { return std::string(96, c) + std::to_string(i); }
  const char* At(uint64_t off) const { return idx_->pool()->base() + off; }
  std::set<uint64_t> Allocated() const { return testutil::AllocatedBlocks(idx_.get()); }
  // The key and value block offsets of the record with key k (PM words).
  void Blocks(const std::string& k, uint64_t* kb, uint64_t* vb) const {
    internal::FPTreePmWords w;
    ASSERT_TRUE(internal::FPTreeGetPmWords(idx_.get(), &w));
    for (uint64_t leaf : w.leaves) {
      uint64_t bm;
      std::memcpy(&bm, At(leaf), 8);
      for (uint32_t i = 0; i < 64; i++) {
        if (!(bm >> i & 1)) continue;
        uint64_t kw, vw, len;
        std::memcpy(&kw, At(leaf + w.slot0_key_in_leaf + i * w.key_stride), 8);
        std::memcpy(&vw, At(leaf + w.slot0_val_in_leaf + i * w.val_stride), 8);
        std::memcpy(&len, At(kw), 8);
        if (std::string(At(kw) + 8, len) == k) {
          *kb = kw;
          *vb = vw;
          return;
        }
      }
    }
    FAIL() << "record not found in the leaves";
  }
  // The writes under test, from another thread: remove record 3, replace
  // record 5's value, insert records 100.. with values of the same size.
  void Writes() {
    std::thread t([&] {
      EXPECT_TRUE(idx_->Remove(Key(3)).ok());
      model_.erase(Key(3));
      EXPECT_TRUE(idx_->Update(Key(5), Val(5, 'u')).ok());
      model_[Key(5)] = Val(5, 'u');
      for (uint64_t i = 100; i < 140; i++) {
        EXPECT_TRUE(idx_->Insert(Key(i), Val(i, 'n')).ok());
        model_[Key(i)] = Val(i, 'n');
      }
    });
    t.join();
  }
  void Load() {
    for (uint64_t i = 0; i < 40; i++) {
      ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 'v')).ok());
      model_[Key(i)] = Val(i, 'v');
    }
  }
  std::string Leak(Index* idx) const { return testutil::LeakReport(idx); }

  std::string tag_;
  Options opts_;
  std::unique_ptr<DurableImage> sim_;
  std::unique_ptr<Index> idx_;
  std::map<std::string, std::string> model_;
  std::vector<std::string> files_;
};

TEST_F(FPTreeRetire, ReaderInsideAGuardKeepsRemovedBlocks) {
  ASSERT_TRUE(OpenIndex("fptree", opts_, &idx_).ok());
  Load();
  uint64_t kb3 = 0, vb3 = 0, kb5 = 0, vb5 = 0;
  ASSERT_NO_FATAL_FAILURE(Blocks(Key(3), &kb3, &vb3));
  ASSERT_NO_FATAL_FAILURE(Blocks(Key(5), &kb5, &vb5));
  const std::vector<uint64_t> old = {kb3, vb3, vb5};
  std::vector<std::string> bytes;  // each block's words: {len, bytes padded to 8}
  for (uint64_t b : old) {
    uint64_t len;
    std::memcpy(&len, At(b), 8);
    bytes.emplace_back(At(b), 8 + ((len + 7) & ~7ull));
  }
  ASSERT_TRUE(internal::FPTreeInEpoch(idx_.get(), [&] {
    Writes();
    std::set<uint64_t> a = Allocated();
    for (size_t i = 0; i < old.size(); i++) {
      EXPECT_EQ(a.count(old[i]), 1u) << "block " << old[i] << " freed while a reader's guard is held";
      EXPECT_EQ(std::string(At(old[i]), bytes[i].size()), bytes[i]) << "block " << old[i] << " rewritten under a reader";
    }
  }));
  // The guard ended: the next write frees them.
  ASSERT_TRUE(idx_->Remove(Key(7)).ok());
  model_.erase(Key(7));
  std::set<uint64_t> a = Allocated();
  for (uint64_t b : old) EXPECT_EQ(a.count(b), 0u) << "block " << b << " not freed after the grace period";
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_EQ(Leak(idx_.get()), "");
  for (auto& [k, v] : model_) {
    std::string out;
    ASSERT_TRUE(idx_->Find(k, &out).ok());
    EXPECT_EQ(out, v);
  }
}

TEST_F(FPTreeRetire, CrashWhileBlocksWaitLeaksNothing) {
  ASSERT_TRUE(internal::kit::CreateObservedIndex("fptree", opts_, &sim_, &idx_));
  Load();
  const std::map<std::string, std::string> before = model_;
  sim_->on_fence = [&](uint64_t) {
    std::string img = tag_ + ".img" + std::to_string(files_.size());
    pm::Pool::Remove(img);
    sim_->Write(img);
    files_.push_back(img);
  };
  ASSERT_TRUE(internal::FPTreeInEpoch(idx_.get(), [&] {
    Writes();
    sim_->Write(tag_ + ".last");  // the retired blocks owned by retire slots only
  }));
  sim_->on_fence = nullptr;
  files_.push_back(tag_ + ".last");
  ASSERT_GT(files_.size(), 20u);
  for (const std::string& img : files_) {
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    std::unique_ptr<Index> rec;
    Status s = OpenIndex("", o, &rec);
    ASSERT_TRUE(s.ok()) << img << ": " << s.ToString();
    ASSERT_TRUE(rec->Check().ok()) << img;
    ASSERT_EQ(Leak(rec.get()), "") << img;
    // Records untouched by the writes are all there, intact.
    for (auto& [k, v] : before) {
      if (k == Key(3) || k == Key(5)) continue;
      std::string out;
      ASSERT_TRUE(rec->Find(k, &out).ok()) << img;
      ASSERT_EQ(out, v) << img;
    }
    std::string out;
    Status f = rec->Find(Key(5), &out);
    ASSERT_TRUE(f.ok()) << img;
    ASSERT_TRUE(out == Val(5, 'v') || out == Val(5, 'u')) << img;
  }
  std::unique_ptr<Index> last;
  Options o = opts_;
  o.pool_path = tag_ + ".last";
  o.create_if_missing = false;
  ASSERT_TRUE(OpenIndex("", o, &last).ok());
  EXPECT_TRUE(last->Find(Key(3), nullptr).IsNotFound());
  EXPECT_EQ(last->Size(), model_.size());
}

// Each Remove retires a key and a value block and each Update a value
// block: 3 retire slots per record, 1500 records, against 512 slots. A
// write that waited for a grace period its own scan held back would hang.
TEST_F(FPTreeRetire, WritesFromAScanCallbackDoNotWaitForTheirOwnScan) {
  opts_.pool_size = opts_.max_pool_size = 16ull << 20;
  ASSERT_TRUE(OpenIndex("fptree", opts_, &idx_).ok());
  constexpr uint64_t kN = 1500;
  for (uint64_t i = 0; i < kN; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i, 'v')).ok());
    model_[Key(i)] = Val(i, 'v');
  }
  test::TestWatchdog dog("fptree writes from inside a Scan callback past the 512 retire slots", 60);
  const std::map<std::string, std::string> loaded = model_;
  size_t visited = 0;
  Status inner;
  Status st = idx_->Scan(Key(0), kN, [&](Slice k, Slice v) {
    const std::string key(k);
    visited++;
    // The value loaded or the one the callback gave it (a scan may hand out
    // a record read before that Update).
    if (inner.ok() && std::string(v) != model_[key] && std::string(v) != loaded.at(key))
      inner = Status::Corrupt("value of " + key);
    if (inner.ok()) inner = idx_->Remove(key);
    model_.erase(key);
    // The next record gets a new value of the same size (its old block
    // retired).
    auto next = model_.upper_bound(key);
    if (inner.ok() && next != model_.end()) {
      const std::string nv(next->second.size(), 'u');
      inner = idx_->Update(next->first, nv);
      next->second = nv;
    }
    return inner.ok();
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(inner.ok()) << inner.ToString();
  EXPECT_EQ(visited, kN);
  EXPECT_EQ(idx_->Size(), 0u);
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  // One more write after the scan frees what has passed its grace period.
  ASSERT_TRUE(idx_->Insert(Key(0), Val(0, 'v')).ok());
  ASSERT_TRUE(idx_->Remove(Key(0)).ok());
  EXPECT_EQ(Leak(idx_.get()), "");
}

}  // namespace
}  // namespace pmindex
