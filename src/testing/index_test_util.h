// Test support (not part of the library): the scaffolding the index tests
// share, so that every index checks itself against std::map the same way.
//   IndexPoolPath      a unique pool path in /dev/shm for one test
//   ScanStart/KeyLess  the smallest key and the key order of a key kind
//   ScanAll            a full scan into a vector
//   AllocatedBlocks    the allocator's blocks
//   LeakReport         owned blocks (ForEachOwnedBlock) == the allocator's blocks
//   ExpectNoLeak       the same as gtest expectations
//   ExpectMatchesModel Check, Size, a full scan equal to the model, no leak
//   ExpectBoundedScan  a scan of n records from a key against the model
//   MixedKey/MixedVal  keys and values of varying length (byte kinds)
//   ShortKey/ShortVal  short keys and values
//   KeyOrder           the key order as a std::map comparator
//   KindsCfg, AllKindsDefaultAndSmall  test parameters over the kinds
//   IndexHolder        a fixture mixin owning the index and its pool file
//   ReplaceWithCopyTakenWhileOpen  the pool file a SIGKILL leaves
//   DrawOp             an operation mix with a delete bias
//   RunDifferentialWithReopens  phases of random operations with reopens
//   ApplyAndCheck      one operation applied to the index and to a std::map
//                      model, with the status each operation must return
// Models are std::map<std::string, std::string> with any comparator: the
// helpers sort in the index's key order themselves (u64 keys numerically).
// Header-only; tests include it as "testing/index_test_util.h".
// Thread-safety: none of these synchronise; call them while no other thread
// writes the index (ScanAll and LeakReport read only).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

namespace pmindex::testutil {

using Record = std::pair<std::string, std::string>;

// "/dev/shm/<tag>-<pid>-<n>.pool", n counting the calls in this process.
inline std::string IndexPoolPath(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/dev/shm/" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".pool";
}

// The key a full scan starts from: u64 0, or the one-byte key "\x01".
inline std::string ScanStart(KeyKind kk) { return kk == KeyKind::kU64 ? std::string(U64Slice(0)) : std::string("\x01", 1); }

// The index's key order: u64 keys numerically, byte keys bytewise.
inline bool KeyLess(KeyKind kk, const std::string& a, const std::string& b) {
  return kk == KeyKind::kU64 ? SliceToU64(a) < SliceToU64(b) : a < b;
}

// A model's records in the index's key order.
template <class Model>
std::vector<Record> InKeyOrder(const Model& model, KeyKind kk) {
  std::vector<Record> v(model.begin(), model.end());
  std::sort(v.begin(), v.end(), [kk](const Record& a, const Record& b) { return KeyLess(kk, a.first, b.first); });
  return v;
}

// Every record, from ScanStart(kk), in scan order.
inline Status ScanAll(Index* idx, KeyKind kk, std::vector<Record>* out) {
  out->clear();
  return idx->Scan(ScanStart(kk), SIZE_MAX, [&](Slice k, Slice v) {
    out->emplace_back(std::string(k), std::string(v));
    return true;
  });
}

// The offsets of the allocator's blocks in the index's pool.
inline std::set<uint64_t> AllocatedBlocks(Index* idx) {
  std::set<uint64_t> a;
  idx->pool()->allocator().ForEachAllocated([&](uint64_t off, size_t) { a.insert(off); });
  return a;
}

// "" when the blocks the index owns are exactly the allocator's blocks, each
// owned once; otherwise what differs.
inline std::string LeakReport(Index* idx) {
  std::set<uint64_t> owned;
  size_t dup = 0;
  Status s = idx->ForEachOwnedBlock([&](uint64_t off) { dup += !owned.insert(off).second; });
  if (!s.ok()) return "owned-block walk: " + s.ToString();
  const std::set<uint64_t> alloc = AllocatedBlocks(idx);
  if (dup != 0) return "leak: " + std::to_string(dup) + " blocks owned twice";
  if (owned != alloc) return "leak: owned " + std::to_string(owned.size()) + " allocated " + std::to_string(alloc.size());
  return "";
}

inline void ExpectNoLeak(Index* idx) {
  const std::string l = LeakReport(idx);
  EXPECT_EQ(l, "");
}

// Check passes, Size and a full scan equal the model (in key order), no leak.
template <class Model>
void ExpectMatchesModel(Index* idx, KeyKind kk, const Model& model) {
  Status c = idx->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  EXPECT_EQ(idx->Size(), model.size());
  std::vector<Record> got;
  ASSERT_TRUE(ScanAll(idx, kk, &got).ok());
  const std::vector<Record> want = InKeyOrder(model, kk);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) {
    ASSERT_EQ(got[i].first, want[i].first) << "record " << i;
    ASSERT_EQ(got[i].second, want[i].second) << "record " << i;
  }
  ExpectNoLeak(idx);
}

