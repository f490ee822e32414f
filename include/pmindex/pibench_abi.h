// pmindex/pibench_abi.h: our own declaration of the PiBench plugin ABI.
//
// PiBench (pibench-evaluation-vldb20.md, section 4) drives an index compiled
// into a shared library through a pure abstract class and one factory
// function. This header restates that binary interface from its documented
// facts (it is not PiBench's header): the layout of tree_options_t and the
// vtable order of tree_api must stay exactly as below, or plugins built
// against PiBench and pmbench stop being interchangeable.
//
//   tree_options_t: size_t key_size, size_t value_size, std::string pool_path,
//                   size_t pool_size, size_t num_threads (in that order).
//   tree_api vtable: virtual destructor, find, insert, update, remove, scan.
//
// Conventions (docs/pmbench.md):
//  * 8-byte keys are native-endian uint64 ordered numerically; other sizes are
//    byte strings ordered by memcmp.
//  * find copies value_size bytes into value_out.
//  * scan points values_out at a buffer owned by the calling thread (valid
//    until that thread's next scan) holding up to scan_sz contiguous
//    <key_size bytes of key><value_size bytes of value> records in ascending
//    key order, and returns their number.
//  * A plugin exports `extern "C" tree_api* create_tree(const tree_options_t&)`
//    and returns nullptr (after a message on stderr) if it cannot build the
//    tree. Deleting the tree closes its pool cleanly.
#pragma once

#include <cstddef>
#include <string>

struct tree_options_t {
  size_t key_size = 8;
  size_t value_size = 8;
  std::string pool_path;
  size_t pool_size = 0;
  size_t num_threads = 1;
};

class tree_api {
 public:
  virtual ~tree_api() = default;
  virtual bool find(const char* key, size_t sz, char* value_out) = 0;
  virtual bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool remove(const char* key, size_t key_sz) = 0;
  virtual int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) = 0;
};

// The factory every plugin exports.
extern "C" {
typedef tree_api* (*pibench_create_tree_fn)(const tree_options_t& options);
}
inline constexpr const char* kPibenchCreateTreeSymbol = "create_tree";
