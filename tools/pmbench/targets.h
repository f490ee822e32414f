// targets.h: what pmbench runs: a built-in index or a PiBench plugin, both
// driven through the tree_api ABI, and the pools they run on (temporary
// pools in /dev/shm are removed at exit and on SIGINT/SIGTERM/SIGHUP).
//
// pmbench writes no PM itself: pools are created, recovered and closed by
// the indexes (OpenIndex) or the plugins.
//
// Thread-safety: a Target is opened and closed by the driver thread; its
// tree() is called concurrently by the worker threads of a phase, as the
// index or plugin allows. The temporary-pool list is written by the driver
// thread and read by the signal handler (fixed buffers, unlink only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bench.h"

namespace pmbench::detail {

// A target: everything is driven through tree_api.
class Target {
 public:
  virtual ~Target() = default;
  virtual Status Open(const tree_options_t& o) = 0;  // create, or open + recover
  virtual void Close() = 0;
  virtual tree_api* tree() = 0;
  virtual pmindex::Index* index() { return nullptr; }
};

// A registered index, opened through pmindex::pibench::OpenIndexTree.
std::unique_ptr<Target> NewBuiltinTarget(std::string name, pmindex::Options base);
// A PiBench plugin (a shared library exporting create_tree). The library
// stays loaded for the life of the process.
Status NewPluginTarget(const std::string& path, std::unique_ptr<Target>* out);

// A file-name-safe form of an index name (alphanumerics, '_' and '-').
std::string SanitizeName(const std::string& s);
// Remembers a temporary pool for RemoveTemporaryPoolsOnSignals.
void RememberTempPool(const std::string& path);
// A pool size for the options' records and inserts when --pool_size is 0.
uint64_t AutoPoolSize(const BenchOptions& o);
// Removes a pool file if it is a regular file (a plugin's own pool).
void RemovePoolFile(const std::string& path);

}  // namespace pmbench::detail
