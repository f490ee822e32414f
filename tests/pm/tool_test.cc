// Tests of the pmindex-pool tool: info and check on a good pool, a pool with
// a corrupt chunk header, a file that is not a pool, a missing file, bad usage.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/pm_test_util.h"
#include "testing/process.h"

namespace pmindex::pm {
namespace {
using testing::PoolFile;

using Result = pmindex::testutil::CommandResult;

Result RunTool(const std::string& args) {
  return pmindex::testutil::RunCommand(std::string(PMINDEX_POOL_TOOL) + " " + args + " 2>&1");
}

void MakePool(const std::string& path) {
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(path, "fptree", PoolOptions{}, &p).ok());
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 800).ok());
  uint64_t* slots = p->root<uint64_t>();
  for (int i = 0; i < 10; i++) ASSERT_TRUE(p->allocator().Allocate(&slots[i], 1024).ok());
}

TEST(PoolTool, InfoAndCheckOnGoodPool) {
  PoolFile f("tool");
  MakePool(f.path);
  Result r = RunTool("info " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fptree"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blocks in use:   11"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clean shutdown:  yes"), std::string::npos) << r.out;
  r = RunTool("info --json " + f.path);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["type"], "fptree");
  EXPECT_EQ(j["blocks_in_use"], 11);
  EXPECT_EQ(j["bytes_in_use"], 10 * 1024 + 896);
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
}

TEST(PoolTool, CheckFindsCorruption) {
  PoolFile f("toolbad");
  MakePool(f.path);
  // Garbage in the first chunk header.
  int fd = ::open(f.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint64_t junk = 0xdeadbeefcafef00dull;
  ASSERT_EQ(::pwrite(fd, &junk, 8, off_t(Allocator::kChunkSize)), 8);
  ::close(fd);
  Result r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("invalid header state"), std::string::npos) << r.out;
  r = RunTool("info " + f.path);
  EXPECT_EQ(r.code, 1) << r.out;
  // Bad magic.
  fd = ::open(f.path.c_str(), O_RDWR);
  ASSERT_EQ(::pwrite(fd, "XXXX", 4, 0), 4);
  ::close(fd);
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a pmindex pool"), std::string::npos) << r.out;
  // A set bit past the last block of a run.
  PoolFile g("toolbits");
  MakePool(g.path);
  fd = ::open(g.path.c_str(), O_RDWR);
  // The 800-byte root lives in a run of class 896 (292 blocks): word 4 has 36 valid bits.
  uint64_t word = ~0ull;
  ASSERT_EQ(::pwrite(fd, &word, 8, off_t(Allocator::kChunkSize + 64 + 4 * 8)), 8);
  ::close(fd);
  r = RunTool("check " + g.path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("past the last block"), std::string::npos) << r.out;
}

// A pool held open by another process: info shows the header only, check
// reports that it cannot open it (exit 2).
TEST(PoolTool, PoolInUse) {
  PoolFile f("tooluse");
  MakePool(f.path);
  std::unique_ptr<Pool> held;  // set in the child only, which keeps it open
  pmindex::testutil::ChildHoldingPool holder([&] { return Pool::Open(f.path, "fptree", PoolOptions{}, &held).ok(); });
  ASSERT_TRUE(holder.opened());
  Result r = RunTool("info " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fptree"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("open in another process"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clean shutdown:  no"), std::string::npos) << r.out;
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("already open"), std::string::npos) << r.out;
  holder.Kill();
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("not cleanly closed"), std::string::npos) << r.out;
}

TEST(PoolTool, MissingFileAndUsage) {
  Result r = RunTool("check /dev/shm/pmindex-no-such-pool-" + std::to_string(getpid()));
  EXPECT_EQ(r.code, 2) << r.out;
  r = RunTool("frobnicate x");
  EXPECT_EQ(r.code, 3) << r.out;
  r = RunTool("");
  EXPECT_EQ(r.code, 3) << r.out;
  r = RunTool("--help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pmindex::pm
