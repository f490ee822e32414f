// The crash-safe PM allocator (include/pmindex/pm/allocator.h, docs/allocator.md).
//
// Follows FPTree (SIGMOD'16) section 2, "persistent memory leaks": allocation
// into a persistent destination whose store is the commit point, with a
// per-thread micro-log (lane) that recovery replays. PiBench (VLDB'20)
// section 5.8 shows allocation is a first-order cost, hence thread-local runs.
//
// PM structures:
//   lane (one cache line per thread): {op, block, dest, arg}; op is written
//     last, so a durable op implies durable fields (stores to one line
//     persist in program order).
//   chunk header (first 8 bytes of each 256 KiB chunk): FREE (0), RUN(class)
//     or LARGE(span). A LARGE block spans whole chunks; the header lines of
//     its later chunks are user data and are never interpreted.
//   run bitmap (after the run's header line): one bit per block, 1 = in use.
//
// Invariants (when no operation is in flight):
//   * a block is in use iff its bitmap bit is set (RUN) / its head is LARGE;
//   * every in-use block is referenced by exactly one persistent word (the
//     caller's contract), and every lane is idle (op == 0).
//   * DRAM: vbits ⊇ PM bitmap (a freed block is republished to vbits only
//     after the freeing thread's next fence, see Free).
//
// Persist ordering:
//   Allocate: lane{ALLOC}, Persist | bit |= m, *dest = block, Flush both,
//     Fence | lane.op = 0, Flush (no fence: the thread's next fence orders it).
//   Free: lane{FREE}, Persist | *dest = 0, bit &= ~m, Flush both, Fence |
//     lane.op = 0 (not flushed); the block becomes reusable only once the
//     lane was overwritten durably (the next Allocate/Free of this thread) or
//     flushed and fenced (thread exit, Reclaim, Close).
//   Recovery: ALLOC lane: *dest == block ? set bit : clear bit. FREE lane:
//     *dest == block ? *dest = 0 : -; clear bit. Then lane.op = 0; Persist.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pm/layout.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/fault.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace pmindex::pm {

namespace {

constexpr uint64_t C = Allocator::kChunkSize;

// ---- size classes --------------------------------------------------------
constexpr uint32_t kClassSizes[] = {16,   32,   48,   64,   128,  192,   256,   320,   384,   448,   512,   640,
                                    768,  896,  1024, 1280, 1536, 1792,  2048,  2560,  3072,  3584,  4096,  5120,
                                    6144, 7168, 8192, 10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768};
constexpr int kNumClasses = int(sizeof(kClassSizes) / sizeof(kClassSizes[0]));
static_assert(kClassSizes[kNumClasses - 1] == Allocator::kMaxRunBlock);

struct ClassGeom {
  uint32_t size = 0, nblocks = 0, nwords = 0, blocks_start = 0;  // blocks_start: offset inside the chunk
};

struct ClassTable {
  ClassGeom geom[kNumClasses];
  uint8_t by16[Allocator::kMaxRunBlock / 16 + 1];  // (size+15)/16 -> class
  ClassTable() {
    for (int c = 0; c < kNumClasses; c++) {
      ClassGeom& g = geom[c];
      g.size = kClassSizes[c];
      uint32_t n = uint32_t((C - 64) / g.size);
      for (;; n--) {
        uint32_t words = (n + 63) / 64;
        uint32_t start = uint32_t(64 + ((words * 8 + 63) / 64) * 64);
        if (start + uint64_t(n) * g.size <= C) {
          g.nblocks = n;
          g.nwords = words;
          g.blocks_start = start;
          break;
        }
      }
    }
    int c = 0;
    for (uint32_t i = 0; i <= Allocator::kMaxRunBlock / 16; i++) {
      while (kClassSizes[c] < i * 16) c++;
      by16[i] = uint8_t(c);
    }
  }
};
const ClassTable& Classes() {
  static const ClassTable t;
  return t;
}
inline int ClassOf(size_t size) { return Classes().by16[(size + 15) / 16]; }

// ---- chunk header states ---------------------------------------------------
constexpr uint64_t kStateFree = 0;
constexpr uint64_t kKindRun = 0x52ull << 56;    // 'R'
constexpr uint64_t kKindLarge = 0x4Cull << 56;  // 'L'
constexpr uint64_t kStateTag = 0xA5ull << 48;
constexpr uint64_t kKindMask = 0xFFFFull << 48;
inline uint64_t RunState(int cls) { return kKindRun | kStateTag | uint64_t(cls); }
inline uint64_t LargeState(uint64_t span) { return kKindLarge | kStateTag | span; }
inline bool IsRunState(uint64_t s) { return (s & kKindMask) == (kKindRun | kStateTag) && (s & 0xFFFFFFFFFFFFull) < uint64_t(kNumClasses); }
inline bool IsLargeState(uint64_t s) { return (s & kKindMask) == (kKindLarge | kStateTag) && (s & 0xFFFFFFFFFFFFull) >= 1; }
inline uint64_t StateArg(uint64_t s) { return s & 0xFFFFFFFFFFFFull; }

// ---- lanes -----------------------------------------------------------------
constexpr uint64_t kOpIdle = 0;
constexpr uint64_t kOpAlloc = 0x414C4C4F43A5A501ull;  // "ALLOC"
constexpr uint64_t kOpFree = 0x46524545A5A5A502ull;   // "FREE"
constexpr uint64_t kArgLarge = 1ull << 63;              // arg = kArgLarge | span, else class

struct alignas(64) Lane {
  uint64_t op;
  uint64_t block;
  uint64_t dest;
  uint64_t arg;
  uint64_t pad[4];
};
static_assert(sizeof(Lane) == layout::kLaneSize);

// ---- DRAM state ------------------------------------------------------------
enum ChunkKind : uint8_t { kFreeChunk = 0, kRunChunk, kLargeHead, kLargeInterior };

struct ThreadCache;

struct Run {
  uint64_t chunk = 0;
  int cls = 0;
  uint32_t nblocks = 0, nwords = 0, bsize = 0;
  uint64_t blocks_off = 0;  // pool offset of block 0
  uint64_t bitmap_off = 0;  // pool offset of the PM bitmap
  std::atomic<int64_t> free_count{0};
  std::atomic<ThreadCache*> owner{nullptr};
  bool in_list = false;  // guarded by the class mutex
  uint32_t hint = 0;     // owner only
  std::unique_ptr<std::atomic<uint64_t>[]> vbits;
};

struct ChunkSlot {
  std::atomic<uint8_t> kind{kFreeChunk};
  std::atomic<Run*> run{nullptr};    // kRunChunk
  std::atomic<uint64_t> span{0};      // kLargeHead: chunks in the block
};
constexpr uint64_t kSegChunks = 4096;

class PoolAllocator;

struct ThreadCache {
  PoolAllocator* alloc = nullptr;
  uint32_t lane_idx = 0;
  Lane* lane = nullptr;
  Run* cur[kNumClasses] = {};
  uint64_t pending = 0;  // a freed block to republish after the next fence
};

// Process-wide registry of live allocators, keyed by pool instance id, so a
// thread's exit can tell whether the pool it used is still open.
std::mutex& RegistryMu() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<uint64_t, PoolAllocator*>& Registry() {
  static auto* r = new std::unordered_map<uint64_t, PoolAllocator*>;
  return *r;
}

struct TlsCaches {
  uint64_t last_id = 0;
  ThreadCache* last = nullptr;
  std::vector<std::pair<uint64_t, ThreadCache*>> all;
  ~TlsCaches();
};
thread_local TlsCaches tls_caches;
// Set by ~TlsCaches. A thread_local constructed before tls_caches is
// destroyed after it, and its destructor may still allocate or free (an
// index operation run at thread exit). tls_caches must not be touched then:
// such operations take an "orphan" cache, released when the operation ends.
// Trivially destructible, so it stays readable until the thread is gone.
thread_local bool tls_caches_gone = false;

class PoolAllocator final : public Allocator {
 public:
  PoolAllocator(Pool* pool, bool read_only);
  ~PoolAllocator() override;

