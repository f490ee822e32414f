// Crash tests of bztree: a mixed workload (inserts, updates, upserts,
// removes) on 256-byte nodes, so that consolidations, splits, merges,
// dropped leaves and root changes all happen, with the durable image (power
// failure as of that fence, kit/test_observer.h) saved at every fence and
// verified after the operation: it opens (PMwCAS recovery and the epoch
// bump), passes Check, leaks nothing (ForEachOwnedBlock == the allocator's
// blocks: replaced nodes and out-of-line values owned by descriptors are
// freed by recovery), holds every acknowledged operation (the one in flight
// either done or not), scans in key order and accepts writes that help any
// frozen node the crash left. Each fault switch (kFaultSwitches) must be
// caught.
#include <unistd.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "bztree/bztree_tree.h"
#include "kit/test_observer.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

struct Case {
  bool bytes;
  std::string fault;  // "" for the clean run
  std::string label;
};

class BzTreeCrash : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/bztree-crash-" + std::to_string(getpid()) + "-" + GetParam().label;
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    opts_.params = {{"node_size", "256"}};
    opts_.max_key_size = 24;
  }
  void TearDown() override {
    pm::DisableAllFaults();
    sim_.reset();
    idx_.reset();
    pm::Pool::Remove(opts_.pool_path);
  }
  std::string Key(uint64_t i) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 37 % 1000));
    return "key-" + std::to_string(i * 37 % 1000) + std::string(i % 3 * 4, 'k');
  }
  std::string Val(uint64_t i, uint64_t ver) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 5 + ver + 1));
    return "value-" + std::to_string(i) + "." + std::to_string(ver) + std::string((i + ver) % 5 * 3, 'v');
  }
  static std::string Leak(Index* idx) {
    std::set<uint64_t> owned, alloc;
    idx->ForEachOwnedBlock([&](uint64_t off) { owned.insert(off); });
    idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { alloc.insert(off); });
    return owned == alloc ? "" : "leak: owned " + std::to_string(owned.size()) + " allocated " + std::to_string(alloc.size());
  }
  bool Less(const std::string& a, const std::string& b) const {
    return GetParam().bytes ? a < b : SliceToU64(a) < SliceToU64(b);
  }
  // "" if the image at path recovers to `before` or `after` (the operation
  // in flight not done, or done) and stays usable.
  std::string Verify(const std::string& path, const std::map<std::string, std::string>& before,
                     const std::map<std::string, std::string>& after) {
    Options o = opts_;
    o.pool_path = path;
    o.create_if_missing = false;
    o.params.clear();
    o.recovery_threads = 2;
    std::unique_ptr<Index> idx;
    Status s = OpenIndex("", o, &idx);
    if (!s.ok()) return "open: " + s.ToString();
    s = idx->Check();
    if (!s.ok()) return "check: " + s.ToString();
    if (std::string l = Leak(idx.get()); !l.empty()) return l;
    std::vector<std::pair<std::string, std::string>> got;
    s = idx->Scan(GetParam().bytes ? std::string(1, '\x01') : std::string(U64Slice(0)), SIZE_MAX, [&](Slice k, Slice v) {
      got.emplace_back(std::string(k), std::string(v));
      return true;
    });
    if (!s.ok()) return "scan: " + s.ToString();
    auto sorted = [&](const std::map<std::string, std::string>& m) {
      std::vector<std::pair<std::string, std::string>> v(m.begin(), m.end());
      std::sort(v.begin(), v.end(), [&](auto& a, auto& b) { return Less(a.first, b.first); });
      return v;
    };
    if (got != sorted(before) && got != sorted(after)) return "recovered records match neither state";
    if (idx->Size() != got.size()) return "Size() disagrees with the scan";
    for (auto& [k, v] : got) {
      std::string out;
      if (!idx->Find(k, &out).ok() || out != v) return "find disagrees with the scan";
    }
    // Usable: writes (helping frozen nodes), then Check and no leak.
    for (uint64_t i = 2000; i < 2012; i++)
      if (Status w = idx->Upsert(Key(i), Val(i, 9)); !w.ok()) return "write after recovery: " + w.ToString();
    for (auto& [k, v] : got)
      if (Status w = idx->Remove(k); !w.ok()) return "remove after recovery: " + w.ToString();
    s = idx->Check();
    if (!s.ok()) return "check after writes: " + s.ToString();
    return Leak(idx.get());
  }

  // Runs `ops` random operations over `keys` keys with every fence's image
  // verified; returns the first failure and counts the images.
  std::string Run(int ops, uint64_t keys, uint64_t* images) {
    EXPECT_TRUE(internal::kit::CreateObservedIndex("bztree", opts_, &sim_, &idx_));
    if (!GetParam().fault.empty()) pm::EnableFault(GetParam().fault);
    std::mt19937_64 rng(7);
    std::map<std::string, std::string> model;
    int saved = 0;
    bool recording = false;
    sim_->on_fence = [&](uint64_t) {
      if (!recording) return;
      std::string img = tag_ + ".img" + std::to_string(saved++);
      pm::Pool::Remove(img);
      sim_->Write(img);
    };
    std::string failure;
    *images = 0;
    for (int op = 0; op < ops && failure.empty(); op++) {
      const uint64_t i = rng() % keys;
      const std::string k = Key(i), v = Val(i, uint64_t(op));
      std::map<std::string, std::string> after = model;
      const int r = int(rng() % 10);
      recording = true;
      Status s;
      if (r < 4) {
        s = idx_->Insert(k, v);
        if (s.ok()) after[k] = v;
      } else if (r < 6) {
        s = idx_->Update(k, v);
        if (s.ok()) after[k] = v;
      } else if (r < 7) {
        s = idx_->Upsert(k, v);
        if (s.ok()) after[k] = v;
      } else {
        s = idx_->Remove(k);
        if (s.ok()) after.erase(k);
      }
      recording = false;
      if (!s.ok() && !s.IsNotFound() && !s.IsAlreadyExists()) failure = "operation failed: " + s.ToString();
      for (int x = 0; x < saved; x++) {
        const std::string img = tag_ + ".img" + std::to_string(x);
        if (failure.empty()) {
          failure = Verify(img, model, after);
          if (!failure.empty()) failure += " (op " + std::to_string(op) + ", fence " + std::to_string(x) + ")";
        }
        ++*images;
        pm::Pool::Remove(img);
      }
      saved = 0;
      model = std::move(after);
    }
    sim_->on_fence = nullptr;
    pm::DisableAllFaults();
    if (failure.empty()) {
      Status c = idx_->Check();
      if (!c.ok()) failure = "live check: " + c.ToString();
    }
    return failure;
  }

  std::string tag_;
  Options opts_;
  std::unique_ptr<DurableImage> sim_;
  std::unique_ptr<Index> idx_;
};

TEST_P(BzTreeCrash, EveryFenceRecovers) {
  uint64_t images = 0;
  const std::string failure = Run(GetParam().fault.empty() ? 200 : 150, 40, &images);
  if (GetParam().fault.empty()) {
    EXPECT_EQ(failure, "");
    EXPECT_GT(images, 700u);  // about 4 fences per operation
  } else {
    EXPECT_NE(failure, "") << "fault " << GetParam().fault << " was not caught in " << images << " images";
  }
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (bool b : {false, true}) {
    const std::string kind = b ? "bytes" : "u64";
    v.push_back({b, "", kind});
    for (std::string f : internal::bztree::kFaultSwitches) {
      if (!b && f == "bztree.insert.skip_value_flush") continue;  // u64 values in this workload are inline
      std::string l = f;
      std::replace(l.begin(), l.end(), '.', '_');
      v.push_back({b, f, kind + "_" + l});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, BzTreeCrash, testing::ValuesIn(Cases()), [](const auto& i) { return i.param.label; });

}  // namespace
}  // namespace pmindex
