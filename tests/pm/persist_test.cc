// Persist primitive tests: a known sequence of stores, flushes, fences and
// copies gives exactly the expected counters; persist modes; fault switches.
#include "pmindex/pm/persist.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "pm/image_file.h"
#include "pmindex/pm/fault.h"

namespace pmindex::pm {
namespace {

struct alignas(64) Buf {
  char b[512];
};

TEST(Persist, CountersForAKnownSequence) {
  static Buf buf;
  ResetThreadCounters();
  uint64_t* w = reinterpret_cast<uint64_t*>(buf.b);
  Store(w, uint64_t(1));          // 1 store, 8 bytes
  StoreAtomic(w + 1, uint64_t(2));  // 1 store, 8 bytes
  uint32_t small = 3;
  Store(reinterpret_cast<uint32_t*>(buf.b + 16), small);  // 4 bytes
  Flush(buf.b, 8);                // 1 line
  Flush(buf.b + 60, 8);           // spans lines 0 and 1: 2
  Flush(buf.b + 64, 64);          // exactly one line
  Flush(buf.b + 1, 128);          // 3 lines
  Flush(buf.b, 0);                // nothing
  Fence();
  Persist(buf.b + 128, 130);      // 3 lines + 1 fence
  Copy(buf.b + 256, "abcdefgh", 8);  // 1 store, 8 bytes
  Set(buf.b + 300, 0, 20);          // 1 store, 20 bytes
  char src[100];
  for (int i = 0; i < 100; i++) src[i] = char(i * 7);
  CopyNT(buf.b + 384, src, 100);  // nt 100 bytes, 1 store; its 4-byte tail is cached: 1 line flushed
  uint64_t expected = 2;
  EXPECT_TRUE(Cas(w + 1, &expected, uint64_t(5)));  // 1 store
  expected = 9;
  EXPECT_FALSE(Cas(w + 1, &expected, uint64_t(6)));  // failed: no store
  EXPECT_EQ(expected, 5u);
  FetchOr(w, uint64_t(2));   // 1 store
  FetchAnd(w, uint64_t(1));  // 1 store
  FetchAdd(w, uint64_t(1));  // 1 store
  StorePersist(w + 2, uint64_t(7));  // 1 store, 1 line, 1 fence
  Counters c = ThreadCounters();
  EXPECT_EQ(c.stores, 11u);
  EXPECT_EQ(c.store_bytes, 8u + 8 + 4 + 8 + 20 + 100 + 8 + 8 + 8 + 8 + 8);
  EXPECT_EQ(c.lines_flushed, 1u + 2 + 1 + 3 + 3 + 1 + 1);
  EXPECT_EQ(c.fences, 3u);
  EXPECT_EQ(c.nt_bytes, 100u);
  EXPECT_EQ(c.allocs, 0u);
  EXPECT_EQ(*w, 2u);
  EXPECT_EQ(w[1], 5u);
  EXPECT_EQ(std::memcmp(buf.b + 384, src, 100), 0);
  // Counter arithmetic.
  Counters d = c - c;
  EXPECT_EQ(d.stores, 0u);
  d += c;
  EXPECT_EQ(d.lines_flushed, c.lines_flushed);
}

TEST(Persist, ModeNoneStillCountsLines) {
  static Buf buf;
  SetPersistMode(PersistMode::kNone);
  EXPECT_EQ(GetPersistMode(), PersistMode::kNone);
  Counters before = ThreadCounters();
  Persist(buf.b, 200);
  Counters d = ThreadCounters() - before;
  EXPECT_EQ(d.lines_flushed, 4u);
  EXPECT_EQ(d.fences, 1u);
  SetPersistMode(PersistMode::kFlush, 100);
  EXPECT_EQ(GetExtraWriteLatencyNs(), 100u);
  Persist(buf.b, 64);
  SetPersistMode(PersistMode::kFlush);
  EXPECT_EQ(GetExtraWriteLatencyNs(), 0u);
}

TEST(Persist, ParsePersistMode) {
  PersistMode m = PersistMode::kFlush;
  EXPECT_TRUE(ParsePersistMode("none", &m));
  EXPECT_EQ(m, PersistMode::kNone);
  EXPECT_TRUE(ParsePersistMode("flush", &m));
  EXPECT_EQ(m, PersistMode::kFlush);
  m = PersistMode::kNone;
  EXPECT_FALSE(ParsePersistMode("clwb", &m));
  EXPECT_FALSE(ParsePersistMode("", &m));
  EXPECT_EQ(m, PersistMode::kNone);  // untouched on failure
  EXPECT_STREQ(PersistModeName(PersistMode::kNone), "none");
  EXPECT_STREQ(PersistModeName(PersistMode::kFlush), "flush");
}

TEST(Persist, FlushInstructions) {
  const FlushInstr orig = GetFlushInstr();
  EXPECT_TRUE(SetFlushInstr(FlushInstr::kClflush));  // every x86-64 CPU has it
  static Buf buf;
  Persist(buf.b, 64);
  EXPECT_EQ(GetFlushInstr(), FlushInstr::kClflush);
  EXPECT_STREQ(FlushInstrName(FlushInstr::kClwb), "clwb");
  EXPECT_TRUE(SetFlushInstr(orig));
}

TEST(Persist, AtomicLineWrite) {
  static Buf buf;
  alignas(64) char src[64];
  for (int i = 0; i < 64; i++) src[i] = char(i);
  EXPECT_FALSE(AtomicLineWrite(buf.b + 8, src));  // misaligned: refused
  SetAtomicLineWriteEmulation(true);
  EXPECT_TRUE(AtomicLineWriteAvailable());
  Counters before = ThreadCounters();
  ASSERT_TRUE(AtomicLineWrite(buf.b + 64, src));
  Fence();
  Counters d = ThreadCounters() - before;
  EXPECT_EQ(d.line_writes, 1u);
  EXPECT_EQ(std::memcmp(buf.b + 64, src, 64), 0);
  SetAtomicLineWriteEmulation(false);
  EXPECT_EQ(AtomicLineWriteAvailable(), CpuHasMovdir64b());
}

PMINDEX_FAULT_SWITCHES(persist_test, "x.y", "x.z");

TEST(Fault, Switches) {
  if (!kFaultInjection) GTEST_SKIP() << "built without PMINDEX_FAULT_INJECTION";
  DisableAllFaults();
  EXPECT_FALSE(PMINDEX_FAULT("x.y"));
  ASSERT_TRUE(EnableFault("x.y").ok());
  EXPECT_TRUE(PMINDEX_FAULT("x.y"));
  EXPECT_FALSE(PMINDEX_FAULT("x.z"));
  ASSERT_TRUE(EnableFault("x.z").ok());
  EXPECT_EQ(EnabledFaults(), (std::vector<std::string>{"x.y", "x.z"}));
  DisableFault("x.y");
  EXPECT_FALSE(PMINDEX_FAULT("x.y"));
  EXPECT_TRUE(PMINDEX_FAULT("x.z"));
  DisableAllFaults();
  EXPECT_FALSE(PMINDEX_FAULT("x.z"));
  EXPECT_TRUE(EnabledFaults().empty());
}

// Every folder's declarations reach the registry (the library's own at load,
// this test's at its static initialisation); an undeclared name is refused
// by EnableFault and by a PMINDEX_FAULTS list, and enables nothing.
TEST(Fault, UnknownNamesAreErrors) {
  EXPECT_TRUE(FaultKnown("x.y"));
  EXPECT_TRUE(FaultKnown("pm.alloc.skip_replay"));
  EXPECT_TRUE(FaultKnown("fptree.insert.skip_kv_flush"));
  EXPECT_TRUE(FaultKnown("nvc.erratum.no_fix"));
  EXPECT_FALSE(FaultKnown("pm.alloc.no_such_switch"));
  EXPECT_FALSE(FaultKnown(""));
  DisableAllFaults();
  Status s = EnableFault("pm.alloc.no_such_switch");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(kFaultInjection ? s.IsInvalidArgument() : s.IsUnsupported()) << s.ToString();
  s = detail::EnableFaultList("x.y,x.nope");
  EXPECT_FALSE(s.ok()) << "an unknown name in PMINDEX_FAULTS must be an error";
  EXPECT_TRUE(EnabledFaults().empty());
  if (!kFaultInjection) {
    EXPECT_TRUE(EnableFault("x.y").IsUnsupported());
    EXPECT_FALSE(PMINDEX_FAULT("x.y"));
    return;
  }
  EXPECT_TRUE(detail::EnableFaultList("x.y,,x.z").ok());
  EXPECT_EQ(EnabledFaults(), (std::vector<std::string>{"x.y", "x.z"}));
  DisableAllFaults();
}

// A switch queried in code but declared nowhere stops the process once any
// fault is on (a misspelt name in an index would otherwise never fire).
TEST(FaultDeathTest, UndeclaredQueryAborts) {
  if (!kFaultInjection) GTEST_SKIP() << "built without PMINDEX_FAULT_INJECTION";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        (void)EnableFault("x.y");
        (void)PMINDEX_FAULT("x.undeclared");
      },
      "no PMINDEX_FAULT_SWITCHES declares");
}