  Status Init(bool fresh);
  void Shutdown();
  void ReleaseCache(ThreadCache* tc);  // registry mutex held

  Status Allocate(uint64_t* dest, size_t size) override { return AllocateImpl(dest, size, false); }
  Status AllocateZeroed(uint64_t* dest, size_t size) override { return AllocateImpl(dest, size, true); }
  void Free(uint64_t* dest) override;
  size_t UsableSize(uint64_t off) const override;
  bool IsAllocated(uint64_t off) const override;
  uint64_t BytesInUse() const override { return bytes_.load(std::memory_order_relaxed); }
  uint64_t BlocksInUse() const override { return blocks_.load(std::memory_order_relaxed); }
  void ForEachAllocated(const std::function<void(uint64_t off, size_t size)>& fn) const override;
  Status Check() const override;

 private:
  Status AllocateImpl(uint64_t* dest, size_t size, bool zero);
  Status AllocLarge(ThreadCache* tc, uint64_t* dest, size_t size, bool zero);
  // This thread's cache for this pool. *orphan is set when the thread's
  // cache table is already destroyed (thread exit): the caller must then
  // release the cache with OrphanGuard when its operation ends.
  Status GetCache(ThreadCache** out, bool* orphan);
  Status NewCache(ThreadCache** out);  // registry mutex held
  struct OrphanGuard {
    PoolAllocator* a;
    ThreadCache* tc;
    ~OrphanGuard() {
      if (!tc) return;
      std::lock_guard<std::mutex> g(RegistryMu());
      a->ReleaseCache(tc);
    }
  };
  bool TakeBlock(Run* r, uint32_t* idx);
  Status Refill(ThreadCache* tc, int cls, Run** out);
  bool TakePartialRun(ThreadCache* tc, int cls, Run** out);
  void ReleaseRun(ThreadCache* tc, Run* r);
  void Reclaim(ThreadCache* tc);  // no locks held
  Status NewChunks(uint64_t span, uint64_t* first);  // heap_mu_ held
  void SyncChunkCount();                             // heap_mu_ held
  Run* MakeRun(uint64_t chunk, int cls, bool from_pm);
  void Publish(ThreadCache* tc, uint64_t off);
  void PublishPending(ThreadCache* tc) {
    if (tc->pending) {
      uint64_t off = tc->pending;
      tc->pending = 0;
      Publish(tc, off);
    }
  }
  Status Recover();
  Status ReplayLane(uint32_t i, bool alloc_pass);
  Status Scan();
  Status ValidateChunks(uint64_t* bytes, uint64_t* blocks,
                        const std::function<void(uint64_t, size_t)>* fn) const;

  uint64_t* State(uint64_t chunk) const { return reinterpret_cast<uint64_t*>(base_ + layout::kHeapOffset + chunk * C); }
  // Marks the `span` chunks of a large block free: the continuation chunks
  // first, the head last (the order Free and the lane replay always used).
  // Flushes without a fence: the caller fences.
  void StoreSpanFree(uint64_t chunk, uint64_t span) const {
    for (uint64_t i = 1; i < span; i++) {
      StoreAtomic(State(chunk + i), kStateFree);
      Flush(State(chunk + i), 8);
    }
    StoreAtomic(State(chunk), kStateFree);
    Flush(State(chunk), 8);
  }
  uint64_t ChunkOff(uint64_t chunk) const { return layout::kHeapOffset + chunk * C; }
  Lane* LaneAt(uint32_t i) const { return reinterpret_cast<Lane*>(base_ + layout::kLanesOffset + i * layout::kLaneSize); }
  ChunkSlot& Slot(uint64_t chunk) const { return segs_[chunk / kSegChunks][chunk % kSegChunks]; }
  uint64_t NumChunks() const { return nchunks_.load(std::memory_order_acquire); }
  bool DestOk(const uint64_t* dest) const {
    auto p = reinterpret_cast<const char*>(dest);
    if (p < base_ || (reinterpret_cast<uintptr_t>(p) & 7) != 0) return false;
    uint64_t off = uint64_t(p - base_);
    return off == layout::kRootSlotOffset || layout::InPmwcasRegion(off) || (off >= layout::kHeapOffset && off + 8 <= pool_->size());
  }

