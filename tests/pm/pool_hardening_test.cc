// Pool tests against hostile or damaged files and for the durability of the
// file system steps (docs/pool-format.md, "Opening an untrusted pool"):
// crafted header sizes, FIFOs and symbolic links, the creation mode, the
// order of fdatasync and the header's size in Grow, directory syncs, holes
// of a sparse copy, require_dax, and copy-on-write opens.
//
// This binary interposes fdatasync, fsync and posix_fallocate (the
// executable's definitions win over libc's for libpmindex.so too) to see the
// order of the pool's file-system calls and to simulate a full file system;
// the real calls go through syscall(2).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"
#include "testing/pm_test_util.h"
#include "testing/process.h"

namespace {
// What the interposed calls saw.
struct SyncRecord {
  bool dir = false;
  uint64_t file_size = 0;    // regular files: st_size at the call
  uint64_t header_size = 0;  // regular files: the header's size word at the call
};
std::vector<SyncRecord> g_syncs;
bool g_recording = false;
bool g_fallocate_enospc = false;
// Called at every directory sync while recording (set by a test).
void (*g_on_dir_sync)() = nullptr;

void Record(int fd) {
  if (!g_recording) return;
  struct stat st;
  if (fstat(fd, &st) != 0) return;
  SyncRecord r;
  r.dir = S_ISDIR(st.st_mode);
  if (r.dir) {
    if (g_on_dir_sync) g_on_dir_sync();
  } else {
    r.file_size = uint64_t(st.st_size);
    if (pread(fd, &r.header_size, 8, 128) != 8) r.header_size = 0;
  }
  g_syncs.push_back(r);
}
}  // namespace

extern "C" int fdatasync(int fd) {
  Record(fd);
  return int(syscall(SYS_fdatasync, fd));
}
extern "C" int fsync(int fd) {
  Record(fd);
  return int(syscall(SYS_fsync, fd));
}
extern "C" int posix_fallocate(int fd, off_t off, off_t len) {
  if (g_fallocate_enospc) return ENOSPC;
  if (syscall(SYS_fallocate, fd, 0, off, len) != 0) return errno;
  return 0;
}

namespace pmindex::pm {
namespace {
using testing::PoolFile;

bool Contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

PoolOptions Small(uint64_t size = 1 << 20) {
  PoolOptions o;
  o.size = size;
  return o;
}

void MakePool(const std::string& path, uint64_t size = 1 << 20) {
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(path, "t", Small(size), &p).ok());
  ASSERT_TRUE(p->allocator().AllocateZeroed(p->root_slot(), 256).ok());
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Writes max_size into the header and fixes the checksum (FNV-1a over
// [8, 112)), as a hostile file would.
void CraftMaxSize(const std::string& path, uint64_t max_size) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char h[128];
  ASSERT_EQ(::pread(fd, h, sizeof h, 0), ssize_t(sizeof h));
  std::memcpy(h + 64, &max_size, 8);
  uint64_t sum = 1469598103934665603ull;
  for (int i = 8; i < 112; i++) {
    sum ^= h[i];
    sum *= 1099511628211ull;
  }
  std::memcpy(h + 112, &sum, 8);
  ASSERT_EQ(::pwrite(fd, h, sizeof h, 0), ssize_t(sizeof h));
  ::close(fd);
}

// Runs fn in a child (so that a hang or a corrupted address space cannot take
// the test binary down) and returns its exit code; 200 + signal if killed.
int InChild(const std::function<int()>& fn, unsigned timeout_s = 10) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(timeout_s);
    _exit(fn());
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + WTERMSIG(st);
}

TEST(PoolHardening, HostileMaxSizeIsRejected) {
  PoolFile f("hostile");
  MakePool(f.path);
  // Near 2^64 the reservation size would wrap to a few MiB and the MAP_FIXED
  // of the pool would replace whatever the process had mapped after it.
  for (uint64_t max : {~uint64_t(0) - Allocator::kChunkSize + 1, uint64_t(1) << 63, kMaxPoolSizeLimit + Allocator::kChunkSize}) {
    CraftMaxSize(f.path, max);
    const int rc = InChild([&] {
      std::unique_ptr<Pool> p;
      Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
      if (!s.IsCorrupt() || !Contains(s.message(), "exceeds the limit")) return 1;
      PoolInfo info;
      s = Pool::ReadInfo(f.path, &info);
      return s.IsCorrupt() ? 0 : 2;
    });
    EXPECT_EQ(rc, 0) << "max_size " << max;
  }
  CraftMaxSize(f.path, kMaxPoolSizeLimit);
  std::unique_ptr<Pool> p;
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());  // the limit itself is fine
}

