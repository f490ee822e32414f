// Damaged nvtree pools: a word of the root, the micro-log, a leaf header or
// an entry is overwritten in the closed pool file; open, Check or an
// operation must report Corrupt, never crash or hang.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <string>

#include <gtest/gtest.h>

#include "nvtree/nvtree_format.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

using internal::nvtree::Root;

struct Damage {
  std::string what;
  bool bytes;
};

class NVTreeCorrupt : public testing::TestWithParam<Damage> {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    opts_.pool_path = "/dev/shm/nvtree-corrupt-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".pool";
    opts_.key_kind = GetParam().bytes ? KeyKind::kBytes : KeyKind::kU64;
    opts_.value_kind = GetParam().bytes ? ValueKind::kBytes : ValueKind::kU64;
    opts_.params = {{"leaf_size", "8"}, {"inner_size", "4"}};
  }
  void TearDown() override { pm::Pool::Remove(opts_.pool_path); }
  std::string Key(uint64_t i) const { return GetParam().bytes ? "key" + std::to_string(i) : std::string(U64Slice(i)); }
  void Patch(uint64_t off, uint64_t v) {
    int fd = ::open(opts_.pool_path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &v, 8, off_t(off)), 8);
    ::close(fd);
  }
  Options opts_;
};

TEST_P(NVTreeCorrupt, ReportedNotCrashed) {
  uint64_t root = 0, head = 0, second = 0;
  {
    std::unique_ptr<Index> idx;
    ASSERT_TRUE(OpenIndex("nvtree", opts_, &idx).ok());
    for (uint64_t i = 0; i < 200; i++) ASSERT_TRUE(idx->Insert(Key(i), Key(i + 1).substr(0, 8)).ok());
    char* base = idx->pool()->base();
    root = *idx->pool()->root_slot();
    const Root* r = reinterpret_cast<const Root*>(base + root);
    head = r->head;
    std::memcpy(&second, base + head + 8, 8);
    ASSERT_TRUE(idx->Close().ok());
  }
  const std::string& w = GetParam().what;
  if (w == "magic") Patch(root + offsetof(Root, magic), 0x1234);
  else if (w == "head") Patch(root + offsetof(Root, head), 4096 + 24);
  else if (w == "head0") Patch(root + offsetof(Root, head), 0);
  else if (w == "leaf_cap") Patch(root + offsetof(Root, leaf_cap), 100000);
  else if (w == "count") Patch(head, 1000);
  else if (w == "next_cycle") Patch(second + 8, head);
  else if (w == "next_wild") Patch(head + 8, uint64_t(1) << 40);
  else if (w == "log_old") Patch(root + offsetof(Root, log) + 8, 77);
  else if (w == "flag") Patch(head + 16, 5);
  else if (w == "key_block") Patch(head + 16 + 8, uint64_t(1) << 41);
  Options o = opts_;
  o.params.clear();
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("nvtree", o, &idx);
  if (!s.ok()) {
    EXPECT_TRUE(s.IsCorrupt()) << s.ToString();
    return;
  }
  Status c = idx->Check();
  // An open that succeeded must answer Corrupt from Check or stay usable.
  std::string v;
  for (uint64_t i = 0; i < 200; i++) (void)idx->Find(Key(i), &v);
  (void)idx->Scan(Key(0), 1000, [](Slice, Slice) { return true; });
  EXPECT_TRUE(c.IsCorrupt()) << w << ": " << c.ToString();
}

std::vector<Damage> Cases() {
  std::vector<Damage> v;
  for (bool b : {false, true})
    for (std::string w : {"magic", "head", "head0", "leaf_cap", "count", "next_cycle", "next_wild", "log_old", "flag"})
      v.push_back({w, b});
  v.push_back({"key_block", true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, NVTreeCorrupt, testing::ValuesIn(Cases()),
                         [](const auto& i) { return i.param.what + (i.param.bytes ? "_bytes" : "_u64"); });

}  // namespace
}  // namespace pmindex
