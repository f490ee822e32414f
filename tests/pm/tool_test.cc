// Tests of the pmindex-pool tool: info and check on a good pool, a pool with
// a corrupt chunk header, a file that is not a pool, a missing file, bad usage,
// a truncated file, and check running the owner index's recovery and Check()
// on a private mapping (an index overwritten with random bytes is reported,
// and the file is never written).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "pmindex/index.h"
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

// Owner type "toolpool": no index of this build, so check verifies the
// header and the allocator and says that the index was not checked.
void MakePool(const std::string& path) {
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(path, "toolpool", PoolOptions{}, &p).ok());
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 800).ok());
  uint64_t* slots = p->root<uint64_t>();
  for (int i = 0; i < 10; i++) ASSERT_TRUE(p->allocator().Allocate(&slots[i], 1024).ok());
}

TEST(PoolTool, InfoAndCheckOnGoodPool) {
  PoolFile f("tool");
  MakePool(f.path);
  Result r = RunTool("info " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("toolpool"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blocks in use:   11"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clean shutdown:  yes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mapping:         shared (MAP_SHARED, not DAX)"), std::string::npos) << r.out;
  r = RunTool("info --json " + f.path);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["type"], "toolpool");
  EXPECT_EQ(j["mapping"], "shared (MAP_SHARED, not DAX)");
  EXPECT_EQ(j["blocks_in_use"], 11);
  EXPECT_EQ(j["bytes_in_use"], 10 * 1024 + 896);
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("index not checked"), std::string::npos) << r.out;
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
// reports that it cannot open it (exit 3).
TEST(PoolTool, PoolInUse) {
  PoolFile f("tooluse");
  MakePool(f.path);
  std::unique_ptr<Pool> held;  // set in the child only, which keeps it open
  pmindex::testutil::ChildHoldingPool holder([&] { return Pool::Open(f.path, "toolpool", PoolOptions{}, &held).ok(); });
  ASSERT_TRUE(holder.opened());
  Result r = RunTool("info " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("toolpool"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("open in another process"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("clean shutdown:  no"), std::string::npos) << r.out;
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("already open"), std::string::npos) << r.out;
  holder.Kill();
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("not cleanly closed"), std::string::npos) << r.out;
}

TEST(PoolTool, MissingFileAndUsage) {
  Result r = RunTool("check /dev/shm/pmindex-no-such-pool-" + std::to_string(getpid()));
  EXPECT_EQ(r.code, 3) << r.out;
  r = RunTool("frobnicate x");
  EXPECT_EQ(r.code, 2) << r.out;
  r = RunTool("");
  EXPECT_EQ(r.code, 2) << r.out;
  r = RunTool("check --no-such-flag x");
  EXPECT_EQ(r.code, 2) << r.out;
  r = RunTool("--help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << r.out;
}

// The header says more bytes than the file has (truncated by another
// program): check reports it (exit 1) before mapping anything.
TEST(PoolTool, CheckReportsATruncatedFile) {
  PoolFile f("tooltrunc");
  MakePool(f.path);
  ASSERT_EQ(::truncate(f.path.c_str(), 8 << 20), 0);  // header: 64 MiB
  Result r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// check runs the owner index's recovery and Check() on a private mapping: a
// real fptree passes, one whose blocks were overwritten with random bytes
// (allocator metadata intact) is reported, and neither run writes the file.
TEST(PoolTool, CheckRunsTheIndexOnAPrivateCopy) {
  PoolFile f("toolindex");
  {
    Options o;
    o.pool_path = f.path;
    o.pool_size = 8 << 20;
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("fptree", o, &idx).ok());
    for (uint64_t k = 1; k <= 3000; k++) ASSERT_TRUE(idx->Insert(U64Slice(k), U64Slice(k)).ok());
  }
  std::string before = ReadAll(f.path);
  Result r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fptree index recovered and checked (3000 records)"), std::string::npos) << r.out;
  EXPECT_TRUE(ReadAll(f.path) == before);

  std::vector<std::pair<uint64_t, size_t>> blocks;
  {
    std::unique_ptr<Pool> p;
    PoolOptions ro;
    ro.read_only = true;
    ASSERT_TRUE(Pool::Open(f.path, "fptree", ro, &p).ok());
    p->allocator().ForEachAllocated([&](uint64_t off, size_t size) { blocks.emplace_back(off, size); });
  }
  ASSERT_FALSE(blocks.empty());
  int fd = ::open(f.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::mt19937_64 rng(7);
  for (const auto& [off, size] : blocks) {
    std::vector<char> junk(size);
    for (auto& c : junk) c = char(rng());
    ASSERT_EQ(::pwrite(fd, junk.data(), size, off_t(off)), ssize_t(size));
  }
  ::close(fd);
  before = ReadAll(f.path);
  r = RunTool("check " + f.path);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("fptree recovery/Check"), std::string::npos) << r.out;
  EXPECT_TRUE(ReadAll(f.path) == before);
}

}  // namespace
}  // namespace pmindex::pm
