// clfbtree_node.h: the differential encoding of one 64-byte clfB-tree node
// (clfB-tree sec. 2.1, figure 1), shared by inner nodes and encoded leaves.
// Pure functions on a 64-byte image: testable without a pool.
//
//   byte 0   bit 7 leaf | bit 6 invalid (method inplace, sec. 4.2) |
//            bit 5 children are leaves (inner) | bits 0-4 n, the key count
//   byte 1   kw << 4 | pw: bytes per key difference, per pointer difference
//   2..9     p[0] raw: the first child (inner) or the first value (leaf)
//   10..17   k[0] raw: the first key
//   then     n-1 key differences k[i]-k[0], kw bytes each (unsigned: keys
//            ascend; sign-magnitude for byte keys, whose words are block
//            offsets), then the other pointers p[i]-p[0] in pw bytes each,
//            sign-magnitude (top bit the sign; width 8 keeps the raw
//            two's-complement difference). An inner node has n+1 pointers, a
//            leaf n values.
// Widths are the minimal ones (at least 1) for the node's contents; a
// valid image fits in 64 bytes. With 1-byte widths an inner node holds 23
// keys and 24 children, an encoded leaf 24 entries.
//
// Thread safety: none needed (pure functions on caller-owned buffers).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace pmindex::internal::clfbtree {

constexpr uint8_t kLeafBit = 0x80, kInvalidBit = 0x40, kKidsLeafBit = 0x20, kCountMask = 0x1f;
constexpr uint32_t kMaxN = 31;
constexpr uint32_t kHdr = 18;

struct Decoded {
  bool leaf = false, kids_leaves = false, invalid = false;
  uint32_t n = 0;           // keys
  uint8_t kw = 1, pw = 1;   // widths as stored
  uint64_t k[kMaxN + 1];
  uint64_t p[kMaxN + 2];
  uint32_t np() const { return leaf ? n : n + 1; }
};

inline uint8_t UnsignedWidth(uint64_t d) {
  uint8_t w = 1;
  while (w < 8 && (d >> (8 * w)) != 0) w++;
  return w;
}
inline uint8_t SignedWidth(uint64_t d) {  // d: two's-complement difference
  const int64_t s = int64_t(d);
  if (s == INT64_MIN) return 8;
  const uint64_t mag = s < 0 ? uint64_t(-s) : uint64_t(s);
  uint8_t w = 1;
  while (w < 8 && (mag >> (8 * w - 1)) != 0) w++;
  return w;
}
inline uint64_t EncSigned(uint64_t d, uint8_t w) {
  if (w == 8) return d;
  const int64_t s = int64_t(d);
  return s < 0 ? (uint64_t(-s) | (1ull << (8 * w - 1))) : uint64_t(s);
}
inline uint64_t DecSigned(uint64_t raw, uint8_t w) {
  if (w == 8) return raw;
  const uint64_t sign = 1ull << (8 * w - 1);
  return (raw & sign) ? uint64_t(-int64_t(raw & (sign - 1))) : raw;
}
inline void PutBytes(uint8_t* out, uint64_t v, uint8_t w) {
  for (uint8_t i = 0; i < w; i++) out[i] = uint8_t(v >> (8 * i));
}
inline uint64_t GetBytes(const uint8_t* in, uint8_t w) {
  uint64_t v = 0;
  for (uint8_t i = 0; i < w; i++) v |= uint64_t(in[i]) << (8 * i);
  return v;
}

// The decoders read a field with one unaligned 8-byte load and a mask; the
// image is first copied into a Padded buffer so that a field in the last
// bytes of the line does not read past it. The layout is little-endian.
static_assert(std::endian::native == std::endian::little, "clfbtree: the line codec assumes a little-endian CPU");
struct Padded {
  uint8_t b[72];
  explicit Padded(const uint8_t in[64]) {
    std::memcpy(b, in, 64);
    std::memset(b + 64, 0, 8);
  }
};
inline uint64_t WidthMask(uint8_t w) { return w >= 8 ? ~0ull : (1ull << (8 * w)) - 1; }
inline uint64_t Load8(const uint8_t* in) {
  uint64_t v;
  std::memcpy(&v, in, 8);
  return v;
}

// Minimal widths for keys k[0..nk) and pointers p[0..np).
inline void Widths(const uint64_t* k, uint32_t nk, const uint64_t* p, uint32_t np, bool ksigned, uint8_t* kw,
                   uint8_t* pw) {
  *kw = 1;
  *pw = 1;
  for (uint32_t i = 1; i < nk; i++) {
    const uint64_t d = k[i] - k[0];
    const uint8_t w = ksigned ? SignedWidth(d) : UnsignedWidth(d);
    if (w > *kw) *kw = w;
  }
  for (uint32_t i = 1; i < np; i++) {
    const uint8_t w = SignedWidth(p[i] - p[0]);
    if (w > *pw) *pw = w;
  }
}

inline uint32_t EncodedBytes(uint32_t nk, uint32_t np, uint8_t kw, uint8_t pw) {
  return kHdr + (nk ? nk - 1 : 0) * kw + (np ? np - 1 : 0) * pw;
}

