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
//
// The files live in a world-writable directory (/dev/shm): they are created
// with O_EXCL (after removing our own previous file), mode 0600, and never
// through a symbolic link; a file at the path that is not a regular file
// owned by this user is refused, so another user cannot make a checker write
// through a planted link or into a file they can read.
//
// Thread safety: plain functions over distinct paths; callers do not share a
// path between threads.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace pmindex::pm {

// Creates an empty file at path for writing: removes what is there (our
// previous image; unlink of another user's file in a sticky directory fails,
// and then so does the O_EXCL open), then O_CREAT|O_EXCL|O_NOFOLLOW, mode
// 0600. Returns the descriptor or -1 (errno set).
inline int CreateFileExclusive(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

// Opens an existing file for rewriting if it is a regular file owned by this
// user (never following a link), else creates it with CreateFileExclusive.
// Returns the descriptor or -1.
inline int OpenOwnFileForRewrite(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? CreateFileExclusive(path) : -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    ::close(fd);
    errno = EPERM;
    return -1;
  }
  return fd;
}

// Makes the file at path hold exactly image[0, size) (creating it if
// needed, see OpenOwnFileForRewrite). Returns false on an I/O error or a
// refused file.
inline bool WriteImageFile(const std::string& path, const char* image, size_t size) {
  const int fd = OpenOwnFileForRewrite(path);
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