  Pool* pool_;
  char* base_;
  bool ro_;
  uint64_t id_;
  uint64_t max_chunks_;
  std::atomic<uint64_t> nchunks_{0};
  std::unique_ptr<std::unique_ptr<ChunkSlot[]>[]> segs_;
  uint64_t nsegs_ = 0;

  std::mutex heap_mu_;
  std::vector<uint8_t> chunk_free_;  // heap_mu_
  uint64_t free_hint_ = 0;           // heap_mu_

  struct ClassState {
    std::mutex mu;
    std::vector<Run*> partial;
  };
  ClassState classes_[kNumClasses];

  std::atomic<uint64_t> bytes_{0}, blocks_{0};

  std::mutex caches_mu_;
  std::vector<bool> lane_used_;
  std::vector<std::unique_ptr<ThreadCache>> caches_;
  bool shut_down_ = false;
};

TlsCaches::~TlsCaches() {
  std::lock_guard<std::mutex> g(RegistryMu());
  for (auto& [id, tc] : all) {
    auto it = Registry().find(id);
    if (it != Registry().end()) it->second->ReleaseCache(tc);
  }
  all.clear();
  last = nullptr;
  last_id = 0;
  tls_caches_gone = true;
}

PoolAllocator::PoolAllocator(Pool* pool, bool read_only)
    : pool_(pool), base_(pool->base()), ro_(read_only), id_(pool->instance_id()) {
  max_chunks_ = (pool->max_size() - layout::kHeapOffset) / C;
  nsegs_ = (max_chunks_ + kSegChunks - 1) / kSegChunks;
  segs_.reset(new std::unique_ptr<ChunkSlot[]>[nsegs_]);
  lane_used_.assign(layout::kLaneCount, false);
}

PoolAllocator::~PoolAllocator() {
  Shutdown();
  for (uint64_t i = 0; i < NumChunks(); i++) {
    if (Slot(i).kind.load(std::memory_order_relaxed) == kRunChunk) delete Slot(i).run.load(std::memory_order_relaxed);
  }
}

void PoolAllocator::Shutdown() {
  std::lock_guard<std::mutex> g(RegistryMu());
  if (shut_down_) return;
  shut_down_ = true;
  Registry().erase(id_);
  // Other threads' last lane clears were flushed but maybe not fenced: flush
  // the lanes in use again from here and fence.
  std::lock_guard<std::mutex> c(caches_mu_);
  if (!ro_) {
    for (auto& tc : caches_)
      if (tc) Flush(tc->lane, sizeof(Lane));
    Fence();
  }
  caches_.clear();
}

void PoolAllocator::SyncChunkCount() {
  const uint64_t n = (pool_->size() - layout::kHeapOffset) / C;
  const uint64_t old = NumChunks();
  if (n <= old) return;
  for (uint64_t s = old / kSegChunks; s <= (n - 1) / kSegChunks; s++)
    if (!segs_[s]) segs_[s].reset(new ChunkSlot[kSegChunks]);
  chunk_free_.resize(n, 1);
  nchunks_.store(n, std::memory_order_release);
}

Status PoolAllocator::Init(bool fresh) {
  {
    std::lock_guard<std::mutex> g(heap_mu_);
    SyncChunkCount();
  }
  if (!fresh) PMINDEX_RETURN_IF_ERROR(Recover());
  std::lock_guard<std::mutex> g(RegistryMu());
  Registry()[id_] = this;
  return Status::OK();
}

// ---- thread caches ---------------------------------------------------------

Status PoolAllocator::GetCache(ThreadCache** out, bool* orphan) {
  *orphan = false;
  if (__builtin_expect(tls_caches_gone, 0)) {
    std::lock_guard<std::mutex> rg(RegistryMu());
    PMINDEX_RETURN_IF_ERROR(NewCache(out));
    *orphan = true;
    return Status::OK();
  }
  TlsCaches& t = tls_caches;
  if (t.last_id == id_) {
    *out = t.last;
    return Status::OK();
  }
  for (auto& [id, tc] : t.all) {
    if (id == id_) {
      t.last_id = id;
      t.last = tc;
      *out = tc;
      return Status::OK();
    }
  }
  std::lock_guard<std::mutex> rg(RegistryMu());
  // Drop entries of pools closed meanwhile.
  t.all.erase(std::remove_if(t.all.begin(), t.all.end(),
                             [](const std::pair<uint64_t, ThreadCache*>& e) { return !Registry().count(e.first); }),
              t.all.end());
  ThreadCache* raw;
  PMINDEX_RETURN_IF_ERROR(NewCache(&raw));
  t.all.emplace_back(id_, raw);
  t.last_id = id_;
  t.last = raw;
  *out = raw;
  return Status::OK();
}

Status PoolAllocator::NewCache(ThreadCache** out) {
  std::lock_guard<std::mutex> g(caches_mu_);
  uint32_t lane = 0;
  while (lane < layout::kLaneCount && lane_used_[lane]) lane++;
  if (lane == layout::kLaneCount)
    return Status::Busy("all " + std::to_string(layout::kLaneCount) + " allocator lanes of pool " + pool_->path() +
                        " are in use (too many threads)");
  lane_used_[lane] = true;
  auto tc = std::make_unique<ThreadCache>();
  tc->alloc = this;
  tc->lane_idx = lane;
  tc->lane = LaneAt(lane);
  *out = tc.get();
  caches_.push_back(std::move(tc));
  return Status::OK();
}

void PoolAllocator::ReleaseCache(ThreadCache* tc) {
  if (!ro_) {
    Flush(tc->lane, sizeof(Lane));
    Fence();  // this thread's last lane clear is durable: republishing is safe
    PublishPending(tc);
  }
  for (int c = 0; c < kNumClasses; c++) {
    if (tc->cur[c]) ReleaseRun(tc, tc->cur[c]);
    tc->cur[c] = nullptr;
  }
  std::lock_guard<std::mutex> g(caches_mu_);
  lane_used_[tc->lane_idx] = false;
  for (auto& p : caches_) {
    if (p.get() == tc) {
      p = std::move(caches_.back());
      caches_.pop_back();
      break;
    }
  }
}

// ---- runs and chunks -------------------------------------------------------

bool PoolAllocator::TakeBlock(Run* r, uint32_t* idx) {
  if (r->free_count.load(std::memory_order_relaxed) <= 0) return false;
  for (uint32_t n = 0; n < r->nwords; n++) {
    uint32_t w = r->hint + n;
    if (w >= r->nwords) w -= r->nwords;
    uint64_t v = r->vbits[w].load(std::memory_order_relaxed);
    while (v != ~0ull) {
      int b = __builtin_ctzll(~v);
      uint64_t m = 1ull << b;
      uint64_t old = r->vbits[w].fetch_or(m, std::memory_order_acq_rel);
      if (!(old & m)) {
        r->free_count.fetch_sub(1, std::memory_order_relaxed);
        r->hint = w;
        *idx = w * 64 + uint32_t(b);
        return true;
      }
      v = old | m;
    }
  }
  return false;
}

Run* PoolAllocator::MakeRun(uint64_t chunk, int cls, bool from_pm) {
  const ClassGeom& g = Classes().geom[cls];
  Run* r = new Run;
  r->chunk = chunk;
  r->cls = cls;
  r->nblocks = g.nblocks;
  r->nwords = g.nwords;
  r->bsize = g.size;
  r->blocks_off = ChunkOff(chunk) + g.blocks_start;
  r->bitmap_off = ChunkOff(chunk) + 64;
  r->vbits.reset(new std::atomic<uint64_t>[g.nwords]);
  const uint64_t* pmbits = reinterpret_cast<const uint64_t*>(base_ + r->bitmap_off);
  int64_t used = 0;
  for (uint32_t w = 0; w < g.nwords; w++) {
    uint64_t v = from_pm ? __atomic_load_n(&pmbits[w], __ATOMIC_ACQUIRE) : 0;
    used += __builtin_popcountll(v);
    // Bits past the last block are permanently "in use" in DRAM.
    if (w == g.nwords - 1 && g.nblocks % 64) v |= ~0ull << (g.nblocks % 64);
    r->vbits[w].store(v, std::memory_order_relaxed);
  }
  r->free_count.store(int64_t(g.nblocks) - used, std::memory_order_relaxed);
  return r;
}

// Finds `span` contiguous free chunks, growing the pool if needed.
Status PoolAllocator::NewChunks(uint64_t span, uint64_t* first) {
  for (int attempt = 0; attempt < 2; attempt++) {
    SyncChunkCount();  // the pool may also have been grown through Pool::Grow
    const uint64_t n = NumChunks();
    if (span == 1) {
      for (uint64_t k = 0; k < n; k++) {
        uint64_t i = (free_hint_ + k) % n;
        if (chunk_free_[i]) {
          chunk_free_[i] = 0;
          free_hint_ = i + 1;
          *first = i;
          return Status::OK();
        }
      }
    } else {
      uint64_t run = 0;
      for (uint64_t i = 0; i < n; i++) {
        run = chunk_free_[i] ? run + 1 : 0;
        if (run == span) {
          uint64_t f = i + 1 - span;
          for (uint64_t j = f; j <= i; j++) chunk_free_[j] = 0;
          *first = f;
          return Status::OK();
        }
      }
    }
    if (attempt == 1) break;
    // Grow: the free tail counts towards the span.
    uint64_t tail = 0;
    while (tail < n && chunk_free_[n - 1 - tail]) tail++;
    const uint64_t need = span > tail ? span - tail : 1;
    uint64_t step = std::max<uint64_t>({need, 8, n / 4});
    if (n + step > max_chunks_) step = max_chunks_ - n;
    if (step < need)
      return Status::PoolFull("pool " + pool_->path() + " is full: " + std::to_string(span) +
                              " chunk(s) needed, max size " + std::to_string(pool_->max_size()) + " bytes reached");
    Status s = pool_->Grow(layout::kHeapOffset + (n + step) * C);
    if (s.IsPoolFull() || s.IsIOError()) {
      // Try the bare minimum before giving up.
      if (step > need) s = pool_->Grow(layout::kHeapOffset + (n + need) * C);
      if (!s.ok()) return Status::PoolFull("pool " + pool_->path() + " is full: " + std::string(s.message()));
    } else if (!s.ok()) {
      return s;
    }
    SyncChunkCount();
  }
  return Status::PoolFull("pool " + pool_->path() + " is full");
}

void PoolAllocator::ReleaseRun(ThreadCache* tc, Run* r) {
  ClassState& cs = classes_[r->cls];
  std::lock_guard<std::mutex> g(cs.mu);
  r->owner.store(nullptr, std::memory_order_relaxed);
  if (r->free_count.load(std::memory_order_relaxed) > 0 && !r->in_list) {
    r->in_list = true;
    cs.partial.push_back(r);
  }
}

// Pops partial runs of class cls until one with a free block is found and
// makes it tc's current run. Caller holds classes_[cls].mu.
bool PoolAllocator::TakePartialRun(ThreadCache* tc, int cls, Run** out) {
  ClassState& cs = classes_[cls];
  while (!cs.partial.empty()) {
    Run* r = cs.partial.back();
    cs.partial.pop_back();
    r->in_list = false;
    if (r->free_count.load(std::memory_order_relaxed) > 0) {
      r->owner.store(tc, std::memory_order_relaxed);
      tc->cur[cls] = r;
      *out = r;
      return true;
    }
  }
  return false;
}

Status PoolAllocator::Refill(ThreadCache* tc, int cls, Run** out) {
  if (tc->cur[cls]) {
    ReleaseRun(tc, tc->cur[cls]);
    tc->cur[cls] = nullptr;
  }
  ClassState& cs = classes_[cls];
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (TakePartialRun(tc, cls, out)) return Status::OK();
  }
  uint64_t chunk;
  for (int attempt = 0;; attempt++) {
    Status s;
    {
      std::lock_guard<std::mutex> g(heap_mu_);
      s = NewChunks(1, &chunk);
    }
    if (s.ok()) break;
    if (!s.IsPoolFull() || attempt == 1) return s;
    Reclaim(tc);
    // Reclaiming may have republished blocks of this class.
    std::lock_guard<std::mutex> g(cs.mu);
    if (TakePartialRun(tc, cls, out)) return Status::OK();
  }
  // Format: zero the bitmap, persist, then the header (the chunk is ours).
  const ClassGeom& geom = Classes().geom[cls];
  Set(base_ + ChunkOff(chunk) + 64, 0, geom.nwords * 8);
  Persist(base_ + ChunkOff(chunk) + 64, geom.nwords * 8);
  StorePersist(State(chunk), RunState(cls));
  Run* r = MakeRun(chunk, cls, false);
  r->owner.store(tc, std::memory_order_relaxed);
  Slot(chunk).run.store(r, std::memory_order_release);
  Slot(chunk).kind.store(kRunChunk, std::memory_order_release);
  tc->cur[cls] = r;
  *out = r;
  return Status::OK();
}

