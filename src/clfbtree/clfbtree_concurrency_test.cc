// clfbtree_concurrency_test: the clfB-tree under concurrent callers (labelled
// concurrency, run under TSan): writers on disjoint key ranges and lock-free
// readers on all of them, for the crash-safe methods (inplace, shadow) and
// both leaf kinds, u64 and byte keys; afterwards every acknowledged write is
// found and Check passes. Readers must never see a key of a writer's range
// disappear once it was found (keys are only inserted here), and scans stay
// sorted. A watchdog turns a hang into a failure.
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
        if (!idx->Insert(Key(c.kk, k), Key(c.kk, k)).ok()) bad = true;
        if (i % 3 == 0 && !idx->Update(Key(c.kk, k), Key(c.kk, k)).ok()) bad = true;
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
          Status s = idx->Find(Key(c.kk, k), &v);
          if (!s.ok() || v != Key(c.kk, k)) bad = true;
        }
        if (x % 50 == 0) {
          std::string prev;
          bool first = true;
          idx->Scan(Key(c.kk, 1), 40, [&](Slice k, Slice) {
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

INSTANTIATE_TEST_SUITE_P(Kinds, ClfBTreeConcurrency,
                         testing::Values(Cfg{KeyKind::kU64, "append", "inplace"}, Cfg{KeyKind::kU64, "encoded", "shadow"},
                                         Cfg{KeyKind::kBytes, "append", "shadow"}, Cfg{KeyKind::kBytes, "encoded", "inplace"}),
                         [](const testing::TestParamInfo<Cfg>& i) {
                           return std::string(i.param.parent) + "_" + i.param.leaf +
                                  (i.param.kk == KeyKind::kU64 ? "_u64" : "_bytes");
                         });

}  // namespace
}  // namespace pmindex
