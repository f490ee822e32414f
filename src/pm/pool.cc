// Pool: a pool file mapped into a reserved address range (include/pmindex/pm/pool.h).
//
// Follows the PM programming model of FPTree (SIGMOD'16) section 2 and the
// PiBench evaluation (VLDB'20) sections 2.2/5.8: persistent pointers are
// offsets from the base, so the mapping address may differ between runs;
// growth happens in place inside an address range reserved at open.
//
// Invariants:
//  * The immutable header fields (magic .. checksum) never change after
//    creation; the checksum covers [8, offsetof(checksum)).
//  * header.size <= file size, size is a whole number of chunks, heap offset
//    + one chunk <= size <= max_size. The mapping covers exactly [0, size).
//  * The magic is the last thing written at creation, and the file is only
//    renamed (hard-linked) into place after the magic is durable, so a file
//    at `path` either is a complete pool or was never created by us.
// Persist ordering:
//  * Create: zero + fill header (pm::Set/pm::Copy), Persist; magic, Persist;
//    msync; fdatasync; link into place.
//  * Create: after the link into place (and after removing a dead process's
//    temporary file), fsync the directory so the name is durable.
//  * Grow: extend the file, fdatasync it (the new length is durable), map
//    the new range, then StoreAtomic+Persist of header.size (a crash in
//    between leaves a larger file; fine; the reverse order could leave a
//    header size beyond the file's durable length: "file is truncated").
//  * Open: StoreAtomic+Persist clean=0 before any other write; then the
//    allocator recovers, then the PMwCAS descriptors (format 2), both before
//    Open returns (so before any index opens).
//  * Close: the PMwCAS recycles its retired descriptors, the allocator shuts
//    down, then StoreAtomic+Persist clean=1.
// Format 1 pools (no PMwCAS region, docs/pool-format.md) open read-write
// with pmwcas() == nullptr; their header is never rewritten.
// Untrusted files: every header field is validated from a pread copy before
// anything is mapped; max_size <= kMaxPoolSizeLimit bounds every size sum
// (max_size + 2 MiB, offsets < size <= max_size) far below 2^64, so the
// MAP_FIXED mappings only ever replace pages of the pool's own reservation.
// Thread safety: see pool.h (Grow serialises on grow_mu_).
#include "pmindex/pm/pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <random>

#include "pm/layout.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pm/pmwcas_internal.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pmwcas.h"

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

