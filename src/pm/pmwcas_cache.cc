// PMwCAS: per-thread descriptor caches (docs/pmwcas.md "Per-thread caches").
//
// The public PMwCAS implementation (Wang, Levandoski and Larson, ICDE'18)
// splits its descriptor pool into one fixed partition per thread, each with
// a free list and a garbage list, so that taking and recycling a descriptor
// touches no shared state. Here the caches are dynamic instead (refilled
// from and overflowing into a shared pool, handed back at thread exit,
// stolen from by a thread that runs short), since the region is small and
// the number of threads is not known. All of it is DRAM state over the
// pool's descriptor region, whose format does not change (which thread
// holds a descriptor is never stored in PM; recovery scans every descriptor
// regardless).
//
// Each thread that runs an operation owns one DescCache of the PMwCAS:
//  * Begin pops a descriptor from the cache's free list. When it is empty:
//    a batch of `batch` from the shared free list (State::mu); else the
//    cache's own retired descriptors past their grace period; else the
//    shared retired list; else steal: every other cache's free descriptors
//    and its retired ones past their grace period. Busy only after a
//    bounded number of such rounds found nothing.
//  * Retire (after Execute's guard ends) adds to the cache's RetireList;
//    every `batch` retirements the cache is reclaimed: one Advance of the
//    epoch stamps what was added since, and what is past its grace period
//    is recycled (pmwcas_recovery.cc) into the cache's free list. A free
//    list longer than 2 * batch returns all but `batch` to the shared list.
//  * Abandon puts the (never published) descriptor back on the free list.
// Steady state with one thread per cache: no shared lock, one Advance per
// `batch` operations.
//
// Thread exit: a thread's bindings (PMwCAS id -> cache) live in a heap list
// behind a pthread_key whose destructor hands every cache back: free
// descriptors to the shared free list, retired ones to the shared retired
// list (stamped anew: later than needed, never earlier), and the empty cache
// is left unbound, to be adopted by the next thread that needs one (so
// short-lived threads do not grow the cache list). glibc runs pthread_key
// destructors after thread_local destructors; a thread whose key destructor
// has run is `exiting` and uses the shared lists directly. A process-wide
// registry of live PMwCAS ids (one mutex, slow paths only) keeps a thread
// exit from touching a PMwCAS that was destroyed; ids are never reused, so a
// stale binding never matches. The scheme mirrors src/kit/epoch.cc's slot
// bindings.
//
// Invariants: every descriptor is in exactly one list or in one thread's
// hands (pmwcas_internal.h); a descriptor enters a free list only with a
// durable free status (Recycle) or never published (Abandon); an entry of a
// RetireList is reclaimed only under the lock it was added under (the
// cache's mu, or State::mu), as RetireList requires.
//
// Persist order: a batch of descriptors past their grace period is recycled
// (Recycle, pmwcas_recovery.cc: policies run, status free stored and
// flushed), then one fence makes every free status of the batch durable
// before any of them enters a free list.
//
// Thread safety: every function may run from any thread. Lock order:
// the registry mutex, then State::mu, then one DescCache::mu; recycling runs
// with no lock held. Reclaims that may free a thread's own retired
// descriptors run outside its guards (Begin and Retire are never called
// inside one).
#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <unordered_map>

#include "pm/pmwcas_internal.h"
#include "pmindex/pm/persist.h"

