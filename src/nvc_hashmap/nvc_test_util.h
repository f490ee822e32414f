// Test helpers for the NVC-Hashmap tests: pool paths, key/value generators,
// a leak check, CrashHarness (a live index whose pool has the durable-image
// observer of kit/test_observer.h, crashed into a second pool), and
// PauseHook, which holds a thread at one of the test hooks of nvc_hashmap.h
// until the test releases it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nvc_hashmap/nvc_format.h"
#include "nvc_hashmap/nvc_hashmap.h"
#include "pm/image_file.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "kit/test_observer.h"

namespace pmindex::nvc_test {

// Options for a 32 MiB test pool at `path`.
inline Options Opts(const std::string& path, KeyKind kk, ValueKind vk, std::map<std::string, std::string> params = {}) {
  Options o;
  o.pool_path = path;
  o.pool_size = 32ull << 20;
  o.key_kind = kk;
  o.value_kind = vk;
  o.params = std::move(params);
  return o;
}

inline std::string PoolPath(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/nvc_hashmap-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
}

// Removes the pool file when the test ends.
struct PoolFile {
  std::string path;
  explicit PoolFile(const std::string& tag) : path(PoolPath(tag)) { pm::Pool::Remove(path); }
  ~PoolFile() { pm::Pool::Remove(path); ::unlink(path.c_str()); }
};

inline std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// Keys for id: 8 bytes for u64 keys; variable-length strings for byte keys
// (shared prefixes, lengths 3..~60).
inline std::string MakeKey(KeyKind kk, uint64_t id) {
  if (kk == KeyKind::kU64) return U64(id * 0x9E3779B97F4A7C15ull + 7);
  std::string s = "key" + std::to_string(id);
  s.append(id % 7 * 8, char('a' + id % 26));
  return s;
}
inline std::string MakeValue(ValueKind vk, uint64_t id, uint64_t version) {
  if (vk == ValueKind::kU64) return U64((id << 20) ^ version);
  std::string s((id * 13 + version) % 200, char('A' + (id + version) % 26));
  std::string tag = std::to_string(id) + ":" + std::to_string(version) + ";";
  return tag + s;
}

// Owned blocks == allocated blocks (no leak, nothing owned twice).
inline void ExpectNoLeak(Index* idx) {
  std::set<uint64_t> owned, allocated;
  ASSERT_TRUE(idx->ForEachOwnedBlock([&](uint64_t off) { EXPECT_TRUE(owned.insert(off).second) << "reported twice: " << off; }).ok());
  idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { allocated.insert(off); });
  EXPECT_EQ(owned.size(), allocated.size());
  EXPECT_TRUE(owned == allocated) << "owned " << owned.size() << " blocks, allocator has " << allocated.size();
}

// Makes a closed pool look as if its process died: Root::clean is cleared
// (persisted), so the next open runs crash recovery.
inline void MarkUnclean(const std::string& path) {
  std::unique_ptr<pm::Pool> p;
  pm::PoolOptions po;
  ASSERT_TRUE(pm::Pool::Open(path, "", po, &p).ok());
  auto* clean = reinterpret_cast<uint64_t*>(p->base() + *p->root_slot() + offsetof(internal::nvc::Root, clean));
  pm::StoreAtomic(clean, uint64_t(0));
  pm::Persist(clean, 8);
  ASSERT_TRUE(p->Close().ok());
}

// ---------------------------------------------------------------------------
// Crash images and paused threads.

// A live index whose pool has a DurableImage observer; Crash() writes the
// durable image to a second pool file and opens it (recovery runs).
class CrashHarness {
 public:
  CrashHarness(const std::string& tag, std::map<std::string, std::string> params, KeyKind kk = KeyKind::kU64)
      : live_(tag + "-live"), image_(tag + "-image") {
    Options o;
    o.pool_path = live_.path;
    o.key_kind = kk;
    o.value_kind = ValueKind::kU64;
    o.params = std::move(params);
    o.pool_size = 8ull << 20;
    o.max_pool_size = 8ull << 20;  // no growth: the image covers the whole pool
    EXPECT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    obs_ = std::make_unique<internal::kit::DurableImage>(idx->pool());  // installs itself
  }
  ~CrashHarness() {
    pm::SetObserver(nullptr);
    pm::DisableAllFaults();
  }
  std::vector<char> Snapshot() { return obs_->Snapshot(); }
  bool SameAsLive() { return obs_->SameAsLive(); }
  // Closes the live index and opens the image in *out.
  Status Crash(const std::vector<char>& img, std::unique_ptr<Index>* out) {
    pm::SetObserver(nullptr);
    pm::DisableAllFaults();
    idx.reset();
    internal::kit::DurableImage::Write(img, image_.path);
    Options o;
    o.pool_path = image_.path;
    o.create_if_missing = false;
    return OpenIndex("nvc_hashmap", o, out);
  }
  std::unique_ptr<Index> idx;

 private:
  PoolFile live_, image_;
  std::unique_ptr<internal::kit::DurableImage> obs_;
};

// Two u64 keys whose nodes are neighbours in split order (a before b).
inline void NeighbourKeys(uint64_t seed, std::string* a, std::string* b) {
  *a = nvc_test::U64(seed);
  *b = nvc_test::U64(seed + 1);
  if (nvc_hashmap_testing::SplitOrderKey(KeyKind::kU64, *a) > nvc_hashmap_testing::SplitOrderKey(KeyKind::kU64, *b)) std::swap(*a, *b);
}

// A thread held at a test hook: PauseHook (installed as the hook, with
// g_pause pointing here) holds the first thread that reaches it with `key`
// until ReleaseAndJoin.
struct PauseState {
  std::mutex mu;
  std::condition_variable cv;
  std::string key;
  bool paused = false, release = false;
};
inline PauseState* g_pause = nullptr;

inline void WaitPaused(PauseState& ps) {
  std::unique_lock<std::mutex> l(ps.mu);
  ps.cv.wait(l, [&] { return ps.paused; });
}
// Lets the paused thread go, joins it and removes the hooks.
inline void ReleaseAndJoin(PauseState& ps, std::thread& t) {
  {
    std::lock_guard<std::mutex> l(ps.mu);
    ps.release = true;
    ps.cv.notify_all();
  }
  t.join();
  nvc_hashmap_testing::SetAfterLinkHook(nullptr);
  nvc_hashmap_testing::SetBeforeLinkHook(nullptr);
  nvc_hashmap_testing::SetAfterValueStoreHook(nullptr);
  nvc_hashmap_testing::SetBeforeValueStoreHook(nullptr);
  nvc_hashmap_testing::SetAfterMarkHook(nullptr);
  g_pause = nullptr;
}

inline void PauseHook(Slice key) {
  PauseState& p = *g_pause;
  std::unique_lock<std::mutex> l(p.mu);
  if (key != p.key || p.paused) return;
  p.paused = true;
  p.cv.notify_all();
  p.cv.wait(l, [&] { return p.release; });
}

}  // namespace pmindex::nvc_test
