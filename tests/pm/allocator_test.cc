// Allocator tests: random alloc/free against a model, enumeration and
// accounting, argument checks, per-operation persist cost, pool-full
// behaviour, and crash safety by SIGKILLing a child at random moments.
#include "pmindex/pm/allocator.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "testing/pm_test_util.h"

namespace pmindex::pm {
namespace {
using testing::CreateWithSlots;
using testing::Opts;
using testing::PoolFile;

// Blocks reported by ForEachAllocated.
std::map<uint64_t, size_t> Enumerate(const Allocator& a) {
  std::map<uint64_t, size_t> m;
  a.ForEachAllocated([&](uint64_t off, size_t size) { EXPECT_TRUE(m.emplace(off, size).second) << "reported twice"; });
  return m;
}

size_t RandomSize(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: return 1 + rng() % 16;
    case 1: return 1 + rng() % 64;
    case 2: case 3: case 4: return 1 + rng() % 512;
    case 5: case 6: return 1 + rng() % 4096;
    case 7: return 1 + rng() % Allocator::kMaxRunBlock;
    case 8: return 1024;
    default: return rng() % 50 == 0 ? Allocator::kMaxRunBlock + 1 + rng() % 600000 : 1 + rng() % 200;
  }
}

TEST(Allocator, RandomAgainstModel) {
  PoolFile f("model");
  std::unique_ptr<Pool> p;
  constexpr int kSlots = 2000;
  ASSERT_TRUE(CreateWithSlots(f.path, kSlots, &p));
  std::mt19937_64 rng(42);
  std::map<int, size_t> model;  // slot -> requested size
  for (int round = 0; round < 3; round++) {
    Allocator& a = p->allocator();
    auto* slots = p->root<uint64_t>();
    for (int i = 0; i < 20000; i++) {
      int s = int(rng() % kSlots);
      if (slots[s]) {
        ASSERT_TRUE(model.count(s));
        ASSERT_TRUE(a.Free(&slots[s]).ok());
        EXPECT_EQ(slots[s], 0u);
        model.erase(s);
      } else {
        size_t sz = RandomSize(rng);
        Status st = (rng() & 1) ? a.Allocate(&slots[s], sz) : a.AllocateZeroed(&slots[s], sz);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_NE(slots[s], 0u);
        EXPECT_GE(a.UsableSize(slots[s]), sz);
        EXPECT_TRUE(a.IsAllocated(slots[s]));
        if (sz > 48) {
          EXPECT_EQ(slots[s] % 64, 0u);
        } else {
          EXPECT_EQ(slots[s] % 16, 0u);
        }
        // Fill the block: overlapping blocks would be caught by the checks below.
        Set(p->base() + slots[s], s & 0xff, std::min<size_t>(sz, 256));
        model[s] = sz;
      }
    }
    // Enumeration == model (plus the root array), accounting consistent.
    auto blocks = Enumerate(a);
    std::map<uint64_t, size_t> expect;
    expect[*p->root_slot()] = a.UsableSize(*p->root_slot());
    uint64_t bytes = 0;
    for (auto& [s, sz] : model) {
      expect[slots[s]] = a.UsableSize(slots[s]);
      EXPECT_EQ(uint8_t(p->base()[slots[s]]), uint8_t(s & 0xff)) << "block of slot " << s << " was overwritten";
    }
    for (auto& [off, sz] : expect) bytes += sz;
    EXPECT_EQ(blocks, expect);
    EXPECT_EQ(a.BlocksInUse(), expect.size());
    EXPECT_EQ(a.BytesInUse(), bytes);
    Status c = a.Check();
    EXPECT_TRUE(c.ok()) << c.ToString();
    // Reopen: the same after recovery.
    p.reset();
    ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
    EXPECT_EQ(Enumerate(p->allocator()), expect);
    EXPECT_EQ(p->allocator().BytesInUse(), bytes);
    EXPECT_TRUE(p->allocator().Check().ok());
  }
}

TEST(Allocator, BadArguments) {
  PoolFile f("args");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Opts(1 << 20), &p).ok());
  Allocator& a = p->allocator();
  ASSERT_TRUE(a.AllocateZeroed(p->root_slot(), 64).ok());
  auto* slots = p->root<uint64_t>();
  uint64_t dram = 0;
  EXPECT_TRUE(a.Allocate(&dram, 10).IsInvalidArgument());
  EXPECT_TRUE(a.Allocate(&slots[0], 0).IsInvalidArgument());
  EXPECT_TRUE(a.Allocate(&slots[0], Allocator::kMaxAllocation + 1).IsInvalidArgument());
  EXPECT_TRUE(a.Allocate(reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(&slots[0]) + 1), 8).IsInvalidArgument());
  EXPECT_TRUE(a.Allocate(reinterpret_cast<uint64_t*>(p->base() + 4096), 8).IsInvalidArgument());  // a lane
  EXPECT_EQ(slots[0], 0u);
  // A too-large request that fits the limit but not the pool: PoolFull.
  PoolFile g("args2");
  std::unique_ptr<Pool> q;
  ASSERT_TRUE(Pool::Create(g.path, "t", Opts(1 << 20, 4 << 20), &q).ok());
  ASSERT_TRUE(q->allocator().AllocateZeroed(q->root_slot(), 64).ok());
  Status s = q->allocator().Allocate(q->root<uint64_t>(), 8 << 20);
  EXPECT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_EQ(q->root<uint64_t>()[0], 0u);
  // Frees of things that are not blocks are refused, *dest left alone.
  ASSERT_TRUE(a.Allocate(&slots[1], 100).ok());
  slots[2] = slots[1] + 8;
  EXPECT_TRUE(a.Free(&slots[2]).IsInvalidArgument());
  EXPECT_EQ(slots[2], slots[1] + 8);
  slots[2] = 0;
  EXPECT_TRUE(a.Free(&slots[2]).ok());  // null: no-op
  uint64_t copy = slots[1];
  ASSERT_TRUE(a.Free(&slots[1]).ok());
  slots[3] = copy;
  EXPECT_TRUE(a.Free(&slots[3]).IsInvalidArgument());  // double free
  EXPECT_EQ(slots[3], copy);
  EXPECT_TRUE(a.Free(reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(&slots[3]) + 1)).IsInvalidArgument());
  slots[3] = 0;
  EXPECT_EQ(a.BlocksInUse(), 1u);
  EXPECT_TRUE(a.Check().ok());
  EXPECT_EQ(a.UsableSize(0), 0u);
  EXPECT_EQ(a.UsableSize(1ull << 40), 0u);
  EXPECT_FALSE(a.IsAllocated(12345));
}