namespace pmindex::pm {

namespace {
// Descriptors collected for one reclaim: up to kInline kept inline (a
// cache's steady-state batch), more spill to the heap (a close, a steal).
class DescBatch {
 public:
  void push_back(uint32_t d) {
    if (n_ < kInline && spill_.empty()) {
      inl_[n_++] = d;
      return;
    }
    if (spill_.empty()) spill_.assign(inl_, inl_ + n_);
    spill_.push_back(d);
    n_++;
  }
  const uint32_t* data() const { return spill_.empty() ? inl_ : spill_.data(); }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kInline = 32;
  uint32_t inl_[kInline];
  size_t n_ = 0;
  std::vector<uint32_t> spill_;
};
}  // namespace

namespace {

constexpr int kTakeRounds = 100000;  // Begin's rounds before Busy (yielding after the first 16)

std::atomic<uint64_t> g_next_id{1};  // 0 marks an empty way
// Live PMwCAS states by id. Leaked on purpose: threads may exit (and
// consult it) after static destructors ran.
std::mutex& RegistryMu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_map<uint64_t, PMwCAS::State*>& Live() {
  static auto* m = new std::unordered_map<uint64_t, PMwCAS::State*>();
  return *m;
}

// The fast path: the caches this thread used last, by PMwCAS id.
// Trivially destructible, so it stays usable during thread exit.
struct CacheWays {
  static constexpr int kWays = 4;
  uint64_t id[kWays];
  DescCache* cache[kWays];
  uint8_t next;
  bool exiting;  // the bindings were handed back (thread exit)
};
constinit thread_local CacheWays tl_ways __attribute__((tls_model("initial-exec"))) = {};

struct ThreadBindings {
  std::vector<std::pair<uint64_t, DescCache*>> v;
  static void Destroy(void* p);
};
constinit thread_local ThreadBindings* tl_bindings = nullptr;

void ThreadBindings::Destroy(void* p) {
  auto* b = static_cast<ThreadBindings*>(p);
  CacheWays& w = tl_ways;
  w.exiting = true;
  for (int i = 0; i < CacheWays::kWays; i++) {
    w.id[i] = 0;
    w.cache[i] = nullptr;
  }
  {
    std::lock_guard<std::mutex> g(RegistryMu());
    for (auto& [id, c] : b->v) {
      auto it = Live().find(id);
      if (it != Live().end()) it->second->HandBack(c);  // else gone with its PMwCAS
    }
  }
  tl_bindings = nullptr;
  delete b;
}

pthread_key_t BindingsKey() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    if (pthread_key_create(&k, &ThreadBindings::Destroy) != 0) std::abort();
    return k;
  }();
  return key;
}

void Fill(uint64_t id, DescCache* c) {
  CacheWays& w = tl_ways;
  const int i = w.next % CacheWays::kWays;
  w.next = uint8_t((i + 1) % CacheWays::kWays);
  w.id[i] = id;
  w.cache[i] = c;
}

}  // namespace

void PMwCAS::State::Register() {
  id = g_next_id.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(RegistryMu());
  Live().emplace(id, this);
}

void PMwCAS::State::Unregister() {
  std::lock_guard<std::mutex> g(RegistryMu());
  Live().erase(id);
}

DescCache* PMwCAS::State::ThreadCache() {
  const CacheWays& w = tl_ways;
  for (int i = 0; i < CacheWays::kWays; i++)
    if (w.id[i] == id) return w.cache[i];
  return BindCache();
}

DescCache* PMwCAS::State::BindCache() {
  if (tl_ways.exiting) return nullptr;
  ThreadBindings*& bp = tl_bindings;
  if (!bp) {
    bp = new ThreadBindings;
    pthread_setspecific(BindingsKey(), bp);  // its destructor hands the caches back
  }
  for (const auto& [bid, c] : bp->v)
    if (bid == id) {
      Fill(id, c);
      return c;
    }
  DescCache* c = nullptr;
  {
    std::lock_guard<std::mutex> g(mu);
    for (auto& u : caches)
      if (!u->bound) {
        c = u.get();
        break;
      }
    if (!c) {
      caches.push_back(std::make_unique<DescCache>());
      c = caches.back().get();
    }
    c->bound = true;
  }
  {
    std::lock_guard<std::mutex> g(RegistryMu());
    std::erase_if(bp->v, [](const auto& e) { return Live().count(e.first) == 0; });
    bp->v.push_back({id, c});
  }
  Fill(id, c);
  return c;
}

