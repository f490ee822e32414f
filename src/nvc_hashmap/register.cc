// Placeholder registration for nvc_hashmap until the index lands.
#include "core/index_util.h"

namespace pmindex::internal {
void RegisterNvcHashmap(std::vector<IndexFactory>*) {}
}  // namespace pmindex::internal