// Returns entirely free runs (unowned ones, and this thread's own current
// runs) to the heap, so that chunks can change size class or serve large
// blocks. Called when the pool is full.
void PoolAllocator::Reclaim(ThreadCache* tc) {
  Flush(tc->lane, sizeof(Lane));
  Fence();  // this thread's last lane clear is durable: its pending block may be reused
  PublishPending(tc);
  std::vector<Run*> freed;
  for (int c = 0; c < kNumClasses; c++) {
    ClassState& cs = classes_[c];
    std::lock_guard<std::mutex> g(cs.mu);
    Run* cur = tc->cur[c];
    if (cur && cur->free_count.load(std::memory_order_relaxed) == int64_t(cur->nblocks)) {
      cur->owner.store(nullptr, std::memory_order_relaxed);
      tc->cur[c] = nullptr;
      if (cur->in_list) {
        cs.partial.erase(std::find(cs.partial.begin(), cs.partial.end(), cur));
        cur->in_list = false;
      }
      freed.push_back(cur);
    }
    for (size_t i = 0; i < cs.partial.size();) {
      Run* r = cs.partial[i];
      if (r->owner.load(std::memory_order_relaxed) == nullptr &&
          r->free_count.load(std::memory_order_relaxed) == int64_t(r->nblocks)) {
        r->in_list = false;
        cs.partial[i] = cs.partial.back();
        cs.partial.pop_back();
        freed.push_back(r);
      } else {
        i++;
      }
    }
  }
  std::lock_guard<std::mutex> g(heap_mu_);
  for (Run* r : freed) {
    Slot(r->chunk).kind.store(kFreeChunk, std::memory_order_release);
    Slot(r->chunk).run.store(nullptr, std::memory_order_release);
    chunk_free_[r->chunk] = 1;
    delete r;
  }
}

