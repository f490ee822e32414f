// fptree_create_test: power failures inside the creation of an FPTree pool
// (fptree, fptree_single, ptree), one and then a second one while the
// crashed creation is finished at the next open. Creation is idempotent
// (fptree_recovery.cc, Format): every image, after one or two crashes, must
// open, hold one empty leaf, pass Check(), own exactly the allocated blocks,
// and take inserts.
//
// Failure model: kit/test_observer.h's DurableImage (a flushed line is
// durable at its thread's next fence; the image at every fence is saved).
//
// Thread safety: single-threaded.
#include <unistd.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/index_util.h"
#include "fptree/fptree.h"
#include "kit/test_observer.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

class FPTreeCreateCrash : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/fptree-create-" + std::to_string(getpid()) + "-" + GetParam();
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 2ull << 20;
    opts_.max_pool_size = 2ull << 20;
    opts_.key_kind = KeyKind::kBytes;
    opts_.value_kind = ValueKind::kBytes;
    opts_.params = {{"leaf_size", "6"}, {"inner_size", "4"}};
    if (GetParam() == "fptree_single") opts_.params["group_size"] = "3";
  }
  void TearDown() override {
    for (auto& p : files_) pm::Pool::Remove(p);
    pm::Pool::Remove(opts_.pool_path);
  }
  // Saves the image at every fence of fn (run with *sim installed).
  std::vector<std::string> Images(DurableImage* sim, const std::string& prefix, const std::function<void()>& fn) {
    std::vector<std::string> out;
    sim->on_fence = [&](uint64_t) {
      std::string img = prefix + "." + std::to_string(out.size());
      pm::Pool::Remove(img);
      sim->Write(img);
      out.push_back(img);
      files_.push_back(img);
    };
    fn();
    sim->on_fence = nullptr;
    return out;
  }
  // "" if the image opens as an empty, consistent, writable tree.
  std::string Verify(const std::string& img) {
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    std::unique_ptr<Index> idx;
    Status s = OpenIndex(GetParam(), o, &idx);
    if (!s.ok()) return "open: " + s.ToString();
    if (idx->Size() != 0) return "not empty";
    uint64_t inner = 0, leaves = 0;
    internal::FPTreeShape(idx.get(), &inner, &leaves);
    if (leaves != 1) return std::to_string(leaves) + " leaves";
    for (int i = 0; i < 40; i++)
      if (!(s = idx->Insert("k" + std::to_string(i), "v")).ok()) return "insert: " + s.ToString();
    if (!(s = idx->Check()).ok()) return "check: " + s.ToString();
    if (std::string l = testutil::LeakReport(idx.get()); !l.empty()) return l;
    return "";
  }

  std::string tag_;
  Options opts_;
  std::vector<std::string> files_;
};

TEST_P(FPTreeCreateCrash, TwoCrashesInCreationStillOpen) {
  std::vector<std::string> first;
  {
    std::unique_ptr<DurableImage> sim;
    std::unique_ptr<Index> idx;
    std::unique_ptr<pm::Pool> pool;
    pm::PoolOptions po;
    po.size = opts_.pool_size;
    po.max_size = opts_.max_pool_size;
    ASSERT_TRUE(pm::Pool::Create(opts_.pool_path, GetParam(), po, &pool).ok());
    sim = std::make_unique<DurableImage>(pool.get());
    first = Images(sim.get(), tag_ + ".c", [&] {
      ASSERT_TRUE(internal::CreateIndexInPool(GetParam(), std::move(pool), opts_, &idx).ok());
    });
    sim.reset();
  }
  ASSERT_GT(first.size(), 2u);
  size_t checked = 0;
  for (const std::string& img : first) {
    // The next open finishes the crashed creation in img; a second crash
    // at each of its fences.
    std::unique_ptr<pm::Pool> pool;
    Status s = pm::Pool::Open(img, GetParam(), pm::PoolOptions{}, &pool);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto sim = std::make_unique<DurableImage>(pool.get());
    std::unique_ptr<Index> idx;
    Options o = opts_;
    o.pool_path = img;
    o.create_if_missing = false;
    std::vector<std::string> second = Images(sim.get(), img + ".r", [&] {
      Status st = internal::OpenIndexInPool(std::move(pool), o, &idx);
      EXPECT_TRUE(st.ok()) << st.ToString();
    });
    sim.reset();
    idx.reset();
    ASSERT_EQ(Verify(img), "") << "after one crash, image " << img;
    for (const std::string& img2 : second) {
      ASSERT_EQ(Verify(img2), "") << "after two crashes, image " << img2;
      checked++;
      pm::Pool::Remove(img2);
    }
  }
  EXPECT_GT(checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(Variants, FPTreeCreateCrash, testing::Values("fptree", "fptree_single", "ptree"));

}  // namespace
}  // namespace pmindex