void PMwCAS::State::HandBack(DescCache* c) {
  std::vector<uint32_t> fr, ret;
  {
    std::lock_guard<std::mutex> g(c->mu);
    fr.swap(c->free);
    c->retired.ReclaimAll([&](uint32_t d) { ret.push_back(d); });  // moved, not recycled
    c->pending = 0;
  }
  std::lock_guard<std::mutex> g(mu);
  free_list.insert(free_list.end(), fr.begin(), fr.end());
  for (uint32_t d : ret) retired.Add(d);
  c->bound = false;
}

std::vector<DescCache*> PMwCAS::State::Caches() {
  std::lock_guard<std::mutex> g(mu);
  std::vector<DescCache*> v;
  for (auto& u : caches) v.push_back(u.get());
  return v;
}

// Puts recycled or never-published descriptors on c's free list (the
// shared one if c is null); an overlong free list gives all but `batch`
// back to the shared list. No heap allocation unless the list overflows
// (Abandon puts one descriptor back on every insert of some indexes).
void PMwCAS::State::AddFree(DescCache* c, const uint32_t* ds, size_t n) {
  std::vector<uint32_t> excess;
  if (c) {
    std::lock_guard<std::mutex> g(c->mu);
    c->free.insert(c->free.end(), ds, ds + n);
    if (c->free.size() > 2 * size_t(batch)) {
      excess.assign(c->free.begin(), c->free.end() - batch);
      c->free.erase(c->free.begin(), c->free.end() - batch);
    }
  } else {
    excess.assign(ds, ds + n);
  }
  if (excess.empty()) return;
  std::lock_guard<std::mutex> g(mu);
  free_list.insert(free_list.end(), excess.begin(), excess.end());
}

// One persist path for every reclaimed batch (a thread's cache or the
// shared list of exiting threads'): recycle each descriptor, then one fence
// makes the batch's free statuses durable before any of them is reused.
// Not inlined, so that pmcheck counts (and crashes in) one fence site for
// both callers.
__attribute__((noinline)) void PMwCAS::State::RecycleBatch(const uint32_t* ds, size_t n) {
  for (size_t i = 0; i < n; i++) Recycle(ds[i], /*fence=*/false);
  Fence();
  asm volatile("" ::: "memory");  // keeps the fence's observer call out of tail position
}

void PMwCAS::State::ReclaimShared(bool all) {
  std::vector<uint32_t> ready;
  {
    std::lock_guard<std::mutex> g(mu);
    if (all)
      retired.ReclaimAll([&](uint32_t d) { ready.push_back(d); });
    else
      retired.Reclaim(epoch, [&](uint32_t d) { ready.push_back(d); });
  }
  if (ready.empty()) return;
  RecycleBatch(ready.data(), ready.size());
  std::lock_guard<std::mutex> g(mu);
  free_list.insert(free_list.end(), ready.begin(), ready.end());
}

// Recycles c's retired descriptors that are past their grace period (all:
// every one) and puts them on `into`'s free list. True if any.
bool PMwCAS::State::ReclaimCache(DescCache* c, DescCache* into, bool all) {
  DescBatch ready;  // a steady-state batch stays inline: no heap allocation
  {
    std::lock_guard<std::mutex> g(c->mu);
    c->pending = 0;
    if (all)
      c->retired.ReclaimAll([&](uint32_t d) { ready.push_back(d); });
    else
      c->retired.Reclaim(epoch, [&](uint32_t d) { ready.push_back(d); });
  }
  if (ready.size() == 0) return false;
  RecycleBatch(ready.data(), ready.size());
  AddFree(into, ready.data(), ready.size());
  return true;
}

void PMwCAS::State::ReclaimEverywhere(bool all) {
  ReclaimShared(all);
  for (DescCache* c : Caches()) ReclaimCache(c, c, all);
}

