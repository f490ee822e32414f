// Pool tests: create/open/close, header fields surviving a reopen, growth in
// place, and every kind of bad or busy file giving a clear error (never a
// crash, a SIGBUS or a silent success).
#include "pmindex/pm/pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/persist.h"
#include "testing/pm_test_util.h"
#include "testing/process.h"

namespace pmindex::pm {
namespace {
using testing::PoolFile;

PoolOptions Small(uint64_t size = 1 << 20, uint64_t max = 0) {
  PoolOptions o;
  o.size = size;
  o.max_size = max;
  return o;
}

// Flips one byte of the file at `off`.
void PokeByte(const std::string& path, uint64_t off, uint8_t x) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, off_t(off)), 1);
  b ^= x;
  ASSERT_EQ(::pwrite(fd, &b, 1, off_t(off)), 1);
  ::close(fd);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

bool Contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

TEST(Pool, CreateCloseReopen) {
  PoolFile f("pool");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "fptree", Small(), &p).ok());
  EXPECT_EQ(p->type(), "fptree");
  EXPECT_EQ(p->size(), 1u << 20);
  EXPECT_EQ(p->max_size(), kDefaultMaxPoolSize);
  EXPECT_FALSE(p->recovered_from_crash());
  EXPECT_EQ(*p->root_slot(), 0u);
  ASSERT_TRUE(p->allocator().Allocate(p->root_slot(), 100).ok());
  uint64_t root = *p->root_slot();
  EXPECT_NE(root, 0u);
  std::strcpy(p->root<char>(), "hello");
  Persist(p->root<char>(), 6);
  PoolInfo info = p->Info();
  EXPECT_EQ(info.uuid.size(), 32u);
  EXPECT_EQ(info.type, "fptree");
  EXPECT_EQ(info.root, root);
  ASSERT_TRUE(p->Close().ok());
  ASSERT_TRUE(p->Close().ok());  // idempotent

  PoolInfo ri;
  ASSERT_TRUE(Pool::ReadInfo(f.path, &ri).ok());
  EXPECT_EQ(ri.uuid, info.uuid);
  EXPECT_EQ(ri.root, root);
  EXPECT_TRUE(ri.clean_shutdown);

  ASSERT_TRUE(Pool::Open(f.path, "fptree", PoolOptions{}, &p).ok());
  EXPECT_EQ(*p->root_slot(), root);
  EXPECT_STREQ(p->root<char>(), "hello");
  EXPECT_EQ(p->Info().uuid, info.uuid);
  EXPECT_EQ(p->size(), 1u << 20);
  EXPECT_EQ(p->max_size(), kDefaultMaxPoolSize);
  EXPECT_FALSE(p->recovered_from_crash());
  EXPECT_TRUE(p->allocator().IsAllocated(root));
  EXPECT_EQ(p->allocator().BlocksInUse(), 1u);
  EXPECT_TRUE(p->allocator().Check().ok());
  // Empty expected type: any owner.
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "", PoolOptions{}, &p).ok());
  EXPECT_NE(p->instance_id(), 0u);
}

TEST(Pool, InstanceIdsAreUnique) {
  PoolFile f("ids");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  uint64_t a = p->instance_id();
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_NE(p->instance_id(), a);
}

TEST(Pool, CreateArguments) {
  PoolFile f("args");
  std::unique_ptr<Pool> p;
  EXPECT_TRUE(Pool::Create(f.path, "", Small(), &p).IsInvalidArgument());
  EXPECT_TRUE(Pool::Create(f.path, std::string(32, 'x'), Small(), &p).IsInvalidArgument());
  EXPECT_TRUE(Pool::Create("", "t", Small(), &p).IsInvalidArgument());
  EXPECT_TRUE(Pool::Create(f.path, "t", Small(4 << 20, 1 << 20), &p).IsInvalidArgument());
  EXPECT_FALSE(Pool::Exists(f.path));
  ASSERT_TRUE(Pool::Create(f.path, std::string(31, 'x'), Small(1000), &p).ok());
  EXPECT_EQ(p->size() % Allocator::kChunkSize, 0u);
  EXPECT_GE(p->size(), 2 * Allocator::kChunkSize);
  p.reset();
  Status s = Pool::Create(f.path, "t", Small(), &p);
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  EXPECT_TRUE(Pool::Open(f.path + ".missing", "t", Small(), &p).IsNotFound());
  EXPECT_TRUE(Pool::Remove(f.path).ok());
  EXPECT_TRUE(Pool::Remove(f.path).IsNotFound());
}

