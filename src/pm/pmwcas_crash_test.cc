// pmwcas_crash_test: power failure at every store, flush and fence of a
// single-threaded PMwCAS workload, and during the recovery of such crashes.
//
// Failure model (docs/persistence.md): a line reaches PM when flushed and a
// fence follows; a flushed line may also reach PM before that fence; any
// stored line may be written back early (an eviction). Every operation is
// recorded (pmwcas_test_util.h Recorder) and, at each event, the image made
// of the durable bytes plus the lines flushed since the last fence (and, at
// a store, that store's line) is written to a file and opened as a pool.
// The recovered pool must hold either the state before the operation in
// flight or the state after it (all-or-nothing; a completed operation is
// durable), keep the sum of the value words, leave no descriptor or RDCSS
// pointer in a target word, own exactly the allocated blocks (root block +
// the blocks the pointer words hold: no leak, no double free), free every
// descriptor, and run a new operation. For some images the recovery itself
// is recorded and crashed at each of its events, and the result checked the
// same way (idempotent recovery).
// Each fault switch (pmwcas.skip_descriptor_persist, skip_status_persist,
// skip_dirty_flush) must make some image fail.
#include <unistd.h>

#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include <gtest/gtest.h>

#include "pm/image_file.h"
#include "pm/pmwcas_test_util.h"
#include "pmindex/pm/fault.h"

namespace pmindex::pm {
namespace {

using pmwcas_test::Recorder;
using pmwcas_test::TestPool;

constexpr int kValues = 8;
constexpr int kPtrs = 2;
constexpr size_t kValueWord[kValues] = {0, 3, 8, 9, 17, 24, 33, 39};  // some share a line
constexpr size_t kPtrWord[kPtrs] = {48, 56};
constexpr uint64_t kInitial = 1000;

struct State {
  uint64_t v[kValues];
  uint64_t p[kPtrs];
  bool operator==(const State& o) const {
    return std::equal(v, v + kValues, o.v) && std::equal(p, p + kPtrs, o.p);
  }
};

// Durable image bookkeeping across the whole workload.
class Tracker {
 public:
  Tracker(uintptr_t base, std::string image) : base_(base), durable_(std::move(image)) {}
  // Processes events; fn(image) at each one (stops early if it returns false).
  void Process(const std::vector<Recorder::Event>& events, const std::function<bool(const std::string&)>& fn) {
    bool go = true;
    auto in = [&](uintptr_t l) { return l >= base_ && l + kCacheLine <= base_ + durable_.size(); };
    auto with_pending = [&] {
      std::string img = durable_;
      for (auto& [off, b] : pending_) std::memcpy(img.data() + off, b.data(), kCacheLine);
      return img;
    };
    for (const auto& e : events) {
      if (e.kind == Recorder::kFence) {
        for (auto& [off, b] : pending_) std::memcpy(durable_.data() + off, b.data(), kCacheLine);
        pending_.clear();
        if (go) go = fn(durable_);
      } else if (in(e.line) && e.kind == Recorder::kFlush) {
        pending_.emplace_back(e.line - base_, std::string(e.bytes, kCacheLine));
        if (go) go = fn(with_pending());
      } else if (in(e.line)) {
        if (!go) continue;
        std::string img = with_pending();
        std::memcpy(img.data() + (e.line - base_), e.bytes, kCacheLine);
        go = fn(img);
      }
    }
  }

 private:
  uintptr_t base_;
  std::string durable_;
  std::vector<std::pair<uint64_t, std::string>> pending_;
};

class PmwcasCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = std::make_unique<TestPool>("crash");
    img_ = t_->path + ".img";
    img2_ = t_->path + ".img2";
    for (int i = 0; i < kValues; i++) t_->Set(kValueWord[i], kInitial);
    for (int i = 0; i < kPtrs; i++) ASSERT_TRUE(t_->pool->allocator().Allocate(&t_->words[kPtrWord[i]], 64).ok());
    Fence();
    root_ = *t_->pool->root_slot();
    SetObserver(&rec_);
  }
  void TearDown() override {
    SetObserver(nullptr);
    DisableAllFaults();
    t_.reset();
    ::unlink(img_.c_str());
    ::unlink(img2_.c_str());
  }

