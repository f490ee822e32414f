// fptree_crash_test: power failure at every fence of leaf deletions (alg. 5-7:
// delete micro-log, unlink, free; the DRAM side removes emptied inner nodes
// and collapses the root) for fptree, fptree_single and ptree, u64 and byte
// keys/values, tiny nodes so that most deletes empty a leaf, many of them the
// only child of their DRAM parent.
// The live tree is scanned after the load and after every remove, so leaves
// carry scan-order hints (volatile stores in their trailer line) that reach
// the crash images whenever that line is flushed (next-pointer updates):
// recovery and scans must not trust them blindly.
//
// A durable image of the pool is kept (a flushed line reaches it at the next
// fence; unflushed stores never do). At every fence of the deletes under test
// the image is written to a file and opened like a pool after a power
// failure; the recovered tree must pass Check(), own exactly the allocated
// blocks, hold every acknowledged record and no acknowledged removal (the
// remove in flight may or may not have happened), return exactly those
// records from scans (twice: the first one may rewrite scan-order hints, the
// second one reads them), and, after removing all
// its records, be down to one leaf and one inner node with no leak. With the
// fault switch fptree.delete.skip_flush some image must fail (the test can
// fail).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/index_util.h"
#include "fptree/fptree.h"
#include "kit/test_observer.h"
#include "pm/image_file.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "testing/fence_images.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

struct Kind {
  std::string name;
  bool bytes;
};

