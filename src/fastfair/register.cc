// Placeholder registration for fastfair until the index lands.
#include "core/index_util.h"

namespace pmindex::internal {
void RegisterFastFair(std::vector<IndexFactory>*) {}
}  // namespace pmindex::internal
