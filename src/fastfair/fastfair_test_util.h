// Test helpers for the fastfair tests: pool paths, options and the leak
// check. The crash tests' durable-image observer is kit/test_observer.h.
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

}  // namespace fftest
