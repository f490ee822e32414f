// fastfair_node_test.cc: the FAST in-node protocol (fastfair_node.h) on one
// node in DRAM, without a tree or a pool: inserts (right shifts, appends,
// left shifts into an lk prefix), deletes, DropPrefix and FixLk keep the
// records sorted, the validity rule and invariant I2.
#include "fastfair/fastfair_node.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace pmindex::internal::fastfair {
namespace {

constexpr uint32_t kNodeSize = 512;
constexpr uint32_t kCap = (kNodeSize - sizeof(Node)) / sizeof(Entry);  // 26

struct DramNode {
  alignas(64) char buf[kNodeSize];
  DramNode() { std::memset(buf, 0, sizeof(buf)); }  // lk = 0, slots 0 and 1 copy it (I2)
  Node* n() { return reinterpret_cast<Node*>(buf); }
};

// The records a reader sees (ignored slots skipped), in slot order.
std::vector<std::pair<uint64_t, uint64_t>> Records(Node* n) {
  std::vector<std::pair<uint64_t, uint64_t>> r;
  for (uint32_t j = 0; j < n->count; j++)
    if (!NodeOps::Ignored(n, j)) r.emplace_back(n->ents()[j].k, n->ents()[j].v);
  return r;
}

// Node invariants of a repaired node: ignored slots only in the leading lk
// prefix, keys ascending, I2 behind the count.
void ExpectNode(NodeOps& ops, Node* n, const std::map<uint64_t, uint64_t>& want) {
  const auto got = Records(n);
  const std::vector<std::pair<uint64_t, uint64_t>> expected(want.begin(), want.end());
  EXPECT_EQ(got, expected);
  const uint32_t s = ops.Start(n);
  for (uint32_t j = s; j < n->count; j++) EXPECT_FALSE(NodeOps::Ignored(n, j)) << "slot " << j;
  const Entry* e = n->ents();
  const uint64_t left = n->count ? e[n->count - 1].k : n->lk;
  for (uint32_t i = n->count; i < std::min(n->count + 2, kCap); i++) EXPECT_EQ(e[i].k, left) << "I2 at " << i;
}

uint32_t Position(NodeOps& ops, Node* n, uint64_t k) {
  uint32_t j = ops.Start(n);
  while (j < n->count && n->ents()[j].k < k) j++;
  return j;
}

TEST(FastFairNode, InsertsAndDeletesKeepTheNodeSorted) {
  NodeOps ops(kCap);
  DramNode d;
  Node* n = d.n();
  std::map<uint64_t, uint64_t> want;
  std::mt19937_64 rng(7);
  while (want.size() < kCap) {
    const uint64_t k = 1 + rng() % 1000;
    if (want.count(k)) continue;
    ops.InsertAt(n, Position(ops, n, k), k, k * 10);
    want[k] = k * 10;
    ExpectNode(ops, n, want);
  }
  EXPECT_EQ(n->count, kCap);
  EXPECT_EQ(n->sw & 1, 0u) << "inserts leave the node in insert mode";
  while (!want.empty()) {
    auto it = want.begin();
    std::advance(it, rng() % want.size());
    const uint32_t pos = Position(ops, n, it->first);
    ASSERT_EQ(n->ents()[pos].k, it->first);
    ops.DeleteAt(n, pos, true);
    want.erase(it);
    ExpectNode(ops, n, want);
    EXPECT_EQ(n->sw & 1, 1u) << "deletes leave the node in delete mode";
  }
  EXPECT_EQ(n->count, 0u);
}

// A leaf whose records sit behind an lk prefix: an insert near the front
// moves the records before it one slot left (count unchanged).
TEST(FastFairNode, LeftInsertShiftsIntoThePrefix) {
  NodeOps ops(kCap);
  DramNode d;
  Node* n = d.n();
  std::map<uint64_t, uint64_t> want;
  const uint32_t s = 6;
  for (uint32_t j = 0; j < s; j++) n->ents()[j] = {n->lk, 0};
  for (uint32_t i = 0; i < 6; i++) {
    n->ents()[s + i] = {100 + 10 * i, i};
    want[100 + 10 * i] = i;
  }
  n->count = s + 6;
  ops.SetTail(n);
  ASSERT_EQ(ops.Start(n), s);
  ExpectNode(ops, n, want);
  ops.InsertAt(n, Position(ops, n, 105), 105, 99);  // one record before it, four after
  want[105] = 99;
  EXPECT_EQ(ops.left_inserts_.load(), 1u);
  EXPECT_EQ(n->count, s + 6) << "a left insert does not grow the count";
  EXPECT_EQ(ops.Start(n), s - 1);
  ExpectNode(ops, n, want);
  ops.InsertAt(n, Position(ops, n, 145), 145, 98);  // near the end: a right shift
  want[145] = 98;
  EXPECT_EQ(ops.left_inserts_.load(), 1u);
  EXPECT_EQ(n->count, s + 7);
  ExpectNode(ops, n, want);
  ops.DropPrefix(n);
  EXPECT_EQ(ops.Start(n), 0u);
  EXPECT_EQ(ops.prefix_drops_.load(), 1u);
  EXPECT_EQ(n->count, want.size());
  ExpectNode(ops, n, want);
}

// An insert of a key equal to lk first moves lk to a value that is no key.
TEST(FastFairNode, FixLkChoosesAFreeValue) {
  NodeOps ops(kCap);
  DramNode d;
  Node* n = d.n();
  std::map<uint64_t, uint64_t> want;
  for (uint64_t k : {1, 2, 4}) {
    ops.InsertAt(n, Position(ops, n, k), k, k);
    want[k] = k;
  }
  ops.FixLk(n, 0);  // about to insert key 0 == lk
  EXPECT_EQ(n->lk, 3u);
  ops.InsertAt(n, 0, 0, 5);
  want[0] = 5;
  ExpectNode(ops, n, want);
}

}  // namespace
}  // namespace pmindex::internal::fastfair
