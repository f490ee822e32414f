// store_test: Store (store.h) without the network: memcached's item
// semantics, the flush threshold across a reopen, the sweep, a full pool, and
// per-key atomicity of incr/append/cas under concurrent callers (labelled
// concurrency: runs under TSan in CI).
#include "store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>
#include <vector>

namespace pmindex::server {
namespace {

// A pool path in /dev/shm, removed when the test ends.
struct PoolFile {
  std::string path;
  explicit PoolFile(const std::string& tag)
      : path("/dev/shm/pmindex-" + tag + "-" + std::to_string(::getpid()) + ".pool") {
    ::unlink(path.c_str());
  }
  ~PoolFile() { ::unlink(path.c_str()); }
};

std::unique_ptr<Store> OpenStore(const std::string& path, uint64_t max_pool = 0, const char* engine = "fptree") {
  StoreConfig c;
  c.engine = engine;
  c.pool = path;
  c.pool_size = max_pool ? max_pool : 32ull << 20;
  c.max_pool_size = max_pool;
  std::unique_ptr<Store> s;
  Status st = Store::Open(c, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

TEST(ServerStore, Modes) {
  PoolFile f("server-modes");
  auto s = OpenStore(f.path);
  Item it;
  EXPECT_EQ(s->Write(Mode::kReplace, "k", 1, 0, "x", 0), Reply::kNotStored);
  EXPECT_EQ(s->Write(Mode::kAppend, "k", 1, 0, "x", 0), Reply::kNotStored);
  EXPECT_EQ(s->Write(Mode::kCas, "k", 1, 0, "x", 7), Reply::kNotFound);
  EXPECT_EQ(s->Write(Mode::kAdd, "k", 5, 0, "mid", 0), Reply::kStored);
  EXPECT_EQ(s->Write(Mode::kAdd, "k", 1, 0, "x", 0), Reply::kNotStored);
  EXPECT_EQ(s->Write(Mode::kAppend, "k", 9, 0, ">", 0), Reply::kStored);
  EXPECT_EQ(s->Write(Mode::kPrepend, "k", 9, 0, "<", 0), Reply::kStored);
  ASSERT_TRUE(s->Get("k", &it));
  EXPECT_EQ(it.data, "<mid>");
  EXPECT_EQ(it.flags, 5u);  // append/prepend keep the flags
  EXPECT_EQ(s->Write(Mode::kCas, "k", 1, 0, "c", it.cas + 1), Reply::kExists);
  uint64_t cas = 0;
  EXPECT_EQ(s->Write(Mode::kCas, "k", 2, 0, "c", it.cas, &cas), Reply::kStored);
  EXPECT_GT(cas, it.cas);
  EXPECT_EQ(s->Delete("k", cas + 1), Reply::kExists);
  EXPECT_EQ(s->Delete("k", cas), Reply::kDeleted);
  EXPECT_EQ(s->Delete("k"), Reply::kNotFound);
  EXPECT_EQ(s->Write(Mode::kSet, "big", 0, 0, std::string(s->max_item_size() + 1, 'b'), 0), Reply::kTooLarge);
}

TEST(ServerStore, ArithAndExpiry) {
  PoolFile f("server-arith");
  auto s = OpenStore(f.path);
  uint64_t v = 0;
  EXPECT_EQ(s->Arith("n", true, 1, &v), Reply::kNotFound);
  s->Write(Mode::kSet, "n", 0, 0, "18446744073709551614", 0);
  EXPECT_EQ(s->Arith("n", true, 3, &v), Reply::kStored);
  EXPECT_EQ(v, 1u);  // wraps
  EXPECT_EQ(s->Arith("n", false, 5, &v), Reply::kStored);
  EXPECT_EQ(v, 0u);  // stops at 0
  s->Write(Mode::kSet, "t", 0, 0, "12a", 0);
  EXPECT_EQ(s->Arith("t", true, 1, &v), Reply::kNonNumeric);
  s->Write(Mode::kSet, "old", 0, Store::AbsoluteExptime(-1), "x", 0);
  Item it;
  EXPECT_FALSE(s->Get("old", &it));
  EXPECT_EQ(s->Write(Mode::kAdd, "old", 0, 0, "y", 0), Reply::kStored);
  EXPECT_EQ(s->Touch("old", Store::AbsoluteExptime(1000), &it), Reply::kTouched);
  EXPECT_GT(it.exptime, Store::Now());
  EXPECT_EQ(Store::AbsoluteExptime(0), 0u);
  EXPECT_EQ(Store::AbsoluteExptime(2000000000), 2000000000u);  // beyond 30 days: absolute
}

TEST(ServerStore, FlushSurvivesReopenAndSweepReclaims) {
  PoolFile f("server-flush");
  uint64_t before = 0;
  {
    auto s = OpenStore(f.path);
    for (int i = 0; i < 100; i++) s->Write(Mode::kSet, "k" + std::to_string(i), 0, 0, "v", 0);
    ASSERT_TRUE(s->FlushAll().ok());
    uint64_t cas = 0;
    s->Write(Mode::kSet, "after", 0, 0, "a", 0, &cas);
    before = cas;
    ASSERT_TRUE(s->Close().ok());
  }
  auto s = OpenStore(f.path);
  Item it;
  EXPECT_FALSE(s->Get("k5", &it));
  ASSERT_TRUE(s->Get("after", &it));
  uint64_t cas = 0;
  s->Write(Mode::kSet, "new", 0, 0, "n", 0, &cas);
  EXPECT_GT(cas, before);  // CAS values keep rising across a reopen
  for (int i = 0; i < 50; i++) s->Write(Mode::kSet, "e" + std::to_string(i), 0, Store::AbsoluteExptime(-1), "x", 0);
  ASSERT_TRUE(s->Sweep().ok());
  EXPECT_GE(s->counters().reclaimed.load(), 149u);  // 99 flushed (k5 went lazily) + 50 expired
  EXPECT_EQ(s->Items(), 2u);
}

TEST(ServerStore, FullPoolKeepsOldValues) {
  PoolFile f("server-full");
  auto s = OpenStore(f.path, 8ull << 20);
  std::string v(60000, 'v');
  int stored = 0;
  Reply r = Reply::kStored;
  for (; stored < 1000; stored++) {
    r = s->Write(Mode::kSet, "f" + std::to_string(stored), 0, 0, v, 0);
    if (r != Reply::kStored) break;
  }
  ASSERT_EQ(r, Reply::kOutOfMemory);
  EXPECT_EQ(s->Write(Mode::kAppend, "f0", 0, 0, std::string(500000, 'a'), 0), Reply::kOutOfMemory);
  Item it;
  for (int i = 0; i < stored; i++) {
    ASSERT_TRUE(s->Get("f" + std::to_string(i), &it)) << i;
    ASSERT_EQ(it.data, v);
  }
}

TEST(ServerStore, ConcurrentReadModifyWriteIsAtomicPerKey) {
  PoolFile f("server-conc");
  auto s = OpenStore(f.path);
  s->Write(Mode::kSet, "ctr", 0, 0, "0", 0);
  s->Write(Mode::kSet, "log", 0, 0, "", 0);
  s->Write(Mode::kSet, "cas", 0, 0, "0", 0);
  constexpr int kThreads = 8, kRounds = 1500;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++) {
    ts.emplace_back([&] {
      uint64_t v;
      Item it;
      for (int i = 0; i < kRounds; i++) {
        s->Arith("ctr", true, 1, &v);
        s->Write(Mode::kAppend, "log", 0, 0, "x", 0);
        for (;;) {
          ASSERT_TRUE(s->Get("cas", &it));
          std::string next = std::to_string(std::stoull(it.data) + 1);
          if (s->Write(Mode::kCas, "cas", 0, 0, next, it.cas) == Reply::kStored) break;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  Item it;
  ASSERT_TRUE(s->Get("ctr", &it));
  EXPECT_EQ(it.data, std::to_string(kThreads * kRounds));
  ASSERT_TRUE(s->Get("log", &it));
  EXPECT_EQ(it.data.size(), size_t(kThreads * kRounds));
  ASSERT_TRUE(s->Get("cas", &it));
  EXPECT_EQ(it.data, std::to_string(kThreads * kRounds));
}

}  // namespace
}  // namespace pmindex::server
