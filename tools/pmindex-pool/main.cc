// pmindex-pool: inspect and verify pmindex pool files.
//
//   pmindex-pool info POOL [--json]   header fields, owner, sizes, usage,
//                                     the mapping used
//   pmindex-pool check POOL           the header, the allocator metadata and
//                                     the owner index's recovery + Check()
// `info` opens the pool read-only under a shared lock (it never writes and
// never runs recovery) and falls back to the header alone when another
// process holds the pool open. `check` opens it copy-on-write (MAP_PRIVATE,
// shared lock): the allocator's and the index's recovery run on private
// pages and the file is never written. The index part runs in a forked
// child, so an index that crashes on hostile bytes is reported as corrupt,
// not as a crash of the tool. Corruption is a message and an exit code: the
// header is validated with pread before anything is mapped, and nothing
// beyond the file size is mapped.
//
// Exit codes (the convention of every pmindex tool, tools/common/cli.h):
// 0 ok, 1 corrupt, 2 usage, 3 cannot open (missing, busy, I/O error).
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/cli.h"
#include "core/index_util.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

constexpr int kExitOk = tools::kExitOk;
constexpr int kExitCorrupt = tools::kExitFound;   // not a valid pool, or inconsistent metadata
constexpr int kExitOpen = tools::kExitCannotRun;  // cannot open: missing, busy, I/O error
constexpr int kExitUsage = tools::kExitUsage;

int ExitFor(const Status& s) {
  if (s.ok()) return kExitOk;
  if (s.IsCorrupt() || s.IsInvalidArgument()) return kExitCorrupt;
  return kExitOpen;
}

std::string Bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%llu (%.2f GiB)", (unsigned long long)b, double(b) / double(1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%llu (%.2f MiB)", (unsigned long long)b, double(b) / double(1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)b);
  return buf;
}

