// workload.h: pmbench's key and operation generation (PiBench methodology,
// pibench-evaluation-vldb20.md section 4 and 5.3).
//
// Keys. A record is named by an integer id. Ids are turned into keys by
// multiplicative hashing (Knuth 6.4): key = id * A mod 2^64 with A odd, a
// bijection on 64 bits, so distinct ids give distinct keys scattered over the
// whole domain (hot ids do not cluster). 8-byte keys are that uint64 in native
// byte order; longer keys are <prefix><8 bytes of the hash, big-endian><zero
// padding>, so memcmp order equals the hash's numeric order.
//
// Ownership (this is where we deliberately differ from PiBench's code, which
// restarts run-phase insert ids inside the loaded range with >1 thread and
// draws removes with replacement): with T threads, thread t owns the loaded
// ids {i < n : i mod T == t} and inserts only fresh ids n + t + k*T (k = 0, 1,
// ...), which no other thread ever generates. Each thread keeps the ids it
// owns that are live in a vector `live`; reads, updates, scans and removes
// pick a rank from the distribution over [0, live.size()) and act on
// live[rank]. A remove swaps the last live id into the removed slot, so it
// never picks an id twice. Consequences (also in docs/pmbench.md):
//  * every insert targets a new key and every remove an existing key, so
//    both always succeed on a correct index, whatever the thread count;
//  * reads, updates and scans only ever target live keys (they never see a
//    key removed earlier), so on a correct index they succeed too;
//  * threads touch disjoint key sets (keys interleave in the key space, so
//    threads still contend for the same nodes, but never for one record);
//  * the skew is over ranks: rank r of thread t starts as id t + r*T, so the
//    hot set is the small loaded ids of every thread. Newly inserted ids get
//    the highest ranks (cold); a remove moves the last (coldest) id into the
//    freed rank.
// Everything is a function of (seed, thread count, phase number): the same
// options give the same operations, key for key.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pmindex/status.h"

namespace pmbench {

using pmindex::Status;

enum class OpType : uint8_t { kRead = 0, kInsert, kUpdate, kRemove, kScan };
inline constexpr int kNumOpTypes = 5;
const char* OpName(OpType t);  // "read", "insert", "update", "remove", "scan"

enum class Distribution : uint8_t { kUniform, kSelfSimilar, kZipfian };
const char* DistributionName(Distribution d);
bool ParseDistribution(const std::string& s, Distribution* d);  // case-insensitive

struct Ratios {
  double r[kNumOpTypes] = {1, 0, 0, 0, 0};  // indexed by OpType
  double& operator[](OpType t) { return r[int(t)]; }
  double operator[](OpType t) const { return r[int(t)]; }
};
// InvalidArgument unless every ratio is in [0,1] and they sum to 1 (+-1e-6).
Status ValidateRatios(const Ratios& r);

// Multiplicative hashing: a bijection on 64-bit integers.
inline constexpr uint64_t kHashMul = 0x9E3779B97F4A7C15ull;  // odd
inline constexpr uint64_t ScatterId(uint64_t id) { return id * kHashMul; }
uint64_t UnscatterKey(uint64_t key);  // inverse (multiplies by A^-1 mod 2^64)

// Builds key and value bytes for ids.
class KeyCodec {
 public:
  // InvalidArgument: key_size 0 or > 1024; a prefix with 8-byte keys; fewer
  // than 8 bytes left after the prefix; value_size 0 or > 4096.
  static Status Validate(size_t key_size, const std::string& prefix, size_t value_size);
  KeyCodec(size_t key_size, std::string prefix, size_t value_size);

  size_t key_size() const { return key_size_; }
  size_t value_size() const { return value_size_; }
  bool u64_keys() const { return key_size_ == 8; }
  // Writes key_size() bytes.
  void EncodeKey(uint64_t id, char* out) const;
  // The id of a key made by EncodeKey.
  uint64_t DecodeKey(const char* key) const;
  // Writes value_size() bytes derived from (id, version).
  void EncodeValue(uint64_t id, uint64_t version, char* out) const;

 private:
  size_t key_size_, value_size_;
  std::string prefix_;
};

// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double NextDouble() { return double(Next() >> 11) * 0x1.0p-53; }  // [0,1)
  uint64_t Below(uint64_t n) { return n ? uint64_t((unsigned __int128)Next() * n >> 64) : 0; }

 private:
  uint64_t s_[4];
};
uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b);

// Draws ranks in [0, n) from a distribution (Gray et al., "Quickly
// generating billion-record synthetic databases", SIGMOD'94): small ranks are
// hot. SELFSIMILAR with skew h puts a fraction 1-h of draws on the first h*n
// ranks; ZIPFIAN with skew theta in (0,1) is Gray's zipf generator.
class RankGenerator {
 public:
  // InvalidArgument for a skew outside (0, 0.5] (SELFSIMILAR) or (0, 1)
  // (ZIPFIAN); UNIFORM ignores skew.
  static Status Validate(Distribution d, double skew);
  RankGenerator(Distribution d, double skew) : dist_(d), skew_(skew) {}
  // Zipfian's constants depend on n: computed here for the phase's starting
  // size; later draws with a smaller current n wrap modulo n.
  void Prepare(uint64_t n);
  uint64_t Next(Rng& rng, uint64_t n) const;

 private:
  Distribution dist_;
  double skew_;
  uint64_t zn_ = 0;
  double zetan_ = 0, alpha_ = 0, eta_ = 0, half_pow_theta_ = 0;
};

// The ids one thread owns (see the header comment).
struct ThreadKeys {
  ThreadKeys(int thread, int threads, uint64_t records);
  int thread, threads;
  uint64_t records;
  uint64_t inserted = 0;       // fresh ids handed out so far
  std::vector<uint64_t> live;  // live ids, rank order

  uint64_t NextInsertId() { return records + uint64_t(thread) + (inserted++) * uint64_t(threads); }
};

struct Op {
  OpType type;
  uint64_t id;
};

// One thread's operation stream for one phase.
class OpStream {
 public:
  OpStream(ThreadKeys* keys, const Ratios& ratios, const RankGenerator* ranks, uint64_t seed);
  // Picks the next operation and updates the live set (an insert's id is
  // appended, a remove's id taken out). Returns false, leaving the live set
  // untouched, when the operation needs an existing key and the thread owns
  // none (only possible when removes outnumber live keys).
  bool Next(Op* op);

 private:
  ThreadKeys* keys_;
  double cum_[kNumOpTypes];
  const RankGenerator* ranks_;
  Rng rng_;
};

}  // namespace pmbench