// The documented cost: Allocate flushes 4 lines, Free 3, each fences twice.
TEST(Allocator, PersistCostPerOperation) {
  PoolFile f("cost");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Opts(1 << 20), &p).ok());
  Allocator& a = p->allocator();
  ASSERT_TRUE(a.AllocateZeroed(p->root_slot(), 64 * 8).ok());
  auto* slots = p->root<uint64_t>();
  for (size_t sz : {size_t(16), size_t(1024), size_t(100000)}) {
    ASSERT_TRUE(a.Allocate(&slots[0], sz).ok());  // warm: the run and the lane exist
    ASSERT_TRUE(a.Free(&slots[0]).ok());
    Counters before = ThreadCounters();
    ASSERT_TRUE(a.Allocate(&slots[1], sz).ok());
    Counters d = ThreadCounters() - before;
    EXPECT_EQ(d.allocs, 1u);
    if (sz <= 1024) {
      EXPECT_EQ(d.lines_flushed, 4u) << sz;
      EXPECT_EQ(d.fences, 2u) << sz;
    }
    before = ThreadCounters();
    ASSERT_TRUE(a.Free(&slots[1]).ok());
    d = ThreadCounters() - before;
    EXPECT_EQ(d.frees, 1u);
    if (sz <= 1024) {
      EXPECT_EQ(d.lines_flushed, 3u) << sz;
      EXPECT_EQ(d.fences, 2u) << sz;
    }
  }
}

