// kit/lock_table.h: a DRAM table of lock/version words for nodes that live
// in PM, keyed by the node's address in the pool mapping.
//
// Why: a lock word inside a PM node costs a PM line per read (the reader
// must see it) and dirties a PM line per write lock; the FPTree paper says
// the leaf lock is "never persisted". The table keeps one word per granule of
// the pool's reserved address space, granule = the largest power of two <=
// the node size, so the word of a node is found from its address alone
// (one shift and one add: At). Two nodes that exist at the same time are at
// least a node size apart and never share a word; a word is shared only over
// time, by nodes at the same place one after the other, which is safe for
// version words that never decrease (kit/version_lock.h).
//
// Memory: MAP_NORESERVE, zero-filled; a page is backed once a node in its
// range touches its word (about sizeof(Word) bytes of DRAM per node in use).
// ResidentBytes counts those pages. Nothing here is persistent: the table is
// zero at every open, and the index's recovery makes its words consistent.
//
// Thread safety: Map/Unmap single-threaded (open, close); At and Contains
// from any thread; the words' own protocol governs concurrent use of them.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pmindex/status.h"

namespace pmindex::internal::kit {

template <class Word>
class LockTable {
 public:
  LockTable() = default;
  LockTable(const LockTable&) = delete;
  LockTable& operator=(const LockTable&) = delete;
  ~LockTable() { Unmap(); }

  // Reserves the table for nodes of `node_bytes` bytes in [base, base +
  // reserved). base must be aligned to the granule (a pool mapping is page
  // aligned; nodes larger than a page need a correspondingly aligned base).
  Status Map(const char* base, uint64_t reserved, uint64_t node_bytes) {
    if (words_) return Status::OK();
    if (node_bytes == 0) return Status::InvalidArgument("lock table: node size 0");
    shift_ = 63 - __builtin_clzll(node_bytes);
    bytes_ = ((reserved >> shift_) + 1) * sizeof(Word);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      bytes_ = 0;
      return Status::IOError("cannot map a lock table");
    }
    words_ = static_cast<Word*>(p);
    if (uintptr_t(base) & ((uintptr_t(1) << shift_) - 1)) return Status::Corrupt("lock table: pool base not aligned");
    bias_ = uintptr_t(words_) - sizeof(Word) * (uintptr_t(base) >> shift_);
    return Status::OK();
  }
  void Unmap() {
    if (words_) munmap(words_, bytes_);
    words_ = nullptr;
    bytes_ = 0;
  }
  bool mapped() const { return words_ != nullptr; }

  // The word of the node at address p (inside the mapped range).
  Word* At(const void* p) const { return reinterpret_cast<Word*>(bias_ + sizeof(Word) * (uintptr_t(p) >> shift_)); }
  bool Contains(const Word* w) const { return w >= words_ && w < words_ + bytes_ / sizeof(Word); }
  size_t bytes() const { return bytes_; }
  uint32_t shift() const { return shift_; }

  // Bytes of the table backed by DRAM (mincore); all of it if that cannot
  // be told.
  uint64_t ResidentBytes() const {
    if (!words_) return 0;
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((bytes_ + page - 1) / page);
    if (::mincore(words_, bytes_, in.data()) != 0) return bytes_;
    uint64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n * page;
  }

  // The same, counting only the words of nodes in [lo, hi) (for example the
  // pool's used part of its reservation): the table spans the whole
  // reservation, and a mincore over all of it costs one vector entry per
  // page, called from Stats() while writers run.
  uint64_t ResidentBytes(const void* lo, const void* hi) const {
    if (!words_ || !(lo < hi)) return 0;
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t first = uintptr_t(words_), end = first + bytes_;
    uintptr_t a = uintptr_t(At(lo)) & ~(page - 1);
    uintptr_t b = uintptr_t(At(hi)) + sizeof(Word);
    if (a < first) a = first;
    if (b > end) b = end;
    if (a >= b) return 0;
    std::vector<unsigned char> in((b - a + page - 1) / page);
    if (::mincore(reinterpret_cast<void*>(a), b - a, in.data()) != 0) return b - a;
    uint64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n * page;
  }

 private:
  Word* words_ = nullptr;
  size_t bytes_ = 0;
  uintptr_t bias_ = 0;  // words_ minus (base >> shift_) words
  uint32_t shift_ = 0;
};

}  // namespace pmindex::internal::kit