// Makes a freed block available for reuse. Called only after a fence that
// follows the freeing operation's lane clear.
void PoolAllocator::Publish(ThreadCache* tc, uint64_t off) {
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  ChunkSlot& slot = Slot(chunk);
  if (slot.kind.load(std::memory_order_acquire) == kLargeHead) {
    std::lock_guard<std::mutex> g(heap_mu_);
    const uint64_t span = slot.span.load(std::memory_order_relaxed);
    for (uint64_t i = chunk; i < chunk + span; i++) {
      Slot(i).kind.store(kFreeChunk, std::memory_order_release);
      Slot(i).run.store(nullptr, std::memory_order_relaxed);
      chunk_free_[i] = 1;
    }
    return;
  }
  Run* r = slot.run.load(std::memory_order_acquire);
  const uint32_t idx = uint32_t((off - r->blocks_off) / r->bsize);
  r->vbits[idx / 64].fetch_and(~(1ull << (idx % 64)), std::memory_order_acq_rel);
  if (r->owner.load(std::memory_order_relaxed) == tc) {
    r->free_count.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ClassState& cs = classes_[r->cls];
  bool to_heap = false;
  {
    std::lock_guard<std::mutex> g(cs.mu);
    int64_t f = r->free_count.fetch_add(1, std::memory_order_relaxed) + 1;
    if (r->owner.load(std::memory_order_relaxed) == nullptr) {
      const size_t others = cs.partial.size() - (r->in_list ? 1 : 0);
      if (f == int64_t(r->nblocks) && others >= 1) {
        // Entirely free and not the only partial run: give the chunk back.
        if (r->in_list) cs.partial.erase(std::find(cs.partial.begin(), cs.partial.end(), r));
        to_heap = true;
      } else if (!r->in_list) {
        r->in_list = true;
        cs.partial.push_back(r);
      }
    }
  }
  if (to_heap) {
    std::lock_guard<std::mutex> g(heap_mu_);
    slot.kind.store(kFreeChunk, std::memory_order_release);
    slot.run.store(nullptr, std::memory_order_release);
    chunk_free_[chunk] = 1;
    delete r;
  }
}

// ---- allocate / free -------------------------------------------------------

Status PoolAllocator::AllocateImpl(uint64_t* dest, size_t size, bool zero) {
  if (ro_) return Status::Unsupported("pool " + pool_->path() + " is open read-only");
  if (size == 0) return Status::InvalidArgument("allocation of 0 bytes");
  if (size > kMaxAllocation)
    return Status::InvalidArgument("allocation of " + std::to_string(size) + " bytes exceeds the limit of " +
                                   std::to_string(kMaxAllocation));
  if (!DestOk(dest)) return Status::InvalidArgument("allocation destination is not an aligned word inside the pool's heap");
  ThreadCache* tc;
  bool orphan;
  PMINDEX_RETURN_IF_ERROR(GetCache(&tc, &orphan));
  OrphanGuard og{this, orphan ? tc : nullptr};
  if (size > kMaxRunBlock) return AllocLarge(tc, dest, size, zero);

  const int cls = ClassOf(size);
  Run* r = tc->cur[cls];
  uint32_t idx;
  if (!r || !TakeBlock(r, &idx)) {
    for (;;) {
      PMINDEX_RETURN_IF_ERROR(Refill(tc, cls, &r));
      if (TakeBlock(r, &idx)) break;
    }
  }
  const uint64_t off = r->blocks_off + uint64_t(idx) * r->bsize;
  if (zero) {
    Set(base_ + off, 0, r->bsize);
    Flush(base_ + off, r->bsize);  // ordered by the lane persist's fence
  }
  Lane* L = tc->lane;
  Store(&L->block, off);
  Store(&L->dest, uint64_t(reinterpret_cast<char*>(dest) - base_));
  Store(&L->arg, uint64_t(cls));
  StoreAtomic(&L->op, kOpAlloc);
  Persist(L, sizeof(Lane));
  PublishPending(tc);
  uint64_t* word = reinterpret_cast<uint64_t*>(base_ + r->bitmap_off) + idx / 64;
  FetchOr(word, uint64_t(1) << (idx % 64));
  StoreAtomic(dest, off);
  Flush(word, 8);
  Flush(dest, 8);
  Fence();
  StoreAtomic(&L->op, kOpIdle);
  Flush(L, sizeof(Lane));
  bytes_.fetch_add(r->bsize, std::memory_order_relaxed);
  blocks_.fetch_add(1, std::memory_order_relaxed);
  ThreadCounters().allocs++;
  return Status::OK();
}

Status PoolAllocator::AllocLarge(ThreadCache* tc, uint64_t* dest, size_t size, bool zero) {
  const uint64_t span = (size + 64 + C - 1) / C;
  uint64_t first;
  for (int attempt = 0;; attempt++) {
    Status s;
    {
      std::lock_guard<std::mutex> g(heap_mu_);
      s = NewChunks(span, &first);
    }
    if (s.ok()) break;
    if (!s.IsPoolFull() || attempt == 1) return s;
    Reclaim(tc);
  }
  {
    std::lock_guard<std::mutex> g(heap_mu_);
    Slot(first).span.store(span, std::memory_order_relaxed);
    Slot(first).kind.store(kLargeHead, std::memory_order_release);
    for (uint64_t i = 1; i < span; i++) Slot(first + i).kind.store(kLargeInterior, std::memory_order_release);
  }
  const uint64_t off = ChunkOff(first) + 64;
  const uint64_t usable = span * C - 64;
  if (zero) {
    Set(base_ + off, 0, usable);
    Flush(base_ + off, usable);
  }
  Lane* L = tc->lane;
  Store(&L->block, off);
  Store(&L->dest, uint64_t(reinterpret_cast<char*>(dest) - base_));
  Store(&L->arg, kArgLarge | span);
  StoreAtomic(&L->op, kOpAlloc);
  Persist(L, sizeof(Lane));
  PublishPending(tc);
  StoreAtomic(State(first), LargeState(span));
  StoreAtomic(dest, off);
  Flush(State(first), 8);
  Flush(dest, 8);
  Fence();
  StoreAtomic(&L->op, kOpIdle);
  Flush(L, sizeof(Lane));
  bytes_.fetch_add(usable, std::memory_order_relaxed);
  blocks_.fetch_add(1, std::memory_order_relaxed);
  ThreadCounters().allocs++;
  return Status::OK();
}

void PoolAllocator::Free(uint64_t* dest) {
  if (ro_) {
    std::fprintf(stderr, "pmindex: Allocator::Free on read-only pool %s ignored\n", pool_->path().c_str());
    return;
  }
  if (!DestOk(dest)) {
    std::fprintf(stderr, "pmindex: Allocator::Free with a destination outside pool %s ignored\n", pool_->path().c_str());
    return;
  }
  const uint64_t off = __atomic_load_n(dest, __ATOMIC_ACQUIRE);
  if (off == 0) return;
  if (!IsAllocated(off)) {
    std::fprintf(stderr, "pmindex: Allocator::Free of %llu, which is not an allocated block of pool %s, ignored\n",
                 (unsigned long long)off, pool_->path().c_str());
    return;
  }
  ThreadCache* tc;
  bool orphan;
  if (Status s = GetCache(&tc, &orphan); !s.ok()) {
    std::fprintf(stderr, "pmindex: Allocator::Free: %s\n", s.ToString().c_str());
    return;
  }
  OrphanGuard og{this, orphan ? tc : nullptr};
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  Lane* L = tc->lane;
  Store(&L->block, off);
  Store(&L->dest, uint64_t(reinterpret_cast<char*>(dest) - base_));
  uint64_t usable;
  if (IsLargeState(state)) {
    const uint64_t span = StateArg(state);
    usable = span * C - 64;
    Store(&L->arg, kArgLarge | span);
    StoreAtomic(&L->op, kOpFree);
    Persist(L, sizeof(Lane));
    PublishPending(tc);
    StoreAtomic(dest, uint64_t(0));
    Flush(dest, 8);
    StoreSpanFree(chunk, span);
  } else {
    const ClassGeom& g = Classes().geom[StateArg(state)];
    usable = g.size;
    const uint64_t idx = (off - ChunkOff(chunk) - g.blocks_start) / g.size;
    Store(&L->arg, StateArg(state));
    StoreAtomic(&L->op, kOpFree);
    Persist(L, sizeof(Lane));
    PublishPending(tc);
    uint64_t* word = reinterpret_cast<uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
    StoreAtomic(dest, uint64_t(0));
    FetchAnd(word, ~(uint64_t(1) << (idx % 64)));
    Flush(dest, 8);
    Flush(word, 8);
  }
  Fence();
  // The lane clear is not flushed: a stale FREE lane is harmless (its replay
  // clears an already clear bit; *dest no longer holds the block), as long as
  // the block is not reused before the lane is overwritten or flushed, which
  // the deferred publication guarantees. Hence a volatile store: the lint
  // must not report it as a missing flush.
  StoreVolatile(&L->op, kOpIdle);
  tc->pending = off;
  bytes_.fetch_sub(usable, std::memory_order_relaxed);
  blocks_.fetch_sub(1, std::memory_order_relaxed);
  ThreadCounters().frees++;
}

// ---- queries -----------------------------------------------------------------

size_t PoolAllocator::UsableSize(uint64_t off) const {
  if (off < layout::kHeapOffset + 64) return 0;
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  if (chunk >= NumChunks()) return 0;
  const uint8_t kind = Slot(chunk).kind.load(std::memory_order_acquire);
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  const uint64_t in = off - ChunkOff(chunk);
  if (kind == kLargeHead && IsLargeState(state)) return in == 64 ? StateArg(state) * C - 64 : 0;
  if (kind == kRunChunk && IsRunState(state)) {
    const ClassGeom& g = Classes().geom[StateArg(state)];
    if (in < g.blocks_start || (in - g.blocks_start) % g.size != 0 || (in - g.blocks_start) / g.size >= g.nblocks) return 0;
    return g.size;
  }
  return 0;
}

bool PoolAllocator::IsAllocated(uint64_t off) const {
  if (UsableSize(off) == 0) return false;
  const uint64_t chunk = (off - layout::kHeapOffset) / C;
  const uint64_t state = __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE);
  if (IsLargeState(state)) return true;
  const ClassGeom& g = Classes().geom[StateArg(state)];
  const uint64_t idx = (off - ChunkOff(chunk) - g.blocks_start) / g.size;
  const uint64_t* word = reinterpret_cast<const uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
  return (__atomic_load_n(word, __ATOMIC_ACQUIRE) >> (idx % 64)) & 1;
}

