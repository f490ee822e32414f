// Test support for the PMwCAS tests: a small pool with a block of target
// words, and a persist recorder that lists every store, flush and fence with
// the bytes of the lines involved, from which crash images are built.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pmwcas.h"
#include "pmindex/pm/pool.h"
#include "testing/pm_test_util.h"

namespace pmindex::pm::pmwcas_test {

using testing::TempPoolPath;

// A pool whose root block holds `nwords` zeroed target words.
struct TestPool {
  std::string path;
  std::unique_ptr<Pool> pool;
  uint64_t* words = nullptr;

  explicit TestPool(const std::string& tag, size_t nwords = 64, uint32_t max_words = PMwCAS::kDefaultMaxWords,
                    uint64_t size = 1 << 20)
      : path(TempPoolPath(tag)) {
    PoolOptions po;
    po.size = size;
    po.max_size = size;
    po.pmwcas_max_words = max_words;
    Status s = Pool::Create(path, "pmwcas_test", po, &pool);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return;
    s = pool->allocator().AllocateZeroed(pool->root_slot(), nwords * 8);
    EXPECT_TRUE(s.ok()) << s.ToString();
    words = pool->root<uint64_t>();
  }
  ~TestPool() {
    pool.reset();
    ::unlink(path.c_str());
  }
  PMwCAS* pm() { return pool->pmwcas(); }
  // Sets a word outside any operation (durable, clean).
  void Set(size_t i, uint64_t v) { StorePersist(&words[i], v); }
};

// Records the persist events of the whole process while `on`.
class Recorder : public Observer {
 public:
  enum Kind : uint8_t { kStore, kFlush, kFence };
  struct Event {
    Kind kind;
    uintptr_t line;    // absolute address of the line (stores: each line touched)
    char bytes[kCacheLine];  // the line's content right after the event
  };
  std::atomic<bool> on{false};

  void OnStore(const void* addr, size_t size) override { Lines(kStore, addr, size); }
  void OnVolatileStore(const void* addr, size_t size) override { Lines(kStore, addr, size); }
  void OnNonTemporalStore(const void* addr, size_t size) override {
    // Durable at the next fence: modelled as a store plus a flush.
    Lines(kStore, addr, size);
    Lines(kFlush, addr, size);
  }
  void OnFlush(const void* line) override { Lines(kFlush, line, kCacheLine); }
  void OnFence() override {
    if (!on.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> g(mu_);
    Event e{};
    e.kind = kFence;
    events_.push_back(e);
  }
  void OnLoad(const void*, size_t) override {}

  std::vector<Event> Take() {
    std::lock_guard<std::mutex> g(mu_);
    return std::move(events_);
  }

 private:
  void Lines(Kind k, const void* addr, size_t size) {
    if (!on.load(std::memory_order_relaxed) || size == 0) return;
    std::lock_guard<std::mutex> g(mu_);
    const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
    for (uintptr_t l = a & ~uintptr_t(kCacheLine - 1); l < a + size; l += kCacheLine) {
      Event e;
      e.kind = k;
      e.line = l;
      std::memcpy(e.bytes, reinterpret_cast<const void*>(l), kCacheLine);
      events_.push_back(e);
    }
  }
  std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace pmindex::pm::pmwcas_test
