// Placeholder registration for fptree until the index lands.
#include "core/index_util.h"

namespace pmindex::internal {
void RegisterFPTree(std::vector<IndexFactory>*) {}
}  // namespace pmindex::internal