  State Live() {
    State s;
    for (int i = 0; i < kValues; i++) s.v[i] = t_->pm()->Read(&t_->words[kValueWord[i]]);
    for (int i = 0; i < kPtrs; i++) s.p[i] = t_->pm()->Read(&t_->words[kPtrWord[i]]);
    return s;
  }

  // "" if the image at `path` recovers to pre or post.
  std::string Verify(const std::string& path, const State& pre, const State& post, bool run_op = true) {
    std::unique_ptr<Pool> p;
    Status s = Pool::Open(path, "", PoolOptions{}, &p);
    if (!s.ok()) return "open: " + s.ToString();
    PMwCAS* pm = p->pmwcas();
    if (!pm) return "no pmwcas";
    if (pm->DescriptorsInUse() != 0) return "descriptors in use after recovery";
    uint64_t* w = p->root<uint64_t>();
    if (!w) return "root lost";
    State st;
    for (int i = 0; i < kValues; i++) {
      const uint64_t raw = __atomic_load_n(&w[kValueWord[i]], __ATOMIC_ACQUIRE);
      if (raw & (pmwcas::kDescriptorBit | pmwcas::kRdcssBit)) return "value word " + std::to_string(i) + " holds a pointer";
      st.v[i] = pm->Read(&w[kValueWord[i]]);
    }
    for (int i = 0; i < kPtrs; i++) {
      const uint64_t raw = __atomic_load_n(&w[kPtrWord[i]], __ATOMIC_ACQUIRE);
      if (raw & (pmwcas::kDescriptorBit | pmwcas::kRdcssBit)) return "pointer word " + std::to_string(i) + " holds a pointer";
      st.p[i] = pm->Read(&w[kPtrWord[i]]);
    }
    uint64_t sum = 0;
    for (uint64_t v : st.v) sum += v;
    if (sum != kInitial * kValues) return "sum " + std::to_string(sum) + " (an operation was torn)";
    if (!(st == pre) && !(st == post)) return "state is neither before nor after the operation in flight";
    std::set<uint64_t> want = {root_}, have;
    for (uint64_t b : st.p) want.insert(b);
    p->allocator().ForEachAllocated([&](uint64_t off, size_t) { have.insert(off); });
    if (want != have)
      return "blocks: " + std::to_string(have.size()) + " allocated, " + std::to_string(want.size()) +
             " owned (leak or double free)";
    if (Status c = p->allocator().Check(); !c.ok()) return "allocator: " + c.ToString();
    if (run_op) {
      PMwCAS::Op op;
      if (!pm->Begin(&op).ok()) return "begin after recovery";
      op.AddWord(&w[kValueWord[0]], st.v[0], st.v[0] + 1);
      op.AddWord(&w[kValueWord[1]], st.v[1], st.v[1] - 1);
      bool ok = false;
      if (!op.Execute(&ok).ok() || !ok) return "operation after recovery failed";
    }
    return "";
  }

  // Recovery of `image` crashed at each of its events.
  std::string CrashRecovery(const std::string& image, const State& pre, const State& post, uint64_t* images) {
    if (!WriteImageFile(img2_, image.data(), image.size())) return "write";
    rec_.Take();
    rec_.on = true;
    std::unique_ptr<Pool> p;
    Status s = Pool::Open(img2_, "", PoolOptions{}, &p);
    rec_.on = false;
    auto events = rec_.Take();
    if (!s.ok()) return "open: " + s.ToString();
    const uintptr_t base = uintptr_t(p->base());
    p.reset();
    std::string failure;
    Tracker tr(base, image);
    tr.Process(events, [&](const std::string& img) {
      ++*images;
      if (!WriteImageFile(img2_, img.data(), img.size())) failure = "write";
      if (failure.empty()) failure = Verify(img2_, pre, post, false);
      if (!failure.empty()) failure = "crash during recovery: " + failure;
      return failure.empty();
    });
    return failure;
  }

