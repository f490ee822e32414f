// targets.cc: pmbench's targets (built-in indexes and PiBench plugins), the
// resolution of --index/--input into targets, and the temporary pools they
// run on (targets.h).
//
// Invariants: a temporary pool's path is remembered before the pool is
// created, so a signal never leaves one behind; at most kMaxTempPools paths
// are remembered (more are still removed at a normal exit).
//
// Thread-safety: driver thread only, but for the async-signal-safe handler.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "bench.h"
#include "index_tree.h"
#include "targets.h"

namespace pmbench {

namespace detail {

using pmindex::Index;

namespace {

class BuiltinTarget final : public Target {
 public:
  BuiltinTarget(std::string name, pmindex::Options base) : name_(std::move(name)), base_(std::move(base)) {}
  ~BuiltinTarget() override { Close(); }
  Status Open(const tree_options_t& o) override {
    tree_.reset();
    return pmindex::pibench::OpenIndexTree(name_, o, &base_, &tree_);
  }
  void Close() override { tree_.reset(); }
  tree_api* tree() override { return tree_.get(); }
  Index* index() override { return tree_ ? tree_->index() : nullptr; }

 private:
  std::string name_;
  pmindex::Options base_;
  std::unique_ptr<pmindex::pibench::IndexTree> tree_;
};

class PluginTarget final : public Target {
 public:
  ~PluginTarget() override { Close(); }
  // The library stays loaded for the life of the process (threads that ran
  // its code may still own thread_local state).
  Status Load(const std::string& path) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return Status::InvalidArgument(std::string("cannot load plugin: ") + dlerror());
    void* sym = dlsym(h, kPibenchCreateTreeSymbol);
    if (!sym) return Status::InvalidArgument("plugin " + path + " does not export create_tree");
    create_ = reinterpret_cast<pibench_create_tree_fn>(sym);
    return Status::OK();
  }
  Status Open(const tree_options_t& o) override {
    Close();
    tree_ = create_(o);
    if (!tree_) return Status::InvalidArgument("the plugin's create_tree returned nullptr (see its message above)");
    return Status::OK();
  }
  void Close() override {
    delete tree_;
    tree_ = nullptr;
  }
  tree_api* tree() override { return tree_; }

 private:
  pibench_create_tree_fn create_ = nullptr;
  tree_api* tree_ = nullptr;
};

}  // namespace

std::unique_ptr<Target> NewBuiltinTarget(std::string name, pmindex::Options base) {
  return std::make_unique<BuiltinTarget>(std::move(name), std::move(base));
}

Status NewPluginTarget(const std::string& path, std::unique_ptr<Target>* out) {
  auto p = std::make_unique<PluginTarget>();
  PMINDEX_RETURN_IF_ERROR(p->Load(path));
  *out = std::move(p);
  return Status::OK();
}

std::string SanitizeName(const std::string& s) {
  std::string r;
  for (char ch : s) r += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-') ? ch : '_';
  return r;
}

// Temporary pools, remembered so that a signal handler can unlink them
// (async-signal-safe: fixed buffers, unlink only).
constexpr int kMaxTempPools = 64;
char g_temp_pools[kMaxTempPools][256];
std::atomic<int> g_num_temp_pools{0};

void RememberTempPool(const std::string& path) {
  if (path.size() >= sizeof g_temp_pools[0]) return;
  int i = g_num_temp_pools.load();
  if (i >= kMaxTempPools) return;
  std::memcpy(g_temp_pools[i], path.c_str(), path.size() + 1);
  g_num_temp_pools.store(i + 1);
}

void RemoveTempPoolsAndReraise(int sig) {
  int n = g_num_temp_pools.load();
  for (int i = 0; i < n && i < kMaxTempPools; i++) unlink(g_temp_pools[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

uint64_t AutoPoolSize(const BenchOptions& o) {
  // Roughly 3x the raw data of the loaded records plus the inserts of every
  // phase, at least 64 MiB; pools grow in place if this is not enough.
  uint64_t inserts = 0;
  for (const auto& p : o.phases) inserts += uint64_t(double(o.operations) * p.ratios[OpType::kInsert]);
  if (o.phases.empty()) inserts = uint64_t(double(o.operations) * o.ratios[OpType::kInsert]);
  uint64_t bytes = (o.records + inserts) * (o.key_size + o.value_size + 16) * 3;
  bytes = std::max<uint64_t>(bytes, 64ull << 20);
  return (bytes + (1 << 20) - 1) & ~uint64_t((1 << 20) - 1);
}

void RemovePoolFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
}

}  // namespace detail

Status ResolveTargets(const std::string& index_list, const std::string& input_list, std::vector<TargetSpec>* out) {
  out->clear();
  auto split = [](const std::string& s) {
    std::vector<std::string> v;
    size_t i = 0;
    while (i <= s.size()) {
      size_t j = s.find(',', i);
      if (j == std::string::npos) j = s.size();
      std::string item = s.substr(i, j - i);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) v.push_back(item);
      i = j + 1;
    }
    return v;
  };
  for (const auto& name : split(index_list)) {
    if (name == "all") {
      std::vector<std::string> names;
      for (const auto& i : pmindex::ListIndexes()) names.push_back(i.name);
      std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n == "dram_btree"; });
      for (const auto& n : names) out->push_back({n, ""});
      continue;
    }
    if (!pmindex::FindIndexInfo(name, nullptr)) {
      std::string m = "unknown index '" + name + "'; built-in:";
      for (const auto& i : pmindex::ListIndexes()) m += " " + i.name;
      return Status::InvalidArgument(m);
    }
    out->push_back({name, ""});
  }
  for (const auto& path : split(input_list)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) return Status::InvalidArgument("--input: no plugin file at " + path);
    std::string stem = std::filesystem::path(path).stem().string();
    if (stem.rfind("lib", 0) == 0) stem = stem.substr(3);
    out->push_back({stem, path});
  }
  if (out->empty()) return Status::InvalidArgument("nothing to run: give --index NAME[,NAME...] and/or --input PLUGIN.so[,...]");
  return Status::OK();
}

void RemoveTemporaryPoolsOnSignals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, detail::RemoveTempPoolsAndReraise);
}

}  // namespace pmbench
