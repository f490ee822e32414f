// pmcheck --shared-writes: the versions a crash may recover for keys every
// thread writes (the rules are in shared_history.h).
#include "shared_history.h"

#include <algorithm>
#include <iterator>

namespace pmcheck {

void SharedHistory::WriteBegan(uint32_t kid, uint32_t version, int64_t begin) {
  if (Key* k = At(kid)) k->writes.push_back({version, begin, -1});
}

void SharedHistory::WriteEnded(uint32_t kid, int64_t begin, int64_t end) {
  Key* k = At(kid);
  if (!k) return;
  for (Write& w : k->writes)
    if (w.begin == begin) w.end = end;
  k->floor = std::max(k->floor, begin);
}

void SharedHistory::ReadEnded(uint32_t kid, uint32_t version, int64_t begin) {
  Key* k = At(kid);
  if (!k || version == 0) return;
  k->reads.push_back({begin, version});
  // Versions of writes are unique per key (removes write 0, never read).
  for (const Write& w : k->writes)
    if (w.version == version) k->floor = std::max(k->floor, w.begin);
}

std::vector<SharedAllowed> SharedHistory::Allowed() const {
  std::vector<SharedAllowed> out;
  for (size_t i = 0; i < keys_.size(); ++i) {
    const Key& k = keys_[i];
    SharedAllowed a;
    a.kid = first_ + uint32_t(i);
    if (k.floor < 0) a.allowed.push_back(0);
    else a.superseded.push_back(0);
    for (const Write& w : k.writes) {
      bool superseded = w.end >= 0 && w.end < k.floor;
      for (const Read& r : k.reads) superseded |= w.end >= 0 && w.end < r.begin && r.version != w.version;
      (superseded ? a.superseded : a.allowed).push_back(w.version);
    }
    // A version both allowed (by one write) and superseded (by another,
    // e.g. two removes) is allowed.
    std::sort(a.allowed.begin(), a.allowed.end());
    a.allowed.erase(std::unique(a.allowed.begin(), a.allowed.end()), a.allowed.end());
    std::sort(a.superseded.begin(), a.superseded.end());
    a.superseded.erase(std::unique(a.superseded.begin(), a.superseded.end()), a.superseded.end());
    std::vector<uint32_t> only;
    std::set_difference(a.superseded.begin(), a.superseded.end(), a.allowed.begin(), a.allowed.end(), std::back_inserter(only));
    a.superseded.swap(only);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace pmcheck