// Encodes the node; false if it does not fit in one line. np must be nk
// (leaf) or nk + 1 (inner).
inline bool Encode(const uint64_t* k, uint32_t nk, const uint64_t* p, uint32_t np, bool leaf, bool kids_leaves,
                   bool ksigned, uint8_t out[64]) {
  if (nk > kMaxN) return false;
  uint8_t kw, pw;
  Widths(k, nk, p, np, ksigned, &kw, &pw);
  if (EncodedBytes(nk, np, kw, pw) > 64) return false;
  std::memset(out, 0, 64);
  out[0] = uint8_t((leaf ? kLeafBit : 0) | (kids_leaves ? kKidsLeafBit : 0) | nk);
  out[1] = uint8_t(kw << 4 | pw);
  PutBytes(out + 2, np ? p[0] : 0, 8);
  PutBytes(out + 10, nk ? k[0] : 0, 8);
  uint8_t* q = out + kHdr;
  for (uint32_t i = 1; i < nk; i++, q += kw) {
    const uint64_t d = k[i] - k[0];
    PutBytes(q, ksigned ? EncSigned(d, kw) : d, kw);
  }
  for (uint32_t i = 1; i < np; i++, q += pw) PutBytes(q, EncSigned(p[i] - p[0], pw), pw);
  return true;
}

// Decodes an image; false if its header is impossible (damage, or a torn
// copy a reader's validation rejects).
inline bool Decode(const uint8_t in[64], bool ksigned, Decoded* d) {
  d->leaf = in[0] & kLeafBit;
  d->invalid = in[0] & kInvalidBit;
  d->kids_leaves = in[0] & kKidsLeafBit;
  d->n = in[0] & kCountMask;
  d->kw = in[1] >> 4;
  d->pw = in[1] & 15;
  if (d->kw < 1 || d->kw > 8 || d->pw < 1 || d->pw > 8) return false;
  const uint32_t np = d->np();
  if (EncodedBytes(d->n, np, d->kw, d->pw) > 64) return false;
  const Padded buf(in);
  d->p[0] = Load8(buf.b + 2);
  d->k[0] = Load8(buf.b + 10);
  const uint8_t* q = buf.b + kHdr;
  const uint64_t km = WidthMask(d->kw), pm = WidthMask(d->pw);
  if (ksigned) {
    for (uint32_t i = 1; i < d->n; i++, q += d->kw) d->k[i] = d->k[0] + DecSigned(Load8(q) & km, d->kw);
  } else {
    for (uint32_t i = 1; i < d->n; i++, q += d->kw) d->k[i] = d->k[0] + (Load8(q) & km);
  }
  for (uint32_t i = 1; i < np; i++, q += d->pw) d->p[i] = d->p[0] + DecSigned(Load8(q) & pm, d->pw);
  return true;
}

// The route of u64 key through an inner node image with unsigned key
// differences (u64 keys), searching while decoding: only the key
// differences up to the first key above `key` and the one pointer taken are
// decoded. *idx = the number of keys <= key, *child = pointer idx, *sep =
// key idx when idx < n (the next key above the route). False if the header
// is impossible or the image is a leaf.
// RouteU64Padded takes the image already in a Padded-style buffer (72
// bytes, the last 8 zero), as a reader copies it.
inline bool RouteU64Padded(const uint8_t pad[72], uint64_t key, uint32_t* idx, uint64_t* child, uint64_t* sep,
                           bool* kids_leaves) {
  const uint32_t n = pad[0] & kCountMask;
  const uint8_t kw = pad[1] >> 4, pw = pad[1] & 15;
  if ((pad[0] & kLeafBit) || kw < 1 || kw > 8 || pw < 1 || pw > 8) return false;
  if (EncodedBytes(n, n + 1, kw, pw) > 64) return false;
  *kids_leaves = pad[0] & kKidsLeafBit;
  const uint64_t k0 = Load8(pad + 10), p0 = Load8(pad + 2);
  uint32_t i = 0;
  uint64_t ki = k0;
  if (n > 0 && key >= k0) {
    const uint64_t d = key - k0, km = WidthMask(kw);
    const uint8_t* q = pad + kHdr;
    for (i = 1; i < n; i++, q += kw) {
      const uint64_t di = Load8(q) & km;
      if (di > d) {
        ki = k0 + di;
        break;
      }
    }
  }
  *idx = i;
  *sep = i < n ? ki : 0;
  if (i == 0) {
    *child = p0;
  } else {
    const uint8_t* q = pad + kHdr + (n ? n - 1 : 0) * kw + (i - 1) * pw;
    *child = p0 + DecSigned(Load8(q) & WidthMask(pw), pw);
  }
  return true;
}
inline bool RouteU64(const uint8_t in[64], uint64_t key, uint32_t* idx, uint64_t* child, uint64_t* sep,
                     bool* kids_leaves) {
  const Padded buf(in);
  return RouteU64Padded(buf.b, key, idx, child, sep, kids_leaves);
}

// Byte offset and width of the encoded form of pointer i (i >= 1): the
// target of shadowing's in-place pointer store (sec. 4.1).
inline uint32_t PtrOffset(const Decoded& d, uint32_t i) { return kHdr + (d.n ? d.n - 1 : 0) * d.kw + (i - 1) * d.pw; }

}  // namespace pmindex::internal::clfbtree
