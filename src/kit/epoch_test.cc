// epoch_test.cc: unit tests of the shared epoch-based reclamation (epoch.h):
// a retired object is never freed while a guard that could see it is open
// (also under ASan/TSan: freed objects are really deleted), callback counts,
// Synchronize waits for open guards, guards from exiting threads give their
// slots back (also from thread_local and pthread_key destructors), bounded managers, nesting and several managers per thread, a
// reader in the second chunk of slots.
#include "kit/epoch.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace pmindex::internal {
namespace {

using Guard = EpochManager::Guard;

TEST(Epoch, AnnouncesOnlyInsideGuardsAndNests) {
  EpochManager m;
  EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
  {
    Guard g(m);
    ASSERT_TRUE(g.ok());
    const uint64_t a = m.MinAnnounced();
    EXPECT_EQ(a, m.Epoch());
    m.Advance();
    {
      Guard inner(m);  // nested: keeps the outer announcement
      EXPECT_EQ(inner.slot(), g.slot());
      EXPECT_EQ(m.MinAnnounced(), a);
    }
    EXPECT_EQ(m.MinAnnounced(), a);  // the inner guard's end does not leave
  }
  EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
  {
    Guard off(m, /*on=*/false);
    EXPECT_FALSE(off.ok());
    EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
  }
}

TEST(Epoch, RetiredObjectWaitsForTheGuardThatCouldSeeIt) {
  EpochManager m;
  RetireList<int> list;
  std::vector<int> freed;
  auto fr = [&](int x) { freed.push_back(x); };
  std::atomic<int> phase{0};
  std::thread reader([&] {
    Guard g(m);
    phase = 1;  // inside the guard: may hold object 1
    while (phase.load() != 2) std::this_thread::yield();
  });
  while (phase.load() != 1) std::this_thread::yield();
  list.Add(1);  // "unlinked" while the reader is inside
  EXPECT_EQ(list.Reclaim(m, fr), 0u);
  EXPECT_EQ(list.Reclaim(m, fr), 0u);
  EXPECT_TRUE(freed.empty());
  {
    // A guard that begins after the retirement does not hold it back.
    Guard late(m);
    std::thread([&] { EXPECT_EQ(list.Reclaim(m, fr), 0u); }).join();  // the reader still holds it
  }
  phase = 2;
  reader.join();
  {
    Guard late(m);  // entered after the stamp: does not hold object 1
    size_t n = 0;
    std::thread([&] { n = list.Reclaim(m, fr); }).join();
    EXPECT_EQ(n, 1u);
  }
  ASSERT_EQ(freed.size(), 1u);
  EXPECT_EQ(freed[0], 1);
  EXPECT_TRUE(list.empty());
  // Own guard: an object retired inside it waits until the guard ends.
  {
    Guard g(m);
    list.Add(2);
    EXPECT_EQ(list.Reclaim(m, fr), 0u);
  }
  EXPECT_EQ(list.Reclaim(m, fr), 1u);
  list.Add(3);
  list.Add(4);
  EXPECT_EQ(list.ReclaimAll(fr), 2u);
  EXPECT_EQ(freed.size(), 4u);
}

// Readers load a shared pointer inside a guard and check the object's canary
// (then again after a pause); the writer replaces the object, retires the old
// one and reclaims. A freed object is deleted after its canary is poisoned:
// an early free is a canary failure, or an ASan use-after-free, or a TSan race.
// Limit: the window Announce's re-read loop closes (a guard that loaded the
// epoch, then stalls before its store while the writer advances and scans)
// is a few instructions wide, so these stress tests only make a mutation
// that drops the re-read likely to fail, not certain (no test hook pauses a
// guard there: it would cost the hot path).
struct Obj {
  std::atomic<uint64_t> canary{0x600DF00D};
  uint64_t payload[7];
};
TEST(Epoch, ReadersNeverSeeAReclaimedObject) {
  EpochManager m;
  std::atomic<Obj*> cur{new Obj};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, reads{0};
  std::atomic<int> started{0};
  const int kReaders = 3;
  std::vector<std::thread> rs;
  for (int r = 0; r < kReaders; r++)
    rs.emplace_back([&] {
      started++;
      while (!stop.load(std::memory_order_relaxed)) {
        Guard g(m);
        Obj* o = cur.load(std::memory_order_acquire);
        if (o->canary.load(std::memory_order_relaxed) != 0x600DF00D) bad++;
        for (int i = 0; i < 20; i++) __builtin_ia32_pause();
        if (o->canary.load(std::memory_order_relaxed) != 0x600DF00D) bad++;
        (void)o->payload[3];
        reads++;
      }
    });
  RetireList<Obj*> list;
  uint64_t retired = 0, freed = 0;
  auto fr = [&](Obj* o) {
    o->canary.store(0xDEAD, std::memory_order_relaxed);
    delete o;
    freed++;
  };
  while (started.load() < kReaders) std::this_thread::yield();
  // At least 20000 replacements, and until the readers did 2000 reads (on a
  // loaded machine they may not have run yet).
  for (int i = 0; i < 20000 || reads.load(std::memory_order_relaxed) < 2000; i++) {
    Obj* n = new Obj;
    n->payload[3] = uint64_t(i);
    Obj* old = cur.exchange(n, std::memory_order_acq_rel);
    list.Add(old);
    retired++;
    if (i % 8 == 0) list.Reclaim(m, fr);
    if (i % 1000 == 0) std::this_thread::yield();
  }
  stop = true;
  for (auto& t : rs) t.join();
  list.Reclaim(m, fr);  // no guard open: the last batch goes
  EXPECT_EQ(list.size(), 0u);
  EXPECT_EQ(freed, retired);
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  delete cur.load();
}

// The same with the blocking grace period (fptree's way).
TEST(Epoch, SynchronizeThenFreeIsSafe) {
  EpochManager m;
  std::atomic<Obj*> cur{new Obj};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0}, reads{0};
  std::atomic<int> started{0};
  std::vector<std::thread> rs;
  for (int r = 0; r < 2; r++)
    rs.emplace_back([&] {
      started++;
      while (!stop.load(std::memory_order_relaxed)) {
        Guard g(m);
        Obj* o = cur.load(std::memory_order_acquire);
        for (int i = 0; i < 10; i++)
          if (o->canary.load(std::memory_order_relaxed) != 0x600DF00D) bad++;
        reads++;
      }
    });
  while (started.load() < 2) std::this_thread::yield();
  for (int i = 0; i < 3000 || reads.load(std::memory_order_relaxed) < 1000; i++) {
    Obj* old = cur.exchange(new Obj, std::memory_order_acq_rel);
    m.Synchronize();
    old->canary.store(0xDEAD, std::memory_order_relaxed);
    delete old;
  }
  stop = true;
  for (auto& t : rs) t.join();
  delete cur.load();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
}

