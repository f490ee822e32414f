// pmindex/pm/pool.h: a pool file mapped into memory.
//
// Layout (docs/pool-format.md):
//   [0, 4 KiB)       header: magic, format version, owner index type, UUID,
//                    max size, checksum over those immutable fields; then on
//                    their own cache lines the mutable 8-byte words (current
//                    size, root offset, clean-shutdown flag).
//   [4 KiB, 68 KiB)  allocator lanes (per-thread micro-logs).
//   [68 KiB, heap)   PMwCAS descriptors (format 2, pmindex/pm/pmwcas.h).
//   [heap, size)     allocator chunks.
//
// Creation writes a temporary file next to the target, fully allocates it
// (posix_fallocate, so a full /dev/shm gives an error instead of a SIGBUS),
// writes the header with the magic last, persists, and renames it into
// place: a process killed mid-create leaves no pool at the path. A file with
// no magic is reported as "not a pool or creation interrupted", never mapped.
//
// Growth: Open/Create reserve max_size bytes of address space; Grow extends
// the file and maps the new part in place, so addresses never move.
//
// Locking: an exclusive flock on the file; a second opener (this process or
// another) gets Status::Busy. Read-only and copy-on-write opens take a shared
// lock. The lock is advisory: a process that ignores it (truncate, cp over
// the file) can still shrink the file under an open pool, and the next access
// past the new end is a SIGBUS (docs/pool-format.md).
//
// DAX: the file is mapped MAP_SHARED_VALIDATE|MAP_SYNC when the filesystem
// supports it (then flush+fence is durable); otherwise MAP_SHARED, and Close
// msyncs. is_dax() and mapping_name() report which; require_dax turns the
// fallback into an error.
//
// Untrusted files: the path is opened O_NOFOLLOW|O_NONBLOCK and must be a
// regular file; every header field is validated with pread before anything is
// mapped, and max_size is capped at kMaxPoolSizeLimit so that no size
// computation can wrap. Holes (a sparse copy) are allocated at a read-write
// open, so a full file system is an error at open rather than a SIGBUS at the
// first store.
//
// Thread safety: Create/Open/ReadInfo/Remove may be called from any thread;
// an open Pool's accessors and Grow are thread-safe; Close must not run
// concurrently with any other use of the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "pmindex/pm/pptr.h"
#include "pmindex/status.h"

namespace pmindex::pm {

class Allocator;
class PMwCAS;

inline constexpr uint64_t kPoolHeaderSize = 4096;
inline constexpr uint64_t kDefaultMaxPoolSize = 64ull << 30;
// The largest max_size a pool may have (16 TiB): Create refuses more, and Open
// reports a header asking for more as Corrupt. Far below the 128 TiB of user
// address space of x86-64, and far from 2^64, so reservation sizes never wrap.
inline constexpr uint64_t kMaxPoolSizeLimit = 16ull << 40;
inline constexpr size_t kPoolTypeNameMax = 31;

struct PoolInfo {
  std::string path;
  std::string type;  // owner index type
  std::string uuid;  // hex
  uint32_t version = 0;
  uint64_t size = 0;      // current size in bytes
  uint64_t max_size = 0;  // growth limit
  uint64_t root = 0;      // root object offset
  uint64_t bytes_in_use = 0;
  uint64_t blocks_in_use = 0;
  bool clean_shutdown = false;  // the previous user closed it cleanly
  bool dax = false;             // mapped with MAP_SYNC
  std::string mapping;          // Pool::mapping_name() of the open that read it; empty from ReadInfo
  uint32_t pmwcas_max_words = 0;    // 0: format 1, no PMwCAS region
  uint32_t pmwcas_descriptors = 0;
};

class Pool;

struct PoolOptions {
  uint64_t size = 64ull << 20;  // initial size (rounded up to whole chunks)
  uint64_t max_size = 0;        // 0: max(size, kDefaultMaxPoolSize)
  bool read_only = false;       // Open only
  // Open only: map the file MAP_PRIVATE and writable. Recovery (allocator
  // lanes, PMwCAS, an index's own) runs on private copy-on-write pages and
  // nothing reaches the file; takes a shared lock like read_only. For
  // checkers (pmindex-pool check). Grow is Unsupported.
  bool copy_on_write = false;
  // Create/Open: fail (Unsupported) unless the file can be mapped with
  // MAP_SYNC (a DAX file system), instead of falling back to MAP_SHARED,
  // which survives a process crash but not a power failure.
  bool require_dax = false;
  // Create only: the most target words of one PMwCAS operation (1..64); the
  // descriptor region then holds 188 KiB / (32 + 32 * words, in lines)
  // descriptors (334 at the default 16).
  uint32_t pmwcas_max_words = 16;
  // Open only: called once the file is mapped and its header validated,
  // before the open stores anything (the clean flag, allocator and PMwCAS
  // recovery), so that a checker can install a persist observer over the
  // mapping first (pmcheck --recovery-crashes). Empty: not called.
  std::function<void(Pool*)> on_mapped;
};

class Pool {
 public:
  // Creates a new pool file owned by index type `type` (<= 31 bytes).
  // AlreadyExists if path exists.
  static Status Create(const std::string& path, std::string_view type, const PoolOptions& opts,
                       std::unique_ptr<Pool>* out);
  // Opens an existing pool and recovers its allocator. If expected_type is
  // non-empty and differs from the owner, InvalidArgument naming the owner.
  static Status Open(const std::string& path, std::string_view expected_type, const PoolOptions& opts,
                     std::unique_ptr<Pool>* out);
  // Reads the header without taking the lock or mapping the heap.
  static Status ReadInfo(const std::string& path, PoolInfo* info);
  static bool Exists(const std::string& path);
  static Status Remove(const std::string& path);

