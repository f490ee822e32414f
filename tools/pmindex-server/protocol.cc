// protocol.cc: Protocol (protocol.h), the memcached text protocol of one
// connection. Parsing follows memcached 1.6's proto_text.c in what it
// accepts and answers; protocol.h lists the replies. No PM access of its
// own: replies follow the Store calls they report (protocol.h). Thread
// safety: one connection's worker thread.
#include "protocol.h"
#include "parse.h"

#include "pmindex/pm/pool.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace pmindex::server {
namespace {

constexpr const char* kBadFormat = "CLIENT_ERROR bad command line format\r\n";

void Split(std::string_view line, std::vector<std::string_view>* t) {
  t->clear();
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') i++;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') j++;
    if (j > i) t->push_back(line.substr(i, j - i));
    i = j;
  }
}

void Append(std::string* out, const char* s) { out->append(s); }

// Only retrievals may have lines over kMaxShortLine (many keys), as in
// memcached.
bool MayBeLong(const std::string& in, size_t pos) {
  std::string_view l(in.data() + pos, std::min<size_t>(in.size() - pos, 5));
  return l.starts_with("get ") || l.starts_with("gets ") || l.starts_with("gat ") || l.starts_with("gats ");
}

}  // namespace

bool Protocol::Run(std::string* out, size_t out_limit) {
  bool keep = true;
  waiting_ = false;
  while (pos_ < in_.size() && out->size() <= out_limit) {
    if (swallow_ > 0) {
      size_t n = std::min(swallow_, in_.size() - pos_);
      swallow_ -= n;
      pos_ += n;
      continue;
    }
    Step s;
    if (pend_.active) {
      s = Data(out);
    } else if (static_cast<unsigned char>(in_[pos_]) == 0x80) {
      s = Step::kClose;  // a binary-protocol request: not spoken here
    } else {
      const char* nl = static_cast<const char*>(std::memchr(in_.data() + pos_, '\n', in_.size() - pos_));
      if (nl == nullptr) {
        if (in_.size() - pos_ > kMaxLine || (in_.size() - pos_ > kMaxShortLine && !MayBeLong(in_, pos_))) {
          Append(out, "CLIENT_ERROR line too long\r\n");
          s = Step::kClose;
        } else {
          s = Step::kNeedMore;
        }
      } else {
        size_t end = size_t(nl - in_.data());
        std::string_view line(in_.data() + pos_, end - pos_);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.size() > kMaxLine) {
          Append(out, "CLIENT_ERROR line too long\r\n");
          s = Step::kClose;
        } else {
          // The line stays valid in in_ while it is handled: in_ only grows
          // between Run calls, never during one.
          s = Line(line, out);
          if (s != Step::kClose) pos_ = end + 1;
        }
      }
    }
    if (s == Step::kNeedMore) {
      waiting_ = true;
      break;
    }
    if (s == Step::kClose) {
      keep = false;
      break;
    }
  }
  st_->bytes_read.fetch_add(pos_, std::memory_order_relaxed);
  in_.erase(0, pos_);
  pos_ = 0;
  return keep;
}

Protocol::Step Protocol::Data(std::string* out) {
  if (in_.size() - pos_ < pend_.bytes + 2) return Step::kNeedMore;
  std::string_view data(in_.data() + pos_, pend_.bytes);
  bool terminated = in_[pos_ + pend_.bytes] == '\r' && in_[pos_ + pend_.bytes + 1] == '\n';
  pos_ += pend_.bytes + 2;
  pend_.active = false;
  if (!terminated) {
    Append(out, "CLIENT_ERROR bad data chunk\r\n");
    return Step::kDone;
  }
  st_->cmd_set.fetch_add(1, std::memory_order_relaxed);
  uint64_t new_cas = 0;
  Reply r = st_->store->Write(pend_.mode, pend_.key, pend_.flags, pend_.exptime, data, pend_.cas, &new_cas);
  if (pend_.mode == Mode::kCas) {
    auto& c = r == Reply::kStored ? st_->cas_hits : r == Reply::kExists ? st_->cas_badval : st_->cas_misses;
    c.fetch_add(1, std::memory_order_relaxed);
  }
  if (pend_.meta) {
    const char* code = r == Reply::kStored ? "HD" : r == Reply::kNotStored ? "NS" : r == Reply::kExists ? "EX"
                       : r == Reply::kNotFound ? "NF" : nullptr;
    if (code == nullptr) StoreReply(r, out);
    else if (!(pend_.noreply && r == Reply::kStored)) {
      out->append(code);
      if (pend_.meta_cas && r == Reply::kStored) out->append(" c" + std::to_string(new_cas));
      out->append(pend_.meta_ret).append("\r\n");
    }
    return Step::kDone;
  }
  if (!pend_.noreply || r == Reply::kError) StoreReply(r, out);
  return Step::kDone;
}