class FPTreeDeleteCrash : public testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/fptree-crash-" + std::to_string(getpid()) + "-" + GetParam().name + (GetParam().bytes ? "-b" : "-u");
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    opts_.params = {{"leaf_size", "4"}, {"inner_size", "3"}};
    if (GetParam().name == "fptree_single") opts_.params["group_size"] = "2";
  }
  void TearDown() override {
    sim_.reset();
    idx_.reset();
    pm::Pool::Remove(opts_.pool_path);
  }
  void Create() {
    ASSERT_TRUE(internal::kit::CreateObservedIndex(GetParam().name, opts_, &sim_, &idx_));
  }
  std::string Key(uint64_t i) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 37 % 1000));
    return "key-" + std::to_string(i * 37 % 1000) + std::string(i % 3 * 4, 'k');
  }
  std::string Val(uint64_t i) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 5 + 1));
    return "value-" + std::to_string(i) + std::string(i % 5 * 3, 'v');
  }

  // Opens a saved durable image; "" if it recovers correctly. (Images are
  // saved at the fence and checked once the remove has returned, outside
  // the observer callback of the remove under test.)
  std::string Verify(const std::string& img) {
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    o.params.clear();
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("", o, &idx);
    if (!s.ok()) return "open: " + s.ToString();
    s = idx->Check();
    if (!s.ok()) return "check: " + s.ToString();
    if (std::string l = Leak(idx.get()); !l.empty()) return l;
    size_t present = 0;
    for (auto& [k, v] : model_) {
      std::string out;
      Status f = idx->Find(k, &out);
      if (f.ok() && out != v) return "wrong value after recovery";
      if (f.ok()) present++;
      else if (k != inflight_) return "acknowledged record lost";
    }
    if (idx->Size() != present) return "Size() " + std::to_string(idx->Size()) + " != " + std::to_string(present) + " (a removed record came back?)";
    std::map<std::string, std::string> expect = model_;
    if (!inflight_.empty() && !idx->Find(inflight_, nullptr).ok()) expect.erase(inflight_);
    for (int pass = 0; pass < 2; pass++)
      if (std::string e = ScanMatches(idx.get(), expect); !e.empty()) return "after recovery: " + e;
    // The recovered tree deletes down to its last leaf without leaking.
    for (auto& [k, v] : model_)
      if (idx->Find(k, nullptr).ok() && !idx->Remove(k).ok()) return "remove after recovery failed";
    s = idx->Check();
    if (!s.ok()) return "check after emptying: " + s.ToString();
    uint64_t inner = 0, leaves = 0;
    internal::FPTreeShape(idx.get(), &inner, &leaves);
    if (inner != 1 || leaves != 1)
      return "emptied tree has " + std::to_string(inner) + " inner nodes, " + std::to_string(leaves) + " leaves";
    return Leak(idx.get());
  }
  // "" if full scans and a few bounded scans return exactly `expect` (in
  // key order).
  std::string ScanMatches(Index* idx, const std::map<std::string, std::string>& expect) const {
    auto less = [&](const std::string& a, const std::string& b) {
      return GetParam().bytes ? a < b : SliceToU64(a) < SliceToU64(b);
    };
    std::vector<std::pair<std::string, std::string>> want(expect.begin(), expect.end());
    std::sort(want.begin(), want.end(), [&](auto& a, auto& b) { return less(a.first, b.first); });
    for (size_t from = 0; from <= want.size(); from += std::max<size_t>(1, want.size() / 3)) {
      std::string start = from < want.size() ? want[from].first : (GetParam().bytes ? std::string("~") : std::string(U64Slice(~0ull)));
      if (from == 0) start = GetParam().bytes ? std::string(1, '\x01') : std::string(U64Slice(0));
      size_t limit = from % 2 ? 5 : SIZE_MAX;
      std::vector<std::pair<std::string, std::string>> got;
      Status s = idx->Scan(start, limit, [&](Slice k, Slice v) {
        got.emplace_back(std::string(k), std::string(v));
        return true;
      });
      if (!s.ok()) return "scan: " + s.ToString();
      size_t end = std::min(want.size(), from + std::min(limit, want.size()));
      std::vector<std::pair<std::string, std::string>> exp(want.begin() + std::min(from, want.size()), want.begin() + end);
      if (got != exp)
        return "scan from record " + std::to_string(from) + " returned " + std::to_string(got.size()) + " records, expected " +
               std::to_string(exp.size()) + " (or wrong order/values)";
      if (want.empty()) break;
    }
    return "";
  }
  static std::string Leak(Index* idx) { return testutil::LeakReport(idx); }

  // Loads n records, then removes them all in a shuffled order with a crash
  // image checked at every fence. Returns the first failure ("" if none) and
  // the number of images checked.
  std::string Run(uint64_t n, uint64_t* images) {
    Create();
    for (uint64_t i = 0; i < n; i++) {
      EXPECT_TRUE(idx_->Insert(Key(i), Val(i)).ok());
      model_[Key(i)] = Val(i);
    }
    if (std::string e = ScanMatches(idx_.get(), model_); !e.empty()) return "live tree after load: " + e;
    std::vector<std::string> order;
    for (auto& kv : model_) order.push_back(kv.first);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
    std::string failure;
    *images = 0;
    testutil::FenceImages fences(sim_.get(), tag_);
    for (auto& k : order) {
      inflight_ = k;
      Status s = fences.During([&] { return idx_->Remove(k); });
      if (!s.ok()) failure = "remove failed: " + s.ToString();
      *images += uint64_t(fences.ForEach([&](const std::string& img, int) {
        if (failure.empty()) failure = Verify(img);
      }));
      model_.erase(k);
      inflight_.clear();
      // Scans of the live tree store hints that the next removes' flushes
      // carry into the images.
      if (failure.empty()) failure = ScanMatches(idx_.get(), model_);
      if (!failure.empty()) break;
    }
    return failure;
  }

  std::string tag_;
  Options opts_;
  std::unique_ptr<DurableImage> sim_;
  std::unique_ptr<Index> idx_;
  std::map<std::string, std::string> model_;
  std::string inflight_;
};

TEST_P(FPTreeDeleteCrash, EveryFenceOfLeafDeletionsRecovers) {
  uint64_t images = 0;
  std::string f = Run(40, &images);
  EXPECT_EQ(f, "");
  EXPECT_GT(images, 40u);
  // The live tree emptied too.
  uint64_t inner = 0, leaves = 0;
  ASSERT_TRUE(internal::FPTreeShape(idx_.get(), &inner, &leaves));
  EXPECT_EQ(leaves, 1u);
  EXPECT_EQ(inner, 1u);
}