int Info(const std::string& path, bool json) {
  pm::PoolInfo info;
  Status s = pm::Pool::ReadInfo(path, &info);
  if (!s.ok()) {
    std::cerr << "pmindex-pool: " << s.ToString() << "\n";
    return ExitFor(s);
  }
  pm::PoolOptions ro;
  ro.read_only = true;
  std::unique_ptr<pm::Pool> pool;
  Status os = pm::Pool::Open(path, "", ro, &pool);
  bool have_usage = false;
  std::string note;
  if (os.ok()) {
    pm::PoolInfo full = pool->Info();
    info.bytes_in_use = full.bytes_in_use;
    info.blocks_in_use = full.blocks_in_use;
    info.dax = full.dax;
    info.mapping = full.mapping;
    have_usage = true;
  } else if (os.IsBusy()) {
    note = "pool is open in another process: usage not read";
  } else {
    std::cerr << "pmindex-pool: " << os.ToString() << "\n";
    return ExitFor(os);
  }
  if (json) {
    nlohmann::json j = {{"path", info.path},
                        {"type", info.type},
                        {"uuid", info.uuid},
                        {"version", info.version},
                        {"size", info.size},
                        {"max_size", info.max_size},
                        {"root", info.root},
                        {"clean_shutdown", info.clean_shutdown}};
    if (have_usage) {
      j["bytes_in_use"] = info.bytes_in_use;
      j["blocks_in_use"] = info.blocks_in_use;
      j["dax"] = info.dax;
      j["mapping"] = info.mapping;
    }
    if (!note.empty()) j["note"] = note;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "pool:            " << info.path << "\n"
            << "owner type:      " << info.type << "\n"
            << "uuid:            " << info.uuid << "\n"
            << "format version:  " << info.version << "\n"
            << "size:            " << Bytes(info.size) << "\n"
            << "max size:        " << Bytes(info.max_size) << "\n"
            << "root offset:     " << info.root << "\n"
            << "clean shutdown:  " << (info.clean_shutdown ? "yes" : "no (crashed or still open)") << "\n";
  if (have_usage) {
    std::cout << "bytes in use:    " << Bytes(info.bytes_in_use) << "\n"
              << "blocks in use:   " << info.blocks_in_use << "\n"
              << "mapping:         " << info.mapping << (info.dax ? "" : ", msync on close") << "\n";
  } else {
    std::cout << "note:            " << note << "\n";
  }
  return kExitOk;
}

// The owner index's recovery and Check() on a copy-on-write open, in a
// forked child. Returns kExitOk, kExitCorrupt or kExitOpen with the verdict
// in *msg.
int CheckIndex(const std::string& path, const std::string& type, std::string* msg) {
  if (!FindIndexInfo(type, nullptr)) {
    *msg = "index not checked: this build has no index type '" + type + "'";
    return kExitOk;
  }
  int fds[2];
  if (::pipe(fds) != 0) {
    *msg = std::string("pipe: ") + std::strerror(errno);
    return kExitOpen;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    *msg = std::string("fork: ") + std::strerror(errno);
    return kExitOpen;
  }
  if (pid == 0) {
    ::close(fds[0]);
    pm::PoolOptions cow;
    cow.copy_on_write = true;
    std::unique_ptr<pm::Pool> pool;
    std::string out;
    int rc = kExitOk;
    Status s = pm::Pool::Open(path, type, cow, &pool);
    if (!s.ok()) {
      rc = s.IsCorrupt() || s.IsInvalidArgument() ? kExitCorrupt : kExitOpen;
      out = s.ToString();
    } else {
      Options o;
      o.pool_path = path;
      o.recovery_threads = 1;
      std::unique_ptr<Index> index;
      s = internal::OpenIndexInPool(std::move(pool), o, &index);
      if (s.ok()) s = index->Check();
      if (!s.ok()) {
        rc = kExitCorrupt;
        out = type + " recovery/Check: " + s.ToString();
      } else {
        out = type + " index recovered and checked (" + std::to_string(index->Size()) + " records)";
      }
      index.reset();  // closes the private mapping; the file is untouched
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(rc);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg->append(buf, size_t(n));
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(st)) {
    *msg = type + " recovery/Check crashed with signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) +
           "): the index is corrupt";
    return kExitCorrupt;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : kExitCorrupt;
}

int Check(const std::string& path) {
  pm::PoolOptions cow;
  cow.copy_on_write = true;
  std::unique_ptr<pm::Pool> pool;
  Status s = pm::Pool::Open(path, "", cow, &pool);
  if (!s.ok()) {
    std::cerr << "pmindex-pool check: " << path << ": " << s.ToString() << "\n";
    return ExitFor(s);
  }
  s = pool->allocator().Check();
  if (!s.ok()) {
    std::cerr << "pmindex-pool check: " << path << ": " << s.ToString() << "\n";
    return kExitCorrupt;
  }
  pm::PoolInfo info = pool->Info();
  // The child opens the pool itself (its own lock and mapping); ours is
  // closed first so that nothing is shared with it.
  pool.reset();
  std::string verdict;
  const int rc = CheckIndex(path, info.type, &verdict);
  if (rc != kExitOk) {
    std::cerr << "pmindex-pool check: " << path << ": " << verdict << "\n";
    return rc;
  }
  std::cout << path << ": ok (" << info.type << ", " << info.blocks_in_use << " blocks, " << info.bytes_in_use
            << " bytes in use" << (info.clean_shutdown ? "" : "; not cleanly closed: recovery runs at the next open")
            << "; " << verdict << ")\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmindex-pool: inspect and verify pmindex pool files.\n"};
  app.footer(
      "Exit codes:\n"
      "  0  success (check: the pool is consistent)\n"
      "  1  not a valid pool, or corrupt metadata or index (the message says what)\n"
      "  2  usage error\n"
      "  3  the pool cannot be opened (missing, in use elsewhere for check, I/O error)");
  app.require_subcommand(1);
  std::string path;
  bool json = false;
  auto* info = app.add_subcommand("info", "print the header, owner index type, sizes and usage");
  info->add_option("POOL", path, "pool file")->required();
  info->add_flag("--json", json, "print JSON");
  auto* check = app.add_subcommand("check",
                                   "verify the header, the allocator metadata and the owner index (its recovery and Check() "
                                   "on a private copy-on-write mapping: the file is never written)");
  check->add_option("POOL", path, "pool file")->required();
  if (std::optional<int> rc = tools::ParseArgs(app, argc, argv, kExitUsage)) return *rc;
  if (info->parsed()) return Info(path, json);
  return Check(path);
}
