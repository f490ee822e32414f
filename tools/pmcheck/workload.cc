// pmcheck workloads (see workload.h). No PM access of its own: ops go
// through the index API.
#include "workload.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

namespace pmcheck {

using pmindex::Slice;
using pmindex::Status;

const char* OpName(OpType t) {
  switch (t) {
    case OpType::kCreate: return "create";
    case OpType::kInsert: return "insert";
    case OpType::kUpdate: return "update";
    case OpType::kUpsert: return "upsert";
    case OpType::kRemove: return "remove";
    case OpType::kFind: return "find";
    case OpType::kScan: return "scan";
  }
  return "?";
}

namespace {
uint32_t Mix32(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 29;
  return uint32_t(h * 0x9E3779B97F4A7C15ull >> 32) | 1u;
}
}  // namespace

Workload::Workload(const Config& c, int threads, uint64_t ops_per_thread, uint64_t seed)
    : kk_(c.key_kind), vk_(c.value_kind) {
  uint64_t nkeys = c.keys ? c.keys : std::max<uint64_t>(8, ops_per_thread / 2);
  per_thread_ = nkeys;
  const bool shared = c.shared_keys && threads > 1;
  const bool shared_writes = shared && c.shared_writes;
  // Shared-write keys are made as the keys of one more thread (number
  // `threads`), so they sort after everyone's and no thread owns them.
  for (int t = 0; t < threads + (shared_writes ? 1 : 0); ++t) {
    for (uint64_t i = 0; i < (t < threads ? nkeys : kSharedWriteKeys); ++i) {
      std::string k;
      if (kk_ == pmindex::KeyKind::kU64) {
        // Thread 0 takes the smallest keys (0, 1, 2, ...): key 0 and keys
        // next to it are where sentinels and "left neighbour" words of an
        // index live (a FAST & FAIR crash bug hid behind keys >= 2^32).
        uint64_t v = t == 0 ? i : (uint64_t(t) << 32) + i * 16 + 5;
        k.assign(reinterpret_cast<const char*>(&v), 8);
      } else {
        // The first byte cycles through low and high values (below and
        // above the bytes of typical headers and sentinels), not one letter.
        static constexpr char kFirst[] = {'\x01', '0', 'A', 'k', '~'};
        char buf[64];
        std::snprintf(buf, sizeof buf, "%c%d:%06llu", kFirst[i % sizeof kFirst], t, static_cast<unsigned long long>(i));
        k = buf;
        for (uint64_t j = 0; j < (i * 7) % 23; ++j) k.push_back(char('a' + (i + j) % 26));
      }
      ids_[k] = uint32_t(keys_.size());
      hashes_.push_back(Mix32(k));
      keys_.push_back(std::move(k));
    }
  }
  std::vector<uint32_t> ver(keys_.size(), 0);
  ops_.resize(threads);
  for (int t = 0; t < threads; ++t) {
    std::mt19937_64 rng(seed * 1000003 + uint64_t(t) * 7919 + 17);
    // Key sweeps (Config::sweep): the thread's key ids in key order (byte
    // keys compare as bytes, u64 keys as numbers).
    std::vector<uint32_t> ord;
    if (c.sweep && !shared) {
      for (uint64_t i = 0; i < nkeys; ++i) ord.push_back(uint32_t(t * nkeys + i));
      std::sort(ord.begin(), ord.end(), [&](uint32_t a, uint32_t b) {
        if (kk_ == pmindex::KeyKind::kU64) {
          uint64_t x, y;
          std::memcpy(&x, keys_[a].data(), 8);
          std::memcpy(&y, keys_[b].data(), 8);
          return x < y;
        }
        return keys_[a] < keys_[b];
      });
    }
    for (uint64_t i = 0; i < ops_per_thread; ++i) {
      Op op;
      op.tid = t;
      if (!ord.empty()) {
        const uint64_t p = i % nkeys;
        switch ((i / nkeys) % 4) {
          case 0: op.type = OpType::kInsert, op.kid = ord[p]; break;
          case 1: op.type = OpType::kRemove, op.kid = ord[nkeys - 1 - p]; break;
          case 2: op.type = OpType::kUpsert, op.kid = ord[nkeys - 1 - p]; break;
          default: op.type = OpType::kRemove, op.kid = ord[p]; break;
        }
        if (op.type != OpType::kRemove) op.version = ++ver[op.kid];
        ops_[t].push_back(op);
        continue;
      }
      op.kid = uint32_t(t * nkeys + rng() % nkeys);
      unsigned r = unsigned(rng() % 100);
      if (shared) {
        // Reads are what shared keys are for: 30% of the ops, on any key.
        op.type = r < 30   ? OpType::kInsert
                  : r < 44 ? OpType::kUpdate
                  : r < 56 ? OpType::kUpsert
                  : r < 70 ? OpType::kRemove
                  : r < 88 ? OpType::kFind
                           : OpType::kScan;
        if (op.type == OpType::kFind || op.type == OpType::kScan) op.kid = uint32_t(rng() % keys_.size());
        // Shared writes: a third of the ops (reads and writes) go to the
        // keys every thread writes, so that writes of two threads meet.
        if (shared_writes && rng() % 3 == 0) op.kid = uint32_t(nkeys * uint64_t(threads) + rng() % kSharedWriteKeys);
      } else if (c.drain) {
        // Fill, then drain: removes of absent keys do nothing, so the
        // drain removes about as many keys as the fill inserted.
        const bool fill = i < ops_per_thread / 2;
        op.type = fill ? (r < 70 ? OpType::kInsert : r < 85 ? OpType::kUpsert : r < 95 ? OpType::kUpdate : OpType::kFind)
                       : (r < 80 ? OpType::kRemove : r < 88 ? OpType::kUpdate : r < 95 ? OpType::kFind : OpType::kScan);
      } else {
        op.type = r < 38   ? OpType::kInsert
                  : r < 55 ? OpType::kUpdate
                  : r < 70 ? OpType::kUpsert
                  : r < 88 ? OpType::kRemove
                  : r < 95 ? OpType::kFind
                           : OpType::kScan;
      }
      if (op.type != OpType::kFind && op.type != OpType::kRemove) op.version = ++ver[op.kid];
      ops_[t].push_back(op);
    }
  }
}

std::string Workload::Value(uint32_t kid, uint32_t version) const {
  const uint32_t h = Hash(kid);
  if (vk_ == pmindex::ValueKind::kU64) {
    uint64_t v = (uint64_t(h) << 32) | version;
    return std::string(reinterpret_cast<const char*>(&v), 8);
  }
  size_t len = 8 + (h + version * 31u) % 97;
  std::string s(len, '\0');
  std::memcpy(&s[0], &version, 4);
  std::memcpy(&s[4], &h, 4);
  for (size_t j = 8; j < len; ++j) s[j] = char((h + version * 7u + j * 13u) & 0xff);
  return s;
}

int64_t Workload::Decode(uint32_t kid, Slice value) const {
  uint32_t version = 0;
  if (vk_ == pmindex::ValueKind::kU64) {
    if (value.size() != 8) return -1;
    uint64_t v = pmindex::SliceToU64(value);
    if (uint32_t(v >> 32) != Hash(kid) || uint32_t(v) == 0) return -1;
    return int64_t(uint32_t(v));
  }
  if (value.size() < 8) return -1;
  std::memcpy(&version, value.data(), 4);
  if (version == 0) return -1;
  return Value(kid, version) == value ? int64_t(version) : -1;
}

int64_t Workload::KeyId(Slice key) const {
  auto it = ids_.find(std::string(key));
  return it == ids_.end() ? -1 : int64_t(it->second);
}

std::string Workload::PostKey(int j) const {
  if (kk_ == pmindex::KeyKind::kU64) {
    uint64_t v = (uint64_t(0xFFFF) << 32) + uint64_t(j) * 3 + 1;
    return std::string(reinterpret_cast<const char*>(&v), 8);
  }
  return "zpost-" + std::to_string(j);
}

std::string Workload::MinKey() const {
  if (kk_ == pmindex::KeyKind::kU64) {
    uint64_t v = 0;
    return std::string(reinterpret_cast<const char*>(&v), 8);
  }
  return std::string(1, '\x01');
}

Status Workload::Apply(pmindex::Index* index, const Op& op, std::string* got) const {
  const std::string& k = keys_[op.kid];
  switch (op.type) {
    case OpType::kInsert: return index->Insert(k, Value(op.kid, op.version));
    case OpType::kUpdate: return index->Update(k, Value(op.kid, op.version));
    case OpType::kUpsert: return index->Upsert(k, Value(op.kid, op.version));
    case OpType::kRemove: return index->Remove(k);
    case OpType::kFind: return index->Find(k, got);
    case OpType::kScan:
      got->clear();
      return index->Scan(
          k, kScanCount,
          [got](Slice key, Slice value) {
            for (Slice part : {key, value}) {
              const uint32_t n = uint32_t(part.size());
              got->append(reinterpret_cast<const char*>(&n), 4);
              got->append(part.data(), part.size());
            }
            return true;
          },
          nullptr);
    case OpType::kCreate: break;
  }
  return Status::InvalidArgument("bad op");
}

std::vector<std::pair<std::string, std::string>> Workload::ParseScan(const std::string& got) {
  std::vector<std::pair<std::string, std::string>> recs;
  for (size_t at = 0; at < got.size();) {
    std::string parts[2];
    for (std::string& part : parts) {
      uint32_t n = 0;
      std::memcpy(&n, got.data() + at, 4);
      part.assign(got, at + 4, n);
      at += 4 + n;
    }
    recs.emplace_back(std::move(parts[0]), std::move(parts[1]));
  }
  return recs;
}

std::vector<std::pair<uint32_t, uint32_t>> Workload::Reads(const Op& op, const std::string& got) const {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  if (op.type == OpType::kFind) {
    const int64_t v = Decode(op.kid, got);
    if (v > 0) out.emplace_back(op.kid, uint32_t(v));
  } else if (op.type == OpType::kScan) {
    for (const auto& [k, val] : ParseScan(got)) {
      const int64_t kid = KeyId(k);
      const int64_t v = kid < 0 ? -1 : Decode(uint32_t(kid), val);
      if (v > 0) out.emplace_back(uint32_t(kid), uint32_t(v));
    }
  }
  return out;
}

std::string Workload::CheckSharedFind(const Op& op, Status::Code result, const std::string& got) const {
  if (result == Status::Code::kNotFound) return "";
  if (result != Status::Code::kOk) return std::string("find of another thread's key returned ") + Status::CodeName(result);
  if (Decode(op.kid, got) < 0) return "find of another thread's key returned a torn value";
  return "";
}

std::string Workload::CheckSharedWrite(const Op& op, Status::Code result, const std::string& got) const {
  using C = Status::Code;
  bool ok = false;
  switch (op.type) {
    case OpType::kInsert: ok = result == C::kOk || result == C::kAlreadyExists; break;
    case OpType::kUpsert: ok = result == C::kOk; break;
    case OpType::kUpdate:
    case OpType::kRemove:
    case OpType::kFind: ok = result == C::kOk || result == C::kNotFound; break;
    default: return "";
  }
  if (!ok) return std::string(OpName(op.type)) + " of a shared-write key returned " + Status::CodeName(result);
  if (op.type == OpType::kFind && result == C::kOk && Decode(op.kid, got) < 0)
    return "find of a shared-write key returned a torn value";
  return "";
}

std::string Workload::CheckScan(const Op& op, const std::string& got, const std::vector<uint32_t>& state) const {
  const std::vector<std::pair<std::string, std::string>> recs = ParseScan(got);
  if (recs.size() > kScanCount) return "scan returned " + std::to_string(recs.size()) + " records, asked for " + std::to_string(kScanCount);
  auto less = [this](const std::string& a, const std::string& b) {
    if (kk_ == pmindex::KeyKind::kU64) return pmindex::SliceToU64(a) < pmindex::SliceToU64(b);
    return a < b;
  };
  const std::string& start = keys_[op.kid];
  for (size_t i = 0; i < recs.size(); ++i) {
    const std::string& k = recs[i].first;
    if (less(k, start)) return "scan returned a key below its start";
    if (i && !less(recs[i - 1].first, k)) return "scan returned keys out of order or twice";
    const int64_t kid = KeyId(k);
    if (kid < 0) return "scan returned a key no op wrote";
    const int64_t v = Decode(uint32_t(kid), recs[i].second);
    if (v < 0) return "scan returned a torn value for key #" + std::to_string(kid);
    if (Owner(uint32_t(kid)) != op.tid) continue;  // another thread's key, or a shared-write key
    if (uint32_t(v) != state[size_t(kid)])
      return "scan returned version " + std::to_string(v) + " of key #" + std::to_string(kid) + ", expected " +
             std::to_string(state[size_t(kid)]);
  }
  // None of this thread's present keys in [start, end of the scan) is missing:
  // up to the last record returned, or everything if the scan ended early.
  const size_t per = per_thread_;
  for (size_t kid = size_t(op.tid) * per; kid < size_t(op.tid + 1) * per; ++kid) {
    if (!state[kid] || less(keys_[kid], start)) continue;
    if (recs.size() == kScanCount && less(recs.back().first, keys_[kid])) continue;
    bool seen = false;
    for (auto& r : recs) seen |= r.first == keys_[kid];
    if (!seen) return "scan missed key #" + std::to_string(kid) + " (version " + std::to_string(state[kid]) + ")";
  }
  return "";
}

uint32_t Workload::After(const Op& op, Status::Code result, uint32_t before) {
  if (result != Status::Code::kOk) return before;
  switch (op.type) {
    case OpType::kInsert:
    case OpType::kUpdate:
    case OpType::kUpsert: return op.version;
    case OpType::kRemove: return 0;
    default: return before;
  }
}

std::string Workload::CheckResult(const Op& op, Status::Code result, uint32_t before, const std::string& got) const {
  Status::Code want = Status::Code::kOk;
  switch (op.type) {
    case OpType::kInsert: want = before ? Status::Code::kAlreadyExists : Status::Code::kOk; break;
    case OpType::kUpdate:
    case OpType::kRemove:
    case OpType::kFind: want = before ? Status::Code::kOk : Status::Code::kNotFound; break;
    case OpType::kScan:
      if (result == Status::Code::kUnsupported) return "";
      break;
    default: break;
  }
  if (result != want)
    return std::string(OpName(op.type)) + " returned " + Status::CodeName(result) + ", expected " + Status::CodeName(want);
  if (op.type == OpType::kFind && before) {
    int64_t v = Decode(op.kid, got);
    if (v != int64_t(before))
      return "find returned " + (v < 0 ? std::string("a torn value") : "version " + std::to_string(v)) +
             ", expected version " + std::to_string(before);
  }
  return "";
}

}  // namespace pmcheck
