// pmbench_test_util.h: helpers shared by the pmbench tests: running the
// pmbench binary and reading its --json file (json_test, rounds_test), and
// naming the phases of a driver run (workload_test, rounds_test).
// Header-only, test support (not part of pmbench).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "bench.h"
#include "testing/process.h"

namespace pmbench::testutil {

struct PmRun {
  int rc = -1;
  std::string out;  // stdout (and stderr with merge_stderr)
};

inline PmRun RunPmbench(const std::string& bin, const std::string& args, bool merge_stderr = false) {
  pmindex::testutil::CommandResult c = pmindex::testutil::RunCommand(bin + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
  return PmRun{c.code, std::move(c.out)};
}

// A --json path in /dev/shm unique to this test process.
inline std::string TmpJsonPath(const std::string& test, const char* tag) {
  return "/dev/shm/pmbench-" + test + "-" + std::string(tag) + "-" + std::to_string(getpid()) + ".json";
}

// Parses the file (throwing, so failing the test, if it does not parse) and
// removes it.
inline nlohmann::json LoadJsonAndRemove(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  return j;
}

// Appends the named phases (--phases names) to o->phases.
inline void AddPhases(BenchOptions* o, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    PhaseSpec ps;
    EXPECT_TRUE(PhaseByName(name, o->ratios, &ps).ok()) << name;
    o->phases.push_back(ps);
  }
}

}  // namespace pmbench::testutil