// Walks the chunk headers from PM; validates and optionally visits blocks.
Status PoolAllocator::ValidateChunks(uint64_t* bytes, uint64_t* blocks,
                                     const std::function<void(uint64_t, size_t)>* fn) const {
  *bytes = *blocks = 0;
  const uint64_t n = NumChunks();
  for (uint64_t i = 0; i < n;) {
    const uint64_t s = __atomic_load_n(State(i), __ATOMIC_ACQUIRE);
    if (s == kStateFree) {
      i++;
      continue;
    }
    if (IsRunState(s)) {
      const ClassGeom& g = Classes().geom[StateArg(s)];
      const uint64_t* bm = reinterpret_cast<const uint64_t*>(base_ + ChunkOff(i) + 64);
      for (uint32_t w = 0; w < g.nwords; w++) {
        uint64_t v = __atomic_load_n(&bm[w], __ATOMIC_ACQUIRE);
        if (w == g.nwords - 1 && g.nblocks % 64 && (v & (~0ull << (g.nblocks % 64))))
          return Status::Corrupt("chunk " + std::to_string(i) + ": bitmap bits set past the last block");
        while (v) {
          int b = __builtin_ctzll(v);
          v &= v - 1;
          (*bytes) += g.size;
          (*blocks)++;
          if (fn) (*fn)(ChunkOff(i) + g.blocks_start + uint64_t(w * 64 + b) * g.size, g.size);
        }
      }
      i++;
      continue;
    }
    if (IsLargeState(s)) {
      const uint64_t span = StateArg(s);
      if (span > n - i)
        return Status::Corrupt("chunk " + std::to_string(i) + ": large block of " + std::to_string(span) +
                               " chunks runs past the end of the heap");
      (*bytes) += span * C - 64;
      (*blocks)++;
      if (fn) (*fn)(ChunkOff(i) + 64, span * C - 64);
      i += span;
      continue;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)s);
    return Status::Corrupt("chunk " + std::to_string(i) + " has an invalid header state 0x" + buf);
  }
  return Status::OK();
}

