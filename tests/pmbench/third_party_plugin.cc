// third_party_plugin.cc: a stand-in for a third-party PiBench plugin, used by
// json_test to show that pmbench --input drives any library with PiBench's
// ABI. It deliberately does NOT include pmindex headers: it declares the ABI
// itself, the way a plugin built against PiBench's own header would, and
// keeps records in a std::map under a mutex (no PM, no pool: pool_path is
// ignored). Not installed; built next to the test binaries.
#include <cstdint>
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
  explicit MapTree(const tree_options_t& o) : ks_(o.key_size), vs_(o.value_size), map_(Less{o.key_size == 8}) {}
  bool find(const char* key, size_t sz, char* value_out) override {
    if (sz != ks_) return false;
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(std::string(key, sz));
    if (it == map_.end()) return false;
    std::memcpy(value_out, it->second.data(), vs_);
    return true;
  }
  bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (key_sz != ks_ || value_sz != vs_) return false;
    std::lock_guard<std::mutex> l(mu_);
    return map_.emplace(std::string(key, key_sz), std::string(value, value_sz)).second;
  }
  bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    if (key_sz != ks_ || value_sz != vs_) return false;
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(std::string(key, key_sz));
    if (it == map_.end()) return false;
    it->second.assign(value, value_sz);
    return true;
  }
  bool remove(const char* key, size_t key_sz) override {
    std::lock_guard<std::mutex> l(mu_);
    return map_.erase(std::string(key, key_sz)) > 0;
  }
  int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) override {
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
  size_t ks_, vs_;
  std::mutex mu_;
  std::map<std::string, std::string, Less> map_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& o) { return new MapTree(o); }