TEST(Allocator, PoolFullThenRoomAgain) {
  PoolFile f("full");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Opts(512 << 10, 2 << 20), &p).ok());
  Allocator& a = p->allocator();
  constexpr int kSlots = 8192;
  ASSERT_TRUE(a.AllocateZeroed(p->root_slot(), kSlots * 8).ok());
  auto* slots = p->root<uint64_t>();
  std::mt19937_64 rng(3);
  int n = 0;
  Status s;
  for (; n < kSlots; n++) {
    s = a.Allocate(&slots[n], (rng() & 1) ? 200 + rng() % 56 : 1000 + rng() % 24);  // two classes
    if (!s.ok()) break;
  }
  ASSERT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_GT(n, 100);
  EXPECT_EQ(slots[n], 0u);  // untouched
  EXPECT_EQ(p->size(), 2u << 20);
  EXPECT_TRUE(a.Check().ok());
  EXPECT_EQ(a.BlocksInUse(), uint64_t(n) + 1);
  EXPECT_TRUE(a.Allocate(&slots[n], 100000).IsPoolFull());
  // Free everything: a large block fits again, and small ones.
  for (int i = 0; i < n; i++) ASSERT_TRUE(a.Free(&slots[i]).ok());
  EXPECT_EQ(a.BlocksInUse(), 1u);
  Status big = a.Allocate(&slots[0], 600000);
  EXPECT_TRUE(big.ok()) << big.ToString();
  for (int i = 1; i < 100; i++) ASSERT_TRUE(a.Allocate(&slots[i], 500).ok());
  EXPECT_TRUE(a.Check().ok());
  // After a reopen, all free runs are back in the heap.
  for (int i = 0; i < 100; i++) ASSERT_TRUE(a.Free(&slots[i]).ok());
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  slots = p->root<uint64_t>();
  EXPECT_TRUE(p->allocator().Allocate(&slots[0], (2 << 20) - 3 * Allocator::kChunkSize).ok());
  EXPECT_TRUE(p->allocator().Check().ok());
}

// ---------------------------------------------------------------------------
// Crash safety: a child allocates and frees into a persistent slot array in
// a loop; the parent SIGKILLs it at random moments, reopens and checks that
// every allocated block is owned by exactly one slot and vice versa.

void ChildLoop(const std::string& path, uint64_t seed, std::atomic<uint64_t>* progress) {
  std::unique_ptr<Pool> p;
  if (!Pool::Open(path, "crash", PoolOptions{}, &p).ok()) _exit(3);
  Allocator& a = p->allocator();
  auto* slots = p->root<uint64_t>();
  const int n = int(a.UsableSize(*p->root_slot()) / 8);
  std::mt19937_64 rng(seed);
  for (;;) {
    progress->fetch_add(1, std::memory_order_relaxed);
    int s = int(rng() % n);
    if (slots[s]) {
      if (!a.Free(&slots[s]).ok()) _exit(5);
    } else {
      size_t sz = rng() % 64 == 0 ? 40000 + rng() % 300000 : 1 + rng() % 3000;
      Status st = a.Allocate(&slots[s], sz);
      if (!st.ok() && !st.IsPoolFull()) _exit(4);
    }
  }
}

// Empty if every allocated block is owned by exactly one slot (or is the slot
// array itself), every non-zero slot references an allocated block, the
// counters match the enumeration and Check passes; else what is wrong.
std::string OwnershipProblems(Pool* p) {
  Allocator& a = p->allocator();
  std::ostringstream why;
  if (Status c = a.Check(); !c.ok()) why << c.ToString() << "; ";
  auto blocks = Enumerate(a);
  const uint64_t root = *p->root_slot();
  if (!blocks.count(root)) return why.str() + "the slot array is not allocated";
  auto* slots = p->root<uint64_t>();
  const size_t n = a.UsableSize(root) / 8;
  std::set<uint64_t> owned{root};
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    if (!slots[i]) continue;
    if (!blocks.count(slots[i])) why << "slot " << i << " references a free block " << slots[i] << "; ";
    if (!owned.insert(slots[i]).second) why << "block " << slots[i] << " owned twice; ";
  }
  for (auto& [off, sz] : blocks) {
    if (!owned.count(off)) why << "leaked block " << off << " (" << sz << " bytes); ";
    bytes += sz;
  }
  if (a.BlocksInUse() != blocks.size() || a.BytesInUse() != bytes) why << "counters differ from the enumeration; ";
  return why.str();
}

