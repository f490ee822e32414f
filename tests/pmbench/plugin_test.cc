// plugin_test.cc: every PiBench plugin in build/lib (libpibench_*.so) is
// loaded with dlopen and driven only through the ABI of
// include/pmindex/pibench_abi.h: a differential check against std::map
// (find, insert, update, remove, scan) for u64 and byte keys, bad input, a
// 2-thread run, and a reopen check (records survive deleting and re-creating
// the tree on the same pool_path). Plugins whose index is not registered in
// this build are skipped.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "pmindex/index.h"
#include "pmindex/pibench_abi.h"

namespace {

std::vector<std::string> PluginNames() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(PMBENCH_PLUGIN_DIR, ec)) {
    std::string f = e.path().filename().string();
    if (f.rfind("libpibench_", 0) == 0 && e.path().extension() == ".so") names.push_back(f.substr(11, f.size() - 14));
  }
  std::sort(names.begin(), names.end());
  return names;
}

class PluginTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    name_ = GetParam();
    std::string path = std::string(PMBENCH_PLUGIN_DIR) + "/libpibench_" + name_ + ".so";
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    create_ = reinterpret_cast<pibench_create_tree_fn>(dlsym(handle_, "create_tree"));
    ASSERT_NE(create_, nullptr) << "no create_tree in " << path;
    if (!pmindex::FindIndexInfo(name_, &info_)) GTEST_SKIP() << name_ << " is not registered in this build";
  }
  // Note: the library stays loaded (thread_local buffers of the adapter).

  tree_api* Create(size_t k, size_t v, const std::string& pool = "", size_t threads = 1) {
    tree_options_t o;
    o.key_size = k;
    o.value_size = v;
    o.pool_path = pool;
    o.pool_size = 64ull << 20;
    o.num_threads = threads;
    return create_(o);
  }
  std::string PoolPath(const char* what) {
    return "/dev/shm/pmbench-plugintest-" + name_ + "-" + what + "-" + std::to_string(getpid()) + ".pool";
  }

  std::string name_;
  void* handle_ = nullptr;
  pibench_create_tree_fn create_ = nullptr;
  pmindex::IndexInfo info_;
};

// Keys of size ks: 8 -> native u64 (numeric order), else random bytes.
std::string MakeKey(std::mt19937_64& rng, size_t ks, uint64_t domain) {
  uint64_t x = rng() % domain;
  if (ks == 8) return std::string(reinterpret_cast<const char*>(&x), 8);
  std::string s(ks, '\0');
  // Few distinct keys (so operations hit), bytes include 0x00 and 0xff.
  std::mt19937_64 g(x * 0x9E3779B97F4A7C15ull + 1);
  for (auto& c : s) c = char(g() & 0xff);
  return s;
}
std::string MakeValue(std::mt19937_64& rng, size_t vs) {
  std::string s(vs, '\0');
  for (auto& c : s) c = char(rng() & 0xff);
  return s;
}
// Map order: numeric for u64 keys, memcmp (unsigned bytes) otherwise.
struct KeyLess {
  size_t ks;
  bool operator()(const std::string& a, const std::string& b) const {
    if (ks == 8) {
      uint64_t x, y;
      std::memcpy(&x, a.data(), 8);
      std::memcpy(&y, b.data(), 8);
      return x < y;
    }
    int c = std::memcmp(a.data(), b.data(), std::min(a.size(), b.size()));
    return c ? c < 0 : a.size() < b.size();
  }
};

