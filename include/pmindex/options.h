// pmindex/options.h: how to open or create an index and its pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace pmindex {

// Keys are either fixed 8-byte integers (passed as 8 native-endian bytes,
// ordered numerically, as in PiBench) or byte strings ordered by memcmp.
enum class KeyKind : uint8_t { kU64 = 0, kBytes = 1 };
// Values are either fixed 8 bytes or variable-length byte strings.
enum class ValueKind : uint8_t { kU64 = 0, kBytes = 1 };

// Limits every index accepts at least (indexes may accept more).
inline constexpr size_t kMaxKeySize = 1024;
inline constexpr size_t kMaxValueSize = 4096;

struct Options {
  // Pool file. Empty: a temporary pool in /dev/shm, removed when the index is
  // closed. Ignored by transient indexes (dram_btree).
  std::string pool_path;
  // Initial pool size in bytes, and the largest size the pool may grow to in
  // place (0: the larger of pool_size and 64 GiB of reserved address space).
  uint64_t pool_size = 64ull << 20;
  uint64_t max_pool_size = 0;
  // Create the pool if pool_path does not exist; fail if it exists.
  bool create_if_missing = true;
  bool error_if_exists = false;
  // Open an existing pool without writing to it (inspection only; indexes
  // may refuse with Unsupported).
  bool read_only = false;

  // Key and value kinds for a new index; an existing pool keeps its own.
  KeyKind key_kind = KeyKind::kU64;
  ValueKind value_kind = ValueKind::kU64;
  size_t max_key_size = kMaxKeySize;
  size_t max_value_size = kMaxValueSize;

  // Threads the caller will use concurrently (a hint), and threads an index
  // may use to recover.
  int num_threads = 1;
  int recovery_threads = 0;  // 0: hardware concurrency

  // Index-specific parameters by name, e.g. {"leaf_size", "56"}. Unknown
  // names are an InvalidArgument error.
  std::map<std::string, std::string> params;
};

}  // namespace pmindex
