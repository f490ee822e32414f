// Test support (not part of the library): the crash test of a mixed
// workload that bztree and nvtree share. Random inserts, updates, upserts
// and removes over a few keys run on an index created under a DurableImage
// (kit/test_observer.h); the durable image of every fence inside an
// operation is saved and, once the operation has returned, verified: it
// opens (recovery), passes Check, leaks nothing (ForEachOwnedBlock == the
// allocator's blocks), holds the records before or after the operation in
// flight (nothing else), scans in key order, agrees with Find and Size, and
// takes writes afterwards (upserts of new keys, removes of all it held) with
// Check passing and no leak. With a fault switch on, some image must fail.
//
//   class FooCrash : public testutil::MixedCrashTest {
//     void SetUp() override { Configure("foo", {{"node_size", "256"}}); }
//   };
//   TEST_P(FooCrash, EveryFenceRecovers) { ExpectEveryFenceRecovers(180, 150); }
//   INSTANTIATE_TEST_SUITE_P(All, FooCrash, testing::ValuesIn(testutil::CrashCases(faults, skip)), CrashCaseName);
//
// Thread-safety: single-threaded (one test thread drives the index).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kit/test_observer.h"
#include "testing/fence_images.h"
#include "pmindex/index.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/pool.h"
#include "testing/index_test_util.h"

namespace pmindex::testutil {

struct CrashCase {
  bool bytes;
  std::string fault;  // "" for the clean run
  std::string label;
};

// For both key kinds: the clean run and one run per fault switch, leaving
// out the switches skip(bytes, fault) names.
inline std::vector<CrashCase> CrashCases(const std::vector<std::string>& faults,
                                         const std::function<bool(bool, const std::string&)>& skip) {
  std::vector<CrashCase> v;
  for (bool b : {false, true}) {
    const std::string kind = b ? "bytes" : "u64";
    v.push_back({b, "", kind});
    for (const std::string& f : faults) {
      if (skip && skip(b, f)) continue;
      std::string l = f;
      std::replace(l.begin(), l.end(), '.', '_');
      v.push_back({b, f, kind + "_" + l});
    }
  }
  return v;
}

inline std::string CrashCaseName(const testing::TestParamInfo<CrashCase>& i) { return i.param.label; }

class MixedCrashTest : public testing::TestWithParam<CrashCase> {
 protected:
  using Model = std::map<std::string, std::string>;

