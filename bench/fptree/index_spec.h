// index_spec.h: "name:param=value:param=value" index specifications of the
// fptree bench tools (fptree_findmix, fptree_opcost), e.g.
// "fptree:inner_size=512". Header only.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

#include "pmindex/options.h"

namespace pmindex::benchutil {

// Splits spec into the index name and its parameters (added to o->params).
// False, with a message on stderr, for a parameter without '='.
inline bool ParseIndexSpec(const std::string& spec, std::string* name, Options* o) {
  std::stringstream ss(spec);
  std::string kv;
  std::getline(ss, *name, ':');
  while (std::getline(ss, kv, ':')) {
    size_t e = kv.find('=');
    if (e == std::string::npos) {
      std::fprintf(stderr, "bad parameter '%s' (want name=value)\n", kv.c_str());
      return false;
    }
    o->params[kv.substr(0, e)] = kv.substr(e + 1);
  }
  return true;
}

}  // namespace pmindex::benchutil
