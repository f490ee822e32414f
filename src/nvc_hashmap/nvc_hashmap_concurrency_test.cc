// NVC-Hashmap concurrency tests (label "concurrency", run under TSan in CI):
// threads inserting, updating, removing and finding overlapping keys, in
// every erratum mode, both key kinds, and u64 keys with u64 values (compact
// 32-byte nodes, two to a cache line, inserted while the table grows from 2
// buckets). Disjoint keys: every result and the
// final state equal a model built from the per-thread histories. Shared keys:
// every read returns a value some writer wrote for that key; exactly one
// concurrent insert of a key wins. Afterwards: check(), no leak, reopen.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <unordered_map>

#include "nvc_hashmap/nvc_test_util.h"

namespace pmindex {
namespace {

using nvc_test::ExpectNoLeak;
using nvc_test::MakeKey;
using nvc_test::PoolFile;

int Threads() { return std::getenv("PMINDEX_LONG") ? 4 : 3; }
int OpsPerThread() { return std::getenv("PMINDEX_LONG") ? 200000 : 15000; }

struct Case {
  KeyKind kk;
  std::string fix;
  std::string na = "allocator";  // node_alloc
  ValueKind vk = ValueKind::kBytes;  // kU64 with u64 keys: compact nodes
};

class NvcConcurrency : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    opts_.pool_path = pf_.path;
    opts_.pool_size = 64ull << 20;
    opts_.key_kind = GetParam().kk;
    opts_.value_kind = GetParam().vk;
    opts_.params = {{"erratum_fix", GetParam().fix}, {"initial_buckets", "2"}, {"node_alloc", GetParam().na}};
    ASSERT_TRUE(OpenIndex("nvc_hashmap", opts_, &idx_).ok());
  }
  void Reopen() {
    ASSERT_TRUE(idx_->Close().ok());
    idx_.reset();
    Options o = opts_;
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("", o, &idx_).ok());
  }
  PoolFile pf_{"conc"};
  Options opts_;
  std::unique_ptr<Index> idx_;
};

// Values written by writer t for key id, sequence s: "id/t/s/padding"; u64
// values: id << 40 | t << 32 | s (id < 2^24, t < 256, s < 2^32).
std::string Val(ValueKind vk, uint64_t id, int t, uint64_t s) {
  if (vk == ValueKind::kU64) {
    const uint64_t x = id << 40 | uint64_t(t) << 32 | s;
    return std::string(reinterpret_cast<const char*>(&x), 8);
  }
  std::string v = std::to_string(id) + "/" + std::to_string(t) + "/" + std::to_string(s) + "/";
  v.append(s % 40, 'x');
  return v;
}
bool ParseVal(ValueKind vk, const std::string& v, uint64_t* id, int* t, uint64_t* s) {
  if (vk == ValueKind::kU64) {
    if (v.size() != 8) return false;
    uint64_t x;
    std::memcpy(&x, v.data(), 8);
    *id = x >> 40;
    *t = int((x >> 32) & 0xff);
    *s = x & 0xffffffffu;
    return true;
  }
  unsigned long long a, c;
  int b;
  if (std::sscanf(v.c_str(), "%llu/%d/%llu/", &a, &b, &c) != 3) return false;
  *id = a;
  *t = b;
  *s = c;
  return v == Val(vk, a, b, c);
}

