// Crash tests of nvtree: a mixed workload (inserts, updates, upserts,
// removes) on small leaves and PLNs, so that splits, compactions, unlinked
// leaves and inner rebuilds all happen, with the durable image (power
// failure as of that fence, kit/test_observer.h) saved at every fence and
// verified after the operation: it opens, passes Check, leaks nothing
// (ForEachOwnedBlock == the allocator's blocks), holds every acknowledged
// operation (the one in flight either done or not), scans in key order and
// accepts writes. Each fault switch of the persist order must be caught.
// A second test SIGKILLs a child process in the middle of a load and
// reopens the pool it leaves (recovery from a real process death, not from
// a simulated image).
#include <unistd.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "kit/test_observer.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/pool.h"
#include "testing/process.h"

namespace pmindex {
namespace {

using internal::kit::DurableImage;

struct Case {
  bool bytes;
  std::string fault;  // "" for the clean run
  std::string label;
};

class NVTreeCrash : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    tag_ = "/dev/shm/nvtree-crash-" + std::to_string(getpid()) + "-" + GetParam().label;
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    opts_.params = {{"leaf_size", "4"}, {"inner_size", "2"}};
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
    // Usable: writes that replace leaves, then Check and no leak.
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
    EXPECT_TRUE(internal::kit::CreateObservedIndex("nvtree", opts_, &sim_, &idx_));
    if (!GetParam().fault.empty()) {
      EXPECT_TRUE(pm::EnableFault(GetParam().fault).ok());
    }
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
          // The image was written by the faulty code; it is recovered and
          // written to by the correct code (a fault left on would, e.g., free
          // blocks twice in the image's own writes).
          pm::DisableAllFaults();
          failure = Verify(img, model, after);
          if (!GetParam().fault.empty()) {
      EXPECT_TRUE(pm::EnableFault(GetParam().fault).ok());
    }
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

TEST_P(NVTreeCrash, EveryFenceRecovers) {
  uint64_t images = 0;
  const std::string failure = Run(GetParam().fault.empty() ? 400 : 300, 40, &images);
  if (GetParam().fault.empty()) {
    EXPECT_EQ(failure, "");
    EXPECT_GT(images, 800u);
  } else {
    EXPECT_NE(failure, "") << "fault " << GetParam().fault << " was not caught in " << images << " images";
  }
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (bool b : {false, true}) {
    const std::string kind = b ? "bytes" : "u64";
    v.push_back({b, "", kind});
    for (std::string f : {"nvtree.append.skip_entry_flush", "nvtree.append.count_before_entry", "nvtree.append.skip_count_flush",
                          "nvtree.replace.skip_leaf_flush", "nvtree.replace.free_before_swap"}) {
      if (!b && f == "nvtree.replace.free_before_swap") continue;  // u64 leaves hold no blocks
      std::string l = f;
      std::replace(l.begin(), l.end(), '.', '_');
      v.push_back({b, f, kind + "_" + l});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, NVTreeCrash, testing::ValuesIn(Cases()), [](const auto& i) { return i.param.label; });

// SIGKILL of a process loading the tree (small leaves and PLNs: leaf
// replacements, compactions and inner rebuilds throughout): every
// acknowledged step survives the reopen, Check passes, nothing leaks, and
// the tree takes writes. Step i inserts key i and, for i % 3 == 2, removes
// key i - 1.
TEST(NVTreeKill, SigkillWhileLoading) {
  for (bool bytes : {false, true}) {
    const std::string path = "/dev/shm/nvtree-kill-" + std::to_string(getpid()) + (bytes ? "-b" : "-u") + ".pool";
    pm::Pool::Remove(path);
    Options o;
    o.pool_path = path;
    o.pool_size = 32ull << 20;
    o.key_kind = bytes ? KeyKind::kBytes : KeyKind::kU64;
    o.value_kind = bytes ? ValueKind::kBytes : ValueKind::kU64;
    o.params = {{"leaf_size", "8"}, {"inner_size", "4"}};
    auto key = [&](uint64_t i) {
      return bytes ? "k" + std::to_string(i * 7919 % 1000003) : std::string(U64Slice(i * 0x9E3779B97F4A7C15ull));
    };
    auto val = [&](uint64_t i) { return bytes ? "v" + std::to_string(i) : std::string(U64Slice(i + 1)); };
    testutil::AckingChild child([&](const testutil::AckingChild::Ack& ack) {
      std::unique_ptr<Index> idx;
      if (!OpenIndex("nvtree", o, &idx).ok()) ::_exit(2);
      for (uint64_t i = 0;; i++) {
        if (!idx->Insert(key(i), val(i)).ok()) ::_exit(3);
        if (i % 3 == 2 && !idx->Remove(key(i - 1)).ok()) ::_exit(3);
        if (!ack(i)) ::_exit(4);
      }
    });
    ASSERT_TRUE(child.started());
    uint64_t acked = 0;
    const bool any = child.ReadUntil([](uint64_t n) { return n >= 12000; }, &acked);
    child.Kill(/*drain=*/false, &acked);
    ASSERT_TRUE(any);
    std::unique_ptr<Index> idx;
    o.params.clear();
    o.create_if_missing = false;
    o.recovery_threads = 2;
    ASSERT_TRUE(OpenIndex("nvtree", o, &idx).ok());
    Status c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    std::set<uint64_t> owned, alloc;
    idx->ForEachOwnedBlock([&](uint64_t off) { owned.insert(off); });
    idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { alloc.insert(off); });
    ASSERT_EQ(owned, alloc) << "leak after the kill";
    // Steps up to `acked` are durable; the child kept going until the kill
    // (its acknowledgements sit in the pipe), so later steps may be too.
    for (uint64_t i = 0; i <= acked; i++) {
      const bool removed = (i + 1) % 3 == 2 && i + 1 <= acked;
      const bool maybe = (i + 1) % 3 == 2 && i == acked;  // step acked + 1 may have removed it
      std::string v;
      const Status f = idx->Find(key(i), &v);
      if (maybe) continue;
      if (removed) {
        ASSERT_TRUE(f.IsNotFound()) << "acknowledged remove of " << i << " lost";
      } else {
        ASSERT_TRUE(f.ok()) << "acknowledged insert " << i << " lost";
        ASSERT_EQ(v, val(i));
      }
    }
    uint64_t scanned = 0;
    ASSERT_TRUE(idx->Scan(bytes ? std::string(1, '\x01') : std::string(U64Slice(0)), SIZE_MAX, [&](Slice, Slice) {
                       scanned++;
                       return true;
                     }).ok());
    EXPECT_EQ(scanned, idx->Size());
    EXPECT_GE(scanned, acked + 1 - (acked + 1) / 3);
    for (uint64_t i = 0; i <= acked; i += 2) ASSERT_TRUE(idx->Upsert(key(i), val(i + 7)).ok());
    c = idx->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    idx.reset();
    pm::Pool::Remove(path);
  }
}

}  // namespace
}  // namespace pmindex