  ~Pool();  // Close()
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Marks a clean shutdown, syncs (non-DAX), unmaps and unlocks. Idempotent.
  Status Close();

  char* base() const { return base_; }
  uint64_t size() const;  // current size
  uint64_t max_size() const { return max_size_; }
  const std::string& path() const { return path_; }
  const std::string& type() const { return type_; }
  bool is_dax() const { return dax_; }
  bool read_only() const { return read_only_; }
  bool copy_on_write() const { return cow_; }
  // "DAX (MAP_SYNC)", "shared (MAP_SHARED, not DAX)" or "private
  // copy-on-write (MAP_PRIVATE)": what the tools print.
  const char* mapping_name() const;
  // True if the previous user did not close the pool (crash or kill).
  bool recovered_from_crash() const { return !was_clean_; }
  // A process-unique id of this open instance (for thread-local caches).
  uint64_t instance_id() const { return instance_id_; }

  bool Contains(const void* p) const {
    auto c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + size();
  }
  template <typename T = void>
  T* At(uint64_t off) const { return off ? reinterpret_cast<T*>(base_ + off) : nullptr; }
  uint64_t OffsetOf(const void* p) const { return p ? uint64_t(static_cast<const char*>(p) - base_) : 0; }
  template <typename T>
  T* Get(PPtr<T> p) const { return p.get(base_); }

  // The persistent root slot: the offset of the index's root object. Allocate
  // into it (allocator().Allocate(root_slot(), n)); it is 0 in a new pool.
  uint64_t* root_slot();
  template <typename T>
  T* root() const { return At<T>(*const_cast<Pool*>(this)->root_slot()); }

  Allocator& allocator() { return *allocator_; }
  // The pool's PMwCAS, recovered by Open before it returned; nullptr for a
  // format 1 pool and for read-only opens.
  PMwCAS* pmwcas() { return pmwcas_.get(); }
  PoolInfo Info() const;

  // Delete the file when the pool is closed (temporary pools).
  void RemoveOnClose() { remove_on_close_ = true; }

  // Grows the pool in place to at least new_size (whole chunks). PoolFull if
  // past max_size, IOError if the file system is full.
  Status Grow(uint64_t new_size);

 private:
  Pool();
  struct Header;
  Header* header() const { return reinterpret_cast<Header*>(base_); }
  Status MapAndValidate(bool creating);
  // Undoes a failed Create/Open: unmaps, closes the file, marks the pool closed.
  void AbandonOpen();

  std::string path_, type_;
  int fd_ = -1;
  char* base_ = nullptr;
  uint64_t max_size_ = 0;
  uint64_t mapped_size_ = 0;
  bool dax_ = false, read_only_ = false, cow_ = false, require_dax_ = false, was_clean_ = true, closed_ = false, remove_on_close_ = false;
  uint64_t instance_id_ = 0;
  std::mutex grow_mu_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<PMwCAS> pmwcas_;
  friend class Allocator;
};

}  // namespace pmindex::pm