// Forks children that run ChildLoop and SIGKILLs each after a random amount
// of progress; reopens and checks ownership after each kill. Returns the
// number of kills after which something was wrong (stops at the first one
// if stop_at_first).
int KillLoop(const std::string& path, int kills, bool stop_at_first, std::string* first_problem) {
  std::mt19937_64 rng(7);
  // Shared with the children: operations started, so that every kill lands
  // after the child opened the pool and made some progress, however loaded
  // the machine is.
  void* shm = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(shm, MAP_FAILED);
  if (shm == MAP_FAILED) return -1;
  auto* progress = new (shm) std::atomic<uint64_t>(0);
  int bad = 0, recovered = 0, done = 0;
  std::set<uint64_t> states;  // distinct (blocks in use) seen, for the log
  for (int k = 0; k < kills; k++) {
    done = k + 1;
    progress->store(0);
    const uint64_t target = 1 + rng() % 3000;
    const uint64_t seed = rng();
    pid_t pid = fork();
    EXPECT_GE(pid, 0);
    if (pid < 0) break;
    if (pid == 0) ChildLoop(path, seed, progress);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (progress->load() < target && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_GE(progress->load(), target) << "the child made no progress in 30 s";
    if (rng() & 1) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFSIGNALED(st)) << "child exited with " << WEXITSTATUS(st);
    std::unique_ptr<Pool> p;
    Status s = Pool::Open(path, "crash", PoolOptions{}, &p);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) break;
    recovered += p->recovered_from_crash();
    std::string why = OwnershipProblems(p.get());
    states.insert(p->allocator().BlocksInUse());
    if (!why.empty()) {
      if (bad++ == 0 && first_problem) *first_problem = "after kill " + std::to_string(k) + ": " + why;
      if (stop_at_first) break;
    }
  }
  munmap(shm, 4096);
  std::printf("%d kills, %d recovered from a crash, %zu distinct states, %d with problems\n", done, recovered,
              states.size(), bad);
  EXPECT_EQ(recovered, done) << "a kill landed before the child opened the pool";
  return bad;
}

void MakeCrashPool(const std::string& path) {
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(path, "crash", Opts(1 << 20, 32 << 20), &p).ok());
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 512 * 8).ok());
}

TEST(Allocator, CrashSafetyUnderSigkill) {
  const int kills = std::getenv("PMINDEX_LONG") ? 500 : 60;
  PoolFile f("crash");
  MakeCrashPool(f.path);
  std::string why;
  EXPECT_EQ(KillLoop(f.path, kills, /*stop_at_first=*/true, &why), 0) << why;
}

// The same test against a deliberately broken recovery (fault switch
// pm.alloc.skip_replay: lanes are discarded instead of replayed) must find
// leaked or dangling blocks: the crash test can fail.
TEST(Allocator, CrashTestDetectsBrokenRecovery) {
  PoolFile f("crashfault");
  MakeCrashPool(f.path);
  EnableFault("pm.alloc.skip_replay");
  std::string why;
  const int bad = KillLoop(f.path, 400, /*stop_at_first=*/true, &why);
  DisableFault("pm.alloc.skip_replay");
  EXPECT_GE(bad, 1) << "400 kills with lane replay disabled went unnoticed";
  std::printf("detected: %s\n", why.c_str());
}

// ---------------------------------------------------------------------------
// Recovery of hand-made crash states: a lane planted at each step of the
// protocol, then the pool reopened. Uses the on-media layout directly
// (docs/allocator.md): lanes at 4 KiB, chunk state word at the chunk start,
// run bitmap after the chunk header line; 1 KiB blocks are size class 14,
// start 128 bytes into their chunk.

namespace planted {
constexpr uint64_t kOpAlloc = 0x414C4C4F43A5A501ull;
constexpr uint64_t kOpFree = 0x46524545A5A5A502ull;
constexpr uint64_t kArgLarge = 1ull << 63;
constexpr uint64_t kClass1K = 14;
constexpr uint64_t C = Allocator::kChunkSize;

struct Lane {
  uint64_t op, block, dest, arg;
};
Lane* LaneAt(Pool* p, int i) { return reinterpret_cast<Lane*>(p->base() + 4096 + 64 * i); }
uint64_t ChunkStart(uint64_t off) { return (off / C) * C; }  // heap starts at one chunk
uint64_t* BitWord(Pool* p, uint64_t off, uint64_t* mask) {
  const uint64_t cs = ChunkStart(off);
  const uint64_t idx = (off - cs - 128) / 1024;
  *mask = 1ull << (idx % 64);
  return reinterpret_cast<uint64_t*>(p->base() + cs + 64) + idx / 64;
}
}  // namespace planted

