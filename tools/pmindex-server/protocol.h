// protocol.h: the memcached text protocol for one connection of
// pmindex-server (docs/server.md lists the commands and replies). It knows
// nothing of sockets: the network layer appends received bytes to input(),
// calls Run, and writes what Run appended to its output buffer.
//
// Commands: get gets gat gats set add replace append prepend cas delete incr
// decr touch flush_all stats version verbosity quit shutdown, and the meta
// commands mg ms md ma mn with the flags meta.cc lists. Replies and
// error strings are memcached 1.6's: ERROR for an unknown command or a wrong
// number of arguments, "CLIENT_ERROR bad command line format" for a bad
// number or a key over 250 bytes, "SERVER_ERROR object too large for cache"
// for data over the item limit (the data block is then skipped), "CLIENT_ERROR
// bad data chunk" when the data block does not end with \r\n, "CLIENT_ERROR
// line too long" (and a close) for a command line over kMaxShortLine bytes
// (kMaxLine for get, gets, gat and gats, which may name many keys),
// "SERVER_ERROR out of memory storing object" when the pool is full. A
// command starting with the binary protocol's magic byte 0x80 closes the
// connection (the binary protocol is not implemented).
//
// Invariants: a reply is appended only after the Store call it reports has
// returned, so STORED, DELETED, OK, TOUCHED and an incr result are durable
// when the client sees them (store.h). Input is consumed in command order;
// a partial command stays in input() until the rest arrives.
//
// Thread safety: a Protocol belongs to one connection and is used by the one
// worker thread serving it. ServerState is shared by all threads (atomics).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "store.h"

namespace pmindex::server {

inline constexpr size_t kMaxKey = 250;
inline constexpr size_t kMaxLine = 256 << 10;    // a retrieval line
inline constexpr size_t kMaxShortLine = 2048;   // any other line
inline constexpr const char* kVersion = "1.6.0-pmindex";

// Figures and settings shared by every connection.
struct ServerState {
  Store* store = nullptr;
  std::string engine, pool;
  int threads = 0;
  uint64_t max_connections = 0;
  uint64_t limit_maxbytes = 0;
  uint32_t started = 0;  // unix time
  double open_seconds = 0;
  std::atomic<int> verbosity{0};
  std::atomic<uint32_t> flush_at{0};  // a delayed flush_all is due then (0: none)
  std::atomic<uint64_t> curr_connections{0}, total_connections{0}, rejected_connections{0};
  std::atomic<uint64_t> cmd_get{0}, get_hits{0}, get_misses{0}, get_expired{0};
  std::atomic<uint64_t> cmd_set{0}, cmd_touch{0}, touch_hits{0}, touch_misses{0};
  std::atomic<uint64_t> delete_hits{0}, delete_misses{0}, incr_hits{0}, incr_misses{0};
  std::atomic<uint64_t> decr_hits{0}, decr_misses{0}, cas_hits{0}, cas_misses{0}, cas_badval{0};
  std::atomic<uint64_t> cmd_flush{0}, out_of_memory{0}, bytes_read{0}, bytes_written{0};
};

class Protocol {
 public:
  explicit Protocol(ServerState* state) : st_(state) {}

  // Received bytes not consumed yet; the caller appends to it.
  std::string& input() { return in_; }
  // Runs every complete command in input(), appending replies to *out, and
  // stops early once out holds more than out_limit bytes (call again after
  // draining). Returns false when the connection must be closed once *out
  // has been written (quit, a line too long).
  bool Run(std::string* out, size_t out_limit);
  // Whether complete input may remain (Run stopped at out_limit).
  bool pending() const { return pos_ < in_.size() && !waiting_; }

 private:
  enum class Step { kDone, kNeedMore, kClose };
  Step Line(std::string_view line, std::string* out);
  Step Data(std::string* out);
  void Get(const std::vector<std::string_view>& t, size_t first, bool cas, bool touch, uint32_t exptime,
           std::string* out);
  void Storage(const std::vector<std::string_view>& t, Mode mode, std::string* out);
  void Arith(const std::vector<std::string_view>& t, bool incr, std::string* out);
  void Stats(const std::vector<std::string_view>& t, std::string* out);
  // The meta commands mg, ms, md, ma (meta.cc).
  void Meta(const std::vector<std::string_view>& t, std::string* out);
  void MetaSet(const std::vector<std::string_view>& t, std::string* out);
  void StoreReply(Reply r, std::string* out);

  ServerState* st_;
  std::string in_;
  size_t pos_ = 0;
  bool waiting_ = false;  // the input ends in an incomplete command
  // A storage command whose data block is awaited.
  struct Pending {
    bool active = false;
    Mode mode = Mode::kSet;
    std::string key;
    uint32_t flags = 0, exptime = 0;
    size_t bytes = 0;
    uint64_t cas = 0;
    bool noreply = false;
    bool meta = false;      // ms: reply HD/NS/EX/NF ...
    bool meta_cas = false;  // ... with c<cas> ...
    std::string meta_ret;   // ... and these echoed flags (O, k)
  } pend_;
  size_t swallow_ = 0;  // bytes of a refused data block still to skip
};

}  // namespace pmindex::server