TEST_P(NvcConcurrency, DisjointKeysMatchPerThreadModels) {
  const int T = Threads(), kOps = OpsPerThread();
  const KeyKind kk = GetParam().kk;
  const ValueKind vk = GetParam().vk;
  std::vector<std::unordered_map<std::string, std::string>> models(T);
  std::vector<std::string> errors(T);
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++)
    th.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      auto& m = models[t];
      std::string v;
      for (int i = 0; i < kOps && errors[t].empty(); i++) {
        const uint64_t id = (rng() % 800) * T + t;  // thread t owns ids == t mod T
        const std::string k = MakeKey(kk, id), val = Val(vk, id, t, i);
        const bool present = m.count(k) != 0;
        Status s;
        switch (rng() % 5) {
          case 0:
            s = idx_->Insert(k, val);
            if (s.ok() == present) errors[t] = "insert " + s.ToString();
            if (!present) m[k] = val;
            break;
          case 1:
            s = idx_->Update(k, val);
            if (s.ok() != present) errors[t] = "update " + s.ToString();
            if (present) m[k] = val;
            break;
          case 2:
            if (!idx_->Upsert(k, val).ok()) errors[t] = "upsert";
            m[k] = val;
            break;
          case 3:
            s = idx_->Remove(k);
            if (s.ok() != present) errors[t] = "remove " + s.ToString();
            m.erase(k);
            break;
          case 4:
            s = idx_->Find(k, &v);
            if (s.ok() != present || (present && v != m[k])) errors[t] = "find " + s.ToString();
            break;
        }
      }
    });
  for (auto& x : th) x.join();
  for (int t = 0; t < T; t++) ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
  auto verify = [&] {
    Status c = idx_->Check();
    ASSERT_TRUE(c.ok()) << c.ToString();
    size_t total = 0;
    std::string v;
    for (const auto& m : models) {
      total += m.size();
      for (const auto& [k, val] : m) {
        ASSERT_TRUE(idx_->Find(k, &v).ok());
        ASSERT_EQ(v, val);
      }
    }
    ASSERT_EQ(idx_->Size(), total);
    ExpectNoLeak(idx_.get());
  };
  verify();
  Reopen();
  verify();
}

TEST_P(NvcConcurrency, SharedKeysReadOnlyWrittenValues) {
  const int T = Threads(), kOps = OpsPerThread();
  const KeyKind kk = GetParam().kk;
  const ValueKind vk = GetParam().vk;
  const uint64_t kKeys = 64;
  std::vector<std::string> errors(T + 1);
  std::atomic<bool> stop{false};
  std::vector<uint64_t> max_seq(T, 0);
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++)
    th.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::string v;
      for (int i = 0; i < kOps && errors[t].empty(); i++) {
        const uint64_t id = rng() % kKeys;
        const std::string k = MakeKey(kk, id);
        Status s;
        switch (rng() % 5) {
          case 0: s = idx_->Insert(k, Val(vk, id, t, i)); if (!s.ok() && !s.IsAlreadyExists()) errors[t] = s.ToString(); break;
          case 1: s = idx_->Update(k, Val(vk, id, t, i)); if (!s.ok() && !s.IsNotFound()) errors[t] = s.ToString(); break;
          case 2: s = idx_->Upsert(k, Val(vk, id, t, i)); if (!s.ok()) errors[t] = s.ToString(); break;
          case 3: s = idx_->Remove(k); if (!s.ok() && !s.IsNotFound()) errors[t] = s.ToString(); break;
          case 4: {
            s = idx_->Find(k, &v);
            uint64_t rid, rs;
            int rt;
            if (s.ok() && (!ParseVal(vk, v, &rid, &rt, &rs) || rid != id || rt < 0 || rt >= T || rs >= uint64_t(kOps)))
              errors[t] = "read a value nobody wrote: " + v;
            else if (!s.ok() && !s.IsNotFound())
              errors[t] = s.ToString();
            break;
          }
        }
      }
    });
  // A pure reader alongside.
  th.emplace_back([&] {
    std::string v;
    std::mt19937_64 rng(7);
    while (!stop.load() && errors[T].empty()) {
      const uint64_t id = rng() % kKeys;
      Status s = idx_->Find(MakeKey(kk, id), &v);
      uint64_t rid, rs;
      int rt;
      if (s.ok() && (!ParseVal(vk, v, &rid, &rt, &rs) || rid != id)) errors[T] = "reader saw " + v;
    }
  });
  for (int t = 0; t < T; t++) th[t].join();
  stop = true;
  th[T].join();
  for (int t = 0; t <= T; t++) ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
  Status c = idx_->Check();
  ASSERT_TRUE(c.ok()) << c.ToString();
  uint64_t found = 0;
  std::string v;
  for (uint64_t id = 0; id < kKeys; id++) found += idx_->Find(MakeKey(kk, id), &v).ok();
  EXPECT_EQ(idx_->Size(), found);
  ExpectNoLeak(idx_.get());
  Reopen();
  ASSERT_TRUE(idx_->Check().ok());
  EXPECT_EQ(idx_->Size(), found);
}

