// conformance_cases.h: what the cross-index suites (conformance_test,
// conformance_concurrency_test) share: one case per registered index x key
// kind x value kind (ListIndexes: a new index is picked up without a change
// here), the key and value generators, and the pool path and options of a
// case.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::conformance {

struct Case {
  std::string index;
  KeyKind kk;
  ValueKind vk;
  bool persistent;
  bool ordered;
  bool concurrent;
};

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.index << (c.kk == KeyKind::kU64 ? "/u64 keys" : "/byte keys") << (c.vk == ValueKind::kU64 ? "/u64 values" : "/byte values");
}

inline std::string CaseName(const testing::TestParamInfo<Case>& i) {
  return i.param.index + (i.param.kk == KeyKind::kU64 ? "_u64key" : "_byteskey") +
         (i.param.vk == ValueKind::kU64 ? "_u64val" : "_bytesval");
}

inline std::vector<Case> AllCases() {
  std::vector<Case> v;
  for (const auto& info : ListIndexes())
    for (KeyKind kk : {KeyKind::kU64, KeyKind::kBytes})
      for (ValueKind vk : {ValueKind::kU64, ValueKind::kBytes}) v.push_back({info.name, kk, vk, info.persistent, info.ordered, info.concurrent});
  return v;
}

// A pool path in /dev/shm unique to this process, index and test (removed first).
inline std::string CasePoolPath(const Case& c) {
  std::string p = "/dev/shm/pmindex-conf-" + c.index + "-" + std::to_string(::getpid()) + "-" +
                  testing::UnitTest::GetInstance()->current_test_info()->name() + ".pool";
  for (char& ch : p)
    if (ch == '/' && &ch > &p[9]) ch = '_';
  pm::Pool::Remove(p);
  return p;
}

// The options of a case: its pool (32 MiB) and key/value kinds.
inline Options CaseOptions(const Case& c, const std::string& pool_path) {
  Options o;
  o.pool_path = pool_path;
  o.pool_size = 32ull << 20;
  o.key_kind = c.kk;
  o.value_kind = c.vk;
  return o;
}

// Keys: u64 ids spread over the domain; byte keys of varying length that
// sort differently from the ids (exercise memcmp order, shared prefixes).
// Distinct for distinct ids below 100003.
inline std::string CaseKey(KeyKind kk, uint64_t id) {
  if (kk == KeyKind::kU64) {
    uint64_t k = id * 0x9E3779B97F4A7C15ull;
    return std::string(reinterpret_cast<const char*>(&k), 8);
  }
  std::string s = "k" + std::to_string(id * 7919 % 100003);
  s.append(id % 5 * 7, char('a' + id % 26));
  return s;
}

inline std::string CaseValue(ValueKind vk, uint64_t id, uint64_t version) {
  if (vk == ValueKind::kU64) {
    uint64_t v = (id << 16) ^ version;
    if (id % 13 == 0) v = 0;   // zero values must read back as found
    if (id % 17 == 0) v = 42;  // equal values across keys must not collide
    return std::string(reinterpret_cast<const char*>(&v), 8);
  }
  size_t len = (id * 31 + version) % 300;  // includes empty values
  std::string s(len, char('A' + (id + version) % 26));
  if (len >= 8) std::memcpy(s.data(), &id, 8);
  return s;
}

}  // namespace pmindex::conformance
