// third_party_plugin.cc: a stand-in for a third-party PiBench plugin, used by
// json_test to show that pmbench --input drives any library with PiBench's
// ABI. It deliberately does NOT include pmindex headers: it declares the ABI
// itself, the way a plugin built against PiBench's own header would, and
// keeps records in a std::map under a mutex (no PM, no pool: pool_path is
// ignored). Not installed; built next to the test binaries.
//
// With PMBENCH_DIGEST_FILE set when the tree is created, it also sums a hash
// of every call (operation, key, value given or found, result; a scan counts
// its start key and size, not what it saw, which depends on other threads'
// writes) and appends the sum and the call count to that file when the tree
// is deleted. The sum does not depend on the order of the calls, and each key
// belongs to one pmbench thread, so it is a function of the operations run:
// rounds_test compares it between --rounds 1 and --rounds 7.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct tree_options_t {
  size_t key_size;
  size_t value_size;
  std::string pool_path;
  size_t pool_size;
  size_t num_threads;
};

class tree_api {
 public:
  virtual ~tree_api() {}
  virtual bool find(const char* key, size_t sz, char* value_out) = 0;
  virtual bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool remove(const char* key, size_t key_sz) = 0;
  virtual int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) = 0;
};

namespace {

struct Less {
  bool u64;
  bool operator()(const std::string& a, const std::string& b) const {
    if (u64) {
      uint64_t x, y;
      std::memcpy(&x, a.data(), 8);
      std::memcpy(&y, b.data(), 8);
      return x < y;
    }
    return a < b;  // std::string compares bytes as unsigned char
  }
};

class MapTree final : public tree_api {
 public:
  explicit MapTree(const tree_options_t& o) : ks_(o.key_size), vs_(o.value_size), map_(Less{o.key_size == 8}) {
    if (const char* f = std::getenv("PMBENCH_DIGEST_FILE")) digest_file_ = f;
  }
  ~MapTree() override {
    if (digest_file_.empty()) return;
    if (FILE* f = std::fopen(digest_file_.c_str(), "a")) {
      std::fprintf(f, "%llu %llu\n", (unsigned long long)digest_.load(), (unsigned long long)calls_.load());
      std::fclose(f);
    }
  }
  bool find(const char* key, size_t sz, char* value_out) override {
    if (sz != ks_) return false;
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(std::string(key, sz));
    if (it == map_.end()) return Record(1, key, sz, nullptr, 0, false);
    std::memcpy(value_out, it->second.data(), vs_);
    return Record(1, key, sz, value_out, vs_, true);
  }
  bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (key_sz != ks_ || value_sz != vs_) return false;
    std::lock_guard<std::mutex> l(mu_);
    return Record(2, key, key_sz, value, value_sz, map_.emplace(std::string(key, key_sz), std::string(value, value_sz)).second);
  }
  bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (key_sz != ks_ || value_sz != vs_) return false;
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(std::string(key, key_sz));
    if (it == map_.end()) return Record(3, key, key_sz, value, value_sz, false);
    it->second.assign(value, value_sz);
    return Record(3, key, key_sz, value, value_sz, true);
  }
  bool remove(const char* key, size_t key_sz) override {
    std::lock_guard<std::mutex> l(mu_);
    return Record(4, key, key_sz, nullptr, 0, map_.erase(std::string(key, key_sz)) > 0);
  }
  int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) override {
    Record(5, key, key_sz, reinterpret_cast<const char*>(&scan_sz), sizeof scan_sz, true);
    thread_local std::vector<char> buf;
    buf.clear();
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (auto it = map_.lower_bound(std::string(key, key_sz)); it != map_.end() && n < scan_sz; ++it, ++n) {
      buf.insert(buf.end(), it->first.begin(), it->first.end());
      buf.insert(buf.end(), it->second.begin(), it->second.end());
    }
    values_out = buf.data();
    return n;
  }

 private:
  // Adds a hash of the call to the digest (if recording); returns ok.
  bool Record(int op, const char* key, size_t ks, const char* value, size_t vs, bool ok) {
    if (digest_file_.empty()) return ok;
    uint64_t h = 1469598103934665603ull ^ uint64_t(op) ^ (uint64_t(ok) << 8);
    auto mix = [&h](const char* p, size_t n) {
      for (size_t i = 0; i < n; i++) h = (h ^ uint8_t(p[i])) * 1099511628211ull;
      h = (h ^ n) * 1099511628211ull;
    };
    mix(key, ks);
    if (value) mix(value, vs);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    digest_.fetch_add(h, std::memory_order_relaxed);
    calls_.fetch_add(1, std::memory_order_relaxed);
    return ok;
  }

  size_t ks_, vs_;
  std::string digest_file_;
  std::atomic<uint64_t> digest_{0}, calls_{0};
  std::mutex mu_;
  std::map<std::string, std::string, Less> map_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& o) { return new MapTree(o); }