TEST_P(NvcConcurrency, ExactlyOneConcurrentInsertWins) {
  const int T = Threads();
  const KeyKind kk = GetParam().kk;
  const ValueKind vk = GetParam().vk;
  const uint64_t kKeys = 3000;
  std::vector<std::vector<uint64_t>> won(T);
  std::vector<std::thread> th;
  for (int t = 0; t < T; t++)
    th.emplace_back([&, t] {
      for (uint64_t id = 0; id < kKeys; id++) {
        const uint64_t k = (t % 2) ? kKeys - 1 - id : id;
        if (idx_->Insert(MakeKey(kk, k), Val(vk, k, t, 0)).ok()) won[t].push_back(k);
      }
    });
  for (auto& x : th) x.join();
  std::vector<int> winner(kKeys, -1);
  for (int t = 0; t < T; t++)
    for (uint64_t k : won[t]) {
      ASSERT_EQ(winner[k], -1) << "key " << k << " inserted twice";
      winner[k] = t;
    }
  std::string v;
  for (uint64_t k = 0; k < kKeys; k++) {
    ASSERT_NE(winner[k], -1) << "key " << k << " inserted by nobody";
    ASSERT_TRUE(idx_->Find(MakeKey(kk, k), &v).ok());
    ASSERT_EQ(v, Val(vk, k, winner[k], 0));
  }
  EXPECT_EQ(idx_->Size(), kKeys);
  ASSERT_TRUE(idx_->Check().ok()) << idx_->Check().ToString();
  ExpectNoLeak(idx_.get());
}

