// test_observer.h: test-only helper (not part of the library). DurableImage
// is a pm::Observer that keeps the image a power failure would leave of one
// pool under docs/persistence.md's flush+fence model, for the index crash
// tests: a flushed line (its content at flush time) or a non-temporal store
// becomes durable when the thread that made it fences; anything else never
// does. It builds the most pessimistic crash image at a fence; tools/pmcheck
// explores the states in between (prefixes of a line's stores).
//
//   DurableImage sim(pool);             // installed as the observer until destroyed
//   sim.on_fence = [&](uint64_t no) {   // at every fence of the live pool's threads
//     sim.Write(path);                  // the image as of this fence
//     ... open path like a pool after a power failure and check it ...
//   };
// CreateObservedIndex makes the pool, attaches the image and only then
// creates the index, so that index creation itself is observed.
//
// Invariants: the image starts as a copy of the pool (construct it when every
// earlier store is durable, e.g. right after creating the pool or opening the
// index) and covers the pool's size at that time: stores past it (growth) are
// ignored, so tests fix max_pool_size. Fences made while on_fence runs (the
// image's own recovery) are not counted and apply nothing. Volatile stores
// (pm::StoreVolatile & co.) may reach PM in either state; the image keeps the
// old bytes and SameAsLive ignores them.
//
// Thread-safety: the observer callbacks may come from any thread (each
// thread's flushes wait for that thread's fence); on_fence runs on the
// fencing thread, and must be set while no other thread uses the pool.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/index_util.h"
#include "pm/image_file.h"
#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::internal::kit {

class DurableImage : public pm::Observer {
 public:
  // Copies the pool's current contents and installs itself as the process's
  // persist observer; the destructor removes it if it is still installed.
  explicit DurableImage(pm::Pool* pool) : base_(pool->base()), img_(pool->base(), pool->base() + pool->size()) {
    pm::SetObserver(this);
  }
  ~DurableImage() override {
    if (pm::GetObserver() == this) pm::SetObserver(nullptr);
  }
  DurableImage(const DurableImage&) = delete;
  DurableImage& operator=(const DurableImage&) = delete;

  void OnStore(const void*, size_t) override {}
  void OnLoad(const void*, size_t) override {}
  void OnNonTemporalStore(const void* addr, size_t size) override { Stage(addr, size); }
  void OnFlush(const void* line) override { Stage(line, pm::kCacheLine); }
  void OnFence() override {
    uint64_t no;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (in_callback_) return;  // fences of the image being verified
      auto& v = staged_[std::this_thread::get_id()];
      for (const auto& [off, bytes] : v) std::memcpy(img_.data() + off, bytes.data(), bytes.size());
      v.clear();
      no = ++fences_;
    }
    if (!on_fence) return;
    in_callback_ = true;
    on_fence(no);
    in_callback_ = false;
  }
  void OnVolatileStore(const void* addr, size_t size) override {
    const char* a = static_cast<const char*>(addr);
    if (!Inside(a, size)) return;
    std::lock_guard<std::mutex> g(mu_);
    volatile_.insert({uint64_t(a - base_), size});
  }

  // Called after each fence has been applied, with the fence's number.
  std::function<void(uint64_t fence_no)> on_fence;
  uint64_t fences() const { return fences_; }

  // The durable image now.
  std::vector<char> Snapshot() {
    std::lock_guard<std::mutex> g(mu_);
    return img_;
  }
  // True if every byte of the pool is durable (volatile words excepted).
  bool SameAsLive() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<char> img = img_;
    for (const auto& [off, n] : volatile_) std::memcpy(img.data() + off, base_ + off, n);
    return std::memcmp(img.data(), base_, img.size()) == 0;
  }
  // Writes the durable image now, or a snapshot, as a pool file at path.
  void Write(const std::string& path) {
    std::lock_guard<std::mutex> g(mu_);
    Write(img_, path);
  }
  static void Write(const std::vector<char>& img, const std::string& path) {
    EXPECT_TRUE(pm::WriteImageFile(path, img.data(), img.size())) << "writing " << path;
  }

 private:
  bool Inside(const char* a, size_t n) const { return a >= base_ && a + n <= base_ + img_.size(); }
  void Stage(const void* addr, size_t size) {
    const char* a = static_cast<const char*>(addr);
    if (!Inside(a, size)) return;
    std::lock_guard<std::mutex> g(mu_);
    staged_[std::this_thread::get_id()].emplace_back(uint64_t(a - base_), std::string(a, size));
  }

  const char* base_;
  std::vector<char> img_;
  std::mutex mu_;
  std::map<std::thread::id, std::vector<std::pair<uint64_t, std::string>>> staged_;
  std::set<std::pair<uint64_t, size_t>> volatile_;
  uint64_t fences_ = 0;
  bool in_callback_ = false;
};

// Creates the pool at options.pool_path (options.pool_size, growing up to
// options.max_pool_size), attaches a DurableImage to it in *sim, then formats
// an index of type `type` in it in *idx.
inline ::testing::AssertionResult CreateObservedIndex(std::string_view type, const Options& options,
                                                      std::unique_ptr<DurableImage>* sim, std::unique_ptr<Index>* idx) {
  std::unique_ptr<pm::Pool> pool;
  pm::PoolOptions po;
  po.size = options.pool_size;
  po.max_size = options.max_pool_size;
  if (Status s = pm::Pool::Create(options.pool_path, type, po, &pool); !s.ok())
    return ::testing::AssertionFailure() << "creating the pool: " << s.ToString();
  *sim = std::make_unique<DurableImage>(pool.get());
  if (Status s = CreateIndexInPool(type, std::move(pool), options, idx); !s.ok())
    return ::testing::AssertionFailure() << "creating the index: " << s.ToString();
  return ::testing::AssertionSuccess();
}

}  // namespace pmindex::internal::kit