TEST(Pool, WrongOwnerType) {
  PoolFile f("owner");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "fastfair", Small(), &p).ok());
  p.reset();
  Status s = Pool::Open(f.path, "fptree", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "fastfair")) << s.ToString();
  EXPECT_EQ(p, nullptr);
  // The failed open released the lock.
  EXPECT_TRUE(Pool::Open(f.path, "fastfair", PoolOptions{}, &p).ok());
}

TEST(Pool, GrowInPlace) {
  PoolFile f("grow");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(1 << 20, 8 << 20), &p).ok());
  char* base = p->base();
  ASSERT_TRUE(p->allocator().Allocate(p->root_slot(), 1000).ok());
  std::memset(p->root<char>(), 'a', 1000);
  Persist(p->root<char>(), 1000);
  ASSERT_TRUE(p->Grow(3 << 20).ok());
  EXPECT_EQ(p->base(), base);
  EXPECT_EQ(p->size(), 3u << 20);
  p->base()[(3 << 20) - 1] = 7;  // the new range is mapped
  EXPECT_EQ(p->root<char>()[999], 'a');
  EXPECT_TRUE(p->Grow(2 << 20).ok());  // shrinking is a no-op
  EXPECT_EQ(p->size(), 3u << 20);
  ASSERT_TRUE(p->Grow(5 * Allocator::kChunkSize * 4 + 1).ok());  // rounded to whole chunks
  EXPECT_EQ(p->size() % Allocator::kChunkSize, 0u);
  Status s = p->Grow(9 << 20);
  EXPECT_TRUE(s.IsPoolFull()) << s.ToString();
  uint64_t size = p->size();
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->size(), size);
  EXPECT_EQ(p->max_size(), 8u << 20);
  EXPECT_EQ(p->root<char>()[999], 'a');
  EXPECT_EQ(p->base()[(3 << 20) - 1], 7);
}

// DAX maps PM with 2 MiB pages only at 2 MiB-aligned addresses: the base of
// every mapping (created, reopened, read-only) is aligned, and the reservation
// behind it is exactly max_size (the slack was returned: mapping the byte just
// past the end with MAP_FIXED_NOREPLACE succeeds). Kernels since 6.7 align
// large anonymous mappings by themselves; older ones (Debian 12's 6.1) do not,
// and there only the pool's own alignment makes the first check pass.
TEST(Pool, BaseIsAlignedFor2MiBPages) {
  PoolFile f("align");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(1 << 20, 8 << 20), &p).ok());
  auto aligned = [](const Pool& q) { return reinterpret_cast<uintptr_t>(q.base()) % (uintptr_t(2) << 20) == 0; };
  EXPECT_TRUE(aligned(*p));
  void* past = mmap(p->base() + p->max_size(), 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  EXPECT_EQ(past, static_cast<void*>(p->base() + p->max_size())) << "the reservation's tail slack was not returned";
  if (past != MAP_FAILED) munmap(past, 4096);
  p.reset();
  for (bool ro : {false, true}) {
    PoolOptions o;
    o.read_only = ro;
    ASSERT_TRUE(Pool::Open(f.path, "t", o, &p).ok());
    EXPECT_TRUE(aligned(*p)) << "read_only=" << ro;
    p.reset();
  }
}

TEST(Pool, AllocatorGrowsPool) {
  PoolFile f("agrow");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(512 << 10, 16 << 20), &p).ok());
  char* base = p->base();
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 64 * 8).ok());
  auto* slots = p->root<uint64_t>();
  for (int i = 0; i < 40; i++) ASSERT_TRUE(p->allocator().Allocate(&slots[i], 100000).ok()) << i;
  EXPECT_GT(p->size(), 512u << 10);
  EXPECT_EQ(p->base(), base);
  uint64_t size = p->size();
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->size(), size);
  EXPECT_EQ(p->allocator().BlocksInUse(), 41u);
  EXPECT_TRUE(p->allocator().Check().ok());
  // Chunks added by an explicit Grow are used before growing again.
  ASSERT_TRUE(p->Grow(size + 4 * Allocator::kChunkSize).ok());
  slots = p->root<uint64_t>();
  for (int i = 40; i < 44; i++) ASSERT_TRUE(p->allocator().Allocate(&slots[i], 100000).ok()) << i;
  EXPECT_EQ(p->size(), size + 4 * Allocator::kChunkSize);
}

