// Test helpers for the PM substrate tests: unique pool paths in /dev/shm,
// pool options, and a pool whose root is a table of allocation destinations.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include "pmindex/pm/pool.h"

namespace pmindex::pm::testing {

inline std::string TempPoolPath(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/pmtest-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
}

// Removes the pool file (and a leftover temporary) when the test ends.
struct PoolFile {
  std::string path;
  explicit PoolFile(const std::string& tag) : path(TempPoolPath(tag)) {}
  ~PoolFile() {
    ::unlink(path.c_str());
    ::unlink((path + ".creating." + std::to_string(::getpid())).c_str());
  }
};

// Options for a pool of `size` bytes growing up to `max` (0: the default).
inline PoolOptions Opts(uint64_t size, uint64_t max = 0) {
  PoolOptions o;
  o.size = size;
  o.max_size = max;
  return o;
}

// Creates a 1 MiB pool of type "t" at path whose root object is a zeroed
// table of nslots persistent words: the allocation destinations of a test.
inline ::testing::AssertionResult CreateWithSlots(const std::string& path, uint64_t nslots, std::unique_ptr<Pool>* p) {
  if (Status s = Pool::Create(path, "t", Opts(1 << 20), p); !s.ok()) return ::testing::AssertionFailure() << "create: " << s.ToString();
  if (Status s = (*p)->allocator().AllocateZeroed((*p)->root_slot(), nslots * 8); !s.ok())
    return ::testing::AssertionFailure() << "root slots: " << s.ToString();
  return ::testing::AssertionSuccess();
}

}  // namespace pmindex::pm::testing