  // Sets up a 4 MiB pool (fixed size: the image does not follow growth) for
  // `index` with `params`; tests may adjust opts_ afterwards.
  void Configure(const std::string& index, std::map<std::string, std::string> params) {
    index_ = index;
    tag_ = "/dev/shm/" + index + "-crash-" + std::to_string(::getpid()) + "-" + GetParam().label;
    opts_.pool_path = tag_ + ".pool";
    opts_.pool_size = 4ull << 20;
    opts_.max_pool_size = 4ull << 20;
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    opts_.params = std::move(params);
  }
  void TearDown() override {
    pm::DisableAllFaults();
    sim_.reset();
    idx_.reset();
    if (!opts_.pool_path.empty()) pm::Pool::Remove(opts_.pool_path);
  }
  std::string Key(uint64_t i) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 37 % 1000));
    return "key-" + std::to_string(i * 37 % 1000) + std::string(i % 3 * 4, 'k');
  }
  std::string Val(uint64_t i, uint64_t ver) const {
    if (!GetParam().bytes) return std::string(U64Slice(i * 5 + ver + 1));
    return "value-" + std::to_string(i) + "." + std::to_string(ver) + std::string((i + ver) % 5 * 3, 'v');
  }

  // "" if the image at path recovers to `before` or `after` (the operation
  // in flight not done, or done) and stays usable.
  std::string Verify(const std::string& path, const Model& before, const Model& after) {
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
    if (std::string l = LeakReport(idx.get()); !l.empty()) return l;
    std::vector<Record> got;
    s = ScanAll(idx.get(), opts_.key_kind, &got);
    if (!s.ok()) return "scan: " + s.ToString();
    if (got != InKeyOrder(before, opts_.key_kind) && got != InKeyOrder(after, opts_.key_kind))
      return "recovered records match neither state";
    if (idx->Size() != got.size()) return "Size() disagrees with the scan";
    for (auto& [k, v] : got) {
      std::string out;
      if (!idx->Find(k, &out).ok() || out != v) return "find disagrees with the scan";
    }
    // Usable: writes (which meet whatever structure change the crash left),
    // then Check and no leak.
    for (uint64_t i = 2000; i < 2012; i++)
      if (Status w = idx->Upsert(Key(i), Val(i, 9)); !w.ok()) return "write after recovery: " + w.ToString();
    for (auto& [k, v] : got)
      if (Status w = idx->Remove(k); !w.ok()) return "remove after recovery: " + w.ToString();
    s = idx->Check();
    if (!s.ok()) return "check after writes: " + s.ToString();
    return LeakReport(idx.get());
  }

  // Runs `ops` random operations over `keys` keys with every fence's image
  // verified; returns the first failure and counts the images.
  std::string Run(int ops, uint64_t keys, uint64_t* images) {
    EXPECT_TRUE(internal::kit::CreateObservedIndex(index_, opts_, &sim_, &idx_));
    if (!sim_ || !idx_) return "create failed";
    EnableCaseFault();
    std::mt19937_64 rng(7);
    Model model;
    std::string failure;
    *images = 0;
    {
      FenceImages fences(sim_.get(), tag_);
      for (int op = 0; op < ops && failure.empty(); op++) {
        const uint64_t i = rng() % keys;
        const std::string k = Key(i), v = Val(i, uint64_t(op));
        Model after = model;
        const int r = int(rng() % 10);
        const Status s = fences.During([&] {
          if (r < 4) return idx_->Insert(k, v);
          if (r < 6) return idx_->Update(k, v);
          if (r < 7) return idx_->Upsert(k, v);
          return idx_->Remove(k);
        });
        if (s.ok()) {
          if (r < 7) after[k] = v;
          else after.erase(k);
        }
        if (!s.ok() && !s.IsNotFound() && !s.IsAlreadyExists()) failure = "operation failed: " + s.ToString();
        *images += uint64_t(fences.ForEach([&](const std::string& img, int x) {
          if (!failure.empty()) return;
          // With faults_off_while_verifying_, the image written by the faulty
          // code is recovered and written to by the correct code (a fault
          // left on would, e.g., free blocks twice in the image's own writes).
          if (faults_off_while_verifying_) pm::DisableAllFaults();
          failure = Verify(img, model, after);
          if (faults_off_while_verifying_) EnableCaseFault();
          if (!failure.empty()) failure += " (op " + std::to_string(op) + ", fence " + std::to_string(x) + ")";
        }));
        model = std::move(after);
      }
    }
    pm::DisableAllFaults();
    if (failure.empty()) {
      Status c = idx_->Check();
      if (!c.ok()) failure = "live check: " + c.ToString();
    }
    return failure;
  }

  // The clean run recovers at every fence (and saw more than 800 images);
  // a run with a fault switch fails somewhere.
  void ExpectEveryFenceRecovers(int clean_ops, int fault_ops, uint64_t min_images = 800) {
    uint64_t images = 0;
    const std::string failure = Run(GetParam().fault.empty() ? clean_ops : fault_ops, 40, &images);
    if (GetParam().fault.empty()) {
      EXPECT_EQ(failure, "");
      EXPECT_GT(images, min_images);
    } else {
      EXPECT_NE(failure, "") << "fault " << GetParam().fault << " was not caught in " << images << " images";
    }
  }

  std::string index_, tag_;
  Options opts_;
  bool faults_off_while_verifying_ = false;
  std::unique_ptr<internal::kit::DurableImage> sim_;
  std::unique_ptr<Index> idx_;

 private:
  void EnableCaseFault() {
    if (!GetParam().fault.empty()) {
      EXPECT_TRUE(pm::EnableFault(GetParam().fault).ok()) << GetParam().fault;
    }
  }
};

}  // namespace pmindex::testutil
