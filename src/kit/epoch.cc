// epoch.cc: the slow paths of EpochManager (slot binding, thread exit,
// scans of the announcements). Design, invariants and memory-order
// reasoning: epoch.h.
#include "kit/epoch.h"

#include <pthread.h>

#include <cstdlib>
#include <thread>
#include <unordered_map>

namespace pmindex::internal {

constinit thread_local EpochTlsCache tl_epoch_cache __attribute__((tls_model("initial-exec"))) = {};

namespace {
std::atomic<uint64_t> g_next_id{1};  // 0 marks an empty cache way
// Live manager ids. Leaked on purpose: threads may exit (and consult it)
// after static destructors ran.
std::mutex& RegistryMu() {
  static auto* mu = new std::mutex();
  return *mu;
}
// Live managers by id.
std::unordered_map<uint64_t, const EpochManager*>& LiveIds() {
  static auto* s = new std::unordered_map<uint64_t, const EpochManager*>();
  return *s;
}
inline void CpuRelax() { __builtin_ia32_pause(); }
}  // namespace

// The slots a thread bound (one per manager it used), released at thread
// exit by a pthread_key destructor. glibc runs those after every
// thread_local destructor (so operations from thread_local destructors still
// find their binding), and runs them again when a later destructor sets the
// key anew (a thread whose first guard runs from another pthread_key
// destructor), up to PTHREAD_DESTRUCTOR_ITERATIONS rounds. Heap-allocated
// behind a trivially destructible thread_local pointer: a thread_local with
// a destructor first touched from a pthread_key destructor would register a
// destructor that never runs (its slots leaked). Touched only on the slow path.
struct EpochThreadBindings;
namespace {
constinit thread_local EpochThreadBindings* tl_bindings = nullptr;
}  // namespace
struct EpochThreadBindings {
  std::vector<std::pair<uint64_t, EpochSlot*>> v;
  static void Destroy(void* p) {
    auto* b = static_cast<EpochThreadBindings*>(p);
    EpochTlsCache& c = tl_epoch_cache;
    c.exiting = true;  // later guards of this thread take transient slots
    for (int w = 0; w < EpochTlsCache::kWays; w++) {
      c.id[w] = 0;
      c.slot[w] = nullptr;
    }
    {
      std::lock_guard<std::mutex> g(RegistryMu());
      for (auto& [id, s] : b->v) {
        if (!LiveIds().count(id)) continue;  // the manager is gone, and its slots with it
        if (s->depth > 0) {
          // A guard still open (a guard in a destructor that is itself
          // running another key's destructor): it releases the slot.
          s->transient = true;
          EpochManager::CacheFill(id, s);
          continue;
        }
        EpochManager::Release(s);
      }
    }
    tl_bindings = nullptr;
    delete b;
  }
};
namespace {
pthread_key_t BindingsKey() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    if (pthread_key_create(&k, &EpochThreadBindings::Destroy) != 0) std::abort();
    return k;
  }();
  return key;
}
}  // namespace

EpochManager::EpochManager(uint32_t max_slots)
    : id_(g_next_id.fetch_add(1, std::memory_order_relaxed)), max_slots_(max_slots), head_(new Chunk) {
  for (uint32_t i = 0; i < kChunk; i++) head_->slots[i].index = i;
  std::lock_guard<std::mutex> g(RegistryMu());
  LiveIds().emplace(id_, this);
}

EpochManager::~EpochManager() {
  {
    // After this no thread-exit releases into our chunks.
    std::lock_guard<std::mutex> g(RegistryMu());
    LiveIds().erase(id_);
  }
  for (Chunk* c = head_; c;) {
    Chunk* n = c->next.load(std::memory_order_relaxed);
    delete c;
    c = n;
  }
}

void EpochManager::Release(EpochSlot* s) {
  s->transient = false;
  s->announced.store(0, std::memory_order_relaxed);
  s->used.store(false, std::memory_order_release);  // hands the slot's per-thread state over
}

void EpochManager::ReleaseTransient(EpochSlot* s) {
  EpochTlsCache& c = tl_epoch_cache;
  for (int w = 0; w < EpochTlsCache::kWays; w++)
    if (c.slot[w] == s) {
      c.id[w] = 0;
      c.slot[w] = nullptr;
    }
  Release(s);
}

// Called on a miss only (the id is in no way): round robin over the ways.
void EpochManager::CacheFill(uint64_t id, EpochSlot* s) {
  EpochTlsCache& c = tl_epoch_cache;
  const int w = c.next % EpochTlsCache::kWays;
  c.next = uint8_t((w + 1) % EpochTlsCache::kWays);
  c.id[w] = id;
  c.slot[w] = s;
}

