// pmindex/pm/pptr.h: 8-byte persistent pointers.
//
// A persistent pointer is the offset of the target from the pool's base, so
// storing one is a single failure-atomic 8-byte store and it stays valid when
// the pool is mapped at another address. 0 is null (offset 0 is the pool
// header, never an allocated block). Conversion needs the pool's base and is
// O(1) both ways. No 16-byte (pool id + offset) pointers: PiBench measured
// their cost.
#pragma once

#include <cstdint>

namespace pmindex::pm {

template <typename T>
struct PPtr {
  uint64_t off = 0;

  constexpr PPtr() = default;
  constexpr explicit PPtr(uint64_t o) : off(o) {}
  static PPtr FromRaw(const char* base, const T* p) { return PPtr(p ? uint64_t(reinterpret_cast<const char*>(p) - base) : 0); }

  bool null() const { return off == 0; }
  explicit operator bool() const { return off != 0; }
  T* get(char* base) const { return off ? reinterpret_cast<T*>(base + off) : nullptr; }
  const T* get(const char* base) const { return off ? reinterpret_cast<const T*>(base + off) : nullptr; }
  // The address of the raw offset word (what Allocator::Allocate/Free take).
  uint64_t* raw() { return &off; }

  friend bool operator==(PPtr a, PPtr b) { return a.off == b.off; }
  friend bool operator!=(PPtr a, PPtr b) { return a.off != b.off; }
};
static_assert(sizeof(PPtr<int>) == 8, "persistent pointers are 8 bytes");

}  // namespace pmindex::pm
