// clfbtree_concurrency_test: the clfB-tree under concurrent callers (labelled
// concurrency, run under TSan): writers on disjoint key ranges and lock-free
// readers on all of them, for the crash-safe methods (inplace, shadow) and
// both leaf kinds, u64 and byte keys; afterwards every acknowledged write is
// found and Check passes. Readers must never see a key of a writer's range
// disappear once it was found (keys are only inserted here), and scans stay
// sorted. SharedKeys: writers insert, update and remove the same few keys
// (leaf writers without the tree mutex against splits and leaf frees, and
// against each other on one leaf); readers see only values some writer wrote
// for the key, scans stay sorted, and afterwards finds agree with a scan. A
// watchdog turns a hang into a failure. The spread configurations make the
// tree deep enough that readers start at the route table's nodes while
// writers split and replace them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kit/test_watchdog.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

struct Cfg {
  KeyKind kk;
  const char* leaf;
  const char* parent;
  bool spread = false;  // u64 keys spread over 64 bits: 8-byte differences, a deep tree
};

std::string Key(KeyKind kk, uint64_t k) {
  if (kk == KeyKind::kU64) return std::string(U64Slice(k));
  return "k" + std::to_string(k);
}

bool Less(KeyKind kk, const std::string& a, const std::string& b) {
  if (kk == KeyKind::kU64) return SliceToU64(a) < SliceToU64(b);
  return a < b;
}

class ClfBTreeConcurrency : public testing::TestWithParam<Cfg> {};

