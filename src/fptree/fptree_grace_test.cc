// fptree_grace_test: what fptree (concurrent) keeps safe while a leaf
// deletion waits for its epoch grace period.
//
// NeighbourDeletersKeepLogsOffFreedLeaves: two deleters of neighbouring
// leaves. Deleter 1 empties leaf A (left neighbour P) and is held by the
// leaf-unlinked test hook after its unlink, before its grace period and its
// free. Deleter 2 then empties P, which is unlinked and freed. No durable
// delete micro-log may still name P: the allocator may hand P's block to a
// new leaf or, with byte values, to a user's value, and recovery would redo
// deleter 1's unlink into it. The test then allocates values shaped so that
// a reused P would hold A's offset where a leaf's next pointer sits, takes
// the crash image and checks that recovery returns every value intact.
// KeepLogPrevIsCaught: the same with the fault switch
// fptree.delete.keep_log_prev, which the checks must report.
//
// Failure model: kit/test_observer.h's DurableImage (a flushed line is
// durable at its thread's next fence).
//
// Thread safety: each test drives its own pool; the hook is process-wide.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
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
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

// The hook holds the first deletion that reaches it until `release`.
std::atomic<int> g_hook_calls{0};
std::atomic<uint64_t> g_held_leaf{0};
std::atomic<bool> g_release{false};
void HoldFirst(uint64_t leaf) {
  if (g_hook_calls.fetch_add(1) != 0) return;
  g_held_leaf.store(leaf);
  while (!g_release.load()) std::this_thread::yield();
}

class FPTreeGrace : public testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/fptree-grace-" + std::to_string(getpid()) + (GetParam() ? "-b" : "-u");
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = GetParam() ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam() ? ValueKind::kBytes : ValueKind::kU64;
    opts_.max_value_size = 512;
    opts_.params = {{"leaf_size", "4"}, {"inner_size", "3"}};
    g_hook_calls = 0;
    g_held_leaf = 0;
    g_release = false;
  }
  void TearDown() override {
    internal::SetFPTreeLeafUnlinkedHook(nullptr);
    sim_.reset();
    idx_.reset();
    pm::Pool::Remove(opts_.pool_path);
    pm::Pool::Remove(tag_ + ".img");
  }
  std::string Key(uint64_t i) const {
    if (!GetParam()) return std::string(U64Slice(i * 10 + 10));
    char b[16];
    std::snprintf(b, sizeof b, "key%05llu", static_cast<unsigned long long>(i));
    return b;
  }
  std::string Val(uint64_t i) const {
    return GetParam() ? "value-" + std::to_string(i) : std::string(U64Slice(i * 3 + 1));
  }
  uint64_t Word(uint64_t off) const {
    uint64_t w;
    std::memcpy(&w, idx_->pool()->base() + off, 8);
    return w;
  }
  // The keys of the leaf at `leaf`, read from PM.
  std::vector<std::string> LeafKeys(const internal::FPTreePmWords& w, uint64_t leaf) const {
    std::vector<std::string> out;
    uint64_t bm = Word(leaf);
    for (uint32_t i = 0; i < 64; i++) {
      if (!(bm >> i & 1)) continue;
      uint64_t kw = Word(leaf + w.slot0_key_in_leaf + i * w.key_stride);
      if (!GetParam()) {
        out.emplace_back(U64Slice(kw));
      } else {
        uint64_t len = Word(kw);
        out.emplace_back(idx_->pool()->base() + kw + 8, len);
      }
    }
    return out;
  }

  void NeighbourDeleters();

  std::string tag_;
  Options opts_;
  bool prev_named_ = false;
  size_t changed_ = 0;
  std::unique_ptr<DurableImage> sim_;
  std::unique_ptr<Index> idx_;
};