TEST(Pool, BadMagic) {
  PoolFile f("magic");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  PokeByte(f.path, 0, 0x20);
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "magic")) << s.ToString();
  PoolInfo info;
  EXPECT_TRUE(Pool::ReadInfo(f.path, &info).IsCorrupt());
}

TEST(Pool, BadChecksum) {
  PoolFile f("sum");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  for (uint64_t off : {16u, 50u, 64u, 104u, 112u}) {  // type, uuid, max size, time, checksum itself
    PokeByte(f.path, off, 0x01);
    Status s = Pool::Open(f.path, "", PoolOptions{}, &p);
    EXPECT_TRUE(s.IsCorrupt()) << off << " " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "checksum")) << s.ToString();
    PokeByte(f.path, off, 0x01);
  }
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
}

TEST(Pool, UnknownVersion) {
  PoolFile f("ver");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  PokeByte(f.path, 8, 0x7);
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "version")) << s.ToString();
}

TEST(Pool, BadMutableWords) {
  PoolFile f("words");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  // size not chunk aligned
  PokeByte(f.path, 128, 0x01);
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).IsCorrupt());
  PokeByte(f.path, 128, 0x01);
  // size > max
  PokeByte(f.path, 128 + 6, 0x10);
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).IsCorrupt());
  PokeByte(f.path, 128 + 6, 0x10);
  // root outside the pool
  PokeByte(f.path, 192 + 5, 0x01);
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "root")) << s.ToString();
  PokeByte(f.path, 192 + 5, 0x01);
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
}

TEST(Pool, TruncatedFile) {
  PoolFile f("trunc");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(4 << 20), &p).ok());
  p.reset();
  ASSERT_EQ(::truncate(f.path.c_str(), 1 << 20), 0);
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "truncated")) << s.ToString();
  ASSERT_EQ(::truncate(f.path.c_str(), 100), 0);
  s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "too small")) << s.ToString();
  ASSERT_EQ(::truncate(f.path.c_str(), 0), 0);
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).IsCorrupt());
}

TEST(Pool, LargerFileIsFine) {
  PoolFile f("larger");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  ASSERT_EQ(::truncate(f.path.c_str(), 3 << 20), 0);  // e.g. a Grow interrupted before the size word
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_EQ(p->size(), 1u << 20);
  EXPECT_TRUE(p->Grow(2 << 20).ok());
}

TEST(Pool, InterruptedCreationFiles) {
  PoolFile f("interrupted");
  std::unique_ptr<Pool> p;
  // Zero-filled file (fallocated, nothing written).
  WriteFile(f.path, std::string(1 << 20, '\0'));
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "creation was interrupted")) << s.ToString();
  // A header written up to (not including) the magic.
  {
    PoolFile g("donor");
    ASSERT_TRUE(Pool::Create(g.path, "t", Small(), &p).ok());
    p.reset();
    std::string img = ReadFile(g.path);
    std::memset(img.data(), 0, 8);
    WriteFile(f.path, img);
    s = Pool::Open(f.path, "t", PoolOptions{}, &p);
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "creation was interrupted")) << s.ToString();
    // Partial header: magic but nothing else.
    std::string part(4096, '\0');
    std::memcpy(part.data(), img.data(), 8);
    std::memcpy(part.data(), "PMINDEX1", 8);
    WriteFile(f.path, part);
    s = Pool::Open(f.path, "t", PoolOptions{}, &p);
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
  }
  // Random junk, and a text file.
  std::mt19937_64 rng(5);
  std::string junk(8192, '\0');
  for (auto& c : junk) c = char(rng());
  WriteFile(f.path, junk);
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).IsCorrupt());
  WriteFile(f.path, "hello world\n");
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).IsCorrupt());
  // A directory is not a pool either.
  EXPECT_FALSE(Pool::Open("/dev/shm", "t", PoolOptions{}, &p).ok());
}

