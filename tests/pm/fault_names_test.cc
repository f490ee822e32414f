// The registry of fault switches (PMINDEX_FAULT_SWITCHES declarations) against the
// sources: every PMINDEX_FAULT("...") literal under src/ and include/ must be
// known, and every known name must still have a call site. pmcheck refuses
// --fault names that are not known (tests/tools/tools_cli_test.cc).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "pmindex/pm/fault.h"

namespace pmindex::pm {
namespace {

std::set<std::string> NamesInSources() {
  std::set<std::string> names;
  const std::regex re(R"re(PMINDEX_FAULT\("([^"]+)"\))re");
  // The library's sources only: pmcheck's toy index (tools/pmcheck) declares
  // its switches in its own binary, which this test does not load.
  for (const char* sub : {"src", "include"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(PMINDEX_SOURCE_DIR) + "/" + sub)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      std::ifstream f(e.path());
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string text = ss.str();
      for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) names.insert((*it)[1].str());
    }
  }
  return names;
}

TEST(FaultNames, KnownListMatchesTheSources) {
  const std::set<std::string> in_sources = NamesInSources();
  ASSERT_GT(in_sources.size(), 10u);
  const std::vector<std::string> known = KnownFaults();
  EXPECT_TRUE(std::is_sorted(known.begin(), known.end()));
  for (const auto& n : in_sources) EXPECT_TRUE(FaultKnown(n)) << n << " has a call site but is not declared by any PMINDEX_FAULT_SWITCHES";
  for (const auto& n : known) EXPECT_TRUE(in_sources.count(n)) << n << " is declared by PMINDEX_FAULT_SWITCHES but no call site checks it";
  EXPECT_FALSE(FaultKnown("fptree.insert.no_such_fault"));
  EXPECT_FALSE(FaultKnown(""));
}

}  // namespace
}  // namespace pmindex::pm
