// The files pmcheck writes in a shared directory (/dev/shm): crash images and
// pool copies are created O_EXCL|O_NOFOLLOW with mode 0600 and never written
// through a symbolic link (src/pm/image_file.h), and their names carry
// random bits (pmcheck::PoolPath), so another user can neither plant a link
// at a predictable name nor read what pmcheck writes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "checker_internal.h"
#include "pm/image_file.h"

namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Paths {
  std::string link, target;
  Paths() {
    const std::string base = "/dev/shm/tools-files-test-" + std::to_string(::getpid());
    link = base + "-link";
    target = base + "-target";
    ::unlink(link.c_str());
    ::unlink(target.c_str());
  }
  ~Paths() {
    ::unlink(link.c_str());
    ::unlink(target.c_str());
  }
};

TEST(ToolsFiles, ImagesAreNotWrittenThroughALink) {
  Paths p;
  { std::ofstream(p.target) << "someone else's file"; }
  ASSERT_EQ(::symlink(p.target.c_str(), p.link.c_str()), 0);
  const std::vector<char> img(8192, 'x');
  // WriteImageFile rewrites an existing image in place, but never through a link.
  EXPECT_FALSE(pmindex::pm::WriteImageFile(p.link, img.data(), img.size()));
  EXPECT_EQ(Slurp(p.target), "someone else's file");
  // CreateFileExclusive (pmcheck's images and copies) replaces the link with
  // a fresh private file.
  const int fd = pmindex::pm::CreateFileExclusive(p.link);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "img", 3), 3);
  ::close(fd);
  EXPECT_EQ(Slurp(p.target), "someone else's file");
  struct stat st;
  ASSERT_EQ(::lstat(p.link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A regular file of ours is rewritten in place.
  EXPECT_TRUE(pmindex::pm::WriteImageFile(p.link, img.data(), img.size()));
  EXPECT_EQ(Slurp(p.link), std::string(img.begin(), img.end()));
}

TEST(ToolsFiles, PmcheckFileNamesAreUnpredictable) {
  pmcheck::Config c;
  c.index = "pmcheck_toy";
  const std::string path = pmcheck::PoolPath(c, "img");
  EXPECT_EQ(path, pmcheck::PoolPath(c, "img"));  // stable within a run (signal cleanup relies on it)
  const std::string predictable = c.dir + "/pmcheck-pmcheck_toy-" + std::to_string(::getpid()) + "-img.pool";
  EXPECT_NE(path, predictable);
  // 16 hex digits of randomness between the pid and the kind.
  const std::string prefix = c.dir + "/pmcheck-pmcheck_toy-" + std::to_string(::getpid()) + "-";
  ASSERT_EQ(path.compare(0, prefix.size(), prefix), 0) << path;
  const std::string token = path.substr(prefix.size(), 16);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << path;
  EXPECT_EQ(path.substr(prefix.size() + 16), "-img.pool") << path;
}

}  // namespace
