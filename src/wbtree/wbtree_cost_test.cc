// wbtree_cost_test: wBTree's PM cost per operation, counted with the
// substrate's per-thread counters (pm::ThreadCounters, never timed), and
// the constant cost of open (docs/wbtree.md, "Flushes per operation" and
// "Recovery"). The asserted bounds are the persist orders of
// wbtree_write.cc: a u64 insert that does not split flushes 3 lines with 2
// fences, an update 1 line with 1 fence, a delete 1 line with 1 fence; open
// stores the same amount whatever the number of records. The averages at
// steady state (splits and leaf frees included) are printed for the docs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/persist.h"

namespace pmindex {
namespace {

struct Cost {
  double lines = 0, fences = 0;
};

class WBTreeCost : public testing::Test {
 protected:
  void SetUp() override {
    path_ = "/dev/shm/wbtree_cost_" + std::to_string(::getpid()) + ".pool";
    std::filesystem::remove(path_);
  }
  void TearDown() override {
    idx_.reset();
    std::filesystem::remove(path_);
  }
  void Open(KeyKind kk = KeyKind::kU64, ValueKind vk = ValueKind::kU64, const char* index = "wbtree") {
    Options o;
    o.pool_path = path_;
    o.pool_size = 256ull << 20;
    o.key_kind = kk;
    o.value_kind = vk;
    ASSERT_TRUE(OpenIndex(index, o, &idx_).ok());
  }
  template <typename F>
  Cost Measure(int n, F op) {
    const pm::Counters before = pm::ThreadCounters();
    for (int i = 0; i < n; i++) op(i);
    const pm::Counters d = pm::ThreadCounters() - before;
    return Cost{double(d.lines_flushed) / n, double(d.fences) / n};
  }
  std::string path_;
  std::unique_ptr<Index> idx_;
};

TEST_F(WBTreeCost, FlushesPerOperationU64) {
  Open();
  const uint64_t kN = 200000;
  std::vector<uint64_t> keys(kN);
  for (uint64_t i = 0; i < kN; i++) keys[i] = i * 2654435761ull % (1ull << 40);
  for (uint64_t k : keys) ASSERT_TRUE(idx_->Insert(U64Slice(k), U64Slice(k)).ok());
  // One insert into a leaf with room: 3 lines, 2 fences. A fresh key next
  // to a known one lands in a leaf that may be full, so measure the
  // minimum over a few and the average over many.
  double min_lines = 1e9, min_fences = 1e9;
  for (int i = 0; i < 64; i++) {
    const uint64_t k = keys[i] + 1;
    Cost c = Measure(1, [&](int) { ASSERT_TRUE(idx_->Insert(U64Slice(k), U64Slice(k)).ok()); });
    min_lines = std::min(min_lines, c.lines);
    min_fences = std::min(min_fences, c.fences);
  }
  EXPECT_EQ(min_lines, 3);
  EXPECT_EQ(min_fences, 2);
  std::mt19937_64 rng(1);
  const Cost ins = Measure(50000, [&](int) {
    const uint64_t k = (rng() % (1ull << 40)) | 1;
    Status s = idx_->Insert(U64Slice(k), U64Slice(k));
    ASSERT_TRUE(s.ok() || s.IsAlreadyExists());
  });
  const Cost upd = Measure(50000, [&](int i) { ASSERT_TRUE(idx_->Update(U64Slice(keys[i]), U64Slice(i)).ok()); });
  EXPECT_EQ(upd.lines, 1);
  EXPECT_EQ(upd.fences, 1);
  const Cost del = Measure(50000, [&](int i) { ASSERT_TRUE(idx_->Remove(U64Slice(keys[i])).ok()); });
  EXPECT_LT(del.lines, 1.1);
  std::string v;
  const Cost find = Measure(50000, [&](int i) { ASSERT_TRUE(idx_->Find(U64Slice(keys[kN - 1 - i]), &v).ok()); });
  EXPECT_EQ(find.lines, 0);
  std::printf("u64 steady state (200k records, 63/32 entries): insert %.3f lines %.3f fences, update %.3f / %.3f, "
              "delete %.3f / %.3f, find %.3f / %.3f\n",
              ins.lines, ins.fences, upd.lines, upd.fences, del.lines, del.fences, find.lines, find.fences);
  ASSERT_TRUE(idx_->Check().ok());
}

TEST_F(WBTreeCost, FlushesPerOperationBytes) {
  Open(KeyKind::kBytes, ValueKind::kBytes);
  const int kN = 50000;
  auto key = [](uint64_t i) { return "user" + std::to_string(i * 2654435761ull % 1000000007ull); };
  const Cost ins = Measure(kN, [&](int i) { ASSERT_TRUE(idx_->Insert(key(i), "value-" + std::to_string(i)).ok()); });
  const Cost upd = Measure(kN, [&](int i) { ASSERT_TRUE(idx_->Update(key(i), "updated-" + std::to_string(i)).ok()); });
  const Cost del = Measure(kN / 2, [&](int i) { ASSERT_TRUE(idx_->Remove(key(i)).ok()); });
  std::printf("bytes (50k records): insert %.3f lines %.3f fences, update %.3f / %.3f, delete %.3f / %.3f "
              "(allocator lines and fences included)\n",
              ins.lines, ins.fences, upd.lines, upd.fences, del.lines, del.fences);
  ASSERT_TRUE(idx_->Check().ok());
}

// The slot-only variant (7-entry nodes): an insert without split flushes
// the entry and the slot word (2 lines, 2 fences); update and delete 1 / 1.
TEST_F(WBTreeCost, FlushesPerOperationSlotOnly) {
  Open(KeyKind::kU64, ValueKind::kU64, "wbtree_slot");
  const uint64_t kN = 200000;
  std::vector<uint64_t> keys(kN);
  for (uint64_t i = 0; i < kN; i++) keys[i] = i * 2654435761ull % (1ull << 40);
  for (uint64_t k : keys) ASSERT_TRUE(idx_->Insert(U64Slice(k), U64Slice(k)).ok());
  double min_lines = 1e9, min_fences = 1e9;
  for (int i = 0; i < 64; i++) {
    const uint64_t k = keys[i] + 1;
    Cost c = Measure(1, [&](int) { ASSERT_TRUE(idx_->Insert(U64Slice(k), U64Slice(k)).ok()); });
    min_lines = std::min(min_lines, c.lines);
    min_fences = std::min(min_fences, c.fences);
  }
  EXPECT_EQ(min_lines, 2);
  EXPECT_EQ(min_fences, 2);
  std::mt19937_64 rng(1);
  const Cost ins = Measure(50000, [&](int) {
    const uint64_t k = (rng() % (1ull << 40)) | 1;
    Status s = idx_->Insert(U64Slice(k), U64Slice(k));
    ASSERT_TRUE(s.ok() || s.IsAlreadyExists());
  });
  const Cost upd = Measure(50000, [&](int i) { ASSERT_TRUE(idx_->Update(U64Slice(keys[i]), U64Slice(i)).ok()); });
  EXPECT_EQ(upd.lines, 1);
  const Cost del = Measure(50000, [&](int i) { ASSERT_TRUE(idx_->Remove(U64Slice(keys[i])).ok()); });
  std::printf("wbtree_slot u64 steady state (200k records, 7/7 entries): insert %.3f lines %.3f fences, update %.3f / %.3f, "
              "delete %.3f / %.3f\n",
              ins.lines, ins.fences, upd.lines, upd.fences, del.lines, del.fences);
  ASSERT_TRUE(idx_->Check().ok());
}

// Open does the same PM work at 2k and 100k records (nothing per node:
// slot arrays and spares are repaired on first touch).
TEST_F(WBTreeCost, OpenCostDoesNotGrowWithRecords) {
  pm::Counters open_cost[2];
  const uint64_t sizes[2] = {2000, 100000};
  for (int t = 0; t < 2; t++) {
    Open();
    for (uint64_t i = 0; i < sizes[t]; i++) ASSERT_TRUE(idx_->Insert(U64Slice(i * 7), U64Slice(i)).ok());
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    const pm::Counters before = pm::ThreadCounters();
    Open();
    open_cost[t] = pm::ThreadCounters() - before;
    idx_.reset();
    std::filesystem::remove(path_);
  }
  EXPECT_EQ(open_cost[0].stores, open_cost[1].stores);
  EXPECT_EQ(open_cost[0].lines_flushed, open_cost[1].lines_flushed);
  std::printf("open: %llu stores, %llu lines at 2k and at 100k records\n", (unsigned long long)open_cost[1].stores,
              (unsigned long long)open_cost[1].lines_flushed);
}

}  // namespace
}  // namespace pmindex
