// plugin.cc: a PiBench plugin (libpibench_NAME.so) for one built-in index.
//
// Compiled once per index name with -DPMINDEX_PLUGIN_INDEX="name" (see
// CMakeLists.txt). Exports create_tree per include/pmindex/pibench_abi.h; the
// tree is the IndexTree adapter of index_tree.h, so persistence, recovery and
// clean shutdown are the index's own (OpenIndex opens and recovers an
// existing pool_path, creates one otherwise). No PM is touched here.
// Thread-safety: create_tree is called once; PiBench's threads then call
// the tree concurrently, and index_tree.h forwards each call to the index
// (IndexInfo::concurrent says whether it may be driven by several).
#include <cstdio>
#include <exception>

#include "index_tree.h"

#ifndef PMINDEX_PLUGIN_INDEX
#error "compile with -DPMINDEX_PLUGIN_INDEX=\"name\""
#endif

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& options) {
  try {
    std::unique_ptr<pmindex::pibench::IndexTree> tree;
    pmindex::Status s = pmindex::pibench::OpenIndexTree(PMINDEX_PLUGIN_INDEX, options, nullptr, &tree);
    if (!s.ok()) {
      std::fprintf(stderr, "libpibench_%s: create_tree: %s\n", PMINDEX_PLUGIN_INDEX, s.ToString().c_str());
      return nullptr;
    }
    return tree.release();
  } catch (const std::exception& e) {  // e.g. bad_alloc: never let it cross the C boundary
    std::fprintf(stderr, "libpibench_%s: create_tree: %s\n", PMINDEX_PLUGIN_INDEX, e.what());
    return nullptr;
  }
}