// u64 values are updated in place (one 8-byte store into the node's value
// word) while a remove linearizes at the mark on the node's next word. Two
// updaters and a reader race a remover over the same keys, in rounds (all
// keys inserted, then a random half removed once). Values carry (key, writer,
// seq); each writer's seq only grows. Checked during the race: every read
// returns a value some writer wrote for that key; per reading thread, key
// and writer, the seqs read never go back (a read never returns an older
// write than one the thread already saw); a writer's find right after its own
// acknowledged update never returns its own older value or the loader's; an
// update of a key that is never removed never gets NotFound; an update or
// find that starts after the key's remove returned reports NotFound (no
// resurrection). After the round: a removed key is absent; a kept key's
// value is the last acknowledged update of one of the writers that updated
// it (the loader's value if nobody did): a lost acknowledged update fails
// this; Size(), check(), no leak; reopen at the end.
TEST(NvcConcurrencyU64, InPlaceUpdatesRacingRemoves) {
  const int kRounds = std::getenv("PMINDEX_LONG") ? 40 : 4;
  const uint64_t kKeys = 300;
  const int kUpdaters = 2;  // thread ids 0, 1; the loader is id 2
  for (std::string cfg : {"dirty_bit/slab", "dirty_bit/allocator", "flush_on_read/slab", "none/slab"}) {
    SCOPED_TRACE(cfg);
    PoolFile pf("u64upd");
    Options o;
    o.pool_path = pf.path;
    o.pool_size = 32ull << 20;
    o.key_kind = KeyKind::kU64;
    o.value_kind = ValueKind::kU64;
    o.params = {{"erratum_fix", cfg.substr(0, cfg.find('/'))}, {"initial_buckets", "2"}, {"node_alloc", cfg.substr(cfg.find('/') + 1)}};
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    auto enc = [](uint64_t id, uint64_t t, uint64_t seq) { return nvc_test::U64(id << 40 | t << 32 | (seq & 0xffffffffu)); };
    std::vector<std::string> errors(kUpdaters + 2);
    for (int round = 0; round < kRounds; round++) {
      for (uint64_t id = 0; id < kKeys; id++) ASSERT_TRUE(idx->Insert(MakeKey(KeyKind::kU64, id), enc(id, 2, round)).ok());
      std::vector<bool> to_remove(kKeys);
      std::mt19937_64 pick(round + 17);
      for (uint64_t id = 0; id < kKeys; id++) to_remove[id] = pick() & 1;
      std::unique_ptr<std::atomic<bool>[]> removed(new std::atomic<bool>[kKeys]);
      for (uint64_t id = 0; id < kKeys; id++) removed[id] = false;
      // last_acked[t][id]: writer t's last acknowledged update of id (0: none).
      std::vector<std::vector<uint64_t>> last_acked(kUpdaters, std::vector<uint64_t>(kKeys, 0));
      std::atomic<bool> done{false};
      // A reader's view: the highest seq it read per (key, writer); a read
      // must not go back. Writer index kUpdaters is the loader (seq 0..).
      struct View {
        std::vector<uint64_t> seen;  // (kUpdaters + 1) x kKeys, seq + 1 (0: nothing read)
        View() : seen((kUpdaters + 1) * kKeys, 0) {}
      };
      // Decodes v for key id and checks it against the view; "" if fine.
      auto observe = [&](View& view, uint64_t id, const std::string& v) -> std::string {
        uint64_t x;
        if (v.size() != 8) return "value of size " + std::to_string(v.size());
        std::memcpy(&x, v.data(), 8);
        const uint64_t t = (x >> 32) & 0xff, seq = x & 0xffffffffu;
        if ((x >> 40) != id || t > uint64_t(kUpdaters)) return "read a value nobody wrote for key " + std::to_string(id);
        if (t == uint64_t(kUpdaters) && seq != uint64_t(round)) return "read a stale loader value of key " + std::to_string(id);
        uint64_t& s = view.seen[t * kKeys + id];
        if (seq + 1 < s)
          return "key " + std::to_string(id) + ": read writer " + std::to_string(t) + "'s seq " + std::to_string(seq) +
                 " after its seq " + std::to_string(s - 1);
        s = seq + 1;
        if (t == uint64_t(kUpdaters))
          for (int w = 0; w < kUpdaters; w++)
            if (view.seen[w * kKeys + id]) return "read the loader's value of key " + std::to_string(id) + " after an update's";
        return "";
      };
      std::vector<std::thread> th;
      for (int t = 0; t < kUpdaters; t++)
        th.emplace_back([&, t] {
          std::mt19937_64 rng(round * 10 + t);
          std::string v;
          View view;
          for (uint64_t seq = 1; !done.load() && errors[t].empty(); seq++) {
            const uint64_t id = rng() % kKeys;
            const std::string k = MakeKey(KeyKind::kU64, id);
            const bool was_removed = removed[id].load(std::memory_order_acquire);
            Status s = idx->Update(k, enc(id, uint64_t(t), seq));
            if (s.ok() && was_removed) errors[t] = "update of a removed key " + std::to_string(id) + " succeeded";
            else if (s.IsNotFound() && !to_remove[id]) errors[t] = "update of kept key " + std::to_string(id) + ": NotFound";
            else if (!s.ok() && !s.IsNotFound()) errors[t] = "update: " + s.ToString();
            const bool acked = s.ok();
            if (acked) {
              last_acked[t][id] = seq;
              // Our own write is now the newest of ours for this key.
              view.seen[t * kKeys + id] = seq + 1;
            }
            s = idx->Find(k, &v);
            if (s.ok() && was_removed) errors[t] = "found removed key " + std::to_string(id);
            else if (s.ok()) {
              std::string e = observe(view, id, v);
              if (!e.empty()) errors[t] = e;
            } else if (!s.IsNotFound()) errors[t] = "find: " + s.ToString();
            else if (!to_remove[id]) errors[t] = "kept key " + std::to_string(id) + " not found";
          }
        });
      th.emplace_back([&] {  // a pure reader
        std::mt19937_64 rng(round + 99);
        std::string v;
        View view;
        while (!done.load() && errors[kUpdaters].empty()) {
          const uint64_t id = rng() % kKeys;
          const bool was_removed = removed[id].load(std::memory_order_acquire);
          Status s = idx->Find(MakeKey(KeyKind::kU64, id), &v);
          if (s.ok() && was_removed) errors[kUpdaters] = "reader: found removed key " + std::to_string(id);
          else if (s.ok()) {
            std::string e = observe(view, id, v);
            if (!e.empty()) errors[kUpdaters] = "reader: " + e;
          } else if (!to_remove[id]) errors[kUpdaters] = "reader: kept key " + std::to_string(id) + " not found";
        }
      });
      th.emplace_back([&] {  // the remover: each key of the removal set once
        std::vector<uint64_t> ids;
        for (uint64_t id = 0; id < kKeys; id++)
          if (to_remove[id]) ids.push_back(id);
        std::shuffle(ids.begin(), ids.end(), std::mt19937_64(round + 5));
        std::string v;
        for (uint64_t id : ids) {
          const std::string k = MakeKey(KeyKind::kU64, id);
          Status s = idx->Remove(k);
          if (!s.ok()) errors[kUpdaters + 1] = "remove of key " + std::to_string(id) + ": " + s.ToString();
          removed[id].store(true, std::memory_order_release);
          if (idx->Find(k, &v).ok()) errors[kUpdaters + 1] = "key " + std::to_string(id) + " found after its remove";
          if (idx->Remove(k).ok()) errors[kUpdaters + 1] = "key " + std::to_string(id) + " removed twice";
        }
        done = true;
      });
      for (auto& x : th) x.join();
      for (size_t t = 0; t < errors.size(); t++) ASSERT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
      std::string v;
      uint64_t kept = 0;
      for (uint64_t id = 0; id < kKeys; id++) {
        Status s = idx->Find(MakeKey(KeyKind::kU64, id), &v);
        if (to_remove[id]) {
          ASSERT_TRUE(s.IsNotFound()) << id;
          continue;
        }
        kept++;
        ASSERT_TRUE(s.ok()) << "kept key " << id << " lost";
        std::vector<std::string> allowed;
        for (int w = 0; w < kUpdaters; w++)
          if (last_acked[w][id]) allowed.push_back(enc(id, uint64_t(w), last_acked[w][id]));
        if (allowed.empty()) allowed.push_back(enc(id, 2, round));
        ASSERT_NE(std::find(allowed.begin(), allowed.end(), v), allowed.end())
            << "key " << id << ": the final value is not the last acknowledged update of any writer (lost update)";
      }
      ASSERT_EQ(idx->Size(), kept);
      Status c = idx->Check();
      ASSERT_TRUE(c.ok()) << c.ToString();
      ExpectNoLeak(idx.get());
      for (uint64_t id = 0; id < kKeys; id++) {
        if (to_remove[id]) continue;
        ASSERT_TRUE(idx->Remove(MakeKey(KeyKind::kU64, id)).ok());
      }
      ASSERT_EQ(idx->Size(), 0u);
    }
    ASSERT_TRUE(idx->Close().ok());
    idx.reset();
    o.create_if_missing = false;
    ASSERT_TRUE(OpenIndex("nvc_hashmap", o, &idx).ok());
    ASSERT_TRUE(idx->Check().ok());
    ASSERT_EQ(idx->Size(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, NvcConcurrency,
                         testing::Values(Case{KeyKind::kU64, "dirty_bit"}, Case{KeyKind::kBytes, "dirty_bit"},
                                         Case{KeyKind::kU64, "flush_on_read"}, Case{KeyKind::kU64, "none"},
                                         Case{KeyKind::kU64, "dirty_bit", "slab"}, Case{KeyKind::kBytes, "dirty_bit", "slab"},
                                         Case{KeyKind::kU64, "flush_on_read", "slab"},
                                         Case{KeyKind::kU64, "dirty_bit", "slab", ValueKind::kU64},
                                         Case{KeyKind::kU64, "flush_on_read", "allocator", ValueKind::kU64}),
                         [](const testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.kk == KeyKind::kU64 ? "u64_" : "bytes_") + i.param.fix + "_" + i.param.na +
                                  (i.param.vk == ValueKind::kU64 ? "_u64values" : "");
                         });

}  // namespace
}  // namespace pmindex
