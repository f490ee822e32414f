// Test support (not part of the library): the fixture of the concurrency
// stress tests (bztree, nvtree), parameterised by the key kind. Keys are u64
// i, or "k%08llu" byte keys (so byte order is numeric order); values name
// their key ("v<i>.<version>..." or i << 20 | version), so that a reader can
// tell a torn or misplaced value from one its writer wrote.
// Header-only; tests include it as "testing/stress_util.h".
// Thread-safety: Key, Val, ValOf and KeyNum are const and may be called from
// every thread of a test; Open and TearDown on the test thread only.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::testutil {

struct StressKind {
  bool bytes;
  std::string label;
};

inline auto BothStressKinds() { return testing::Values(StressKind{false, "u64"}, StressKind{true, "bytes"}); }
inline std::string StressKindName(const testing::TestParamInfo<StressKind>& i) { return i.param.label; }

class StressTest : public testing::TestWithParam<StressKind> {
 protected:
  // Opens `index` in a fresh 64 MiB pool with `params` (and max_key_size,
  // unless 0).
  void Open(const std::string& index, std::map<std::string, std::string> params, uint32_t max_key_size = 0) {
    static std::atomic<int> n{0};
    opts_.pool_path = "/dev/shm/" + index + "-conc-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
    opts_.pool_size = 64ull << 20;
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    if (max_key_size) opts_.max_key_size = max_key_size;
    opts_.params = std::move(params);
    Status s = OpenIndex(index, opts_, &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    idx_.reset();
    if (!opts_.pool_path.empty()) pm::Pool::Remove(opts_.pool_path);
  }
  std::string Key(uint64_t i) const {
    if (!GetParam().bytes) return std::string(U64Slice(i));
    char b[32];
    std::snprintf(b, sizeof b, "k%08llu", static_cast<unsigned long long>(i));
    return b;
  }
  // Values encode their key, so a reader can tell a torn or misplaced one.
  std::string Val(uint64_t i, uint64_t ver) const {
    if (!GetParam().bytes) return std::string(U64Slice(i << 20 | (ver & 0xfffff)));
    return "v" + std::to_string(i) + "." + std::to_string(ver) + std::string(ver % 7, 'x');
  }
  bool ValOf(uint64_t i, const std::string& v) const {
    if (!GetParam().bytes) return SliceToU64(v) >> 20 == i;
    return v.rfind("v" + std::to_string(i) + ".", 0) == 0;
  }
  // The i of Key(i).
  uint64_t KeyNum(Slice k) const {
    if (!GetParam().bytes) return SliceToU64(k);
    return std::stoull(std::string(k.substr(1)));
  }

  Options opts_;
  std::unique_ptr<Index> idx_;
};

}  // namespace pmindex::testutil