void Differential(tree_api* t, size_t ks, size_t vs, bool ordered, uint64_t seed) {
  std::map<std::string, std::string, KeyLess> model(KeyLess{ks});
  std::mt19937_64 rng(seed);
  const uint64_t domain = 3000;
  std::vector<char> out(vs);
  for (int i = 0; i < 20000; i++) {
    std::string k = MakeKey(rng, ks, domain);
    const bool present = model.count(k) > 0;
    switch (rng() % 6) {
      case 0:
      case 1: {
        std::string v = MakeValue(rng, vs);
        bool ok = t->insert(k.data(), ks, v.data(), vs);
        ASSERT_EQ(ok, !present) << "insert, op " << i;
        if (ok) model[k] = v;
        break;
      }
      case 2: {
        std::string v = MakeValue(rng, vs);
        bool ok = t->update(k.data(), ks, v.data(), vs);
        ASSERT_EQ(ok, present) << "update, op " << i;
        if (ok) model[k] = v;
        break;
      }
      case 3: {
        bool ok = t->remove(k.data(), ks);
        ASSERT_EQ(ok, present) << "remove, op " << i;
        model.erase(k);
        break;
      }
      case 4: {
        bool ok = t->find(k.data(), ks, out.data());
        ASSERT_EQ(ok, present) << "find, op " << i;
        if (ok) {
          ASSERT_EQ(std::string(out.data(), vs), model[k]) << "find value, op " << i;
        }
        break;
      }
      case 5: {
        if (!ordered) break;
        int want = int(rng() % 40) + 1;
        char* recs = nullptr;
        int n = t->scan(k.data(), ks, want, recs);
        auto it = model.lower_bound(k);
        int expect = 0;
        for (auto j = it; j != model.end() && expect < want; ++j) expect++;
        ASSERT_EQ(n, expect) << "scan count, op " << i;
        ASSERT_TRUE(n == 0 || recs != nullptr);
        for (int r = 0; r < n; r++, ++it) {
          const char* rec = recs + size_t(r) * (ks + vs);
          ASSERT_EQ(std::string(rec, ks), it->first) << "scan key " << r << ", op " << i;
          ASSERT_EQ(std::string(rec + ks, vs), it->second) << "scan value " << r << ", op " << i;
        }
        break;
      }
    }
  }
  for (const auto& [k, v] : model) {
    ASSERT_TRUE(t->find(k.data(), ks, out.data()));
    ASSERT_EQ(std::string(out.data(), vs), v);
  }
}

TEST_P(PluginTest, DifferentialU64) {
  tree_api* t = Create(8, 8);
  ASSERT_NE(t, nullptr);
  Differential(t, 8, 8, info_.ordered, 1);
  delete t;
}

TEST_P(PluginTest, DifferentialByteKeys) {
  tree_api* t = Create(16, 24);
  ASSERT_NE(t, nullptr);
  Differential(t, 16, 24, info_.ordered, 2);
  delete t;
}

TEST_P(PluginTest, BadInputIsRefusedNotFatal) {
  EXPECT_EQ(Create(0, 8), nullptr);
  EXPECT_EQ(Create(8, 0), nullptr);
  EXPECT_EQ(Create(100000, 8), nullptr);
  tree_api* t = Create(8, 8);
  ASSERT_NE(t, nullptr);
  char buf[16] = {};
  uint64_t k = 42, v = 7;
  EXPECT_FALSE(t->insert(reinterpret_cast<char*>(&k), 3, reinterpret_cast<char*>(&v), 8));  // short u64 key
  EXPECT_FALSE(t->insert(reinterpret_cast<char*>(&k), 8, reinterpret_cast<char*>(&v), 5));  // short u64 value
  EXPECT_FALSE(t->find(nullptr, 8, buf));
  EXPECT_TRUE(t->insert(reinterpret_cast<char*>(&k), 8, reinterpret_cast<char*>(&v), 8));
  char* recs = nullptr;
  EXPECT_EQ(t->scan(reinterpret_cast<char*>(&k), 8, 0, recs), 0);
  EXPECT_EQ(t->scan(reinterpret_cast<char*>(&k), 8, -5, recs), 0);
  delete t;
}