namespace pmindex::pm {

namespace {
constexpr char kMagic[8] = {'P', 'M', 'I', 'N', 'D', 'E', 'X', '1'};
std::atomic<uint64_t> g_next_instance{1};

uint64_t Fnv1a(const void* p, size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= c[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string Errno(const std::string& what, int e) { return what + ": " + std::strerror(e); }

// Callers bound v by kMaxPoolSizeLimit first, so v + a - 1 cannot wrap.
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

constexpr uint64_t kHugePage = uint64_t(2) << 20;
static_assert(kMaxPoolSizeLimit % Allocator::kChunkSize == 0);
static_assert(kMaxPoolSizeLimit < (uint64_t(1) << 62), "reservation sums must not wrap");

// Opens an existing pool file without following a symbolic link and without
// blocking (a FIFO would block an O_RDONLY open until a writer appears);
// anything but a regular file is InvalidArgument.
Status OpenExisting(const std::string& path, int flags, int* fd) {
  *fd = open(path.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (*fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound("no pool at " + path);
    if (e == ELOOP) return Status::InvalidArgument(path + ": is a symbolic link (pools are opened without following links)");
    return Status::IOError(Errno("open " + path, e));
  }
  struct stat st;
  Status s;
  if (fstat(*fd, &st) != 0) s = Status::IOError(Errno("fstat " + path, errno));
  else if (!S_ISREG(st.st_mode)) s = Status::InvalidArgument(path + ": not a regular file");
  if (!s.ok()) {
    close(*fd);
    *fd = -1;
  }
  return s;
}

std::string DirOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Makes the directory's entries (a link, an unlink) durable.
Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Errno("open directory " + dir, errno));
  const int rc = fsync(fd);
  const int e = errno;
  close(fd);
  // tmpfs and some others answer EINVAL for directories: nothing to sync.
  if (rc != 0 && e != EINVAL) return Status::IOError(Errno("fsync directory " + dir, e));
  return Status::OK();
}

// A sparse copy of a pool (cp, rsync) has holes that the file system fills
// at the first store, raising SIGBUS if it is full then. A file whose
// allocated blocks cover its length has none (one fstat: st_blocks counts
// preallocated blocks too, where SEEK_HOLE on tmpfs also reports allocated
// but never written pages as holes); otherwise posix_fallocate allocates
// what is missing in [0, size), so a full file system is an error at open.
Status AllocateHoles(int fd, const std::string& path, uint64_t size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::IOError(Errno("fstat " + path, errno));
  if (uint64_t(st.st_blocks) * 512 >= uint64_t(st.st_size)) return Status::OK();  // dense
  if (int e = posix_fallocate(fd, 0, off_t(size)); e != 0) {
    if (e == ENOSPC) {
      const off_t hole = lseek(fd, 0, SEEK_HOLE);
      return Status::IOError(path + ": the pool file is sparse (" + std::to_string(uint64_t(st.st_blocks) * 512) + " of " +
                             std::to_string(uint64_t(st.st_size)) + " bytes allocated, first hole at byte " +
                             std::to_string(int64_t(hole)) + ") and the file system has no space to allocate the holes; "
                             "free space or copy the pool without holes");
    }
    return Status::IOError(Errno("posix_fallocate (holes) " + path, e));
  }
  return Status::OK();
}
}  // namespace

struct HeaderLayout {
  // --- immutable (checksummed) ---
  char magic[8];          // 0
  uint32_t version;       // 8
  uint32_t header_size;   // 12
  char type[32];          // 16, NUL-terminated
  uint8_t uuid[16];       // 48
  uint64_t max_size;      // 64
  uint64_t heap_offset;   // 72
  uint64_t chunk_size;    // 80
  uint64_t lanes_offset;  // 88
  uint64_t lane_count;    // 96
  uint64_t create_time;   // 104 (seconds since the epoch)
  uint64_t checksum;      // 112: FNV-1a over [8, 112)
  uint64_t pad0;          // 120
  // --- mutable words, each on its own cache line ---
  alignas(64) uint64_t size;  // 128
  char pad1[56];
  alignas(64) uint64_t root;  // 192
  char pad2[56];
  alignas(64) uint64_t clean;  // 256: 1 after a clean Close
  char pad3[56];
  // --- format 2: the PMwCAS descriptor region (immutable, own checksum) ---
  alignas(64) uint32_t pmwcas_max_words;  // 320
  uint32_t pmwcas_desc_size;              // 324
  uint64_t pmwcas_offset;                 // 328
  uint64_t pmwcas_count;                  // 336
  uint64_t pmwcas_checksum;               // 344: FNV-1a over [320, 344)
  char pad4[32];
};
struct Pool::Header : HeaderLayout {};
static_assert(offsetof(HeaderLayout, checksum) == 112);
static_assert(offsetof(HeaderLayout, size) == 128);
static_assert(offsetof(HeaderLayout, root) == layout::kRootSlotOffset);
static_assert(offsetof(HeaderLayout, clean) == 256);
static_assert(offsetof(HeaderLayout, pmwcas_max_words) == layout::kPmwcasInfoOffset);
static_assert(offsetof(HeaderLayout, pmwcas_checksum) == 344);
static_assert(sizeof(HeaderLayout) <= kPoolHeaderSize);

namespace {

// Validates a header read from a file of `file_size` bytes (no mapping).
Status ValidateHeader(const std::string& path, const HeaderLayout& h, uint64_t file_size) {
  static const char kZero[8] = {};
  if (std::memcmp(h.magic, kZero, 8) == 0)
    return Status::Corrupt(path + ": not a pmindex pool, or its creation was interrupted (no magic)");
  if (std::memcmp(h.magic, kMagic, 8) != 0) return Status::Corrupt(path + ": not a pmindex pool (bad magic)");
  if (h.version < layout::kOldestFormatVersion || h.version > layout::kFormatVersion)
    return Status::Corrupt(path + ": unsupported pool format version " + std::to_string(h.version) + " (this build reads " +
                           std::to_string(layout::kOldestFormatVersion) + " to " + std::to_string(layout::kFormatVersion) +
                           ")");
  const uint64_t sum = Fnv1a(reinterpret_cast<const char*>(&h) + 8, offsetof(HeaderLayout, checksum) - 8);
  if (sum != h.checksum) return Status::Corrupt(path + ": pool header checksum mismatch (header corrupted)");
  if (h.header_size != kPoolHeaderSize || h.chunk_size != Allocator::kChunkSize || h.heap_offset != layout::kHeapOffset ||
      h.lanes_offset != layout::kLanesOffset || h.lane_count != layout::kLaneCount)
    return Status::Corrupt(path + ": pool header has an unsupported geometry (header/chunk/lane sizes)");
  if (h.type[kPoolTypeNameMax] != '\0' || h.type[0] == '\0')
    return Status::Corrupt(path + ": pool header has an invalid owner type name");
  const uint64_t size = __atomic_load_n(&h.size, __ATOMIC_ACQUIRE);
  if (h.max_size % Allocator::kChunkSize != 0 || h.max_size < layout::kMinPoolSize)
    return Status::Corrupt(path + ": invalid max size " + std::to_string(h.max_size));
  if (h.max_size > kMaxPoolSizeLimit)
    return Status::Corrupt(path + ": max size " + std::to_string(h.max_size) + " exceeds the limit of " +
                           std::to_string(kMaxPoolSizeLimit) + " bytes (kMaxPoolSizeLimit)");
  if (size % Allocator::kChunkSize != 0 || size < layout::kMinPoolSize || size > h.max_size)
    return Status::Corrupt(path + ": invalid pool size " + std::to_string(size) + " (max " + std::to_string(h.max_size) + ")");
  if (size > file_size)
    return Status::Corrupt(path + ": file is truncated: header says " + std::to_string(size) + " bytes, file has " +
                           std::to_string(file_size));
  const uint64_t root = __atomic_load_n(&h.root, __ATOMIC_ACQUIRE);
  if (root != 0 && (root < layout::kHeapOffset || root >= size))
    return Status::Corrupt(path + ": root offset " + std::to_string(root) + " is outside the heap");
  const uint64_t clean = __atomic_load_n(&h.clean, __ATOMIC_ACQUIRE);
  if (clean > 1) return Status::Corrupt(path + ": invalid clean-shutdown flag");
  if (h.version >= 2) {
    const uint64_t psum = Fnv1a(&h.pmwcas_max_words, offsetof(HeaderLayout, pmwcas_checksum) - layout::kPmwcasInfoOffset);
    if (psum != h.pmwcas_checksum) return Status::Corrupt(path + ": PMwCAS header line checksum mismatch");
    if (h.pmwcas_max_words < 1 || h.pmwcas_max_words > PMwCAS::kMaxMaxWords ||
        h.pmwcas_desc_size != pmwcas_format::DescriptorSize(h.pmwcas_max_words) ||
        h.pmwcas_offset != layout::kPmwcasRegionOffset ||
        h.pmwcas_count != layout::kPmwcasRegionSize / h.pmwcas_desc_size)
      return Status::Corrupt(path + ": PMwCAS descriptor region has an unsupported geometry");
  }
  return Status::OK();
}

// Reads and validates the header of an open file.
Status ReadHeader(int fd, const std::string& path, HeaderLayout* h, uint64_t* file_size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::IOError(Errno("fstat " + path, errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": not a regular file");
  *file_size = uint64_t(st.st_size);
  if (*file_size < kPoolHeaderSize)
    return Status::Corrupt(path + ": file too small (" + std::to_string(*file_size) +
                           " bytes): not a pmindex pool, or its creation was interrupted");
  std::memset(h, 0, sizeof(*h));
  ssize_t n = pread(fd, h, sizeof(*h), 0);
  if (n < 0) return Status::IOError(Errno("read " + path, errno));
  if (size_t(n) != sizeof(*h)) return Status::Corrupt(path + ": short header read");
  return ValidateHeader(path, *h, *file_size);
}

// Removes "<path>.creating.<pid>" files left by dead processes; true if it
// removed one (the caller then syncs the directory).
bool RemoveStaleTemporaries(const std::string& path) {
  const std::string dir = DirOf(path);
  const std::string base = path.rfind('/') == std::string::npos ? path : path.substr(path.rfind('/') + 1);
  bool removed = false;
  const std::string prefix = base + ".creating.";
  DIR* d = opendir(dir.c_str());
  if (!d) return false;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::string pid_s = name.substr(prefix.size());
    if (pid_s.empty() || pid_s.find_first_not_of("0123456789") != std::string::npos) continue;
    long pid = std::strtol(pid_s.c_str(), nullptr, 10);
    if (pid <= 0 || pid == long(getpid())) continue;
    if (kill(pid_t(pid), 0) != 0 && errno == ESRCH && unlink((dir + "/" + name).c_str()) == 0) removed = true;
  }
  closedir(d);
  return removed;
}

}  // namespace

Pool::Pool() : instance_id_(g_next_instance.fetch_add(1)) {}

Pool::~Pool() { Close(); }

uint64_t Pool::size() const { return base_ ? __atomic_load_n(&header()->size, __ATOMIC_ACQUIRE) : 0; }

uint64_t* Pool::root_slot() { return &header()->root; }

bool Pool::Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

const char* Pool::mapping_name() const {
  if (cow_) return "private copy-on-write (MAP_PRIVATE)";
  return dax_ ? "DAX (MAP_SYNC)" : "shared (MAP_SHARED, not DAX)";
}

Status Pool::Remove(const std::string& path) {
  if (unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return Status::NotFound("no pool at " + path);
    return Status::IOError(Errno("unlink " + path, errno));
  }
  return Status::OK();
}

// Reserves max_size_ bytes of address space, aligned to 2 MiB, and maps
// [0, size) of fd_ over its start. Tries MAP_SYNC first.
//
// Why 2 MiB: on a DAX file system the kernel maps PM with 2 MiB (PMD) pages
// only where the virtual address and the file offset are both 2 MiB aligned;
// an unaligned base would leave every access to a multi-gigabyte pool on 4 KiB
// pages (a TLB miss per random leaf). The reservation over-allocates by 2 MiB
// and returns the slack on both sides. MADV_HUGEPAGE asks for the same on
// tmpfs when /sys/kernel/mm/transparent_hugepage/shmem_enabled is "advise"
// (it is ignored where huge pages are off, and failures are harmless).
Status Pool::MapAndValidate(bool creating) {
  (void)creating;
  constexpr uint64_t kHuge = kHugePage;
  // Validated by the header check or Create's arguments; checked again here
  // because the MAP_FIXED below must stay inside the reservation.
  if (max_size_ > kMaxPoolSizeLimit || mapped_size_ > max_size_ || mapped_size_ == 0)
    return Status::Corrupt(path_ + ": pool size " + std::to_string(mapped_size_) + " / max size " + std::to_string(max_size_) +
                           " out of range");
  void* r = mmap(nullptr, max_size_ + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return Status::IOError(Errno("reserving " + std::to_string(max_size_) + " bytes of address space", errno));
  {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(r);
    const uintptr_t aligned = (raw + kHuge - 1) & ~uintptr_t(kHuge - 1);
    if (aligned > raw) munmap(r, aligned - raw);
    const uintptr_t tail = raw + max_size_ + kHuge - (aligned + max_size_);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + max_size_), tail);
    base_ = reinterpret_cast<char*>(aligned);
  }
  const int prot = read_only_ ? PROT_READ : (PROT_READ | PROT_WRITE);
  void* m = MAP_FAILED;
  if (cow_) {
    m = mmap(base_, mapped_size_, prot, MAP_PRIVATE | MAP_FIXED, fd_, 0);
  } else {
    if (!read_only_) {
      m = mmap(base_, mapped_size_, prot, MAP_SHARED_VALIDATE | MAP_SYNC | MAP_FIXED, fd_, 0);
      if (m != MAP_FAILED) dax_ = true;
    }
    if (m == MAP_FAILED && require_dax_ && !read_only_) {
      const int e = errno;
      munmap(base_, max_size_);
      base_ = nullptr;
      return Status::Unsupported(path_ + ": a synchronous DAX mapping (MAP_SYNC) was required but is not available (" +
                                 std::strerror(e) + "); the file system is not DAX-capable");
    }
    if (m == MAP_FAILED) {
      m = mmap(base_, mapped_size_, prot, MAP_SHARED | MAP_FIXED, fd_, 0);
      dax_ = false;
    }
  }
  if (m == MAP_FAILED) {
    int e = errno;
    munmap(base_, max_size_);
    base_ = nullptr;
    return Status::IOError(Errno("mmap " + path_, e));
  }
  (void)madvise(base_, mapped_size_, MADV_HUGEPAGE);
  return Status::OK();
}

void Pool::AbandonOpen() {
  if (base_) munmap(base_, max_size_);
  base_ = nullptr;
  close(fd_);
  fd_ = -1;
  closed_ = true;
}

Status Pool::Create(const std::string& path, std::string_view type, const PoolOptions& opts, std::unique_ptr<Pool>* out) {
  if (path.empty()) return Status::InvalidArgument("empty pool path");
  if (type.empty() || type.size() > kPoolTypeNameMax || type.find('\0') != std::string_view::npos)
    return Status::InvalidArgument("pool owner type must be 1.." + std::to_string(kPoolTypeNameMax) + " bytes, got '" +
                                   std::string(type) + "'");
  if (opts.pmwcas_max_words < 1 || opts.pmwcas_max_words > PMwCAS::kMaxMaxWords)
    return Status::InvalidArgument("pmwcas_max_words must be 1.." + std::to_string(PMwCAS::kMaxMaxWords) + ", got " +
                                   std::to_string(opts.pmwcas_max_words));
  if (opts.size > kMaxPoolSizeLimit || opts.max_size > kMaxPoolSizeLimit)
    return Status::InvalidArgument("pool size " + std::to_string(opts.size) + " / max_size " + std::to_string(opts.max_size) +
                                   " exceeds the limit of " + std::to_string(kMaxPoolSizeLimit) + " bytes (kMaxPoolSizeLimit)");
  uint64_t size = std::max<uint64_t>(RoundUp(opts.size, Allocator::kChunkSize), layout::kMinPoolSize);
  uint64_t max_size = opts.max_size ? RoundUp(opts.max_size, Allocator::kChunkSize) : std::max(size, kDefaultMaxPoolSize);
  if (opts.max_size && max_size < size)
    return Status::InvalidArgument("max_size " + std::to_string(opts.max_size) + " is smaller than the initial size " +
                                   std::to_string(size));
  if (Exists(path)) return Status::AlreadyExists("pool " + path + " already exists");
  if (RemoveStaleTemporaries(path)) PMINDEX_RETURN_IF_ERROR(SyncDir(DirOf(path)));

  std::unique_ptr<Pool> p(new Pool());
  p->path_ = path;
  p->type_ = std::string(type);
  p->max_size_ = max_size;
  p->mapped_size_ = size;
  p->require_dax_ = opts.require_dax;
  const std::string tmp = path + ".creating." + std::to_string(getpid());
  unlink(tmp.c_str());
  // 0600: index data is nobody else's business (the umask may only narrow it).
  p->fd_ = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (p->fd_ < 0) return Status::IOError(Errno("create " + tmp, errno));
  auto fail = [&](Status s) {
    p->AbandonOpen();
    unlink(tmp.c_str());
    return s;
  };
  if (flock(p->fd_, LOCK_EX | LOCK_NB) != 0) return fail(Status::IOError(Errno("flock " + tmp, errno)));
  if (int e = posix_fallocate(p->fd_, 0, off_t(size)); e != 0) {
    if (e == ENOSPC)
      return fail(Status::IOError("cannot create pool " + path + ": the file system is full (needed " + std::to_string(size) +
                                  " bytes)"));
    return fail(Status::IOError(Errno("posix_fallocate " + tmp, e)));
  }
  PMINDEX_RETURN_IF_ERROR([&] {
    Status s = p->MapAndValidate(true);
    return s.ok() ? s : fail(s);
  }());

  // Format: header without magic, persist; then the magic, persist.
  Header* h = p->header();
  Set(h, 0, kPoolHeaderSize);
  HeaderLayout img;
  std::memset(&img, 0, sizeof(img));
  img.version = layout::kFormatVersion;
  img.header_size = kPoolHeaderSize;
  std::memcpy(img.type, type.data(), type.size());
  std::random_device rd;
  for (int i = 0; i < 16; i += 4) {
    uint32_t v = rd();
    std::memcpy(img.uuid + i, &v, 4);
  }
  img.max_size = max_size;
  img.heap_offset = layout::kHeapOffset;
  img.chunk_size = Allocator::kChunkSize;
  img.lanes_offset = layout::kLanesOffset;
  img.lane_count = layout::kLaneCount;
  img.create_time = uint64_t(std::time(nullptr));
  img.checksum = Fnv1a(reinterpret_cast<const char*>(&img) + 8, offsetof(HeaderLayout, checksum) - 8);
  img.size = size;
  img.pmwcas_max_words = opts.pmwcas_max_words;
  img.pmwcas_desc_size = uint32_t(pmwcas_format::DescriptorSize(opts.pmwcas_max_words));
  img.pmwcas_offset = layout::kPmwcasRegionOffset;
  img.pmwcas_count = layout::kPmwcasRegionSize / img.pmwcas_desc_size;
  img.pmwcas_checksum = Fnv1a(&img.pmwcas_max_words, offsetof(HeaderLayout, pmwcas_checksum) - layout::kPmwcasInfoOffset);
  Copy(reinterpret_cast<char*>(h) + 8, reinterpret_cast<const char*>(&img) + 8, sizeof(HeaderLayout) - 8);
  Persist(h, sizeof(HeaderLayout));
  std::unique_ptr<Allocator> alloc;
  if (Status s = NewPoolAllocator(p.get(), /*fresh=*/true, false, &alloc); !s.ok()) return fail(s);
  std::unique_ptr<PMwCAS> pmwcas;
  if (Status s = PMwCAS::Open(p.get(), img.pmwcas_offset, img.pmwcas_max_words, uint32_t(img.pmwcas_count), /*fresh=*/true,
                              false, &pmwcas);
      !s.ok())
    return fail(s);
  Copy(h->magic, kMagic, 8);
  Persist(h->magic, 8);
  if (!p->dax_ && msync(p->base_, size, MS_SYNC) != 0) return fail(Status::IOError(Errno("msync " + tmp, errno)));
  // The length from posix_fallocate is file metadata: durable before the link.
  if (fdatasync(p->fd_) != 0) return fail(Status::IOError(Errno("fdatasync " + tmp, errno)));
  // link() fails with EEXIST instead of replacing a pool created meanwhile.
  if (link(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    if (e == EEXIST) return fail(Status::AlreadyExists("pool " + path + " already exists"));
    return fail(Status::IOError(Errno("link " + tmp + " -> " + path, e)));
  }
  unlink(tmp.c_str());
  if (Status s = SyncDir(DirOf(path)); !s.ok()) {
    unlink(path.c_str());
    return fail(s);
  }
  p->allocator_ = std::move(alloc);
  p->pmwcas_ = std::move(pmwcas);
  p->was_clean_ = true;
  *out = std::move(p);
  return Status::OK();
}

Status Pool::Open(const std::string& path, std::string_view expected_type, const PoolOptions& opts,
                  std::unique_ptr<Pool>* out) {
  if (path.empty()) return Status::InvalidArgument("empty pool path");
  std::unique_ptr<Pool> p(new Pool());
  p->path_ = path;
  if (opts.read_only && opts.copy_on_write) return Status::InvalidArgument("read_only and copy_on_write exclude each other");
  if (opts.copy_on_write && opts.require_dax)
    return Status::InvalidArgument("a copy-on-write open is private memory, never a DAX mapping (require_dax)");
  p->read_only_ = opts.read_only;
  p->cow_ = opts.copy_on_write;
  p->require_dax_ = opts.require_dax;
  const bool writes_file = !opts.read_only && !opts.copy_on_write;
  if (Status s = OpenExisting(path, writes_file ? O_RDWR : O_RDONLY, &p->fd_); !s.ok()) {
    p->closed_ = true;
    return s;
  }
  auto fail = [&](Status s) {
    p->AbandonOpen();
    return s;
  };
  if (flock(p->fd_, (writes_file ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    int e = errno;
    if (e == EWOULDBLOCK) return fail(Status::Busy("pool " + path + " is already open by another process"));
    return fail(Status::IOError(Errno("flock " + path, e)));
  }
  HeaderLayout h;
  uint64_t file_size = 0;
  PMINDEX_RETURN_IF_ERROR([&] {
    Status s = ReadHeader(p->fd_, path, &h, &file_size);
    return s.ok() ? s : fail(s);
  }());
  p->type_ = h.type;
  if (!expected_type.empty() && expected_type != p->type_)
    return fail(Status::InvalidArgument("pool " + path + " is owned by index type '" + p->type_ + "', not '" +
                                        std::string(expected_type) + "'"));
  p->max_size_ = h.max_size;
  p->mapped_size_ = h.size;
  if (writes_file) {
    if (Status s = AllocateHoles(p->fd_, path, h.size); !s.ok()) return fail(s);
  }
  PMINDEX_RETURN_IF_ERROR([&] {
    Status s = p->MapAndValidate(false);
    return s.ok() ? s : fail(s);
  }());
  // The file may have changed between pread and mmap only if someone ignored
  // the lock; re-validate the mapped header cheaply.
  if (std::memcmp(&h, p->header(), offsetof(HeaderLayout, checksum) + 8) != 0)
    return fail(Status::Corrupt(path + ": header changed while opening"));
  p->was_clean_ = h.clean == 1;
  if (opts.on_mapped) opts.on_mapped(p.get());
  if (!p->read_only_) StorePersist(&p->header()->clean, uint64_t(0));
  std::unique_ptr<Allocator> alloc;
  if (Status s = NewPoolAllocator(p.get(), false, p->read_only_, &alloc); !s.ok()) return fail(s);
  p->allocator_ = std::move(alloc);
  if (h.version >= 2 && !p->read_only_) {
    // PMwCAS recovery frees blocks through the allocator: it runs after it.
    std::unique_ptr<PMwCAS> pmwcas;
    if (Status s = PMwCAS::Open(p.get(), h.pmwcas_offset, h.pmwcas_max_words, uint32_t(h.pmwcas_count), false, false, &pmwcas);
        !s.ok()) {
      ShutdownPoolAllocator(p->allocator_.get());
      p->allocator_.reset();
      return fail(s);
    }
    p->pmwcas_ = std::move(pmwcas);
  }
  *out = std::move(p);
  return Status::OK();
}

Status Pool::ReadInfo(const std::string& path, PoolInfo* info) {
  int fd = -1;
  PMINDEX_RETURN_IF_ERROR(OpenExisting(path, O_RDONLY, &fd));
  HeaderLayout h;
  uint64_t file_size = 0;
  Status s = ReadHeader(fd, path, &h, &file_size);
  close(fd);
  if (!s.ok()) return s;
  *info = PoolInfo{};
  info->path = path;
  info->type = h.type;
  static const char* kHex = "0123456789abcdef";
  for (uint8_t b : h.uuid) {
    info->uuid += kHex[b >> 4];
    info->uuid += kHex[b & 15];
  }
  info->version = h.version;
  info->size = h.size;
  info->max_size = h.max_size;
  info->root = h.root;
  info->clean_shutdown = h.clean == 1;
  if (h.version >= 2) {
    info->pmwcas_max_words = h.pmwcas_max_words;
    info->pmwcas_descriptors = uint32_t(h.pmwcas_count);
  }
  return Status::OK();
}

PoolInfo Pool::Info() const {
  PoolInfo info;
  info.path = path_;
  info.type = type_;
  if (!base_) return info;  // closed
  static const char* kHex = "0123456789abcdef";
  for (uint8_t b : header()->uuid) {
    info.uuid += kHex[b >> 4];
    info.uuid += kHex[b & 15];
  }
  info.version = header()->version;
  info.size = size();
  info.max_size = max_size_;
  info.root = __atomic_load_n(&header()->root, __ATOMIC_ACQUIRE);
  if (allocator_) {
    info.bytes_in_use = allocator_->BytesInUse();
    info.blocks_in_use = allocator_->BlocksInUse();
  }
  info.clean_shutdown = was_clean_;
  info.dax = dax_;
  info.mapping = mapping_name();
  if (header()->version >= 2) {
    info.pmwcas_max_words = header()->pmwcas_max_words;
    info.pmwcas_descriptors = uint32_t(header()->pmwcas_count);
  }
  return info;
}

Status Pool::Grow(uint64_t new_size) {
  if (closed_ || !base_) return Status::InvalidArgument("pool is closed");
  if (read_only_) return Status::Unsupported("pool " + path_ + " is open read-only");
  if (cow_) return Status::Unsupported("pool " + path_ + " is open copy-on-write (private)");
  if (new_size > max_size_)  // also keeps the rounding below from wrapping
    return Status::PoolFull("pool " + path_ + " cannot grow to " + std::to_string(new_size) + " bytes: max size is " +
                            std::to_string(max_size_));
  std::lock_guard<std::mutex> g(grow_mu_);
  const uint64_t target = RoundUp(new_size, Allocator::kChunkSize);
  const uint64_t cur = size();
  if (target <= cur) return Status::OK();
  if (target > max_size_)
    return Status::PoolFull("pool " + path_ + " cannot grow to " + std::to_string(target) + " bytes: max size is " +
                            std::to_string(max_size_));
  if (int e = posix_fallocate(fd_, 0, off_t(target)); e != 0) {
    if (e == ENOSPC) return Status::IOError("cannot grow pool " + path_ + ": the file system is full");
    return Status::IOError(Errno("posix_fallocate " + path_, e));
  }
  // The new length must be durable before the header says it: otherwise a
  // power failure could leave a header size past the end of the file.
  if (fdatasync(fd_) != 0) return Status::IOError(Errno("fdatasync (grow) " + path_, errno));
  if (target > mapped_size_) {
    const int prot = PROT_READ | PROT_WRITE;
    const int flags = (dax_ ? (MAP_SHARED_VALIDATE | MAP_SYNC) : MAP_SHARED) | MAP_FIXED;
    void* m = mmap(base_ + mapped_size_, target - mapped_size_, prot, flags, fd_, off_t(mapped_size_));
    if (m == MAP_FAILED) return Status::IOError(Errno("mmap (grow) " + path_, errno));
    (void)madvise(m, target - mapped_size_, MADV_HUGEPAGE);
    mapped_size_ = target;
  }
  if (PMINDEX_FAULT("pm.grow.skip_size_persist"))
    StoreAtomic(&header()->size, target);
  else
    StorePersist(&header()->size, target);
  return Status::OK();
}

Status Pool::Close() {
  if (closed_) return Status::OK();
  closed_ = true;
  Status result;
  pmwcas_.reset();  // recycles retired descriptors through the allocator
  if (allocator_) {
    ShutdownPoolAllocator(allocator_.get());
    allocator_.reset();
  }
  if (base_) {
    if (!read_only_ && !cow_) {
      StorePersist(&header()->clean, uint64_t(1));
      if (!dax_ && msync(base_, mapped_size_, MS_SYNC) != 0) result = Status::IOError(Errno("msync " + path_, errno));
    }
    munmap(base_, max_size_);
    base_ = nullptr;
  }
  if (fd_ >= 0) {
    flock(fd_, LOCK_UN);
    close(fd_);
    fd_ = -1;
  }
  if (remove_on_close_) unlink(path_.c_str());
  return result;
}

}  // namespace pmindex::pm
