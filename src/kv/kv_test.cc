// kv_test.cc: pmindex::KV (include/pmindex/kv.h) against every registered
// engine: the operations, a differential check of every read against
// std::map after random writes (byte and u64 keys), iterators (seek, next,
// prev across batch boundaries), reopen, bad input, calls after close, a
// callback writing into the store it reads, and iteration beside a writer.
#include "pmindex/kv.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

namespace pmindex {
namespace {

std::string PoolPath(const std::string& name) {
  return "/dev/shm/pmindex_kv_test_" + std::to_string(getpid()) + "_" + name;
}

class KVTest : public ::testing::TestWithParam<IndexInfo> {
 protected:
  void SetUp() override {
    path_ = PoolPath(GetParam().name);
    std::remove(path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::unique_ptr<KV> Open(KeyKind kk = KeyKind::kBytes, ValueKind vk = ValueKind::kBytes) {
    KVConfig c;
    c.path = path_;
    c.key_kind = kk;
    c.value_kind = vk;
    std::unique_ptr<KV> kv;
    Status s = KV::Open(GetParam().name, c, &kv);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return kv;
  }
  std::string path_;
};

std::string U64Key(uint64_t v) { return std::string(U64Slice(v)); }

TEST_P(KVTest, BasicOperations) {
  auto kv = Open();
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->info().name, GetParam().name);
  std::string v;
  EXPECT_TRUE(kv->get("a", &v).IsNotFound());
  EXPECT_TRUE(kv->exists("a").IsNotFound());
  ASSERT_TRUE(kv->put("a", "1").ok());
  ASSERT_TRUE(kv->put("b", "2").ok());
  ASSERT_TRUE(kv->put("a", "one").ok());  // replaces
  ASSERT_TRUE(kv->get("a", &v).ok());
  EXPECT_EQ(v, "one");
  EXPECT_TRUE(kv->exists("b").ok());
  uint64_t n = 0;
  ASSERT_TRUE(kv->count_all(&n).ok());
  EXPECT_EQ(n, 2u);
  EXPECT_TRUE(kv->remove("b").ok());
  EXPECT_TRUE(kv->remove("b").IsNotFound());
  ASSERT_TRUE(kv->count_all(&n).ok());
  EXPECT_EQ(n, 1u);

  std::vector<Slice> keys = {"a", "zz", "a"};
  std::vector<std::string> vals;
  std::vector<Status> sts;
  ASSERT_TRUE(kv->get_many(keys, &vals, &sts).ok());
  ASSERT_EQ(vals.size(), 3u);
  EXPECT_TRUE(sts[0].ok());
  EXPECT_EQ(vals[0], "one");
  EXPECT_TRUE(sts[1].IsNotFound());
  EXPECT_EQ(vals[2], "one");

  if (!GetParam().ordered) {
    EXPECT_TRUE(kv->count_above("a", &n).IsUnsupported());
    EXPECT_TRUE(kv->get_all([](Slice, Slice) { return true; }).IsUnsupported());
    std::unique_ptr<KVIterator> it;
    EXPECT_TRUE(kv->new_iterator(&it).IsUnsupported());
    EXPECT_FALSE(it);
  }
  EXPECT_TRUE(kv->close().ok());
  EXPECT_TRUE(kv->close().ok());
}

// Random puts and removes, then every read compared with std::map.
template <typename MakeKey>
void Differential(KV* kv, const IndexInfo& info, MakeKey make_key, uint64_t key_space, int ops, uint32_t seed) {
  std::map<std::string, std::string, std::function<bool(const std::string&, const std::string&)>> ref(
      [&](const std::string& a, const std::string& b) {
        if (kv->key_kind() == KeyKind::kU64) return SliceToU64(a) < SliceToU64(b);
        return a < b;
      });
  std::mt19937_64 rng(seed);
  for (int i = 0; i < ops; i++) {
    std::string k = make_key(rng() % key_space);
    if (rng() % 4 == 0) {
      Status s = kv->remove(k);
      EXPECT_EQ(s.ok(), ref.erase(k) == 1) << s.ToString();
    } else {
      std::string v = kv->value_kind() == ValueKind::kU64 ? U64Key(rng()) : "v" + std::to_string(rng() % 100000);
      ASSERT_TRUE(kv->put(k, v).ok());
      ref[k] = v;
    }
  }
  uint64_t n = 0;
  ASSERT_TRUE(kv->count_all(&n).ok());
  ASSERT_EQ(n, ref.size());
  for (auto& [k, v] : ref) {
    std::string got;
    ASSERT_TRUE(kv->get(k, &got).ok());
    ASSERT_EQ(got, v);
  }
  if (!info.ordered) return;

  std::vector<std::pair<std::string, std::string>> all;
  ASSERT_TRUE(kv->get_all([&](Slice k, Slice v) {
                  all.emplace_back(k, v);
                  return true;
                }).ok());
  const std::vector<std::pair<std::string, std::string>> want_all(ref.begin(), ref.end());
  ASSERT_EQ(all, want_all);

  for (int t = 0; t < 30; t++) {
    std::string lo = make_key(rng() % key_space), hi = make_key(rng() % key_space);
    auto above = ref.upper_bound(lo);
    uint64_t want_above = std::distance(above, ref.end());
    uint64_t want_below = std::distance(ref.begin(), ref.lower_bound(hi));
    uint64_t want_between = 0;
    for (auto it = above; it != ref.end() && ref.key_comp()(it->first, hi); ++it) want_between++;
    uint64_t got = 0;
    ASSERT_TRUE(kv->count_above(lo, &got).ok());
    EXPECT_EQ(got, want_above);
    ASSERT_TRUE(kv->count_below(hi, &got).ok());
    EXPECT_EQ(got, want_below);
    ASSERT_TRUE(kv->count_between(lo, hi, &got).ok());
    EXPECT_EQ(got, want_between);
    std::vector<std::string> seen;
    ASSERT_TRUE(kv->get_between(lo, hi, [&](Slice k, Slice) {
                    seen.emplace_back(k);
                    return true;
                  }).ok());
    EXPECT_EQ(seen.size(), want_between);
    if (!seen.empty()) {
      EXPECT_EQ(seen.front(), above->first);
    }
    // Early stop.
    size_t calls = 0;
    ASSERT_TRUE(kv->get_above(lo, [&](Slice, Slice) { return ++calls < 3; }).ok());
    EXPECT_EQ(calls, std::min<uint64_t>(3, want_above));
  }

  // Iterator: whole forward pass, seeks, and prev back over batch edges.
  std::unique_ptr<KVIterator> it;
  ASSERT_TRUE(kv->new_iterator(&it).ok());
  EXPECT_FALSE(it->valid());
  ASSERT_TRUE(it->seek_to_first().ok());
  auto r = ref.begin();
  for (; it->valid(); ++r) {
    ASSERT_NE(r, ref.end());
    ASSERT_EQ(it->key(), r->first);
    ASSERT_EQ(it->value(), r->second);
    ASSERT_TRUE(it->next().ok());
  }
  EXPECT_EQ(r, ref.end());
  EXPECT_TRUE(it->next().IsInvalidArgument());
  for (int t = 0; t < 10; t++) {
    std::string k = make_key(rng() % key_space);
    ASSERT_TRUE(it->seek(k).ok());
    auto want = ref.lower_bound(k);
    if (want == ref.end()) {
      EXPECT_FALSE(it->valid());
      continue;
    }
    ASSERT_TRUE(it->valid());
    EXPECT_EQ(it->key(), want->first);
    for (int back = 0; back < 300 && it->valid(); back++) {  // crosses a batch edge
      ASSERT_EQ(it->key(), want->first);
      ASSERT_TRUE(it->prev().ok());
      if (want == ref.begin()) {
        EXPECT_FALSE(it->valid());
        break;
      }
      --want;
    }
  }
}

TEST_P(KVTest, DifferentialBytes) {
  auto kv = Open();
  ASSERT_TRUE(kv);
  Differential(kv.get(), GetParam(), [](uint64_t i) { return "key" + std::to_string(i); }, 2000, 4000, 1);
}

TEST_P(KVTest, DifferentialU64) {
  auto kv = Open(KeyKind::kU64, ValueKind::kU64);
  ASSERT_TRUE(kv);
  // Keys spread over bytes so numeric and memcmp order differ.
  Differential(kv.get(), GetParam(), [](uint64_t i) { return U64Key(i * 0x10001); }, 2000, 4000, 2);
}

TEST_P(KVTest, Reopen) {
  if (!GetParam().persistent) GTEST_SKIP() << "transient engine";
  {
    auto kv = Open();
    ASSERT_TRUE(kv);
    for (int i = 0; i < 500; i++) ASSERT_TRUE(kv->put("k" + std::to_string(i), std::to_string(i)).ok());
    ASSERT_TRUE(kv->remove("k7").ok());
  }
  KVConfig c;
  c.path = path_;
  c.create_if_missing = false;
  std::unique_ptr<KV> kv;
  ASSERT_TRUE(KV::Open("", c, &kv).ok());  // any engine: the pool's own
  EXPECT_EQ(kv->info().name, GetParam().name);
  uint64_t n = 0;
  ASSERT_TRUE(kv->count_all(&n).ok());
  EXPECT_EQ(n, 499u);
  std::string v;
  ASSERT_TRUE(kv->get("k42", &v).ok());
  EXPECT_EQ(v, "42");
  EXPECT_TRUE(kv->exists("k7").IsNotFound());
  kv.reset();
  c.error_if_exists = true;
  c.create_if_missing = true;
  EXPECT_FALSE(KV::Open(GetParam().name, c, &kv).ok());
  EXPECT_FALSE(kv);
}

TEST_P(KVTest, BadInput) {
  {
    auto kv = Open();
    ASSERT_TRUE(kv);
    std::string v;
    EXPECT_TRUE(kv->put("", "x").IsInvalidArgument());
    EXPECT_TRUE(kv->get("", &v).IsInvalidArgument());
    EXPECT_TRUE(kv->put(std::string(kMaxKeySize + 100000, 'k'), "x").IsInvalidArgument());
    EXPECT_TRUE(kv->get("a", nullptr).IsInvalidArgument());
    EXPECT_TRUE(kv->count_all(nullptr).IsInvalidArgument());
    std::unique_ptr<KV>* null_out = nullptr;
    EXPECT_TRUE(KV::Open(GetParam().name, KVConfig(), null_out).IsInvalidArgument());
  }
  std::remove(path_.c_str());
  auto kv = Open(KeyKind::kU64, ValueKind::kU64);
  ASSERT_TRUE(kv);
  EXPECT_TRUE(kv->put("abc", U64Key(1)).IsInvalidArgument());
  EXPECT_TRUE(kv->put(U64Key(1), "abc").IsInvalidArgument());
  uint64_t n;
  if (GetParam().ordered) {
    EXPECT_TRUE(kv->count_above("abc", &n).IsInvalidArgument());
    EXPECT_TRUE(kv->count_between(U64Key(1), "x", &n).IsInvalidArgument());
    std::unique_ptr<KVIterator> it;
    ASSERT_TRUE(kv->new_iterator(&it).ok());
    EXPECT_TRUE(it->seek("abc").IsInvalidArgument());
    EXPECT_FALSE(it->valid());
    EXPECT_TRUE(it->status().IsInvalidArgument());
    EXPECT_TRUE(it->prev().IsInvalidArgument());
  }
}

TEST_P(KVTest, CallsAfterClose) {
  auto kv = Open();
  ASSERT_TRUE(kv);
  ASSERT_TRUE(kv->put("a", "1").ok());
  std::unique_ptr<KVIterator> it;
  if (GetParam().ordered) {
    ASSERT_TRUE(kv->new_iterator(&it).ok());
  }
  ASSERT_TRUE(kv->close().ok());
  EXPECT_FALSE(kv->is_open());
  std::string v;
  uint64_t n;
  EXPECT_TRUE(kv->get("a", &v).IsInvalidArgument());
  EXPECT_TRUE(kv->put("a", "1").IsInvalidArgument());
  EXPECT_TRUE(kv->remove("a").IsInvalidArgument());
  EXPECT_TRUE(kv->exists("a").IsInvalidArgument());
  EXPECT_TRUE(kv->count_all(&n).IsInvalidArgument());
  EXPECT_TRUE(kv->count_above("a", &n).IsInvalidArgument());
  EXPECT_TRUE(kv->get_all([](Slice, Slice) { return true; }).IsInvalidArgument());
  IndexStats st;
  EXPECT_TRUE(kv->stats(&st).IsInvalidArgument());
  std::unique_ptr<KVIterator> it2;
  EXPECT_TRUE(kv->new_iterator(&it2).IsInvalidArgument());
  if (it) {
    EXPECT_TRUE(it->seek_to_first().IsInvalidArgument());
    EXPECT_FALSE(it->valid());
  }
}

TEST_P(KVTest, CallbackWritesIntoTheStore) {
  if (!GetParam().ordered) GTEST_SKIP() << "hash engine";
  auto kv = Open();
  ASSERT_TRUE(kv);
  for (int i = 0; i < 600; i++) ASSERT_TRUE(kv->put("k" + std::to_string(1000 + i), "v").ok());
  size_t visited = 0;
  ASSERT_TRUE(kv->get_all([&](Slice k, Slice) {
                  visited++;
                  return kv->put(std::string(k), "w").ok();  // same store, inside the read
                }).ok());
  EXPECT_EQ(visited, 600u);
  std::string v;
  ASSERT_TRUE(kv->get("k1599", &v).ok());
  EXPECT_EQ(v, "w");
}

// Keys present for the whole iteration are all seen, in ascending order,
// while another thread inserts and removes other keys.
TEST_P(KVTest, IteratorBesideAWriter) {
  if (!GetParam().ordered || !GetParam().concurrent) GTEST_SKIP() << "needs a concurrent ordered engine";
  auto kv = Open(KeyKind::kU64, ValueKind::kU64);
  ASSERT_TRUE(kv);
  for (uint64_t i = 0; i < 3000; i++) ASSERT_TRUE(kv->put(U64Key(i * 2), U64Key(i)).ok());  // stable: even keys
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937_64 rng(3);
    while (!stop.load()) {
      uint64_t k = (rng() % 3000) * 2 + 1;  // odd keys come and go
      if (rng() % 2) (void)kv->put(U64Key(k), U64Key(k));
      else (void)kv->remove(U64Key(k));
    }
  });
  for (int pass = 0; pass < 3; pass++) {
    std::unique_ptr<KVIterator> it;
    ASSERT_TRUE(kv->new_iterator(&it).ok());
    ASSERT_TRUE(it->seek_to_first().ok());
    uint64_t evens = 0;
    bool first = true;
    uint64_t last = 0;
    while (it->valid()) {
      uint64_t k = SliceToU64(it->key());
      if (!first) {
        ASSERT_LT(last, k);
      }
      first = false;
      last = k;
      if (k % 2 == 0) evens++;
      ASSERT_TRUE(it->next().ok());
    }
    EXPECT_EQ(evens, 3000u);
  }
  stop = true;
  writer.join();
}

std::string EngineName(const ::testing::TestParamInfo<IndexInfo>& p) { return p.param.name; }

INSTANTIATE_TEST_SUITE_P(Engines, KVTest, ::testing::ValuesIn(ListIndexes()), EngineName);

TEST(KVOpen, UnknownEngine) {
  KVConfig c;
  std::unique_ptr<KV> kv;
  Status s = KV::Open("no_such_engine", c, &kv);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(s.message().empty());
  EXPECT_FALSE(kv);
}

}  // namespace
}  // namespace pmindex