  // Runs `ops` random operations, crashing at every event of each.
  std::string Run(int ops, uint64_t* images, uint64_t* recovery_images) {
    std::mt19937_64 rng(42);
    Tracker tr(uintptr_t(t_->pool->base()), std::string(t_->pool->base(), t_->pool->size()));
    *images = *recovery_images = 0;
    rec_.Take();
    rec_.on = true;  // also while Live() reads (a read may flush)
    for (int n = 0; n < ops; n++) {
      std::unordered_set<size_t> seen;
      const State pre = Live();
      PMwCAS::Op op;
      if (!t_->pm()->Begin(&op).ok()) return "begin";
      const int k = 1 + int(rng() % kValues);
      std::vector<int> idx(kValues);
      std::iota(idx.begin(), idx.end(), 0);
      std::shuffle(idx.begin(), idx.end(), rng);
      int64_t rest = 0;
      const bool wrong = rng() % 5 == 0;
      for (int j = 0; j < k; j++) {
        int64_t delta = j + 1 < k ? int64_t(rng() % 11) - 5 : -rest;
        rest += delta;
        const int i = idx[j];
        const uint64_t exp = pre.v[i] + (wrong && j == k - 1 ? 1 : 0);
        if (!op.AddWord(&t_->words[kValueWord[i]], exp, uint64_t(int64_t(pre.v[i]) + delta)).ok()) return "add";
      }
      const int ptr = rng() % 3 == 0 ? int(rng() % kPtrs) : -1;
      void* blk = nullptr;
      if (ptr >= 0) {
        Status s = op.AddAllocation(&t_->words[kPtrWord[ptr]], pre.p[ptr], 64, &blk, Recycle::kFreeOldOnSuccessNewOnFailure);
        if (!s.ok()) return "allocation: " + s.ToString();
        Set(blk, n & 0xff, 64);
        Persist(blk, 64);
      }
      bool ok = false;
      const bool abandon = rng() % 10 == 0;
      if (abandon) op.Abandon();
      else if (!op.Execute(&ok).ok()) return "execute";
      const State post = Live();
      if (abandon || !ok) {
        if (!(post == pre)) return "a failed operation changed words";
      } else if (ptr >= 0 && post.p[ptr] != t_->pool->OffsetOf(blk)) {
        return "the new block was not published";
      }
      if (ok == wrong && !abandon) return "outcome " + std::to_string(ok) + " with wrong=" + std::to_string(wrong);
      std::string failure;
      rec_.on = false;  // not while images are verified
      tr.Process(rec_.Take(), [&](const std::string& img) {
        if (!seen.insert(std::hash<std::string_view>()(img)).second) return true;
        ++*images;
        if (!WriteImageFile(img_, img.data(), img.size())) failure = "write";
        if (failure.empty()) failure = Verify(img_, pre, post);
        if (failure.empty() && *images % 23 == 0) failure = CrashRecovery(img, pre, post, recovery_images);
        if (!failure.empty()) failure = "operation " + std::to_string(n) + ", image " + std::to_string(*images) + ": " + failure;
        return failure.empty();
      });
      if (!failure.empty()) return failure;
      rec_.on = true;
    }
    rec_.on = false;
    return "";
  }

  std::unique_ptr<TestPool> t_;
  std::string img_, img2_;
  uint64_t root_ = 0;
  Recorder rec_;
};

TEST_F(PmwcasCrash, EveryEventOfOperationsRecovers) {
  uint64_t images = 0, rec_images = 0;
  EXPECT_EQ(Run(60, &images, &rec_images), "");
  EXPECT_GT(images, 1000u);
  EXPECT_GT(rec_images, 100u);
  std::printf("%llu crash images, %llu crashes during recovery\n", (unsigned long long)images,
              (unsigned long long)rec_images);
}

TEST_F(PmwcasCrash, SkippedDescriptorPersistIsCaught) {
  EnableFault("pmwcas.skip_descriptor_persist");
  uint64_t images = 0, rec_images = 0;
  const std::string f = Run(60, &images, &rec_images);
  EXPECT_NE(f, "");
  std::printf("caught: %s\n", f.c_str());
}

TEST_F(PmwcasCrash, SkippedStatusPersistIsCaught) {
  EnableFault("pmwcas.skip_status_persist");
  uint64_t images = 0, rec_images = 0;
  const std::string f = Run(60, &images, &rec_images);
  EXPECT_NE(f, "");
  std::printf("caught: %s\n", f.c_str());
}

TEST_F(PmwcasCrash, SkippedDirtyFlushIsCaught) {
  EnableFault("pmwcas.skip_dirty_flush");
  uint64_t images = 0, rec_images = 0;
  const std::string f = Run(60, &images, &rec_images);
  EXPECT_NE(f, "");
  std::printf("caught: %s\n", f.c_str());
}

}  // namespace
}  // namespace pmindex::pm