// A scan of at most n records from `from` returns the model's keys from
// `from` on, in key order.
template <class Model>
void ExpectBoundedScan(Index* idx, KeyKind kk, const Model& model, const std::string& from, size_t n) {
  std::vector<std::string> seen;
  ASSERT_TRUE(idx->Scan(from, n, [&](Slice k, Slice) {
                   seen.emplace_back(k);
                   return true;
                 }).ok());
  std::vector<std::string> want;
  for (auto& [k, v] : model)
    if (!KeyLess(kk, k, from)) want.push_back(k);
  std::sort(want.begin(), want.end(), [kk](const std::string& a, const std::string& b) { return KeyLess(kk, a, b); });
  if (want.size() > n) want.resize(n);
  EXPECT_EQ(seen, want);
}

// Byte keys of varying length with shared prefixes, whose byte order is not
// their numeric order: "k" + a hash of i, then i % 7 * pad letters. u64
// keys: i.
inline std::string MixedKey(KeyKind kk, uint64_t i, size_t pad = 5) {
  if (kk == KeyKind::kU64) return std::string(U64Slice(i));
  std::string s = "k" + std::to_string(i * 2654435761ull % 1000003);
  s.append(i % 7 * pad, char('a' + i % 26));
  return s;
}

// Byte values "v<i>.<ver>" of varying length, empty for every 13th; u64
// values i * 31 + ver.
inline std::string MixedVal(ValueKind vk, uint64_t i, uint64_t ver) {
  if (vk == ValueKind::kU64) return std::string(U64Slice(i * 31 + ver));
  std::string s = "v" + std::to_string(i) + "." + std::to_string(ver);
  s.append((i + ver) % 40, 'x');
  if ((i + ver) % 13 == 0) s.clear();  // empty values are legal
  return s;
}

// Leaves the pool file at path as a SIGKILL of its holder would: copies it
// while *idx has it open, drops *idx (which closes the original) and puts
// the copy, never closed, in its place.
inline void ReplaceWithCopyTakenWhileOpen(const std::string& path, std::unique_ptr<Index>* idx) {
  const std::string copy = path + ".copy";
  std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
  idx->reset();
  std::filesystem::rename(copy, path);
}

// Short byte keys "key<k * 7919 % 100003>" + k % 5 'x's (u64 keys: k), and
// values "value-<v>" + v % 40 'v's (u64 values: v).
inline std::string ShortKey(KeyKind kk, uint64_t k) {
  if (kk == KeyKind::kU64) return std::string(U64Slice(k));
  return "key" + std::to_string(k * 7919 % 100003) + std::string(k % 5, 'x');
}
inline std::string ShortVal(ValueKind vk, uint64_t v) {
  if (vk == ValueKind::kU64) return std::string(U64Slice(v));
  return "value-" + std::to_string(v) + std::string(v % 40, 'v');
}

// The index's key order as a comparator: std::map<std::string, std::string,
// KeyOrder> iterates in scan order.
struct KeyOrder {
  KeyKind kk;
  bool operator()(const std::string& a, const std::string& b) const { return KeyLess(kk, a, b); }
};
using OrderedModel = std::map<std::string, std::string, KeyOrder>;

// One configuration of a test parameterised over the key and value kinds.
struct KindsCfg {
  KeyKind kk;
  ValueKind vk;
  std::map<std::string, std::string> params;
  std::string label;
};

// Every key kind x value kind ("ukey_uval" .. "bkey_bval"), each with the
// default parameters and with `small` (label + "_small").
inline std::vector<KindsCfg> AllKindsDefaultAndSmall(const std::map<std::string, std::string>& small) {
  std::vector<KindsCfg> v;
  for (int kk = 0; kk < 2; kk++)
    for (int vk = 0; vk < 2; vk++) {
      std::string l = std::string(kk ? "bkey" : "ukey") + (vk ? "_bval" : "_uval");
      v.push_back({KeyKind(kk), ValueKind(vk), {}, l});
      v.push_back({KeyKind(kk), ValueKind(vk), small, l + "_small"});
    }
  return v;
}