void Protocol::StoreReply(Reply r, std::string* out) {
  switch (r) {
    case Reply::kStored: Append(out, "STORED\r\n"); break;
    case Reply::kNotStored: Append(out, "NOT_STORED\r\n"); break;
    case Reply::kExists: Append(out, "EXISTS\r\n"); break;
    case Reply::kNotFound: Append(out, "NOT_FOUND\r\n"); break;
    case Reply::kDeleted: Append(out, "DELETED\r\n"); break;
    case Reply::kTouched: Append(out, "TOUCHED\r\n"); break;
    case Reply::kTooLarge: Append(out, "SERVER_ERROR object too large for cache\r\n"); break;
    case Reply::kOutOfMemory:
      st_->out_of_memory.fetch_add(1, std::memory_order_relaxed);
      Append(out, "SERVER_ERROR out of memory storing object\r\n");
      break;
    case Reply::kNonNumeric: Append(out, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"); break;
    case Reply::kError: out->append("SERVER_ERROR " + Store::error() + "\r\n"); break;
  }
}

Protocol::Step Protocol::Line(std::string_view line, std::string* out) {
  std::vector<std::string_view> t;
  Split(line, &t);
  if (t.empty()) {
    Append(out, "ERROR\r\n");
    return Step::kDone;
  }
  std::string_view cmd = t[0];
  size_t n = t.size();
  bool noreply = n > 1 && t[n - 1] == "noreply";
  Store* store = st_->store;
  if (cmd == "get" || cmd == "gets") {
    if (n < 2) return Append(out, "ERROR\r\n"), Step::kDone;
    Get(t, 1, cmd == "gets", false, 0, out);
  } else if (cmd == "gat" || cmd == "gats") {
    int64_t exp;
    if (n < 3) return Append(out, "ERROR\r\n"), Step::kDone;
    if (!ParseI32(t[1], &exp)) return Append(out, "CLIENT_ERROR invalid exptime argument\r\n"), Step::kDone;
    Get(t, 2, cmd == "gats", true, Store::AbsoluteExptime(exp), out);
  } else if (cmd == "set" || cmd == "add" || cmd == "replace" || cmd == "append" || cmd == "prepend") {
    if (n != 5 && n != 6) return Append(out, "ERROR\r\n"), Step::kDone;
    Mode m = cmd == "set" ? Mode::kSet
             : cmd == "add" ? Mode::kAdd
             : cmd == "replace" ? Mode::kReplace
             : cmd == "append" ? Mode::kAppend
                               : Mode::kPrepend;
    Storage(t, m, out);
  } else if (cmd == "cas") {
    if (n != 6 && n != 7) return Append(out, "ERROR\r\n"), Step::kDone;
    Storage(t, Mode::kCas, out);
  } else if (cmd == "delete") {
    if (n < 2 || n > 4) return Append(out, "ERROR\r\n"), Step::kDone;
    if (n - noreply > 2 && !(n - noreply == 3 && t[2] == "0"))
      return Append(out, "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"), Step::kDone;
    if (t[1].size() > kMaxKey) return Append(out, kBadFormat), Step::kDone;
    Reply r = store->Delete(t[1]);
    (r == Reply::kDeleted ? st_->delete_hits : st_->delete_misses).fetch_add(1, std::memory_order_relaxed);
    if (!noreply || r == Reply::kError) StoreReply(r, out);
  } else if (cmd == "incr" || cmd == "decr") {
    if (n != 3 && n != 4) return Append(out, "ERROR\r\n"), Step::kDone;
    Arith(t, cmd == "incr", out);
  } else if (cmd == "touch") {
    int64_t exp;
    if (n != 3 && n != 4) return Append(out, "ERROR\r\n"), Step::kDone;
    if (t[1].size() > kMaxKey) return Append(out, kBadFormat), Step::kDone;
    if (!ParseI32(t[2], &exp)) return Append(out, "CLIENT_ERROR invalid exptime argument\r\n"), Step::kDone;
    st_->cmd_touch.fetch_add(1, std::memory_order_relaxed);
    Reply r = store->Touch(t[1], Store::AbsoluteExptime(exp), nullptr);
    (r == Reply::kTouched ? st_->touch_hits : st_->touch_misses).fetch_add(1, std::memory_order_relaxed);
    if (!noreply || r == Reply::kError) StoreReply(r, out);
  } else if (cmd == "flush_all") {
    if (n > 3) return Append(out, "ERROR\r\n"), Step::kDone;
    int64_t delay = 0;
    if (n - noreply == 2 && !ParseI32(t[1], &delay))
      return Append(out, "CLIENT_ERROR invalid exptime argument\r\n"), Step::kDone;
    st_->cmd_flush.fetch_add(1, std::memory_order_relaxed);
    if (delay > 0) {
      st_->flush_at.store(Store::AbsoluteExptime(delay));
    } else {
      Status s = store->FlushAll();
      if (!s.ok()) return out->append("SERVER_ERROR " + s.ToString() + "\r\n"), Step::kDone;
    }
    if (!noreply) Append(out, "OK\r\n");
  } else if (cmd == "stats") {
    Stats(t, out);
  } else if (cmd == "version") {
    out->append(std::string("VERSION ") + kVersion + "\r\n");
  } else if (cmd == "verbosity") {
    uint32_t v = 0;
    if (n < 2 || n > 3) return Append(out, "ERROR\r\n"), Step::kDone;
    if (!ParseU32(t[1], &v)) return noreply ? Step::kDone : (Append(out, kBadFormat), Step::kDone);
    st_->verbosity.store(int(v));
    if (!noreply) Append(out, "OK\r\n");
  } else if (cmd == "quit") {
    return Step::kClose;
  } else if (cmd == "shutdown") {
    Append(out, "ERROR: shutdown not enabled\r\n");
  } else if (cmd == "mn") {
    Append(out, "MN\r\n");
  } else if (cmd == "mg" || cmd == "md" || cmd == "ma") {
    if (n < 2) return Append(out, "ERROR\r\n"), Step::kDone;
    Meta(t, out);
  } else if (cmd == "ms") {
    if (n < 3) return Append(out, "ERROR\r\n"), Step::kDone;
    MetaSet(t, out);
  } else {
    Append(out, "ERROR\r\n");
  }
  return Step::kDone;
}

void Protocol::Get(const std::vector<std::string_view>& t, size_t first, bool cas, bool touch, uint32_t exptime,
                   std::string* out) {
  std::vector<Slice> keys(t.begin() + long(first), t.end());
  for (Slice k : keys)
    if (k.size() > kMaxKey) return Append(out, kBadFormat);
  std::vector<Item> items;
  std::vector<bool> found;
  Store* store = st_->store;
  if (touch) {
    items.resize(keys.size());
    found.resize(keys.size());
    for (size_t i = 0; i < keys.size(); i++) {
      found[i] = store->Touch(keys[i], exptime, &items[i]) == Reply::kTouched;
      (found[i] ? st_->touch_hits : st_->touch_misses).fetch_add(1, std::memory_order_relaxed);
    }
    st_->cmd_touch.fetch_add(keys.size(), std::memory_order_relaxed);
  } else if (keys.size() == 1) {
    items.resize(1);
    found.assign(1, store->Get(keys[0], &items[0]));
  } else {
    store->GetMany(keys, &items, &found);
  }
  uint64_t hits = 0;
  char head[64];
  for (size_t i = 0; i < keys.size(); i++) {
    if (!found[i]) continue;
    hits++;
    const Item& it = items[i];
    out->append("VALUE ");
    out->append(keys[i]);
    int len = cas ? std::snprintf(head, sizeof head, " %u %zu %llu\r\n", it.flags, it.data.size(),
                                  (unsigned long long)it.cas)
                  : std::snprintf(head, sizeof head, " %u %zu\r\n", it.flags, it.data.size());
    out->append(head, size_t(len));
    out->append(it.data);
    out->append("\r\n");
  }
  Append(out, "END\r\n");
  st_->cmd_get.fetch_add(keys.size(), std::memory_order_relaxed);
  st_->get_hits.fetch_add(hits, std::memory_order_relaxed);
  st_->get_misses.fetch_add(keys.size() - hits, std::memory_order_relaxed);
}

void Protocol::Storage(const std::vector<std::string_view>& t, Mode mode, std::string* out) {
  uint32_t flags;
  int64_t exp, bytes;
  uint64_t cas = 0;
  size_t n = t.size();
  if (t[1].size() > kMaxKey || !ParseU32(t[2], &flags) || !ParseI32(t[3], &exp) || !ParseI32(t[4], &bytes) ||
      bytes < 0 || (mode == Mode::kCas && !ParseU64(t[5], &cas)))
    return Append(out, kBadFormat);
  bool noreply = n == (mode == Mode::kCas ? 7u : 6u) && t[n - 1] == "noreply";
  if (size_t(bytes) > st_->store->max_item_size()) {
    Append(out, "SERVER_ERROR object too large for cache\r\n");
    swallow_ = size_t(bytes) + 2;
    return;
  }
  pend_ = Pending();
  pend_.active = true;
  pend_.mode = mode;
  pend_.key.assign(t[1]);
  pend_.flags = flags;
  pend_.exptime = Store::AbsoluteExptime(exp);
  pend_.bytes = size_t(bytes);
  pend_.cas = cas;
  pend_.noreply = noreply;
}

void Protocol::Arith(const std::vector<std::string_view>& t, bool incr, std::string* out) {
  bool noreply = t.size() == 4 && t[3] == "noreply";
  uint64_t delta, v = 0;
  if (t[1].size() > kMaxKey) return Append(out, kBadFormat);
  if (!ParseU64(t[2], &delta)) return Append(out, "CLIENT_ERROR invalid numeric delta argument\r\n");
  Reply r = st_->store->Arith(t[1], incr, delta, &v);
  auto& hit = incr ? st_->incr_hits : st_->decr_hits;
  auto& miss = incr ? st_->incr_misses : st_->decr_misses;
  (r == Reply::kStored ? hit : miss).fetch_add(1, std::memory_order_relaxed);
  if (noreply && r != Reply::kError) return;
  if (r == Reply::kStored) out->append(std::to_string(v) + "\r\n");
  else StoreReply(r, out);
}

void Protocol::Stats(const std::vector<std::string_view>& t, std::string* out) {
  if (t.size() > 1) {
    if (t[1] == "reset") return Append(out, "RESET\r\n");
    if (t[1] == "settings" || t[1] == "items" || t[1] == "slabs" || t[1] == "sizes" || t[1] == "conns")
      return Append(out, "END\r\n");
    return Append(out, "ERROR\r\n");
  }
  Store* store = st_->store;
  IndexStats is;
  store->kv()->stats(&is);
  uint32_t now = Store::Now();
  auto stat = [&](const char* name, const std::string& v) { out->append("STAT ").append(name).append(" ").append(v).append("\r\n"); };
  auto num = [&](const char* name, uint64_t v) { stat(name, std::to_string(v)); };
  auto at = [&](const char* name, const std::atomic<uint64_t>& v) { num(name, v.load(std::memory_order_relaxed)); };
  num("pid", uint64_t(getpid()));
  num("uptime", now - st_->started);
  num("time", now);
  stat("version", kVersion);
  num("pointer_size", sizeof(void*) * 8);
  at("curr_connections", st_->curr_connections);
  at("total_connections", st_->total_connections);
  at("rejected_connections", st_->rejected_connections);
  num("max_connections", st_->max_connections);
  at("cmd_get", st_->cmd_get);
  at("cmd_set", st_->cmd_set);
  at("cmd_flush", st_->cmd_flush);
  at("cmd_touch", st_->cmd_touch);
  at("get_hits", st_->get_hits);
  at("get_misses", st_->get_misses);
  at("delete_misses", st_->delete_misses);
  at("delete_hits", st_->delete_hits);
  at("incr_misses", st_->incr_misses);
  at("incr_hits", st_->incr_hits);
  at("decr_misses", st_->decr_misses);
  at("decr_hits", st_->decr_hits);
  at("cas_misses", st_->cas_misses);
  at("cas_hits", st_->cas_hits);
  at("cas_badval", st_->cas_badval);
  at("touch_hits", st_->touch_hits);
  at("touch_misses", st_->touch_misses);
  at("bytes_read", st_->bytes_read);
  at("bytes_written", st_->bytes_written);
  num("limit_maxbytes", st_->limit_maxbytes);
  num("threads", uint64_t(st_->threads));
  num("curr_items", store->Items());
  at("out_of_memory", st_->out_of_memory);
  num("reclaimed", store->counters().reclaimed.load(std::memory_order_relaxed));
  num("sweeps", store->counters().sweeps.load(std::memory_order_relaxed));
  stat("engine", store->info().name);
  num("engine_persistent", store->info().persistent);
  num("engine_records", is.records);
  num("engine_pm_bytes", is.pm_bytes);
  num("engine_dram_bytes", is.dram_bytes);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", is.recovery_seconds);
  stat("engine_recovery_seconds", buf);
  std::snprintf(buf, sizeof buf, "%.6f", st_->open_seconds);
  stat("open_seconds", buf);
  if (pm::Pool* p = store->kv()->index()->pool()) {
    num("pool_bytes", p->size());
    num("pool_max_bytes", p->max_size());
  }
  Append(out, "END\r\n");
}

}  // namespace pmindex::server
