// Public API basics: Status, registry, OpenIndex argument handling, and the
// dram_btree baseline.
#include <gtest/gtest.h>

#include "core/index_util.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::NotFound("key 7");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_EQ(s.ToString(), "NotFound: key 7");
  Status c = s;  // copy keeps the message
  EXPECT_EQ(c.message(), "key 7");
  EXPECT_EQ(Status::PoolFull().ToString(), "PoolFull");
  EXPECT_TRUE(Status::Busy("x").IsBusy());
  EXPECT_TRUE(Status::Corrupt("x").IsCorrupt());
}

TEST(RegistryTest, DramBtreeIsRegistered) {
  IndexInfo info;
  ASSERT_TRUE(FindIndexInfo("dram_btree", &info));
  EXPECT_FALSE(info.persistent);
  EXPECT_TRUE(info.ordered);
  EXPECT_FALSE(FindIndexInfo("no_such_index", nullptr));
  bool seen = false;
  for (const auto& i : ListIndexes()) seen |= i.name == "dram_btree";
  EXPECT_TRUE(seen);
}

TEST(RegistryTest, UnknownIndexIsAClearError) {
  std::unique_ptr<Index> idx;
  Status s = OpenIndex("btree_that_does_not_exist", Options(), &idx);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("dram_btree"), std::string_view::npos) << "message should list built-in indexes";
  EXPECT_EQ(idx, nullptr);
}

TEST(RegistryTest, UnknownParameterIsRejected) {
  Options o;
  o.params["no_such_param"] = "1";
  std::unique_ptr<Index> idx;
  EXPECT_TRUE(OpenIndex("dram_btree", o, &idx).IsInvalidArgument());
}

TEST(ParamsTest, ParsesAndValidates) {
  std::map<std::string, std::string> m{{"a", "12"}, {"b", "x"}, {"c", "true"}};
  internal::Params p(m);
  long long v = 0;
  EXPECT_TRUE(p.GetInt("a", 0, 0, 100, &v).ok());
  EXPECT_EQ(v, 12);
  EXPECT_TRUE(p.GetInt("a", 0, 0, 10, &v).IsInvalidArgument());
  EXPECT_TRUE(p.GetInt("b", 0, 0, 10, &v).IsInvalidArgument());
  EXPECT_TRUE(p.GetInt("zz", 5, 0, 10, &v).ok());
  EXPECT_EQ(v, 5);
  bool b = false;
  EXPECT_TRUE(p.GetBool("c", false, &b).ok());
  EXPECT_TRUE(b);
  EXPECT_TRUE(p.Expect({"a", "b", "c"}).ok());
  EXPECT_TRUE(p.Expect({"a", "b"}).IsInvalidArgument());
}

TEST(KeyOrderTest, U64IsNumericBytesAreMemcmp) {
  uint64_t a = 1, b = 256;  // little-endian bytes of 256 compare lower by memcmp
  EXPECT_LT(internal::CompareKeys(KeyKind::kU64, U64Slice(a), U64Slice(b)), 0);
  EXPECT_LT(internal::CompareKeys(KeyKind::kBytes, "ab", "abc"), 0);
  EXPECT_GT(internal::CompareKeys(KeyKind::kBytes, "\xff", "a"), 0);  // unsigned bytes
  EXPECT_EQ(internal::CompareKeys(KeyKind::kBytes, "abc", "abc"), 0);
}

TEST(FunctionRefTest, CallsThrough) {
  int calls = 0;
  auto f = [&](Slice k, Slice v) {
    calls++;
    return k.size() + v.size() < 5;
  };
  ScanCallback cb(f);
  EXPECT_TRUE(cb("a", "b"));
  EXPECT_FALSE(cb("abc", "def"));
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace pmindex