TEST(PoolHardening, CreateRefusesSizesPastTheLimit) {
  PoolFile f("createlimit");
  std::unique_ptr<Pool> p;
  PoolOptions o;
  o.size = ~uint64_t(0);  // rounding up to whole chunks would wrap to 0
  Status s = Pool::Create(f.path, "t", o, &p);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  o = Small();
  o.max_size = kMaxPoolSizeLimit + 1;
  s = Pool::Create(f.path, "t", o, &p);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "limit")) << s.ToString();
  EXPECT_FALSE(Pool::Exists(f.path));
  // Grow to a size whose rounding would wrap to 0 ("nothing to do").
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(), &p).ok());
  s = p->Grow(~uint64_t(0) - 5);
  EXPECT_TRUE(s.IsPoolFull()) << s.ToString();
  EXPECT_EQ(p->size(), 1u << 20);
}

TEST(PoolHardening, FifoIsRefusedWithoutBlocking) {
  PoolFile f("fifo");
  ASSERT_EQ(::mkfifo(f.path.c_str(), 0600), 0);
  const int rc = InChild([&] {
    std::unique_ptr<Pool> p;
    PoolOptions ro;
    ro.read_only = true;
    Status s = Pool::Open(f.path, "", ro, &p);
    if (!s.IsInvalidArgument() || !Contains(s.message(), "not a regular file")) return 1;
    PoolInfo info;
    if (!Pool::ReadInfo(f.path, &info).IsInvalidArgument()) return 2;
    if (!Pool::Open(f.path, "", PoolOptions{}, &p).IsInvalidArgument()) return 3;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "(214: blocked until the alarm)";
}

TEST(PoolHardening, SymlinkIsNotFollowed) {
  PoolFile f("target"), l("link");
  MakePool(f.path);
  ASSERT_EQ(::symlink(f.path.c_str(), l.path.c_str()), 0);
  std::unique_ptr<Pool> p;
  Status s = Pool::Open(l.path, "t", PoolOptions{}, &p);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "symbolic link")) << s.ToString();
  PoolInfo info;
  EXPECT_TRUE(Pool::ReadInfo(l.path, &info).IsInvalidArgument());
  // Create does not write through a (dangling) link either.
  ::unlink(f.path.c_str());
  s = Pool::Create(l.path, "t", Small(), &p);
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  EXPECT_FALSE(Pool::Exists(f.path));
}

TEST(PoolHardening, CreatedPrivate) {
  PoolFile f("mode");
  const mode_t old = ::umask(022);
  MakePool(f.path);
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat(f.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Grow makes the file's new length durable (fdatasync) while the header
// still holds the old size; then it persists the new size.
TEST(PoolHardening, GrowSyncsTheLengthBeforeTheSize) {
  PoolFile f("growsync");
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Create(f.path, "t", Small(1 << 20), &p).ok());
  g_syncs.clear();
  g_recording = true;
  Status s = p->Grow(4 << 20);
  g_recording = false;
  ASSERT_TRUE(s.ok()) << s.ToString();
  bool ordered = false;
  for (const auto& r : g_syncs)
    if (!r.dir && r.file_size >= (4u << 20) && r.header_size == (1u << 20)) ordered = true;
  EXPECT_TRUE(ordered) << g_syncs.size() << " file syncs, none with the new length and the old header size";
  EXPECT_EQ(p->size(), 4u << 20);
}

// Create syncs the directory after linking the pool into place, and after
// removing a dead process's temporary file (before creating its own).
TEST(PoolHardening, CreateSyncsTheDirectory) {
  PoolFile f("dirsync");
  // A dead process's temporary file.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  static std::string stale, pool_path;
  stale = f.path + ".creating." + std::to_string(dead);
  pool_path = f.path;
  { std::ofstream(stale) << "junk"; }
  static int syncs_after_stale_removal = 0, syncs_with_pool = 0;
  syncs_after_stale_removal = syncs_with_pool = 0;
  g_on_dir_sync = [] {
    if (Pool::Exists(pool_path)) syncs_with_pool++;
    else if (!Pool::Exists(stale)) syncs_after_stale_removal++;
  };
  g_recording = true;
  std::unique_ptr<Pool> p;
  Status s = Pool::Create(f.path, "t", Small(), &p);
  g_recording = false;
  g_on_dir_sync = nullptr;
  ::unlink(stale.c_str());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(Pool::Exists(stale));
  EXPECT_GE(syncs_after_stale_removal, 1);
  EXPECT_GE(syncs_with_pool, 1);
}

// A hole in the heap (a sparse copy): a read-write open allocates it (the
// file's blocks cover its length again); with
// no space left, the open fails with a clear IOError instead of a later
// SIGBUS. Read-only opens leave the file alone.
TEST(PoolHardening, HolesAreAllocatedAtOpen) {
  PoolFile f("holes");
  MakePool(f.path, 4 << 20);
  int fd = ::open(f.path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2 << 20, 2 << 20), 0) << std::strerror(errno);
  auto allocated = [fd] {
    struct stat st;
    EXPECT_EQ(::fstat(fd, &st), 0);
    return uint64_t(st.st_blocks) * 512;
  };
  ASSERT_LT(allocated(), 4u << 20);
  std::unique_ptr<Pool> p;
  PoolOptions ro;
  ro.read_only = true;
  ASSERT_TRUE(Pool::Open(f.path, "t", ro, &p).ok());
  p.reset();
  EXPECT_LT(allocated(), 4u << 20);
  g_fallocate_enospc = true;
  Status s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  g_fallocate_enospc = false;
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "sparse")) << s.ToString();
  s = Pool::Open(f.path, "t", PoolOptions{}, &p);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(allocated(), 4u << 20);
  ::close(fd);
}