void PoolAllocator::ForEachAllocated(const std::function<void(uint64_t off, size_t size)>& fn) const {
  uint64_t b, k;
  (void)ValidateChunks(&b, &k, &fn);
}

Status PoolAllocator::Check() const {
  uint64_t bytes, blocks;
  PMINDEX_RETURN_IF_ERROR(ValidateChunks(&bytes, &blocks, nullptr));
  for (uint32_t i = 0; i < layout::kLaneCount; i++) {
    const Lane* L = LaneAt(i);
    const uint64_t op = __atomic_load_n(&L->op, __ATOMIC_ACQUIRE);
    if (op == kOpIdle) continue;
    if (op != kOpAlloc && op != kOpFree) return Status::Corrupt("lane " + std::to_string(i) + " has an invalid op word");
    if (!ro_) return Status::Corrupt("lane " + std::to_string(i) + " is not idle while the allocator is quiescent");
    if (L->block < layout::kHeapOffset || L->block >= pool_->size() || L->dest >= pool_->size() || (L->dest & 7))
      return Status::Corrupt("lane " + std::to_string(i) + " refers outside the pool");
  }
  if (bytes != BytesInUse() || blocks != BlocksInUse())
    return Status::Corrupt("allocator accounting mismatch: counters say " + std::to_string(BytesInUse()) + " bytes / " +
                           std::to_string(BlocksInUse()) + " blocks, chunks hold " + std::to_string(bytes) + " / " +
                           std::to_string(blocks));
  // DRAM runs must cover every PM-allocated block.
  for (uint64_t i = 0; i < NumChunks(); i++) {
    Run* r = Slot(i).run.load(std::memory_order_acquire);
    if (!r || Slot(i).kind.load(std::memory_order_acquire) != kRunChunk) continue;
    const uint64_t* bm = reinterpret_cast<const uint64_t*>(base_ + r->bitmap_off);
    for (uint32_t w = 0; w < r->nwords; w++)
      if (__atomic_load_n(&bm[w], __ATOMIC_ACQUIRE) & ~r->vbits[w].load(std::memory_order_relaxed))
        return Status::Corrupt("chunk " + std::to_string(i) + ": a block in use is marked free in the volatile state");
  }
  return Status::OK();
}