// Owns a test's index and its pool file (a mixin for test fixtures):
// CreateIndex opens a fresh pool with opts_ at a unique path, Reopen closes
// the index cleanly and opens the pool again (recovery), the destructor
// removes the file.
class IndexHolder {
 protected:
  ~IndexHolder() {
    idx_.reset();
    if (!path_.empty()) pm::Pool::Remove(path_);
  }
  void CreateIndex(const std::string& index, const std::string& tag) {
    index_ = index;
    path_ = IndexPoolPath(tag);
    opts_.pool_path = path_;
    Status s = OpenIndex(index, opts_, &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // recovery_threads 0: the default.
  void Reopen(int recovery_threads = 0) {
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    Options o;
    o.pool_path = path_;
    if (recovery_threads) o.recovery_threads = recovery_threads;
    Status s = OpenIndex(index_, o, &idx_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::string index_, path_;
  Options opts_;
  std::unique_ptr<Index> idx_;
};

enum class Op { kInsert, kUpdate, kUpsert, kRemove, kFind };

// The operation of a draw r in [0, 100): Remove below del_bias, then 25
// Inserts, 15 Updates, 10 Upserts, and Finds for the rest.
inline Op DrawOp(int r, int del_bias) {
  if (r < del_bias) return Op::kRemove;
  if (r < del_bias + 25) return Op::kInsert;
  if (r < del_bias + 40) return Op::kUpdate;
  if (r < del_bias + 50) return Op::kUpsert;
  return Op::kFind;
}

// Applies op(k, v) to the index and the model. Insert answers AlreadyExists
// for a present key, Update and Remove NotFound for an absent one, Upsert
// always succeeds, Find returns the model's value.
template <class Model>
void ApplyAndCheck(Index* idx, Model* model, Op op, const std::string& k, const std::string& v) {
  const bool present = model->count(k) > 0;
  switch (op) {
    case Op::kInsert: {
      Status s = idx->Insert(k, v);
      ASSERT_EQ(s.ok(), !present) << s.ToString();
      if (present) {
        ASSERT_TRUE(s.IsAlreadyExists()) << s.ToString();
      } else {
        (*model)[k] = v;
      }
      break;
    }
    case Op::kUpdate: {
      Status s = idx->Update(k, v);
      ASSERT_EQ(s.ok(), present) << s.ToString();
      if (present) {
        (*model)[k] = v;
      } else {
        ASSERT_TRUE(s.IsNotFound()) << s.ToString();
      }
      break;
    }
    case Op::kUpsert: {
      Status s = idx->Upsert(k, v);
      ASSERT_TRUE(s.ok()) << s.ToString();
      (*model)[k] = v;
      break;
    }
    case Op::kRemove: {
      Status s = idx->Remove(k);
      ASSERT_EQ(s.ok(), present) << s.ToString();
      if (!present) {
        ASSERT_TRUE(s.IsNotFound()) << s.ToString();
      }
      model->erase(k);
      break;
    }
    case Op::kFind: {
      std::string got;
      Status s = idx->Find(k, &got);
      ASSERT_EQ(s.ok(), present) << s.ToString();
      if (present) {
        ASSERT_EQ(got, model->find(k)->second);
      } else {
        ASSERT_TRUE(s.IsNotFound()) << s.ToString();
      }
      break;
    }
  }
}

// The differential run with reopens: `phases` phases of `ops` random
// operations over keys 0..keys-1 (every third phase mostly deletes), each
// followed by check(), a bounded scan from a random key and, after every
// second phase, reopen() and check() again; then every record is removed
// and check() runs once more. key(i) and val(i, ver) make the records;
// *idx is the index (reopen() replaces it).
inline void RunDifferentialWithReopens(std::unique_ptr<Index>* idx, KeyKind kk, int phases, int ops, uint64_t keys,
                                       const std::function<std::string(uint64_t)>& key,
                                       const std::function<std::string(uint64_t, uint64_t)>& val,
                                       const std::function<void(const std::map<std::string, std::string>&)>& check,
                                       const std::function<void()>& reopen) {
  std::mt19937_64 rng(42);
  std::map<std::string, std::string> model;
  for (int phase = 0; phase < phases; phase++) {
    const int del_bias = phase % 3 == 2 ? 60 : 15;  // every third phase mostly deletes
    for (int op = 0; op < ops; op++) {
      const uint64_t i = rng() % keys;
      const std::string k = key(i), v = val(i, rng() % 1000);
      const int r = int(rng() % 100);
      ASSERT_NO_FATAL_FAILURE(ApplyAndCheck(idx->get(), &model, DrawOp(r, del_bias), k, v));
    }
    ASSERT_NO_FATAL_FAILURE(check(model));
    ASSERT_NO_FATAL_FAILURE(ExpectBoundedScan(idx->get(), kk, model, key(rng() % keys), 17));
    if (phase % 2 == 1) {
      ASSERT_NO_FATAL_FAILURE(reopen());
      ASSERT_NO_FATAL_FAILURE(check(model));
    }
  }
  for (auto& [k, v] : model) ASSERT_TRUE((*idx)->Remove(k).ok());
  model.clear();
  check(model);
}

}  // namespace pmindex::testutil