TEST_P(FPTreeDeleteCrash, SkippedDeleteFlushIsCaught) {
  pm::EnableFault("fptree.delete.skip_flush");
  uint64_t images = 0;
  std::string f = Run(12, &images);
  pm::DisableAllFaults();
  EXPECT_NE(f, "");
}

INSTANTIATE_TEST_SUITE_P(Variants, FPTreeDeleteCrash,
                         testing::Values(Kind{"fptree", false}, Kind{"fptree", true}, Kind{"fptree_single", false},
                                         Kind{"fptree_single", true}, Kind{"ptree", false}, Kind{"ptree", true}),
                         [](const testing::TestParamInfo<Kind>& i) { return i.param.name + (i.param.bytes ? "_bytes" : "_u64"); });

// Power failure at every fence of inserts that split leaves (alg. 3; recovery
// redoes a pending split, alg. 4 and 9), concurrent fptree only. The delete
// test above never saves an image with a split micro-log pending (its load
// is not recorded), and its post-recovery writes are removes only, so it
// passed while recovery left a redone split's new leaf "born locked" in the
// DRAM version table. Here every image must
// recover, pass Check(), hold every acknowledged insert (the one in flight
// may or may not be there), and then take an update of every record, an
// insert next to every record (so every leaf gets written) and removes,
// after which Check() passes and the contents are exactly as expected. The
// checks and writes after the open run in a thread: a reader or writer
// spinning on a leaf left locked becomes a failure after 20 s instead of a
// stuck test.
class FPTreeSplitCrash : public FPTreeDeleteCrash {
 protected:
  void SetUp() override {
    FPTreeDeleteCrash::SetUp();
    tag_ += "-split";
    opts_.pool_path = tag_ + ".pool";
    opts_.params = {{"leaf_size", "8"}, {"inner_size", "4"}};
  }
  // A key sorting right after k and absent from the model (so it lands in
  // k's leaf), or "" if there is none.
  std::string KeyAfter(const std::string& k, const std::map<std::string, std::string>& m) const {
    std::string n = GetParam().bytes ? k + "+" : std::string(U64Slice(SliceToU64(k) + 1));
    return m.count(n) ? std::string() : n;
  }
  std::string NewVal(const std::string& v) const {
    return GetParam().bytes ? v + "-u" : std::string(U64Slice(SliceToU64(v) + 7777));
  }

  // Shared with the checking thread, which may outlive the check if it hangs.
  struct Writes {
    std::unique_ptr<Index> idx;
    std::string result;
  };
  static constexpr auto kWriteBound = std::chrono::seconds(20);