TEST(Epoch, SynchronizeWaitsForAnOpenGuard) {
  EpochManager m;
  std::atomic<bool> entered{false}, go{false}, left{false};
  std::thread reader([&] {
    Guard g(m);
    entered = true;
    while (!go.load()) std::this_thread::yield();
    left = true;  // still inside the guard
  });
  while (!entered.load()) std::this_thread::yield();
  std::atomic<bool> synced{false};
  std::thread syncer([&] {
    m.Synchronize();
    EXPECT_TRUE(left.load());  // returned only after the guard ended
    synced = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it wait (no assertion on time)
  EXPECT_FALSE(synced.load());
  go = true;
  reader.join();
  syncer.join();
  EXPECT_TRUE(synced.load());
}

// A guarded reader in a slot of the second chunk (slot >= 64): 64 other
// threads stay bound (each took and left a guard, then waits alive), so the
// reader cannot get a slot of the first chunk. Reclaim must free nothing it
// could see and Synchronize must wait for it (fails if MinAnnounced or
// Synchronize visit only the first chunk of slots).
TEST(Epoch, ReaderInSecondChunkHoldsBackReclaimAndSynchronize) {
  EpochManager m;
  const int kHolders = int(EpochManager::kChunk);
  std::atomic<int> bound{0};
  std::atomic<bool> release_holders{false};
  std::vector<std::thread> holders;
  for (int i = 0; i < kHolders; i++)
    holders.emplace_back([&] {
      { Guard g(m); EXPECT_TRUE(g.ok()); }
      bound++;
      while (!release_holders.load()) std::this_thread::yield();
    });
  while (bound.load() < kHolders) std::this_thread::yield();
  EXPECT_EQ(m.SlotCount(), EpochManager::kChunk);

  std::atomic<int> phase{0};  // 1: reader inside; 2: may leave
  std::atomic<bool> leaving{false};
  uint32_t reader_slot = 0;
  std::thread reader([&] {
    Guard g(m);
    reader_slot = g.slot();
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    leaving = true;  // still inside the guard
  });
  while (phase.load() != 1) std::this_thread::yield();
  EXPECT_GE(reader_slot, EpochManager::kChunk);
  EXPECT_EQ(m.MinAnnounced(), m.Epoch());

  RetireList<int> list;
  std::vector<int> freed;
  auto fr = [&](int x) { freed.push_back(x); };
  list.Add(1);  // "unlinked" while the reader is inside
  EXPECT_EQ(list.Reclaim(m, fr), 0u);
  EXPECT_EQ(list.Reclaim(m, fr), 0u);
  EXPECT_TRUE(freed.empty());

  // Synchronize: the reader leaves only after the syncer started and main
  // saw it had not returned; it must return only after the reader left.
  std::atomic<bool> syncing{false}, synced{false}, returned_early{false};
  std::thread syncer([&] {
    syncing = true;
    m.Synchronize();
    if (!leaving.load()) returned_early = true;
    synced = true;
  });
  while (!syncing.load()) std::this_thread::yield();
  for (int i = 0; i < 1000 && !synced.load(); i++) std::this_thread::yield();  // give a wrong Synchronize the chance to return
  EXPECT_FALSE(synced.load());
  phase = 2;
  reader.join();
  syncer.join();
  EXPECT_TRUE(synced.load());
  EXPECT_FALSE(returned_early.load());

  EXPECT_EQ(list.Reclaim(m, fr), 1u);
  EXPECT_EQ(freed.size(), 1u);
  release_holders = true;
  for (auto& t : holders) t.join();
}

// Several managers: independent announcements; a guard of one does not hold
// back another's grace period, even on the same thread. More managers than
// cache ways, interleaved and nested.
TEST(Epoch, ManagersAreIndependent) {
  constexpr int kN = 11;
  std::vector<std::unique_ptr<EpochManager>> ms;
  for (int i = 0; i < kN; i++) ms.push_back(std::make_unique<EpochManager>());
  {
    Guard ga(*ms[0]);
    ms[1]->Synchronize();  // would wait forever if the epochs were shared
    EXPECT_EQ(ms[1]->MinAnnounced(), UINT64_MAX);
    EXPECT_NE(ms[0]->MinAnnounced(), UINT64_MAX);
  }
  for (int round = 0; round < 3; round++) {
    std::vector<std::unique_ptr<Guard>> gs;
    for (int i = 0; i < kN; i++) {
      gs.push_back(std::make_unique<Guard>(*ms[i]));
      gs.push_back(std::make_unique<Guard>(*ms[(i * 7) % kN]));  // nested on an open one
    }
    for (int i = 0; i < kN; i++) EXPECT_NE(ms[i]->MinAnnounced(), UINT64_MAX) << i;
    while (!gs.empty()) gs.pop_back();
    for (int i = 0; i < kN; i++) {
      EXPECT_EQ(ms[i]->MinAnnounced(), UINT64_MAX) << i;
      EXPECT_EQ(ms[i]->SlotCount(), 1u) << i;  // one thread: always its one slot
    }
  }
}

// Threads exit: their slots come back. A thread_local constructed before the
// thread's first guard is destroyed after the binding list, and runs guards
// in its destructor: those take a slot for their own duration. With a bounded
// manager a leaked slot makes the later threads fail.
EpochManager* g_exit_m = nullptr;
std::atomic<int> g_exit_ok{0}, g_exit_bad{0};
// A guard and a nested one on g_exit_m, as a thread-exit destructor runs
// them: both get the same slot and announce.
void NestedGuardsAtExit(std::atomic<int>& ok, std::atomic<int>& bad) {
  Guard g(*g_exit_m);
  Guard nested(*g_exit_m);
  if (g.ok() && nested.ok() && g.slot() == nested.slot() && g_exit_m->MinAnnounced() != UINT64_MAX) ok++;
  else bad++;
}
struct GuardAtExit {
  bool armed = false;
  ~GuardAtExit() {
    if (armed) NestedGuardsAtExit(g_exit_ok, g_exit_bad);
  }
};
TEST(Epoch, ThreadExitReleasesSlotsAlsoForLateGuards) {
  EpochManager m(/*max_slots=*/4);
  EpochManager other;  // a second manager used by the same threads
  g_exit_m = &m;
  g_exit_ok = 0;
  g_exit_bad = 0;
  const int kThreads = 300;
  for (int i = 0; i < kThreads; i++) {
    std::thread([&] {
      thread_local GuardAtExit late;  // constructed before the binding list
      late.armed = true;
      Guard g(m);
      EXPECT_TRUE(g.ok());
      Guard g2(other);
      EXPECT_TRUE(g2.ok());
    }).join();
  }
  EXPECT_EQ(g_exit_ok.load(), kThreads);
  EXPECT_EQ(g_exit_bad.load(), 0);
  EXPECT_LE(m.SlotCount(), 2u);      // reused, not leaked
  EXPECT_LE(other.SlotCount(), 1u);
  EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
  g_exit_m = nullptr;
}

// A thread that only ever runs guards during its exit (no binding list yet).
TEST(Epoch, GuardsOnlyAtThreadExit) {
  EpochManager m(/*max_slots=*/2);
  g_exit_m = &m;
  g_exit_ok = 0;
  for (int i = 0; i < 50; i++) {
    std::thread([] {
      thread_local GuardAtExit late;
      late.armed = true;
    }).join();
  }
  EXPECT_EQ(g_exit_ok.load(), 50);
  Guard g(m);
  EXPECT_TRUE(g.ok());
  g_exit_m = nullptr;
}

// Guards run from a pthread_key destructor (glibc runs those after every
// thread_local destructor), in threads that never used the manager before
// (that guard binds the thread's first slot) and in threads that did.
// Against a manager capped at 2 slots a leaked slot makes later guards fail.
// Failed while the bindings were a thread_local released by its destructor:
// touched first from a pthread_key destructor, that thread_local registered
// a destructor that never ran, and the slot leaked.
std::atomic<int> g_key_ok{0}, g_key_bad{0};
void GuardsInKeyDestructor(void*) { NestedGuardsAtExit(g_key_ok, g_key_bad); }
TEST(Epoch, GuardsFromPthreadKeyDestructorsReleaseTheirSlots) {
  EpochManager m(/*max_slots=*/2);
  g_exit_m = &m;
  g_key_ok = 0;
  g_key_bad = 0;
  pthread_key_t key;
  ASSERT_EQ(pthread_key_create(&key, &GuardsInKeyDestructor), 0);
  const int kThreads = 100;
  for (int i = 0; i < kThreads; i++) {
    const bool used_before = i % 2 == 1;
    std::thread([&] {
      pthread_setspecific(key, &m);  // non-null: the destructor runs at exit
      if (used_before) {
        Guard g(m);
        EXPECT_TRUE(g.ok());
      }
    }).join();
  }
  EXPECT_EQ(g_key_ok.load(), kThreads);
  EXPECT_EQ(g_key_bad.load(), 0);
  EXPECT_LE(m.SlotCount(), 2u);
  std::thread([&] {
    Guard g(m);
    EXPECT_TRUE(g.ok());
  }).join();
  EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
  pthread_key_delete(key);
  g_exit_m = nullptr;
}

// More threads inside guards at once than a chunk has slots (unbounded), and
// than a bounded manager allows (the surplus gets !ok(), and slots come back
// once the threads exit).
TEST(Epoch, ManyThreadsAtOnce) {
  const int kThreads = 200;
  for (uint32_t cap : {EpochManager::kUnbounded, 16u}) {
    SCOPED_TRACE(cap);
    EpochManager m(cap);
    std::atomic<int> in{0}, ok{0}, failed{0};
    std::atomic<bool> release{false};
    std::vector<int> slot(kThreads, -1);
    std::vector<std::thread> ts;
    for (int i = 0; i < kThreads; i++)
      ts.emplace_back([&, i] {
        Guard g(m);
        if (g.ok()) {
          ok++;
          slot[i] = int(g.slot());
        } else {
          failed++;
        }
        in++;
        while (!release.load()) std::this_thread::yield();
      });
    while (in.load() < kThreads) std::this_thread::yield();
    if (cap == 0) {
      EXPECT_EQ(ok.load(), kThreads);
      EXPECT_GE(m.SlotCount(), uint32_t(kThreads));
    } else {
      EXPECT_EQ(ok.load(), int(cap));
      EXPECT_EQ(failed.load(), kThreads - int(cap));
      EXPECT_EQ(m.SlotCount(), cap);
    }
    EXPECT_NE(m.MinAnnounced(), UINT64_MAX);
    release = true;
    for (auto& t : ts) t.join();
    std::vector<int> seen;
    for (int s : slot)
      if (s >= 0) seen.push_back(s);
    std::sort(seen.begin(), seen.end());
    EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end()) << "a slot bound twice";
    EXPECT_EQ(m.MinAnnounced(), UINT64_MAX);
    std::thread([&] {
      Guard g(m);
      EXPECT_TRUE(g.ok());
    }).join();
  }
}

// A manager destroyed while a live thread still has it bound: that thread
// drops the binding (no use of the freed slots at its exit, ASan), and a new
// manager, possibly at the same address, is never confused with it.
TEST(Epoch, ManagerDestroyedWhileThreadsKeepBindings) {
  std::atomic<int> step{0};
  auto* m1 = new EpochManager;
  std::thread t([&] {
    { Guard g(*m1); }
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    EpochManager* m2 = new EpochManager;
    {
      Guard g(*m2);
      EXPECT_TRUE(g.ok());
      EXPECT_NE(m2->MinAnnounced(), UINT64_MAX);
    }
    EXPECT_EQ(m2->MinAnnounced(), UINT64_MAX);
    delete m2;
  });
  while (step.load() != 1) std::this_thread::yield();
  delete m1;
  step = 2;
  t.join();
}

}  // namespace
}  // namespace pmindex::internal