// A child creating pools is SIGKILLed at random moments; whatever is left at
// the path opens cleanly or gives a clear error, never a SIGBUS.
TEST(Pool, KilledDuringCreate) {
  std::mt19937_64 rng(11);
  int created = 0, missing = 0;
  const int rounds = std::getenv("PMINDEX_LONG") ? 200 : 20;
  for (int round = 0; round < rounds; round++) {
    PoolFile f("killcreate");
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::unique_ptr<Pool> p;
      PoolOptions o;
      o.size = 32 << 20;
      Status s = Pool::Create(f.path, "t", o, &p);
      _exit(s.ok() ? 0 : 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 25000));
    kill(pid, SIGKILL);
    int st;
    waitpid(pid, &st, 0);
    std::unique_ptr<Pool> p;
    Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
    if (s.ok()) {
      created++;
      EXPECT_TRUE(p->allocator().Check().ok());
      EXPECT_EQ(p->allocator().BlocksInUse(), 0u);
    } else {
      missing++;
      EXPECT_TRUE(s.IsNotFound()) << s.ToString();
    }
    p.reset();
    // A later Create removes the dead child's temporary file.
    ::unlink(f.path.c_str());
    ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
    p.reset();
    const std::string tmp = f.path + ".creating." + std::to_string(pid);
    EXPECT_FALSE(Pool::Exists(tmp)) << tmp;
  }
  std::printf("killed during create: %d complete, %d not created\n", created, missing);
}

// Another process holds the pool open: Busy, with a clear message.
TEST(Pool, AlreadyOpenElsewhere) {
  PoolFile f("busy");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p.reset();
  std::unique_ptr<Pool> held;  // set in the child only, which keeps it open
  pmindex::testutil::ChildHoldingPool holder([&] { return Pool::Open(f.path, "t", PoolOptions{}, &held).ok(); });
  ASSERT_TRUE(holder.opened());
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsBusy()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "already open")) << s.ToString();
  PoolOptions ro;
  ro.read_only = true;
  EXPECT_TRUE(Pool::Open(f.path, "t", ro, &p).IsBusy());
  holder.Kill();
  // The holder died: the pool opens, and reports the unclean shutdown.
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_TRUE(p->recovered_from_crash());
  EXPECT_FALSE(p->Info().clean_shutdown);
  // Same process, second open: also Busy.
  std::unique_ptr<Pool> q;
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &q).IsBusy());
  p.reset();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &q).ok());
  EXPECT_FALSE(q->recovered_from_crash());
}

TEST(Pool, ReadOnly) {
  PoolFile f("ro");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  ASSERT_TRUE(p->allocator().Allocate(p->root_slot(), 64).ok());
  p.reset();
  PoolOptions ro;
  ro.read_only = true;
  ASSERT_TRUE(Pool::Open(f.path, "t", ro, &p).ok());
  EXPECT_TRUE(p->read_only());
  std::unique_ptr<Pool> q;
  EXPECT_TRUE(Pool::Open(f.path, "t", ro, &q).ok());  // shared lock
  EXPECT_EQ(q->allocator().BlocksInUse(), 1u);
  EXPECT_TRUE(q->allocator().Check().ok());
  EXPECT_FALSE(q->allocator().Allocate(q->root_slot(), 64).ok());
  EXPECT_TRUE(q->Grow(4 << 20).IsUnsupported());
  std::unique_ptr<Pool> w;
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &w).IsBusy());
}

// A file system that refuses to grow the file (here: RLIMIT_FSIZE in a
// child) gives an IOError from Create and Grow, never a SIGBUS later.
TEST(Pool, NoSpace) {
  PoolFile f("nospace");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {2 << 20, 2 << 20};
    setrlimit(RLIMIT_FSIZE, &rl);
    std::unique_ptr<Pool> p;
    PoolOptions o;
    o.size = 8 << 20;
    Status s = Pool::Create(f.path, "t", o, &p);
    if (!s.IsIOError()) _exit(10);
    if (Pool::Exists(f.path)) _exit(11);
    if (Pool::Exists(f.path + ".creating." + std::to_string(getpid()))) _exit(12);
    o.size = 1 << 20;
    if (!Pool::Create(f.path, "t", o, &p).ok()) _exit(13);
    s = p->Grow(4 << 20);
    if (!s.IsIOError()) _exit(14);
    if (p->size() != (1u << 20)) _exit(15);
    // The allocator reports PoolFull (not a crash) when growth fails.
    if (!p->allocator().AllocateZeroed(p->root_slot(), 64).ok()) _exit(16);
    s = p->allocator().Allocate(p->root<uint64_t>(), 3 << 20);
    if (!s.IsPoolFull()) _exit(17);
    if (!p->allocator().Check().ok()) _exit(18);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

TEST(Pool, RemoveOnClose) {
  PoolFile f("tmp");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  p->RemoveOnClose();
  EXPECT_TRUE(Pool::Exists(f.path));
  p.reset();
  EXPECT_FALSE(Pool::Exists(f.path));
}

}  // namespace
}  // namespace pmindex::pm