// ---- recovery --------------------------------------------------------------

Status PoolAllocator::ReplayLane(uint32_t i, bool alloc_pass) {
  Lane* L = LaneAt(i);
  const uint64_t op = L->op;
  if (op == kOpIdle) return Status::OK();
  if (op != kOpAlloc && op != kOpFree) return Status::Corrupt("allocator lane " + std::to_string(i) + " has an invalid op word");
  if ((op == kOpAlloc) != alloc_pass) return Status::OK();
  if (PMINDEX_FAULT("pm.alloc.skip_replay")) {
    // Deliberately broken recovery (proves the crash tests): forget the lane.
    StorePersist(&L->op, kOpIdle);
    return Status::OK();
  }
  const uint64_t size = pool_->size();
  const uint64_t block = L->block, dest_off = L->dest, arg = L->arg;
  if (block < layout::kHeapOffset + 64 || block >= size || dest_off + 8 > size || (dest_off & 7) ||
      !(dest_off == layout::kRootSlotOffset || layout::InPmwcasRegion(dest_off) || dest_off >= layout::kHeapOffset))
    return Status::Corrupt("allocator lane " + std::to_string(i) + " refers outside the pool");
  uint64_t* dest = reinterpret_cast<uint64_t*>(base_ + dest_off);
  const uint64_t chunk = (block - layout::kHeapOffset) / C;
  const bool holds = __atomic_load_n(dest, __ATOMIC_ACQUIRE) == block;
  if (arg & kArgLarge) {
    const uint64_t span = arg & ~kArgLarge;
    if (span == 0 || chunk + span > NumChunks() || block != ChunkOff(chunk) + 64)
      return Status::Corrupt("allocator lane " + std::to_string(i) + " has an invalid large block");
    if (op == kOpAlloc) {
      StoreAtomic(State(chunk), holds ? LargeState(span) : kStateFree);
      Flush(State(chunk), 8);
    } else {
      if (holds) {
        StoreAtomic(dest, uint64_t(0));
        Flush(dest, 8);
      }
      StoreSpanFree(chunk, span);
    }
  } else {
    if (arg >= uint64_t(kNumClasses) || __atomic_load_n(State(chunk), __ATOMIC_ACQUIRE) != RunState(int(arg)))
      return Status::Corrupt("allocator lane " + std::to_string(i) + " refers to a block outside a run of its class");
    const ClassGeom& g = Classes().geom[arg];
    const uint64_t in = block - ChunkOff(chunk);
    if (in < g.blocks_start || (in - g.blocks_start) % g.size || (in - g.blocks_start) / g.size >= g.nblocks)
      return Status::Corrupt("allocator lane " + std::to_string(i) + " refers to a misaligned block");
    const uint64_t idx = (in - g.blocks_start) / g.size;
    uint64_t* word = reinterpret_cast<uint64_t*>(base_ + ChunkOff(chunk) + 64) + idx / 64;
    const uint64_t m = 1ull << (idx % 64);
    if (op == kOpAlloc && holds) {
      FetchOr(word, m);
    } else {
      if (op == kOpFree && holds) {
        StoreAtomic(dest, uint64_t(0));
        Flush(dest, 8);
      }
      FetchAnd(word, ~m);
    }
    Flush(word, 8);
  }
  Fence();
  StoreAtomic(&L->op, kOpIdle);
  Persist(&L->op, 8);
  return Status::OK();
}

Status PoolAllocator::Recover() {
  if (!ro_) {
    // Allocations first, then frees: a block logged in both (impossible under
    // the publication rule, but cheap to order) ends up free.
    for (uint32_t i = 0; i < layout::kLaneCount; i++) PMINDEX_RETURN_IF_ERROR(ReplayLane(i, true));
    for (uint32_t i = 0; i < layout::kLaneCount; i++) PMINDEX_RETURN_IF_ERROR(ReplayLane(i, false));
  }
  return Scan();
}

Status PoolAllocator::Scan() {
  uint64_t bytes, blocks;
  PMINDEX_RETURN_IF_ERROR(ValidateChunks(&bytes, &blocks, nullptr));
  std::lock_guard<std::mutex> g(heap_mu_);
  const uint64_t n = NumChunks();
  for (uint64_t i = 0; i < n;) {
    const uint64_t s = __atomic_load_n(State(i), __ATOMIC_ACQUIRE);
    if (IsRunState(s)) {
      Run* r = MakeRun(i, int(StateArg(s)), true);
      if (r->free_count.load() == int64_t(r->nblocks)) {
        delete r;  // empty run: the chunk is free
        chunk_free_[i] = 1;
      } else {
        chunk_free_[i] = 0;
        Slot(i).run.store(r, std::memory_order_release);
        Slot(i).kind.store(kRunChunk, std::memory_order_release);
        if (r->free_count.load() > 0) {
          r->in_list = true;
          classes_[r->cls].partial.push_back(r);
        }
      }
      i++;
    } else if (IsLargeState(s)) {
      const uint64_t span = StateArg(s);
      chunk_free_[i] = 0;
      Slot(i).span.store(span, std::memory_order_relaxed);
      Slot(i).kind.store(kLargeHead, std::memory_order_release);
      for (uint64_t k = 1; k < span; k++) {
        chunk_free_[i + k] = 0;
        Slot(i + k).kind.store(kLargeInterior, std::memory_order_release);
      }
      i += span;
    } else {
      chunk_free_[i] = 1;
      i++;
    }
  }
  bytes_.store(bytes);
  blocks_.store(blocks);
  return Status::OK();
}

}  // namespace

Status NewPoolAllocator(Pool* pool, bool fresh, bool read_only, std::unique_ptr<Allocator>* out) {
  auto a = std::make_unique<PoolAllocator>(pool, read_only);
  PMINDEX_RETURN_IF_ERROR(a->Init(fresh));
  *out = std::move(a);
  return Status::OK();
}

void ShutdownPoolAllocator(Allocator* a) { static_cast<PoolAllocator*>(a)->Shutdown(); }

}  // namespace pmindex::pm