  // Opens a saved image; "" if it recovers correctly and takes the writes.
  // Everything after the open runs in a thread: finds and scans also wait
  // for a locked leaf, so a leaf left locked would hang them too. If the
  // thread does not finish within kWriteBound it is left behind, spinning,
  // with its index (it never returns, so it touches nothing else).
  std::string VerifySplitImage(const std::string& img) {
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    o.params.clear();
    auto w = std::make_shared<Writes>();
    Status s = OpenIndex("", o, &w->idx);
    if (!s.ok()) return "open: " + s.ToString();
    std::promise<void> done;
    std::future<void> fut = done.get_future();
    std::thread t([this, w, p = std::move(done)]() mutable {
      w->result = CheckAndWrite(w->idx.get());
      p.set_value();
    });
    if (fut.wait_for(kWriteBound) != std::future_status::ready) {
      t.detach();
      (void)w->idx.release();  // still in use by the stuck thread
      return "reads/writes after recovery did not finish within 20 s (a leaf left locked?)";
    }
    t.join();
    return w->result;
  }
  std::string CheckAndWrite(Index* idx) {
    Status s = idx->Check();
    if (!s.ok()) return "check after recovery: " + s.ToString();
    if (std::string l = Leak(idx); !l.empty()) return "after recovery: " + l;
    std::map<std::string, std::string> expect = model_;
    for (auto& kv : model_) {
      std::string out;
      Status f = idx->Find(kv.first, &out);
      if (!f.ok()) return "acknowledged record lost";
      if (out != kv.second) return "wrong value after recovery";
    }
    if (!inflight_.empty()) {
      std::string out;
      if (idx->Find(inflight_, &out).ok()) {
        if (out != inflight_val_) return "in-flight insert recovered with a wrong value";
        expect[inflight_] = inflight_val_;
      }
    }
    if (idx->Size() != expect.size()) return "Size() " + std::to_string(idx->Size()) + " != " + std::to_string(expect.size());
    if (std::string e = ScanMatches(idx, expect); !e.empty()) return "after recovery: " + e;
    // Writes into every leaf: update every record, insert a key right after
    // each one, remove every third original record.
    std::map<std::string, std::string> after = expect;
    int i = 0;
    for (auto& kv : expect) {
      std::string nv = NewVal(kv.second);
      s = idx->Update(kv.first, nv);
      if (!s.ok()) return "update after recovery: " + s.ToString();
      after[kv.first] = nv;
      std::string nk = KeyAfter(kv.first, expect);
      if (!nk.empty() && !after.count(nk)) {
        s = idx->Insert(nk, Val(1000 + i));
        if (!s.ok()) return "insert after recovery: " + s.ToString();
        after[nk] = Val(1000 + i);
      }
      if (i++ % 3 == 0) {
        s = idx->Remove(kv.first);
        if (!s.ok()) return "remove after recovery: " + s.ToString();
        after.erase(kv.first);
      }
    }
    s = idx->Check();
    if (!s.ok()) return "check after writes: " + s.ToString();
    if (idx->Size() != after.size()) return "Size() after writes " + std::to_string(idx->Size()) + " != " + std::to_string(after.size());
    if (std::string e = ScanMatches(idx, after); !e.empty()) return "after writes: " + e;
    if (std::string l = Leak(idx); !l.empty()) return "after writes: " + l;
    return "";
  }

  // Inserts n records with a crash image checked at every fence. Returns the
  // first failure ("" if none), the images checked, and those saved inside
  // an insert that split a leaf.
  std::string RunInserts(uint64_t n, uint64_t* images, uint64_t* split_images) {
    Create();
    std::string failure;
    *images = *split_images = 0;
    testutil::FenceImages fences(sim_.get(), tag_);
    for (uint64_t i = 0; i < n && failure.empty(); i++) {
      uint64_t inner = 0, before = 0, now = 0;
      internal::FPTreeShape(idx_.get(), &inner, &before);
      inflight_ = Key(i);
      inflight_val_ = Val(i);
      Status s = fences.During([&] { return idx_->Insert(Key(i), Val(i)); });
      if (!s.ok()) failure = "insert failed: " + s.ToString();
      internal::FPTreeShape(idx_.get(), &inner, &now);
      const int saved = fences.ForEach([&](const std::string& img, int) {
        if (failure.empty()) failure = VerifySplitImage(img);
      });
      *images += uint64_t(saved);
      if (now > before) *split_images += uint64_t(saved);
      model_[Key(i)] = Val(i);
      inflight_.clear();
    }
    return failure;
  }
  std::string inflight_val_;
};

TEST_P(FPTreeSplitCrash, EveryFenceOfSplittingInsertsRecoversWritable) {
  uint64_t images = 0, split_images = 0;
  std::string f = RunInserts(64, &images, &split_images);
  EXPECT_EQ(f, "");
  std::printf("%llu crash images, %llu of them inside a splitting insert\n", (unsigned long long)images,
              (unsigned long long)split_images);
  EXPECT_GT(images, 64u);
  EXPECT_GT(split_images, 10u);
  uint64_t inner = 0, leaves = 0;
  ASSERT_TRUE(internal::FPTreeShape(idx_.get(), &inner, &leaves));
  EXPECT_GT(leaves, 8u);  // many splits
  std::string why;
  EXPECT_TRUE(internal::FPTreeLeafVersionWords(idx_.get(), &why)) << why;
}

INSTANTIATE_TEST_SUITE_P(Concurrent, FPTreeSplitCrash, testing::Values(Kind{"fptree", false}, Kind{"fptree", true}),
                         [](const testing::TestParamInfo<Kind>& i) { return i.param.name + (i.param.bytes ? "_bytes" : "_u64"); });

}  // namespace
}  // namespace pmindex
