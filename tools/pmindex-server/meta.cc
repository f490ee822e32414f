// meta.cc: memcached's meta commands for Protocol (protocol.h), the subset
// pmindex-server implements, with memcached 1.6's replies:
//   mg <key> [v s t f c k O<opaque> q T<ttl>]      VA <size> <flags> + data, HD <flags>, EN
//   ms <key> <datalen> [F<flags> T<ttl> C<cas> M<E|A|P|R|S> c k O q] + data
//                                                  HD, NS, EX, NF
//   md <key> [C<cas> k O q]                        HD, NF, EX
//   ma <key> [D<delta> M<I|+|D|-> v k O q]         HD, VA <len> + number, NF
// Return flags come back in the order asked. q hides EN for mg and the
// success reply (HD, or VA for ma) for ms, md and ma. Flags outside these
// lists (b, h, l, I, N, E, ...) answer "CLIENT_ERROR invalid flag"; C on ms
// is accepted with mode S only. Durability and atomicity are the plain
// commands' (protocol.h, store.h).
//
// Thread safety: as Protocol: one connection's worker thread.
#include <string>

#include "parse.h"
#include "protocol.h"

namespace pmindex::server {
namespace {

constexpr const char* kBadFormat = "CLIENT_ERROR bad command line format\r\n";
constexpr const char* kBadFlag = "CLIENT_ERROR invalid flag\r\n";

}  // namespace

void Protocol::Meta(const std::vector<std::string_view>& t, std::string* out) {
  std::string_view cmd = t[0], key = t[1];
  if (key.size() > kMaxKey) return out->append(kBadFormat), void();
  const std::string_view allowed = cmd == "mg" ? "vstfckOqT" : cmd == "md" ? "CkOq" : "DMvkOq";
  bool quiet = false, value = false, has_ttl = false;
  std::string ret;  // echoed return flags, in the order asked
  std::vector<char> want;  // mg's item flags, in the order asked
  int64_t ttl = 0;
  uint64_t cas = 0, delta = 1;
  bool incr = true;
  for (size_t i = 2; i < t.size(); i++) {
    char f = t[i][0];
    std::string_view v = t[i].substr(1);
    if (allowed.find(f) == std::string_view::npos) return out->append(kBadFlag), void();
    switch (f) {
      case 'q': quiet = true; break;
      case 'v': value = true; break;
      case 'O': want.push_back('O'), ret += " O" + std::string(v); break;
      case 'k': want.push_back('k'), ret += " k" + std::string(key); break;
      case 's': case 't': case 'f': case 'c': want.push_back(f); break;
      case 'T':
        if (!ParseI32(v, &ttl)) return out->append(kBadFormat), void();
        has_ttl = true;
        break;
      case 'C':
        if (!ParseU64(v, &cas)) return out->append(kBadFormat), void();
        break;
      case 'D':
        if (!ParseU64(v, &delta)) return out->append("CLIENT_ERROR invalid numeric delta argument\r\n"), void();
        break;
      case 'M':
        if (v == "I" || v == "i" || v == "+") incr = true;
        else if (v == "D" || v == "d" || v == "-") incr = false;
        else return out->append("CLIENT_ERROR invalid mode for ma M token\r\n"), void();
        break;
    }
  }
  Store* store = st_->store;
  if (cmd == "md") {
    Reply r = store->Delete(key, cas);
    (r == Reply::kDeleted ? st_->delete_hits : st_->delete_misses).fetch_add(1, std::memory_order_relaxed);
    if (r == Reply::kDeleted && quiet) return;
    const char* code = r == Reply::kDeleted ? "HD" : r == Reply::kNotFound ? "NF" : r == Reply::kExists ? "EX" : nullptr;
    if (code == nullptr) return StoreReply(r, out);
    out->append(code).append(ret).append("\r\n");
    return;
  }
  if (cmd == "ma") {
    uint64_t n = 0;
    Reply r = store->Arith(key, incr, delta, &n);
    auto& hit = incr ? st_->incr_hits : st_->decr_hits;
    auto& miss = incr ? st_->incr_misses : st_->decr_misses;
    (r == Reply::kStored ? hit : miss).fetch_add(1, std::memory_order_relaxed);
    if (r == Reply::kNotFound) return out->append("NF").append(ret).append("\r\n"), void();
    if (r != Reply::kStored) return StoreReply(r, out);
    if (quiet) return;
    std::string num = std::to_string(n);
    if (value) out->append("VA " + std::to_string(num.size())).append(ret).append("\r\n" + num + "\r\n");
    else out->append("HD").append(ret).append("\r\n");
    return;
  }
  // mg
  Item it;
  bool hit = has_ttl ? store->Touch(key, Store::AbsoluteExptime(ttl), &it) == Reply::kTouched : store->Get(key, &it);
  st_->cmd_get.fetch_add(1, std::memory_order_relaxed);
  (hit ? st_->get_hits : st_->get_misses).fetch_add(1, std::memory_order_relaxed);
  if (!hit) {
    if (!quiet) out->append("EN\r\n");
    return;
  }
  out->append(value ? "VA " + std::to_string(it.data.size()) : std::string("HD"));
  size_t opaque = 0;  // O tokens seen, to echo each in turn
  for (char f : want) {
    switch (f) {
      case 's': out->append(" s" + std::to_string(it.data.size())); break;
      case 't': {
        int64_t left = it.exptime == 0 ? -1 : std::max<int64_t>(int64_t(it.exptime) - int64_t(Store::Now()), 0);
        out->append(" t" + std::to_string(left));
        break;
      }
      case 'f': out->append(" f" + std::to_string(it.flags)); break;
      case 'c': out->append(" c" + std::to_string(it.cas)); break;
      case 'k': out->append(" k").append(key); break;
      case 'O': {
        size_t seen = 0;
        for (size_t i = 2; i < t.size(); i++)
          if (t[i][0] == 'O' && seen++ == opaque) out->append(" ").append(t[i]);
        opaque++;
        break;
      }
    }
  }
  out->append("\r\n");
  if (value) out->append(it.data).append("\r\n");
}

void Protocol::MetaSet(const std::vector<std::string_view>& t, std::string* out) {
  std::string_view key = t[1];
  int64_t len = 0;
  if (key.size() > kMaxKey || !ParseI32(t[2], &len) || len < 0) return out->append(kBadFormat), void();
  uint32_t flags = 0;
  int64_t ttl = 0;
  uint64_t cas = 0;
  bool quiet = false, want_cas = false, has_cas = false;
  char mode = 'S';
  std::string ret;
  const char* err = nullptr;
  for (size_t i = 3; i < t.size() && err == nullptr; i++) {
    char f = t[i][0];
    std::string_view v = t[i].substr(1);
    switch (f) {
      case 'F': if (!ParseU32(v, &flags)) err = kBadFormat; break;
      case 'T': if (!ParseI32(v, &ttl)) err = kBadFormat; break;
      case 'C': if (!ParseU64(v, &cas)) err = kBadFormat; has_cas = true; break;
      case 'M':
        if (v.size() != 1 || std::string_view("EAPRS").find(v[0]) == std::string_view::npos)
          err = "CLIENT_ERROR invalid mode for ms M token\r\n";
        else mode = v[0];
        break;
      case 'q': quiet = true; break;
      case 'c': want_cas = true; break;
      case 'k': ret += " k" + std::string(key); break;
      case 'O': ret += " " + std::string(t[i]); break;
      default: err = kBadFlag;
    }
  }
  if (err == nullptr && has_cas && mode != 'S') err = kBadFlag;
  if (err == nullptr && size_t(len) > st_->store->max_item_size()) err = "SERVER_ERROR object too large for cache\r\n";
  if (err != nullptr) {  // the data block follows anyway: skip it
    out->append(err);
    swallow_ = size_t(len) + 2;
    return;
  }
  pend_ = Pending();
  pend_.active = true;
  pend_.mode = has_cas ? Mode::kCas
               : mode == 'E' ? Mode::kAdd
               : mode == 'A' ? Mode::kAppend
               : mode == 'P' ? Mode::kPrepend
               : mode == 'R' ? Mode::kReplace
                             : Mode::kSet;
  pend_.key.assign(key);
  pend_.flags = flags;
  pend_.exptime = Store::AbsoluteExptime(ttl);
  pend_.bytes = size_t(len);
  pend_.cas = cas;
  pend_.noreply = quiet;
  pend_.meta = true;
  pend_.meta_cas = want_cas;
  pend_.meta_ret = std::move(ret);
}

}  // namespace pmindex::server
