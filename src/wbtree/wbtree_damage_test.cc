// wbtree_damage_test: damaged pools give errors, never a crash or a hang.
// A tree with small nodes is built and closed; then, many times over, one
// word of its Meta or of one node (header, slot array or an entry) is
// overwritten with garbage (random bits, a small number, or the offset of
// another block) and the pool is opened and used: open, Check, Find of
// every key, a full Scan, Size, inserts and removes. Any Status is
// accepted; the test fails on a crash (the sanitizers in asan), on a hang
// (the watchdog), and if no damage at all was reported.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kit/test_watchdog.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

struct Case {
  const char* index;
  KeyKind kk;
  ValueKind vk;
};

std::string Read(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void Write(const std::string& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data.data(), std::streamsize(data.size()));
}

class WBTreeDamage : public testing::TestWithParam<Case> {};

TEST_P(WBTreeDamage, GarbageWordsGiveErrorsNotCrashes) {
  test::TestWatchdog dog("wbtree damage", 600);
  const Case c = GetParam();
  const std::string path = "/dev/shm/wbtree_damage_" + std::to_string(::getpid()) + ".pool";
  std::filesystem::remove(path);
  Options o;
  o.pool_path = path;
  o.pool_size = 8ull << 20;
  o.key_kind = c.kk;
  o.value_kind = c.vk;
  o.params = {{"leaf_size", "4"}, {"inner_size", "3"}};
  auto key = [&](uint64_t i) { return c.kk == KeyKind::kU64 ? std::string(U64Slice(i)) : "key" + std::to_string(i); };
  auto val = [&](uint64_t i) { return c.vk == ValueKind::kU64 ? std::string(U64Slice(i)) : "val" + std::to_string(i); };
  std::vector<std::pair<uint64_t, size_t>> blocks;
  {
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex(c.index, o, &idx).ok());
    for (uint64_t i = 0; i < 300; i++) ASSERT_TRUE(idx->Insert(key(i * 3), val(i)).ok());
    for (uint64_t i = 0; i < 60; i++) ASSERT_TRUE(idx->Remove(key(i * 9)).ok());
    idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t n) { blocks.emplace_back(off, n); });
    ASSERT_TRUE(idx->Close().ok());
  }
  const std::string clean = Read(path);
  std::mt19937_64 rng(GetParam().kk == KeyKind::kU64 ? 1 : 2);
  int reported = 0;
  const int kTrials = 150;
  for (int t = 0; t < kTrials; t++) {
    std::string img = clean;
    const auto& [off, size] = blocks[rng() % blocks.size()];
    // Mostly the structural words (the first two lines), sometimes any.
    const size_t words = size / 8;
    const size_t w = rng() % 3 ? rng() % std::min<size_t>(words, 16) : rng() % words;
    uint64_t garbage;
    switch (rng() % 4) {
      case 0: garbage = rng(); break;
      case 1: garbage = rng() % 70; break;
      case 2: garbage = blocks[rng() % blocks.size()].first; break;
      default: garbage = ~uint64_t(0);
    }
    // The pool file maps the pool at offset 0 (pool-format.md).
    if (off + 8 * w + 8 > img.size()) continue;
    std::memcpy(img.data() + off + 8 * w, &garbage, 8);
    Write(path, img);
    std::unique_ptr<Index> idx;
    Status s = OpenIndex(c.index, o, &idx);
    if (!s.ok()) {
      reported++;
      continue;
    }
    bool bad = !idx->Check().ok();
    std::string v;
    for (uint64_t i = 0; i < 300; i++) {
      Status f = idx->Find(key(i * 3), &v);
      bad |= f.IsCorrupt();
    }
    size_t n = 0;
    bad |= idx->Scan(key(0), 1000, [&](Slice, Slice) { return ++n < 100000; }).IsCorrupt();
    (void)idx->Size();
    for (uint64_t i = 0; i < 20; i++) {
      bad |= idx->Insert(key(i * 3 + 1), val(i)).IsCorrupt();
      bad |= idx->Remove(key(i * 3 + 3)).IsCorrupt();
    }
    reported += bad;
    idx.reset();
  }
  std::printf("%d of %d damaged pools reported Corrupt (others: damage to unused or benign words)\n", reported, kTrials);
  EXPECT_GT(reported, 0);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Cases, WBTreeDamage,
                         testing::Values(Case{"wbtree", KeyKind::kU64, ValueKind::kU64},
                                         Case{"wbtree", KeyKind::kBytes, ValueKind::kBytes},
                                         Case{"wbtree_slot", KeyKind::kU64, ValueKind::kU64},
                                         Case{"wbtree_slot", KeyKind::kBytes, ValueKind::kBytes}),
                         [](const testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.index) + (i.param.kk == KeyKind::kU64 ? "_u64" : "_bytes");
                         });

}  // namespace
}  // namespace pmindex
