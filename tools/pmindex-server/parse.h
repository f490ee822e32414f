// parse.h: strict decimal parsing for the memcached protocol (protocol.cc,
// meta.cc): digits only, no sign unless stated, no surrounding spaces,
// overflow refused. Header only, no state: callable from any thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace pmindex::server {

inline bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

inline bool ParseU32(std::string_view s, uint32_t* out) {
  uint64_t v;
  if (!ParseU64(s, &v) || v > UINT32_MAX) return false;
  *out = uint32_t(v);
  return true;
}

// A signed 32-bit number (memcached's exptime and byte count).
inline bool ParseI32(std::string_view s, int64_t* out) {
  bool neg = !s.empty() && s[0] == '-';
  uint64_t v;
  if (!ParseU64(neg ? s.substr(1) : s, &v) || v > (neg ? 2147483648ull : 2147483647ull)) return false;
  *out = neg ? -int64_t(v) : int64_t(v);
  return true;
}

}  // namespace pmindex::server