// /dev/shm is tmpfs, never DAX: requiring MAP_SYNC is an error there.
TEST(PoolHardening, RequireDax) {
  PoolFile f("dax");
  std::unique_ptr<Pool> p;
  PoolOptions o = Small();
  o.require_dax = true;
  Status s = Pool::Create(f.path, "t", o, &p);
  EXPECT_TRUE(s.IsUnsupported()) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "MAP_SYNC")) << s.ToString();
  EXPECT_FALSE(Pool::Exists(f.path));
  MakePool(f.path);
  PoolOptions ro;
  ro.require_dax = true;
  s = Pool::Open(f.path, "t", ro, &p);
  EXPECT_TRUE(s.IsUnsupported()) << s.ToString();
  ASSERT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &p).ok());
  EXPECT_FALSE(p->is_dax());
  EXPECT_STREQ(p->mapping_name(), "shared (MAP_SHARED, not DAX)");
  EXPECT_EQ(p->Info().mapping, "shared (MAP_SHARED, not DAX)");
}

// A copy-on-write open recovers and writes in private memory: the file keeps
// every byte, including the clean flag of a crashed pool.
TEST(PoolHardening, CopyOnWriteNeverWritesTheFile) {
  PoolFile f("cow");
  MakePool(f.path);
  {
    std::unique_ptr<Pool> held;
    pmindex::testutil::ChildHoldingPool holder([&] { return Pool::Open(f.path, "t", PoolOptions{}, &held).ok(); });
    ASSERT_TRUE(holder.opened());
    holder.Kill();  // crashed: clean flag 0
  }
  const std::string before = ReadAll(f.path);
  std::unique_ptr<Pool> p;
  PoolOptions cow;
  cow.copy_on_write = true;
  ASSERT_TRUE(Pool::Open(f.path, "t", cow, &p).ok());
  EXPECT_TRUE(p->copy_on_write());
  EXPECT_FALSE(p->read_only());
  EXPECT_TRUE(p->recovered_from_crash());
  EXPECT_STREQ(p->mapping_name(), "private copy-on-write (MAP_PRIVATE)");
  uint64_t* slots = p->root<uint64_t>();
  ASSERT_TRUE(p->allocator().Allocate(&slots[0], 4096).ok());
  std::memset(p->At<char>(slots[0]), 0x5a, 4096);
  EXPECT_TRUE(p->Grow(8 << 20).IsUnsupported());
  std::unique_ptr<Pool> q;
  EXPECT_TRUE(Pool::Open(f.path, "t", PoolOptions{}, &q).IsBusy());  // shared lock held
  ASSERT_TRUE(p->Close().ok());
  EXPECT_TRUE(ReadAll(f.path) == before);
  PoolOptions bad = cow;
  bad.read_only = true;
  EXPECT_TRUE(Pool::Open(f.path, "t", bad, &p).IsInvalidArgument());
}

}  // namespace
}  // namespace pmindex::pm