TEST_P(PluginTest, TwoThreadsDisjointKeys) {
  if (!info_.concurrent) GTEST_SKIP() << name_ << " is single-threaded";
  tree_api* t = Create(8, 8, "", 2);
  ASSERT_NE(t, nullptr);
  const uint64_t per = 5000;
  std::atomic<uint64_t> failures{0};
  auto work = [&](uint64_t tid) {
    for (uint64_t i = 0; i < per; i++) {
      uint64_t k = (i * 2 + tid) * 0x9E3779B97F4A7C15ull, v = i;
      if (!t->insert(reinterpret_cast<char*>(&k), 8, reinterpret_cast<char*>(&v), 8)) failures++;
      if (i % 3 == 0 && !t->remove(reinterpret_cast<char*>(&k), 8)) failures++;
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0u);
  for (uint64_t tid = 0; tid < 2; tid++)
    for (uint64_t i = 0; i < per; i++) {
      uint64_t k = (i * 2 + tid) * 0x9E3779B97F4A7C15ull, v = 0;
      bool found = t->find(reinterpret_cast<char*>(&k), 8, reinterpret_cast<char*>(&v));
      ASSERT_EQ(found, i % 3 != 0);
      if (found) {
        ASSERT_EQ(v, i);
      }
    }
  delete t;
}

TEST_P(PluginTest, ReopenKeepsRecords) {
  if (!info_.persistent) GTEST_SKIP() << name_ << " is transient";
  for (size_t ks : {size_t(8), size_t(16)}) {
    const std::string pool = PoolPath(ks == 8 ? "u64" : "bytes");
    std::filesystem::remove(pool);
    std::map<std::string, std::string, KeyLess> model(KeyLess{ks});
    std::mt19937_64 rng(ks);
    {
      tree_api* t = Create(ks, 8, pool);
      ASSERT_NE(t, nullptr);
      for (int i = 0; i < 3000; i++) {
        std::string k = MakeKey(rng, ks, 1ull << 40), v = MakeValue(rng, 8);
        if (t->insert(k.data(), ks, v.data(), 8)) model[k] = v;
      }
      int n = 0;
      for (auto it = model.begin(); it != model.end() && n < 500; n++) {  // remove some, update some
        if (n % 2) {
          ASSERT_TRUE(t->remove(it->first.data(), ks));
          it = model.erase(it);
        } else {
          std::string v = MakeValue(rng, 8);
          ASSERT_TRUE(t->update(it->first.data(), ks, v.data(), 8));
          it->second = v;
          ++it;
        }
      }
      delete t;  // clean close
    }
    ASSERT_TRUE(std::filesystem::exists(pool));
    tree_api* t = Create(ks, 8, pool);  // opens and recovers
    ASSERT_NE(t, nullptr);
    char out[8];
    for (const auto& [k, v] : model) {
      ASSERT_TRUE(t->find(k.data(), ks, out));
      ASSERT_EQ(std::string(out, 8), v);
    }
    if (info_.ordered) {
      char* recs = nullptr;
      std::string lo(ks, '\0');
      int n = t->scan(lo.data(), ks, int(model.size()) + 10, recs);
      ASSERT_EQ(size_t(n), model.size());
    }
    // Opening a pool with the wrong key size is refused, not misread.
    delete t;
    EXPECT_EQ(Create(ks == 8 ? 16 : 8, 8, pool), nullptr);
    std::filesystem::remove(pool);
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, PluginTest, ::testing::ValuesIn(PluginNames()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PluginTest);

TEST(PluginAbi, EveryListedPluginWasBuilt) {
  auto names = PluginNames();
  for (const char* n : {"fptree", "fptree_single", "ptree", "fastfair", "nvc_hashmap", "dram_btree", "wbtree", "wbtree_slot", "nvtree", "bztree", "clfbtree"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << "libpibench_" << n << ".so missing";
}

TEST(PluginAbi, LayoutIsPiBenchs) {
  // tree_options_t: key_size, value_size, pool_path, pool_size, num_threads.
  tree_options_t o;
  auto off = [&](const void* m) { return size_t(static_cast<const char*>(m) - reinterpret_cast<const char*>(&o)); };
  EXPECT_EQ(off(&o.key_size), 0u);
  EXPECT_EQ(off(&o.value_size), sizeof(size_t));
  EXPECT_EQ(off(&o.pool_path), 2 * sizeof(size_t));
  EXPECT_EQ(off(&o.pool_size), 2 * sizeof(size_t) + sizeof(std::string));
  EXPECT_EQ(off(&o.num_threads), 3 * sizeof(size_t) + sizeof(std::string));
  EXPECT_EQ(sizeof(tree_options_t), 4 * sizeof(size_t) + sizeof(std::string));
}

}  // namespace
