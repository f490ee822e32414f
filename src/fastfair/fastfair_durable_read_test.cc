// fastfair_durable_read_test (label: concurrency): a lock-free read must not
// answer from a store that a crash can still take away (docs/fastfair.md,
// "Durable reads"). A writer is held at the after_commit hook (fastfair.h),
// after the store that commits its insert, update or delete for lock-free
// readers and before the fence that makes it durable; a reader's Find or
// Scan returns; the durable image at that moment (kit/test_observer.h) is
// recovered and must agree with what the reader answered. Each scenario
// also runs with the no_durable_reads switch, the control that shows the
// scenario fails without the readers' flush (the answered record is lost,
// the old value or a removed key comes back). Every scenario runs on a
// u64 tree and on a byte-key, byte-value tree (whose readers are lock-free
// too and read the blocks in place).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/index_util.h"
#include "fastfair/fastfair.h"
#include "fastfair/fastfair_test_util.h"
#include "kit/test_observer.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace {

using namespace pmindex;
using fftest::U64;

enum class Op { kInsertShift, kInsertAppend, kUpdate, kRemove, kScan };
const char* const kOpNames[] = {"insert (shift)", "insert (append)", "update", "remove", "scan over an insert"};

struct Outcome {
  Status read;            // the reader's answer
  std::string read_value;  // its value (Find), or "1" if the scan returned the key
  Status recovered;        // Find of the key in the recovered image
  std::string recovered_value;
};

// Keys and values of the u64 tree, or of the byte tree (same order).
std::string Key(bool bytes, uint64_t k) {
  if (!bytes) return U64(k);
  char b[16];
  std::snprintf(b, sizeof b, "key%04llu", static_cast<unsigned long long>(k));
  return b;
}
std::string Val(bool bytes, uint64_t v) { return bytes ? "value-" + std::to_string(v) + std::string(30, '.') : U64(v); }

// One leaf holding keys 10, 20, ..., 100 (value key + 1000), all durable;
// the writer runs `op` and is held after its commit store; the reader
// answers; the image is taken, the writer released; the image is opened.
Outcome RunScenario(Op op, bool durable_reads, bool bytes) {
  fftest::PoolGuard live("durable-live"), image("durable-image");
  const KeyKind kk = bytes ? KeyKind::kBytes : KeyKind::kU64;
  const ValueKind vk = bytes ? ValueKind::kBytes : ValueKind::kU64;
  Options o = fftest::MakeOptions(live.path, kk, vk, 512);
  o.pool_size = o.max_pool_size = 8ull << 20;  // no growth: the image covers the pool
  std::unique_ptr<internal::kit::DurableImage> sim;
  std::unique_ptr<Index> idx;
  EXPECT_TRUE(internal::kit::CreateObservedIndex("fastfair", o, &sim, &idx));
  for (uint64_t k = 10; k <= 100; k += 10) EXPECT_TRUE(idx->Insert(Key(bytes, k), Val(bytes, k + 1000)).ok());
  const uint64_t key = op == Op::kInsertAppend ? 105 : (op == Op::kUpdate || op == Op::kRemove) ? 50 : 55;

  std::mutex mu;
  std::condition_variable cv;
  int phase = 0;  // 1: writer held after its commit, 2: released
  internal::fastfair::TestHooks hooks;
  hooks.no_durable_reads = !durable_reads;
  hooks.after_commit = [&](const void*) {
    std::unique_lock<std::mutex> l(mu);
    if (phase != 0) return;
    phase = 1;
    cv.notify_all();
    if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return phase == 2; }))
      ADD_FAILURE() << "timed out waiting for the reader";
  };
  internal::fastfair::SetTestHooks(idx.get(), &hooks);
  std::thread w([&] {
    Status s = op == Op::kUpdate   ? idx->Update(Key(bytes, key), Val(bytes, 7))
               : op == Op::kRemove ? idx->Remove(Key(bytes, key))
                                   : idx->Insert(Key(bytes, key), Val(bytes, key + 1000));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  {
    std::unique_lock<std::mutex> l(mu);
    EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(20), [&] { return phase == 1; })) << "the writer never committed";
  }
  Outcome out;
  if (op == Op::kScan) {
    size_t n = 0;
    out.read = idx->Scan(Key(bytes, 0), 100, [&](Slice k, Slice) {
      if (k == Key(bytes, key)) out.read_value = "1";
      return true;
    }, &n);
  } else {
    out.read = idx->Find(Key(bytes, key), &out.read_value);
  }
  std::vector<char> img = sim->Snapshot();  // power failure now
  {
    std::lock_guard<std::mutex> l(mu);
    phase = 2;
    cv.notify_all();
  }
  w.join();
  internal::fastfair::SetTestHooks(idx.get(), nullptr);
  sim.reset();
  idx.reset();
  internal::kit::DurableImage::Write(img, image.path);
  Options ro = o;
  ro.pool_path = image.path;
  ro.create_if_missing = false;
  std::unique_ptr<Index> rec;
  Status s = OpenIndex("fastfair", ro, &rec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return out;
  Status c = rec->Check();
  EXPECT_TRUE(c.ok()) << c.ToString();
  EXPECT_TRUE(fftest::NoLeak(rec.get()));
  out.recovered = rec->Find(Key(bytes, key), &out.recovered_value);
  for (uint64_t k = 10; k <= 100; k += 10) {  // every other record survives
    if (op == Op::kRemove && k == key) continue;
    EXPECT_TRUE(rec->Find(Key(bytes, k), nullptr).ok()) << k;
  }
  EXPECT_TRUE(rec->Insert(Key(bytes, 999), Val(bytes, 1)).ok());  // the recovered tree keeps working
  EXPECT_TRUE(rec->Check().ok());
  return out;
}