TEST(Allocator, RecoveryOfPlantedLanes) {
  using namespace planted;
  PoolFile f("planted");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Opts(4 << 20), &p).ok());
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 64 * 8).ok());
  auto reopen = [&] {
    p.reset();
    Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Status c = p->allocator().Check();
    EXPECT_TRUE(c.ok()) << c.ToString();
  };
  auto slots = [&] { return p->root<uint64_t>(); };
  auto plant = [&](uint64_t op, uint64_t block, uint64_t* dest, uint64_t arg) {
    Lane* l = LaneAt(p.get(), 1023);
    l->block = block;
    l->dest = p->OffsetOf(dest);
    l->arg = arg;
    l->op = op;
  };
  uint64_t m;

  // (a) ALLOC committed (*dest == block) but the bit never reached PM.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[0], 1024).ok());
  uint64_t b = slots()[0];
  *BitWord(p.get(), b, &m) &= ~m;
  plant(kOpAlloc, b, &slots()[0], kClass1K);
  reopen();
  EXPECT_TRUE(p->allocator().IsAllocated(b));
  EXPECT_EQ(slots()[0], b);
  EXPECT_EQ(LaneAt(p.get(), 1023)->op, 0u);

  // (b) ALLOC not committed: bit set, *dest still 0 -> rolled back.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[1], 1024).ok());
  b = slots()[1];
  slots()[1] = 0;
  plant(kOpAlloc, b, &slots()[1], kClass1K);
  reopen();
  EXPECT_FALSE(p->allocator().IsAllocated(b));
  EXPECT_EQ(slots()[1], 0u);

  // (c) FREE logged, nothing else done: rolled forward.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[2], 1024).ok());
  b = slots()[2];
  plant(kOpFree, b, &slots()[2], kClass1K);
  reopen();
  EXPECT_FALSE(p->allocator().IsAllocated(b));
  EXPECT_EQ(slots()[2], 0u);

  // (d) FREE with *dest cleared but the bit still set: bit cleared.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[3], 1024).ok());
  b = slots()[3];
  slots()[3] = 0;
  plant(kOpFree, b, &slots()[3], kClass1K);
  reopen();
  EXPECT_FALSE(p->allocator().IsAllocated(b));

  // (e) LARGE ALLOC not committed: head rolled back to FREE.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[4], 300000).ok());
  b = slots()[4];
  const uint64_t span = (300000 + 64 + C - 1) / C;
  slots()[4] = 0;
  plant(kOpAlloc, b, &slots()[4], kArgLarge | span);
  reopen();
  EXPECT_FALSE(p->allocator().IsAllocated(b));
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(p->base() + ChunkStart(b)), 0u);

  // (f) LARGE FREE logged: rolled forward, later chunk headers cleared.
  ASSERT_TRUE(p->allocator().Allocate(&slots()[5], 600000).ok());
  b = slots()[5];
  Set(p->base() + b, 0x5a, 600000);  // user data over the later chunks' header lines
  plant(kOpFree, b, &slots()[5], kArgLarge | ((600000 + 64 + C - 1) / C));
  reopen();
  EXPECT_FALSE(p->allocator().IsAllocated(b));
  EXPECT_EQ(slots()[5], 0u);
  EXPECT_EQ(p->allocator().BlocksInUse(), 2u);  // root array + (a)

  // (g) Garbage lanes make Open fail with Corrupt, not crash.
  LaneAt(p.get(), 1023)->op = 0x1234;
  p.reset();
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  // Repair through the file, then an out-of-pool block.
  int fd = ::open(f.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  Lane bad{kOpAlloc, 1ull << 40, 4096 * 64, kClass1K};
  ASSERT_EQ(::pwrite(fd, &bad, sizeof bad, 4096 + 64 * 1023), ssize_t(sizeof bad));
  s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  Lane idle{0, 0, 0, 0};
  ASSERT_EQ(::pwrite(fd, &idle, sizeof idle, 4096 + 64 * 1023), ssize_t(sizeof idle));
  ::close(fd);
  reopen();
  EXPECT_EQ(p->allocator().BlocksInUse(), 2u);
}

}  // namespace
}  // namespace pmindex::pm
