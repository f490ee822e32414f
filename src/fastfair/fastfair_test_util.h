// Test helpers for the fastfair tests: pool paths, leak check, and a small
// crash simulator (an Observer keeping the durable image: only lines that
// were flushed and then fenced; see docs/persistence.md). It builds the
// most pessimistic crash image at any fence; tools/pmcheck explores more.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace fftest {

std::string PoolPath(const std::string& tag);
struct PoolGuard {
  std::string path;
  explicit PoolGuard(const std::string& tag) : path(PoolPath(tag)) {}
  ~PoolGuard();
};

pmindex::Options MakeOptions(const std::string& path, pmindex::KeyKind kk, pmindex::ValueKind vk, int node_size = 512);
inline std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// ForEachOwnedBlock == Allocator::ForEachAllocated, each block reported once.
testing::AssertionResult NoLeak(pmindex::Index* idx);

// Keeps the durable image of one pool. At every fence (after applying the
// flushed lines) calls on_fence if set; the callback may write the image.
class CrashSim : public pmindex::pm::Observer {
 public:
  explicit CrashSim(pmindex::pm::Pool* pool);
  ~CrashSim() override;
  void OnStore(const void*, size_t) override {}
  void OnNonTemporalStore(const void* addr, size_t size) override;
  void OnFlush(const void* line) override;
  void OnFence() override;
  void OnLoad(const void*, size_t) override {}
  // Writes the durable image to path (a pool file that can be opened).
  void WriteImage(const std::string& path);
  std::function<void(uint64_t fence_no)> on_fence;
  uint64_t fences() const { return fences_; }

 private:
  bool Mine(const void* p) const;
  char* base_;
  uint64_t size_;
  std::vector<char> durable_;
  std::vector<std::pair<uint64_t, std::string>> pending_;
  std::mutex mu_;
  uint64_t fences_ = 0;
  bool in_callback_ = false;
};

}  // namespace fftest