// A batch from the shared free list into c. True if any. The shared
// retired list (filled by exiting threads) is reclaimed on the way once it
// holds a batch.
bool PMwCAS::State::Refill(DescCache* c) {
  std::vector<uint32_t> got;
  bool reclaim;
  {
    std::lock_guard<std::mutex> g(mu);
    const size_t n = std::min<size_t>(batch, free_list.size());
    got.assign(free_list.end() - n, free_list.end());
    free_list.resize(free_list.size() - n);
    reclaim = retired.size() >= batch;
  }
  if (reclaim) ReclaimShared(false);
  if (got.empty()) return false;
  std::lock_guard<std::mutex> g(c->mu);
  c->free.insert(c->free.end(), got.begin(), got.end());
  return true;
}

// Takes every free descriptor of the other caches, and their retired ones
// past their grace period (recycled here), into c (the shared free list if
// c is null). True if any. A cache whose thread is idle (or blocked) holds
// nothing back from a thread that ran short; its retired descriptors are
// stamped by the first round and taken by a later one.
bool PMwCAS::State::Steal(DescCache* c) {
  bool any = false;
  for (DescCache* v : Caches()) {
    if (v == c) continue;
    std::vector<uint32_t> got;
    {
      std::lock_guard<std::mutex> g(v->mu);
      got.swap(v->free);
    }
    if (!got.empty()) {
      AddFree(c, got.data(), got.size());
      any = true;
    }
    if (ReclaimCache(v, c, false)) any = true;
  }
  if (any) steals.fetch_add(1, std::memory_order_relaxed);
  return any;
}

bool PMwCAS::State::Take(uint32_t* d) {
  DescCache* c = ThreadCache();
  for (int round = 0; round < kTakeRounds; round++) {
    if (round > 16) std::this_thread::yield();
    if (c) {
      {
        std::lock_guard<std::mutex> g(c->mu);
        if (!c->free.empty()) {
          *d = c->free.back();
          c->free.pop_back();
          return true;
        }
      }
      if (Refill(c) || ReclaimCache(c, c, false)) continue;
    } else {
      std::lock_guard<std::mutex> g(mu);
      if (!free_list.empty()) {
        *d = free_list.back();
        free_list.pop_back();
        return true;
      }
    }
    ReclaimShared(false);
    {
      std::lock_guard<std::mutex> g(mu);
      if (!free_list.empty()) continue;
    }
    Steal(c);
  }
  return false;
}

bool PMwCAS::State::TakeCached(uint32_t* d) {
  DescCache* c = ThreadCache();
  if (!c) return false;
  std::lock_guard<std::mutex> g(c->mu);
  if (c->free.empty()) return false;
  *d = c->free.back();
  c->free.pop_back();
  return true;
}

void PMwCAS::State::PutFree(uint32_t d) { AddFree(ThreadCache(), &d, 1); }

void PMwCAS::State::Retire(uint32_t d) {
  DescCache* c = ThreadCache();
  if (!c) {
    size_t n;
    {
      std::lock_guard<std::mutex> g(mu);
      retired.Add(d);
      n = retired.size();
    }
    if (n >= batch) ReclaimShared(false);
    return;
  }
  bool reclaim;
  {
    std::lock_guard<std::mutex> g(c->mu);
    c->retired.Add(d);
    reclaim = ++c->pending >= batch;
  }
  if (reclaim) ReclaimCache(c, c, false);
}

uint32_t PMwCAS::DescriptorsInUse() const {
  std::lock_guard<std::mutex> g(s_->mu);
  size_t free = s_->free_list.size();
  for (auto& c : s_->caches) {
    std::lock_guard<std::mutex> gc(c->mu);
    free += c->free.size();
  }
  return s_->count - uint32_t(free);
}

PMwCAS::CacheStats PMwCAS::cache_stats() const {
  CacheStats st;
  std::lock_guard<std::mutex> g(s_->mu);
  st.caches = uint32_t(s_->caches.size());
  for (auto& c : s_->caches) {
    std::lock_guard<std::mutex> gc(c->mu);
    st.bound += c->bound ? 1 : 0;
    st.cached += uint32_t(c->free.size() + c->retired.size());
  }
  st.steals = s_->steals.load(std::memory_order_relaxed);
  return st;
}

}  // namespace pmindex::pm