class FastFairDurableRead : public testing::TestWithParam<std::tuple<Op, bool>> {};
std::string OpName(const testing::TestParamInfo<std::tuple<Op, bool>>& i) {
  const char* const names[] = {"InsertShift", "InsertAppend", "Update", "Remove", "Scan"};
  return std::string(names[int(std::get<0>(i.param))]) + (std::get<1>(i.param) ? "_bytes" : "_u64");
}

TEST_P(FastFairDurableRead, AnswerSurvivesACrashBeforeTheWritersFence) {
  const Op op = std::get<0>(GetParam());
  const bool bytes = std::get<1>(GetParam());
  for (const bool fix : {true, false}) {
    SCOPED_TRACE(std::string(kOpNames[int(op)]) + (fix ? "" : " (control: no_durable_reads)"));
    Outcome r = RunScenario(op, fix, bytes);
    // The reader saw the writer's commit.
    switch (op) {
      case Op::kInsertShift:
      case Op::kInsertAppend:
        ASSERT_TRUE(r.read.ok()) << r.read.ToString();
        break;
      case Op::kUpdate:
        ASSERT_TRUE(r.read.ok()) << r.read.ToString();
        ASSERT_EQ(r.read_value, Val(bytes, 7));
        break;
      case Op::kRemove:
        ASSERT_TRUE(r.read.IsNotFound()) << r.read.ToString();
        break;
      case Op::kScan:
        ASSERT_TRUE(r.read.ok()) << r.read.ToString();
        ASSERT_EQ(r.read_value, "1") << "the scan did not return the key being inserted";
        break;
    }
    // With the readers' flush the crash keeps what the reader answered;
    // without it, it takes it away.
    const uint64_t key = op == Op::kInsertAppend ? 105 : (op == Op::kUpdate || op == Op::kRemove) ? 50 : 55;
    switch (op) {
      case Op::kInsertShift:
      case Op::kInsertAppend:
      case Op::kScan:
        if (fix) EXPECT_TRUE(r.recovered.ok()) << "a record the reader returned is lost: " << r.recovered.ToString();
        else EXPECT_TRUE(r.recovered.IsNotFound()) << "control: " << r.recovered.ToString();
        if (fix && r.recovered.ok()) {
          EXPECT_EQ(r.recovered_value, Val(bytes, key + 1000));
        }
        break;
      case Op::kUpdate:
        ASSERT_TRUE(r.recovered.ok()) << r.recovered.ToString();
        EXPECT_EQ(r.recovered_value, fix ? Val(bytes, 7) : Val(bytes, key + 1000))
            << (fix ? "the value the reader returned is lost" : "control");
        break;
      case Op::kRemove:
        if (fix) EXPECT_TRUE(r.recovered.IsNotFound()) << "a key the reader found absent came back: " << r.recovered.ToString();
        else EXPECT_TRUE(r.recovered.ok()) << "control: " << r.recovered.ToString();
        break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, FastFairDurableRead,
                         testing::Combine(testing::Values(Op::kInsertShift, Op::kInsertAppend, Op::kUpdate,
                                                          Op::kRemove, Op::kScan),
                                          testing::Bool()),
                         OpName);

}  // namespace