EpochSlot* EpochManager::BindSlow() {
  EpochTlsCache& c = tl_epoch_cache;
  if (c.exiting) {
    // The binding list is gone (thread exit): a slot for this guard only.
    EpochSlot* s = TakeFreeSlot();
    if (!s) return nullptr;
    s->transient = true;
    CacheFill(id_, s);  // nested guards on this manager find it
    return s;
  }
  EpochThreadBindings*& bp = tl_bindings;
  if (!bp) {
    const pthread_key_t key = BindingsKey();
    bp = new EpochThreadBindings;
    pthread_setspecific(key, bp);  // its destructor releases the slots at thread exit
  }
  EpochThreadBindings& b = *bp;
  for (const auto& [id, s] : b.v)
    if (id == id_) {
      CacheFill(id_, s);
      return s;
    }
  EpochSlot* s = TakeFreeSlot();
  if (!s) return nullptr;
  {
    std::lock_guard<std::mutex> g(RegistryMu());
    // Drop bindings of destroyed managers (their ids are never reused).
    std::erase_if(b.v, [](const auto& e) { return LiveIds().count(e.first) == 0; });
    b.v.push_back({id_, s});
  }
  CacheFill(id_, s);
  return s;
}

EpochSlot* EpochManager::TakeFreeSlot() {
  auto raise = [this](uint32_t i) {
    // Before the slot's first announcement (see epoch.h: a scan that reads
    // the old mark treats the slot as quiescent, which the entry's re-read
    // of the counter makes safe).
    uint32_t h = hwm_.load(std::memory_order_seq_cst);
    while (h < i + 1 && !hwm_.compare_exchange_weak(h, i + 1, std::memory_order_seq_cst)) {
    }
  };
  for (;;) {
    Chunk* tail = head_;
    for (Chunk* ch = head_; ch; ch = ch->next.load(std::memory_order_acquire)) {
      tail = ch;
      for (EpochSlot& s : ch->slots) {
        if (max_slots_ && s.index >= max_slots_) return nullptr;
        bool f = false;
        if (!s.used.load(std::memory_order_relaxed) && s.used.compare_exchange_strong(f, true, std::memory_order_acq_rel)) {
          raise(s.index);
          return &s;
        }
      }
    }
    const uint32_t base = tail->slots[0].index + kChunk;
    if (max_slots_ && base >= max_slots_) return nullptr;
    std::lock_guard<std::mutex> g(grow_mu_);
    if (tail->next.load(std::memory_order_acquire)) continue;  // another thread grew it: rescan
    auto* ch = new Chunk;
    for (uint32_t i = 0; i < kChunk; i++) ch->slots[i].index = base + i;
    ch->slots[0].used.store(true, std::memory_order_relaxed);
    tail->next.store(ch, std::memory_order_release);
    raise(base);
    return &ch->slots[0];
  }
}

std::vector<uint32_t> EpochManager::LiveSlotCounts() {
  std::lock_guard<std::mutex> g(RegistryMu());
  std::vector<uint32_t> r;
  for (const auto& [id, m] : LiveIds()) r.push_back(m->SlotCount());
  return r;
}

uint64_t EpochManager::MinAnnounced() const {
  uint64_t m = UINT64_MAX;
  const uint32_t h = hwm_.load(std::memory_order_seq_cst);
  uint32_t i = 0;
  for (const Chunk* ch = head_; ch && i < h; ch = ch->next.load(std::memory_order_acquire)) {
    for (const EpochSlot& s : ch->slots) {
      if (i++ >= h) break;
      const uint64_t a = s.announced.load(std::memory_order_seq_cst);
      if (a && a < m) m = a;
    }
  }
  return m;
}

void EpochManager::Synchronize() {
  const uint64_t t = Advance();
  const uint32_t h = hwm_.load(std::memory_order_seq_cst);
  uint32_t i = 0;
  for (Chunk* ch = head_; ch && i < h; ch = ch->next.load(std::memory_order_acquire)) {
    for (EpochSlot& s : ch->slots) {
      if (i++ >= h) break;
      for (int spins = 0;; spins++) {
        const uint64_t a = s.announced.load(std::memory_order_seq_cst);
        if (a == 0 || a > t) break;
        if (spins < 64) CpuRelax();
        else std::this_thread::yield();
      }
    }
  }
}

}  // namespace pmindex::internal