TEST_P(ClfBTreeConcurrency, WritersAndLockFreeReaders) {
  const Cfg c = GetParam();
  const auto key = [&](uint64_t k) { return Key(c.kk, c.spread ? k * 0x9E3779B97F4A7C15ull : k); };
  const std::string path = "/dev/shm/clfbtree_conc_" + std::to_string(::getpid()) + ".pool";
  std::filesystem::remove(path);
  Options o;
  o.pool_path = path;
  o.pool_size = 64ull << 20;
  o.key_kind = c.kk;
  o.value_kind = c.kk == KeyKind::kU64 ? ValueKind::kU64 : ValueKind::kBytes;
  o.params = {{"leaf", c.leaf}, {"parent", c.parent}, {"leaf_size", "256"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
  test::TestWatchdog dog("clfbtree concurrency", 120);
  constexpr int kWriters = 2, kReaders = 2;
  const uint64_t per = 250;
  std::atomic<uint64_t> done[kWriters];
  for (auto& d : done) d = 0;
  std::atomic<bool> stop{false}, bad{false};
  std::vector<std::thread> ts;
  for (int w = 0; w < kWriters; w++)
    ts.emplace_back([&, w] {
      for (uint64_t i = 0; i < per; i++) {
        const uint64_t k = i * kWriters + uint64_t(w) + 1;
        if (!idx->Insert(key(k), key(k)).ok()) bad = true;
        if (i % 3 == 0 && !idx->Update(key(k), key(k)).ok()) bad = true;
        done[w].store(i + 1, std::memory_order_release);
      }
    });
  for (int r = 0; r < kReaders; r++)
    ts.emplace_back([&, r] {
      uint64_t x = uint64_t(r) * 7 + 1;
      while (!stop.load(std::memory_order_acquire)) {
        const int w = int(x % kWriters);
        const uint64_t upto = done[w].load(std::memory_order_acquire);
        if (upto) {
          const uint64_t i = (x * 2654435761ull) % upto;
          const uint64_t k = i * kWriters + uint64_t(w) + 1;
          std::string v;
          Status s = idx->Find(key(k), &v);
          if (!s.ok() || v != key(k)) bad = true;
        }
        if (x % 50 == 0) {
          std::string prev;
          bool first = true;
          idx->Scan(key(1), 40, [&](Slice k, Slice) {
            if (!first && !Less(c.kk, prev, std::string(k.data(), k.size()))) bad = true;
            prev.assign(k.data(), k.size());
            first = false;
            return true;
          });
        }
        x++;
      }
    });
  for (int w = 0; w < kWriters; w++) ts[size_t(w)].join();
  stop = true;
  for (size_t i = kWriters; i < ts.size(); i++) ts[i].join();
  EXPECT_FALSE(bad.load());
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  EXPECT_EQ(idx->Size(), per * kWriters);
  idx.reset();
  std::filesystem::remove(path);
}

class ClfBTreeSharedKeys : public testing::TestWithParam<const char*> {};

TEST_P(ClfBTreeSharedKeys, SkewedWritersOnSharedKeys) {
  const std::string path = "/dev/shm/clfbtree_shared_" + std::to_string(::getpid()) + ".pool";
  std::filesystem::remove(path);
  Options o;
  o.pool_path = path;
  o.pool_size = 64ull << 20;
  o.params = {{"leaf", "append"}, {"parent", GetParam()}, {"leaf_size", "128"}};
  std::unique_ptr<Index> idx;
  ASSERT_TRUE(OpenIndex("clfbtree", o, &idx).ok());
  test::TestWatchdog dog("clfbtree shared keys", 120);
  constexpr int kWriters = 2;
  constexpr uint64_t kKeys = 48, kOps = 4000;
  std::atomic<int> running{kWriters};
  std::atomic<bool> bad{false};
  std::vector<std::thread> ts;
  for (int w = 0; w < kWriters; w++)
    ts.emplace_back([&, w] {
      uint64_t x = uint64_t(w) * 0x9e3779b97f4a7c15ull + 1;
      for (uint64_t i = 0; i < kOps; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        // Skewed: half the operations on 4 hot keys, the rest on all of them.
        const uint64_t k = 1 + ((x >> 8) % 2 ? (x >> 16) % 4 : (x >> 16) % kKeys);
        const uint64_t v = k * 1000 + uint64_t(w);
        Status s;
        switch ((x >> 32) % 4) {
          case 0: s = idx->Insert(U64Slice(k), U64Slice(v)); break;
          case 1: s = idx->Upsert(U64Slice(k), U64Slice(v)); break;
          case 2: s = idx->Update(U64Slice(k), U64Slice(v)); break;
          default: s = idx->Remove(U64Slice(k)); break;
        }
        if (!s.ok() && !s.IsNotFound() && !s.IsAlreadyExists()) bad = true;
      }
      running--;
    });
  ts.emplace_back([&] {
    uint64_t k = 1;
    while (running.load(std::memory_order_acquire) > 0) {
      std::string v;
      Status s = idx->Find(U64Slice(k), &v);
      if (s.ok() && SliceToU64(v) / 1000 != k) bad = true;
      if (!s.ok() && !s.IsNotFound()) bad = true;
      uint64_t prev = 0;
      idx->Scan(U64Slice(uint64_t(1)), 20, [&](Slice key, Slice val) {
        if (SliceToU64(key) <= prev || SliceToU64(val) / 1000 != SliceToU64(key)) bad = true;
        prev = SliceToU64(key);
        return true;
      });
      k = k % kKeys + 1;
    }
  });
  for (auto& t : ts) t.join();
  EXPECT_FALSE(bad.load());
  ASSERT_TRUE(idx->Check().ok()) << idx->Check().ToString();
  uint64_t found = 0;
  for (uint64_t k = 1; k <= kKeys; k++) {
    std::string v;
    found += idx->Find(U64Slice(k), &v).ok();
  }
  EXPECT_EQ(idx->Size(), found);
  idx.reset();
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Parents, ClfBTreeSharedKeys, testing::Values("inplace", "shadow"));

INSTANTIATE_TEST_SUITE_P(Kinds, ClfBTreeConcurrency,
                         testing::Values(Cfg{KeyKind::kU64, "append", "inplace"}, Cfg{KeyKind::kU64, "encoded", "shadow"},
                                         Cfg{KeyKind::kBytes, "append", "shadow"}, Cfg{KeyKind::kBytes, "encoded", "inplace"},
                                         Cfg{KeyKind::kU64, "append", "shadow", true},
                                         Cfg{KeyKind::kU64, "encoded", "inplace", true}),
                         [](const testing::TestParamInfo<Cfg>& i) {
                           return std::string(i.param.parent) + "_" + i.param.leaf +
                                  (i.param.kk == KeyKind::kU64 ? "_u64" : "_bytes") + (i.param.spread ? "_spread" : "");
                         });

}  // namespace
}  // namespace pmindex
