// pmindex-pool: inspect and verify pmindex pool files.
//
//   pmindex-pool info POOL [--json]   header fields, owner, sizes, usage
//   pmindex-pool check POOL           read-only validation of the header and
//                                     the allocator metadata
// Both open the pool read-only under a shared lock (so they never write to
// it and never run recovery); `info` falls back to the header alone when
// another process holds the pool open. Corruption is reported as a message
// and an exit code, never a crash: the header is validated with pread before
// anything is mapped, and nothing beyond the file size is mapped.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/cli.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/pool.h"

using namespace pmindex;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitCorrupt = 1;  // not a valid pool, or inconsistent metadata
constexpr int kExitOpen = 2;     // cannot open: missing, busy, I/O error
constexpr int kExitUsage = 3;

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
              << "mapping:         " << (info.dax ? "DAX (MAP_SYNC)" : "not DAX (MAP_SHARED, msync on close)") << "\n";
  } else {
    std::cout << "note:            " << note << "\n";
  }
  return kExitOk;
}

int Check(const std::string& path) {
  pm::PoolOptions ro;
  ro.read_only = true;
  std::unique_ptr<pm::Pool> pool;
  Status s = pm::Pool::Open(path, "", ro, &pool);
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
  std::cout << path << ": ok (" << info.type << ", " << info.blocks_in_use << " blocks, " << info.bytes_in_use
            << " bytes in use" << (info.clean_shutdown ? "" : "; not cleanly closed: recovery runs at the next open")
            << ")\n";
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmindex-pool: inspect and verify pmindex pool files.\n"};
  app.footer(
      "Exit codes:\n"
      "  0  success (check: the pool is consistent)\n"
      "  1  not a valid pool, or corrupt metadata (the message says what)\n"
      "  2  the pool cannot be opened (missing, in use elsewhere for check, I/O error)\n"
      "  3  usage error");
  app.require_subcommand(1);
  std::string path;
  bool json = false;
  auto* info = app.add_subcommand("info", "print the header, owner index type, sizes and usage");
  info->add_option("POOL", path, "pool file")->required();
  info->add_flag("--json", json, "print JSON");
  auto* check = app.add_subcommand("check", "open read-only and verify the header and allocator metadata");
  check->add_option("POOL", path, "pool file")->required();
  if (std::optional<int> rc = tools::ParseArgs(app, argc, argv, kExitUsage)) return *rc;
  if (info->parsed()) return Info(path, json);
  return Check(path);
}
