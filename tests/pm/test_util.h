// Test helpers for the PM substrate tests: unique pool paths in /dev/shm.
#pragma once

#include <unistd.h>

#include <atomic>
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

}  // namespace pmindex::pm::testing