// The scenario of the file comment; sets prev_named_ (deleter 1's durable
// delete log names the freed P) and changed_ (values recovery did not
// return intact).
void FPTreeGrace::NeighbourDeleters() {
  ASSERT_TRUE(internal::kit::CreateObservedIndex("fptree", opts_, &sim_, &idx_));
  std::map<std::string, std::string> model;
  for (uint64_t i = 0; i < 40; i++) {
    ASSERT_TRUE(idx_->Insert(Key(i), Val(i)).ok());
    model[Key(i)] = Val(i);
  }
  internal::FPTreePmWords w;
  ASSERT_TRUE(internal::FPTreeGetPmWords(idx_.get(), &w));
  ASSERT_GE(w.leaves.size(), 4u);
  const uint64_t p = w.leaves[1], a = w.leaves[2];
  // Each of P and A down to one record.
  std::vector<std::string> pk = LeafKeys(w, p), ak = LeafKeys(w, a);
  ASSERT_FALSE(pk.empty());
  ASSERT_FALSE(ak.empty());
  for (const auto* keys : {&pk, &ak})
    for (size_t i = 1; i < keys->size(); i++) {
      ASSERT_TRUE(idx_->Remove((*keys)[i]).ok());
      model.erase((*keys)[i]);
    }

  internal::SetFPTreeLeafUnlinkedHook(&HoldFirst);
  std::thread d1([&] { EXPECT_TRUE(idx_->Remove(ak[0]).ok()); });
  while (g_hook_calls.load() == 0) std::this_thread::yield();
  ASSERT_EQ(g_held_leaf.load(), a);
  model.erase(ak[0]);
  // Deleter 2 empties P while deleter 1 waits before its grace period.
  ASSERT_TRUE(idx_->Remove(pk[0]).ok());
  model.erase(pk[0]);
  ASSERT_TRUE(internal::FPTreeGetPmWords(idx_.get(), &w));
  ASSERT_EQ(std::count(w.leaves.begin(), w.leaves.end(), p), 0) << "P was not unlinked";
  std::set<uint64_t> allocated;
  idx_->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
  ASSERT_EQ(allocated.count(p), 0u) << "P was not freed";
  // Deleter 1 took delete log 0 (the first free one) and still owns A there.
  ASSERT_EQ(Word(w.del0_cur), a);
  prev_named_ = Word(w.del0_prev) == p;

  // Values that a reused P would hold with A's offset at the next pointer.
  if (GetParam()) {
    // A block is {u64 len, bytes}: a value of leaf_bytes - 8 bytes asks
    // for a leaf-sized block, whose next-pointer word is value byte
    // next_in_leaf - 8.
    std::string v(w.leaf_bytes - 8, 'r');
    std::memcpy(&v[w.next_in_leaf - 8], &a, 8);
    // Updates of live records (no split, which could take P as a leaf)
    // until P's block holds one of them.
    bool reused = false;
    std::vector<std::string> live;
    for (auto& kv : model) live.push_back(kv.first);
    for (size_t i = 0; i < 64 && !reused; i++) {
      const std::string& k = live[i % live.size()];
      ASSERT_TRUE(idx_->Update(k, v).ok());
      model[k] = v;
      allocated.clear();
      idx_->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
      ASSERT_TRUE(internal::FPTreeGetPmWords(idx_.get(), &w));
      reused = allocated.count(p) && std::count(w.leaves.begin(), w.leaves.end(), p) == 0;
    }
    EXPECT_TRUE(reused) << "P's block does not hold a value (the recovery check below then proves less)";
  }
  sim_->Write(tag_ + ".img");
  Options o = opts_;
  o.pool_path = tag_ + ".img";
  o.create_if_missing = false;
  std::unique_ptr<Index> rec;
  Status s = OpenIndex("", o, &rec);
  if (s.ok() && rec->Check().ok()) {
    for (auto& [k, v] : model) {
      std::string out;
      if (!rec->Find(k, &out).ok() || out != v) changed_++;
    }
  } else {
    changed_ = model.size();
  }
  rec.reset();

  g_release = true;
  d1.join();
  EXPECT_TRUE(idx_->Check().ok());
  EXPECT_EQ(idx_->Size(), model.size());
}

TEST_P(FPTreeGrace, NeighbourDeletersKeepLogsOffFreedLeaves) {
  NeighbourDeleters();
  EXPECT_FALSE(prev_named_) << "the delete log of A still names its freed left neighbour P";
  EXPECT_EQ(changed_, 0u) << "values changed or lost in recovery";
}

// The fault switch fptree.delete.keep_log_prev (the log's prev word is not
// cleared once the unlink is durable) is caught: the log names the freed P
// and, with byte values, recovery's redone unlink overwrites a value that
// reused P's block.
TEST_P(FPTreeGrace, KeepLogPrevIsCaught) {
  pm::EnableFault("fptree.delete.keep_log_prev");
  NeighbourDeleters();
  pm::DisableFault("fptree.delete.keep_log_prev");
  EXPECT_TRUE(prev_named_);
  if (GetParam()) {
    EXPECT_GT(changed_, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, FPTreeGrace, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool>& i) { return std::string(i.param ? "bytes" : "u64"); });

}  // namespace
}  // namespace pmindex
