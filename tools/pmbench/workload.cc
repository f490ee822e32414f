// workload.cc: key and operation generation for pmbench (see workload.h for
// the design and how it follows / corrects PiBench, section 4 and 5.3 of
// pibench-evaluation-vldb20.md). Nothing here touches PM.
// Thread-safety: each worker thread owns its ThreadKeys, Rng and
// RankGenerator; KeyCodec is read-only once built.
#include "workload.h"

#include <algorithm>
#include <cctype>

#include "pmindex/options.h"

namespace pmbench {

const char* OpName(OpType t) {
  switch (t) {
    case OpType::kRead: return "read";
    case OpType::kInsert: return "insert";
    case OpType::kUpdate: return "update";
    case OpType::kRemove: return "remove";
    case OpType::kScan: return "scan";
  }
  return "?";
}

const char* DistributionName(Distribution d) {
  switch (d) {
    case Distribution::kUniform: return "UNIFORM";
    case Distribution::kSelfSimilar: return "SELFSIMILAR";
    case Distribution::kZipfian: return "ZIPFIAN";
  }
  return "?";
}

bool ParseDistribution(const std::string& s, Distribution* d) {
  std::string u;
  for (char c : s) u += char(std::toupper(static_cast<unsigned char>(c)));
  if (u == "UNIFORM") *d = Distribution::kUniform;
  else if (u == "SELFSIMILAR" || u == "SELF_SIMILAR") *d = Distribution::kSelfSimilar;
  else if (u == "ZIPFIAN" || u == "ZIPF") *d = Distribution::kZipfian;
  else return false;
  return true;
}

Status ValidateRatios(const Ratios& r) {
  double sum = 0;
  for (int i = 0; i < kNumOpTypes; i++) {
    if (!(r.r[i] >= 0 && r.r[i] <= 1))
      return Status::InvalidArgument(std::string(OpName(OpType(i))) + " ratio " + std::to_string(r.r[i]) + " is not in [0, 1]");
    sum += r.r[i];
  }
  if (std::fabs(sum - 1.0) > 1e-6)
    return Status::InvalidArgument("read/insert/update/remove/scan ratios (-r -i -u -d -s) sum to " + std::to_string(sum) +
                                   ", not 1");
  return Status::OK();
}

uint64_t UnscatterKey(uint64_t key) {
  // Inverse of an odd number mod 2^64 by Newton's iteration (each step
  // doubles the number of correct low bits; 3 correct bits to start).
  uint64_t inv = kHashMul;
  for (int i = 0; i < 5; i++) inv *= 2 - kHashMul * inv;
  return key * inv;
}

Status KeyCodec::Validate(size_t key_size, const std::string& prefix, size_t value_size) {
  if (key_size == 0 || key_size > pmindex::kMaxKeySize)
    return Status::InvalidArgument("key size (-k) " + std::to_string(key_size) + " is not in [1, " +
                                   std::to_string(pmindex::kMaxKeySize) + "]");
  if (key_size == 8 && !prefix.empty())
    return Status::InvalidArgument("a key prefix (-f) needs byte keys: use -k of at least " + std::to_string(prefix.size() + 9) +
                                   " (8 is the u64 key size)");
  if (key_size != 8 && key_size < prefix.size() + 8)
    return Status::InvalidArgument("byte keys need at least 8 bytes after the prefix: -k " + std::to_string(key_size) +
                                   " with a " + std::to_string(prefix.size()) + "-byte prefix is too short");
  if (value_size == 0 || value_size > pmindex::kMaxValueSize)
    return Status::InvalidArgument("value size (-v) " + std::to_string(value_size) + " is not in [1, " +
                                   std::to_string(pmindex::kMaxValueSize) + "]");
  return Status::OK();
}

KeyCodec::KeyCodec(size_t key_size, std::string prefix, size_t value_size)
    : key_size_(key_size), value_size_(value_size), prefix_(std::move(prefix)) {}

void KeyCodec::EncodeKey(uint64_t id, char* out) const {
  uint64_t h = ScatterId(id);
  if (key_size_ == 8) {
    std::memcpy(out, &h, 8);
    return;
  }
  std::memcpy(out, prefix_.data(), prefix_.size());
  char* p = out + prefix_.size();
  for (int i = 0; i < 8; i++) p[i] = char(h >> (56 - 8 * i));
  size_t rest = key_size_ - prefix_.size() - 8;
  if (rest) std::memset(p + 8, 0, rest);
}

uint64_t KeyCodec::DecodeKey(const char* key) const {
  uint64_t h = 0;
  if (key_size_ == 8) {
    std::memcpy(&h, key, 8);
  } else {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(key) + prefix_.size();
    for (int i = 0; i < 8; i++) h = (h << 8) | p[i];
  }
  return UnscatterKey(h);
}

void KeyCodec::EncodeValue(uint64_t id, uint64_t version, char* out) const {
  uint64_t v = ScatterId(id ^ (version << 40)) ^ version;
  if (value_size_ == 8) {
    std::memcpy(out, &v, 8);
    return;
  }
  for (size_t i = 0; i < value_size_; i += 8) {
    size_t n = std::min<size_t>(8, value_size_ - i);
    std::memcpy(out + i, &v, n);
    v = v * kHashMul + 1;
  }
}

static uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed;
  uint64_t h = SplitMix(x);
  x = h ^ (a * 0xD6E8FEB86659FD93ull);
  h = SplitMix(x);
  x = h ^ (b * 0xA0761D6478BD642Full);
  return SplitMix(x);
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = SplitMix(x);
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t v, int k) { return (v << k) | (v >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Status RankGenerator::Validate(Distribution d, double skew) {
  if (d == Distribution::kSelfSimilar && !(skew > 0 && skew <= 0.5))
    return Status::InvalidArgument("SELFSIMILAR skew " + std::to_string(skew) +
                                   " is not in (0, 0.5] (0.2: 80% of accesses on 20% of the keys)");
  if (d == Distribution::kZipfian && !(skew > 0 && skew < 1))
    return Status::InvalidArgument("ZIPFIAN skew (theta) " + std::to_string(skew) + " is not in (0, 1)");
  return Status::OK();
}

// zeta(n, theta) = sum_{i=1..n} i^-theta: exact up to 2^20 terms, then the
// Euler-Maclaurin midpoint integral (relative error far below 1e-9 there).
static double Zeta(uint64_t n, double theta) {
  const uint64_t exact = std::min<uint64_t>(n, 1u << 20);
  double z = 0;
  for (uint64_t i = 1; i <= exact; i++) z += std::pow(double(i), -theta);
  if (n > exact)
    z += (std::pow(double(n) + 0.5, 1 - theta) - std::pow(double(exact) + 0.5, 1 - theta)) / (1 - theta);
  return z;
}

void RankGenerator::Prepare(uint64_t n) {
  if (dist_ != Distribution::kZipfian || n == 0 || n == zn_) return;
  zn_ = n;
  const double theta = skew_;
  zetan_ = Zeta(n, theta);
  const double zeta2 = 1 + std::pow(0.5, theta);
  alpha_ = 1 / (1 - theta);
  eta_ = (1 - std::pow(2.0 / double(n), 1 - theta)) / (1 - zeta2 / zetan_);
  half_pow_theta_ = std::pow(0.5, theta);
}

uint64_t RankGenerator::Next(Rng& rng, uint64_t n) const {
  if (n <= 1) return 0;
  uint64_t r = 0;
  switch (dist_) {
    case Distribution::kUniform:
      return rng.Below(n);
    case Distribution::kSelfSimilar: {
      double u = rng.NextDouble();
      r = uint64_t(double(n) * std::pow(u, std::log(skew_) / std::log(1 - skew_)));
      break;
    }
    case Distribution::kZipfian: {
      uint64_t zn = zn_ ? zn_ : n;
      double u = rng.NextDouble();
      double uz = u * zetan_;
      if (uz < 1) r = 0;
      else if (uz < 1 + half_pow_theta_) r = 1;
      else r = uint64_t(double(zn) * std::pow(eta_ * u - eta_ + 1, alpha_));
      if (r >= zn) r = zn - 1;
      break;
    }
  }
  return r < n ? r : r % n;
}

ThreadKeys::ThreadKeys(int t, int tn, uint64_t n) : thread(t), threads(tn), records(n) {
  live.reserve(n / uint64_t(tn) + 1);
  for (uint64_t id = uint64_t(t); id < n; id += uint64_t(tn)) live.push_back(id);
}

OpStream::OpStream(ThreadKeys* keys, const Ratios& ratios, const RankGenerator* ranks, uint64_t seed)
    : keys_(keys), ranks_(ranks), rng_(seed) {
  double c = 0;
  for (int i = 0; i < kNumOpTypes; i++) cum_[i] = (c += ratios.r[i]);
  // The last used type takes any rounding slack.
  for (int i = kNumOpTypes - 1; i >= 0; i--)
    if (ratios.r[i] > 0) {
      for (int j = i; j < kNumOpTypes; j++) cum_[j] = 2.0;
      break;
    }
}

bool OpStream::Next(Op* op) {
  double u = rng_.NextDouble();
  int t = 0;
  while (t < kNumOpTypes - 1 && u >= cum_[t]) t++;
  op->type = OpType(t);
  auto& live = keys_->live;
  if (op->type == OpType::kInsert) {
    op->id = keys_->NextInsertId();
    live.push_back(op->id);
    return true;
  }
  if (live.empty()) return false;
  uint64_t rank = ranks_->Next(rng_, live.size());
  op->id = live[rank];
  if (op->type == OpType::kRemove) {
    live[rank] = live.back();
    live.pop_back();
  }
  return true;
}

}  // namespace pmbench
