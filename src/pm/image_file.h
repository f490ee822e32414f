// Internal test support: writing a simulated crash image to a pool file.
//
// The in-process crash simulators of the index tests (fastfair, fptree,
// nvc_hashmap) write the durable image of a pool to a file at every fence
// and open it as a pool after a power failure. Rewriting the whole file with
// truncation each time made the kernel free and re-allocate every page of
// it (about 60% of fastfair_crash_test's time in a profile). WriteImageFile
// rewrites only the 4 KiB pages whose bytes differ from what the file holds
// now (the previous image plus whatever the verifying open wrote to it), so
// the file ends up byte-identical to the image either way.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace pmindex::pm {

// Makes the file at path hold exactly image[0, size) (creating it if
// needed). Returns false on an I/O error.
inline bool WriteImageFile(const std::string& path, const char* image, size_t size) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0;
  if (ok && uint64_t(st.st_size) != size) ok = ::ftruncate(fd, off_t(size)) == 0;  // new bytes read as 0
  constexpr size_t kPage = 4096, kChunk = 64 * kPage;
  std::vector<char> cur(kChunk);
  for (size_t off = 0; ok && off < size; off += kChunk) {
    const size_t n = std::min(kChunk, size - off);
    ok = ::pread(fd, cur.data(), n, off_t(off)) == ssize_t(n);
    for (size_t p = 0; ok && p < n; p += kPage) {
      const size_t m = std::min(kPage, n - p);
      if (std::memcmp(cur.data() + p, image + off + p, m) != 0)
        ok = ::pwrite(fd, image + off + p, m, off_t(off + p)) == ssize_t(m);
    }
  }
  ok = ::close(fd) == 0 && ok;
  return ok;
}

}  // namespace pmindex::pm