// The crash simulators' image writer: whatever the file held before (an
// older image, bytes a verifying open wrote, a longer or shorter file), it
// holds exactly the new image afterwards.
TEST(ImageFile, FileHoldsExactlyTheImage) {
  const std::string path = "/dev/shm/pmindex-image-file-test-" + std::to_string(::getpid());
  auto read_back = [&] {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  std::mt19937_64 rng(7);
  std::vector<char> img(300 * 1024 + 100);  // not a whole number of pages or chunks
  for (char& c : img) c = char(rng() % 3 ? 0 : rng());
  ::unlink(path.c_str());
  ASSERT_TRUE(WriteImageFile(path, img.data(), img.size()));
  EXPECT_EQ(read_back(), img);
  // A verifying open wrote to the file; the next image differs elsewhere.
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(5000);
    f.write("garbage", 7);
    f.seekp(std::streamoff(img.size() - 3));
    f.write("xyz", 3);
  }
  img[200 * 1024] ^= 1;
  img[8] ^= 0x40;
  ASSERT_TRUE(WriteImageFile(path, img.data(), img.size()));
  EXPECT_EQ(read_back(), img);
  // Shorter and longer images than the file.
  std::vector<char> small(img.begin(), img.begin() + 4097);
  ASSERT_TRUE(WriteImageFile(path, small.data(), small.size()));
  EXPECT_EQ(read_back(), small);
  img.resize(img.size() + 70000, 'q');
  ASSERT_TRUE(WriteImageFile(path, img.data(), img.size()));
  EXPECT_EQ(read_back(), img);
  ::unlink(path.c_str());
  EXPECT_FALSE(WriteImageFile("/nonexistent-dir/x", img.data(), img.size()));
}

}  // namespace
}  // namespace pmindex::pm
