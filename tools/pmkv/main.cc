// pmkv: a command-line key-value store on any pmindex engine (docs/kv.md).
//
//   pmkv [options] put    POOL KEY VALUE    insert or replace (creates POOL)
//   pmkv [options] get    POOL KEY          print the value
//   pmkv [options] remove POOL KEY
//   pmkv [options] scan   POOL [--from K] [--to K] [--limit N]   records in order, TSV
//   pmkv [options] count  POOL [--above K] [--below K]
//   pmkv [options] load   POOL FILE|-  [--format tsv|jsonl]      (creates POOL)
//   pmkv [options] dump   POOL [FILE]  [--format tsv|jsonl]
//   pmkv [options] info   POOL [--json]
// Options: --engine NAME (default: the pool's own; fptree for a new pool),
// --key-kind/--value-kind bytes|u64 (new pools), --size BYTES, --param k=v.
// Byte keys and values are written with C escapes (\t \n \\ \xNN) in TSV and
// JSON lines so any bytes round-trip; u64 keys and values are decimal.
// Exit codes (tools/common/cli.h): 0 ok, 1 not found or operation error,
// 2 usage, 3 the pool cannot be opened (missing, busy, I/O error).
//
// Single-threaded; one pmkv process holds the pool at a time (a second one
// gets Busy).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/cli.h"
#include "pmindex/kv.h"

using namespace pmindex;

namespace {

constexpr int kOk = tools::kExitOk, kFail = tools::kExitFound, kUsage = tools::kExitUsage, kCannotRun = tools::kExitCannotRun;

struct Common {
  std::string engine;
  std::string key_kind = "bytes", value_kind = "bytes";
  uint64_t size = 64ull << 20;
  std::vector<std::string> params;
};

std::string Escape(Slice s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\t') out += "\\t";
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c >= 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  return out;
}

bool Unescape(const std::string& s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] != '\\') {
      *out += s[i];
      continue;
    }
    if (++i >= s.size()) return false;
    switch (s[i]) {
      case '\\': *out += '\\'; break;
      case 't': *out += '\t'; break;
      case 'n': *out += '\n'; break;
      case 'x': {
        if (i + 2 >= s.size() || !std::isxdigit((unsigned char)s[i + 1]) || !std::isxdigit((unsigned char)s[i + 2]))
          return false;
        *out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
        i += 2;
        break;
      }
      default: return false;
    }
  }
  return true;
}

class Codec {
 public:
  Codec(KeyKind k, ValueKind v) : k_(k), v_(v) {}
  // Text (CLI argument or file field) to stored bytes.
  Status Key(const std::string& text, std::string* out) const { return Decode(k_ == KeyKind::kU64, text, out, "key"); }
  Status Value(const std::string& text, std::string* out) const {
    return Decode(v_ == ValueKind::kU64, text, out, "value");
  }
  std::string KeyText(Slice k) const { return k_ == KeyKind::kU64 ? std::to_string(SliceToU64(k)) : Escape(k); }
  std::string ValueText(Slice v) const { return v_ == ValueKind::kU64 ? std::to_string(SliceToU64(v)) : Escape(v); }

 private:
  static Status Decode(bool u64, const std::string& text, std::string* out, const char* what) {
    if (u64) {
      size_t pos = 0;
      uint64_t v = 0;
      try {
        v = std::stoull(text, &pos, 0);
      } catch (...) {
        pos = 0;
      }
      if (pos == 0 || pos != text.size() || text[0] == '-')
        return Status::InvalidArgument(std::string(what) + " '" + text + "' is not an unsigned 64-bit integer");
      *out = std::string(U64Slice(v));
      return Status::OK();
    }
    if (!Unescape(text, out)) return Status::InvalidArgument(std::string("bad escape in ") + what + " '" + text + "'");
    return Status::OK();
  }
  KeyKind k_;
  ValueKind v_;
};

int Fail(const Status& s, const std::string& what) {
  std::cerr << "pmkv: " << what << ": " << s.ToString() << "\n";
  return kFail;
}

int OpenStore(const Common& c, const std::string& path, bool may_create, std::unique_ptr<KV>* kv) {
  KVConfig cfg;
  cfg.path = path;
  cfg.size = c.size;
  cfg.create_if_missing = may_create;
  if (c.key_kind != "bytes" && c.key_kind != "u64") return (std::cerr << "pmkv: --key-kind is bytes or u64\n", kUsage);
  if (c.value_kind != "bytes" && c.value_kind != "u64")
    return (std::cerr << "pmkv: --value-kind is bytes or u64\n", kUsage);
  cfg.key_kind = c.key_kind == "u64" ? KeyKind::kU64 : KeyKind::kBytes;
  cfg.value_kind = c.value_kind == "u64" ? ValueKind::kU64 : ValueKind::kBytes;
  for (const auto& p : c.params) {
    size_t eq = p.find('=');
    if (eq == std::string::npos) return (std::cerr << "pmkv: --param wants NAME=VALUE, got '" << p << "'\n", kUsage);
    cfg.params[p.substr(0, eq)] = p.substr(eq + 1);
  }
  std::string engine = c.engine;
  bool exists = access(path.c_str(), F_OK) == 0;
  if (!exists && !may_create) {
    Fail(Status::NotFound("no pool at " + path), "open");
    return kCannotRun;
  }
  if (!exists && engine.empty()) engine = "fptree";
  Status s = KV::Open(engine, cfg, kv);
  if (s.ok()) return kOk;
  Fail(s, "open " + path);
  return s.IsNotFound() || s.IsBusy() || s.IsIOError() ? kCannotRun : kFail;
}

// A progress bar on stderr, redrawn at most every 100 ms.
class Progress {
 public:
  Progress(bool on, uint64_t total) : on_(on), total_(total) {}
  void Update(uint64_t done, uint64_t records) {
    if (!on_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
    last_ = now;
    int pct = total_ ? int(100.0 * double(done) / double(total_)) : 0;
    int bars = pct * 30 / 100;
    std::fprintf(stderr, "\rload [%s%s] %3d%% %llu records", std::string(bars, '#').c_str(),
                 std::string(30 - bars, ' ').c_str(), pct, (unsigned long long)records);
    std::fflush(stderr);
  }
  void Done(uint64_t records) {
    if (on_) std::fprintf(stderr, "\rload [%s] 100%% %llu records\n", std::string(30, '#').c_str(), (unsigned long long)records);
  }

 private:
  bool on_;
  uint64_t total_;
  std::chrono::steady_clock::time_point last_{};
};

int Load(KV* kv, const std::string& file, const std::string& format, bool progress) {
  Codec codec(kv->key_kind(), kv->value_kind());
  std::ifstream f;
  std::istream* in = &std::cin;
  uint64_t total = 0;
  if (file != "-") {
    f.open(file, std::ios::binary | std::ios::ate);
    if (!f) return Fail(Status::IOError("cannot read " + file), "load");
    total = uint64_t(f.tellg());
    f.seekg(0);
    in = &f;
  }
  Progress bar(progress && total > 0, total);
  std::string line, ktext, vtext, k, v;
  uint64_t lineno = 0, records = 0, bytes = 0;
  while (std::getline(*in, line)) {
    lineno++;
    bytes += line.size() + 1;
    if (line.empty()) continue;
    if (format == "jsonl") {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("key") || !j.contains("value"))
        return Fail(Status::InvalidArgument("line " + std::to_string(lineno) + ": not {\"key\":..,\"value\":..}"), "load");
      auto text = [](const nlohmann::json& x) { return x.is_string() ? x.get<std::string>() : x.dump(); };
      ktext = text(j["key"]);
      vtext = text(j["value"]);
    } else {
      size_t tab = line.find('\t');
      if (tab == std::string::npos)
        return Fail(Status::InvalidArgument("line " + std::to_string(lineno) + ": no tab between key and value"), "load");
      ktext = line.substr(0, tab);
      vtext = line.substr(tab + 1);
    }
    Status s = codec.Key(ktext, &k);
    if (s.ok()) s = codec.Value(vtext, &v);
    if (s.ok()) s = kv->put(k, v);
    if (!s.ok()) return Fail(s, "load, line " + std::to_string(lineno));
    records++;
    bar.Update(bytes, records);
  }
  bar.Done(records);
  std::cerr << "pmkv: loaded " << records << " records\n";
  return kOk;
}

int Dump(KV* kv, const std::string& file, const std::string& format) {
  Codec codec(kv->key_kind(), kv->value_kind());
  std::ofstream f;
  std::ostream* out = &std::cout;
  if (!file.empty() && file != "-") {
    f.open(file, std::ios::binary | std::ios::trunc);
    if (!f) return Fail(Status::IOError("cannot write " + file), "dump");
    out = &f;
  }
  Status s = kv->get_all([&](Slice k, Slice v) {
    if (format == "jsonl") {
      nlohmann::json j;
      if (kv->key_kind() == KeyKind::kU64) j["key"] = SliceToU64(k);
      else j["key"] = codec.KeyText(k);
      if (kv->value_kind() == ValueKind::kU64) j["value"] = SliceToU64(v);
      else j["value"] = codec.ValueText(v);
      *out << j.dump() << "\n";
    } else {
      *out << codec.KeyText(k) << "\t" << codec.ValueText(v) << "\n";
    }
    return bool(*out);
  });
  if (!s.ok()) return Fail(s, "dump");
  out->flush();
  if (!*out) return Fail(Status::IOError("write failed"), "dump");
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmkv: a persistent key-value store on any pmindex engine (docs/kv.md)"};
  app.require_subcommand(1);
  Common c;
  app.add_option("--engine", c.engine, "engine (default: the pool's own; fptree for a new pool)");
  app.add_option("--key-kind", c.key_kind, "bytes or u64 (a new pool)");
  app.add_option("--value-kind", c.value_kind, "bytes or u64 (a new pool)");
  app.add_option("--size", c.size, "initial pool size in bytes (a new pool)");
  app.add_option("--param", c.params, "engine parameter NAME=VALUE (repeatable)");

  std::string pool, key, value, file, format = "tsv", from, to, above, below;
  uint64_t limit = 0;
  bool json = false, progress = isatty(2), no_progress = false;
  auto pool_arg = [&](CLI::App* s) { s->add_option("POOL", pool, "pool file")->required(); };
  CLI::App* put = app.add_subcommand("put", "insert or replace a record (creates the pool)");
  pool_arg(put);
  put->add_option("KEY", key)->required();
  put->add_option("VALUE", value)->required();
  CLI::App* get = app.add_subcommand("get", "print the value of a key");
  pool_arg(get);
  get->add_option("KEY", key)->required();
  CLI::App* rm = app.add_subcommand("remove", "remove a key");
  pool_arg(rm);
  rm->add_option("KEY", key)->required();
  CLI::App* scan = app.add_subcommand("scan", "print records in key order (TSV)");
  pool_arg(scan);
  scan->add_option("--from", from, "first key (inclusive)");
  scan->add_option("--to", to, "end key (exclusive)");
  scan->add_option("--limit", limit, "at most this many records");
  CLI::App* count = app.add_subcommand("count", "count records (all, or with key > --above and < --below)");
  pool_arg(count);
  count->add_option("--above", above);
  count->add_option("--below", below);
  CLI::App* load = app.add_subcommand("load", "load records from a TSV or JSON-lines file (creates the pool)");
  pool_arg(load);
  load->add_option("FILE", file, "input file, - for stdin")->required();
  load->add_option("--format", format, "tsv or jsonl")->check(CLI::IsMember({"tsv", "jsonl"}));
  load->add_flag("--progress", progress, "show a progress bar on stderr (default when stderr is a terminal)");
  load->add_flag("--no-progress", no_progress);
  CLI::App* dump = app.add_subcommand("dump", "write every record to a file (or stdout)");
  pool_arg(dump);
  dump->add_option("FILE", file, "output file (default stdout)");
  dump->add_option("--format", format, "tsv or jsonl")->check(CLI::IsMember({"tsv", "jsonl"}));
  CLI::App* info = app.add_subcommand("info", "print the store's engine and figures");
  pool_arg(info);
  info->add_flag("--json", json);

  if (std::optional<int> rc = tools::ParseArgs(app, argc, argv, kUsage)) return *rc;

  bool creates = put->parsed() || load->parsed();
  std::unique_ptr<KV> kv;
  if (int rc = OpenStore(c, pool, creates, &kv); rc != kOk) return rc;
  Codec codec(kv->key_kind(), kv->value_kind());
  std::string k, v, k2;
  Status s;
  int rc = kOk;
  if (put->parsed()) {
    s = codec.Key(key, &k);
    if (s.ok()) s = codec.Value(value, &v);
    if (s.ok()) s = kv->put(k, v);
    if (!s.ok()) rc = Fail(s, "put");
  } else if (get->parsed() || rm->parsed()) {
    s = codec.Key(key, &k);
    if (s.ok()) s = get->parsed() ? kv->get(k, &v) : kv->remove(k);
    if (!s.ok()) rc = Fail(s, get->parsed() ? "get" : "remove");
    else if (get->parsed()) std::cout << codec.ValueText(v) << "\n";
  } else if (scan->parsed()) {
    uint64_t n = 0;
    std::unique_ptr<KVIterator> it;
    s = kv->new_iterator(&it);
    if (s.ok() && !from.empty()) s = codec.Key(from, &k);
    if (s.ok() && !to.empty()) s = codec.Key(to, &k2);
    if (s.ok()) s = from.empty() ? it->seek_to_first() : it->seek(k);
    while (s.ok() && it->valid() && (limit == 0 || n < limit)) {
      if (!to.empty() && !(kv->key_kind() == KeyKind::kU64 ? SliceToU64(it->key()) < SliceToU64(k2) : it->key() < Slice(k2)))
        break;
      std::cout << codec.KeyText(it->key()) << "\t" << codec.ValueText(it->value()) << "\n";
      n++;
      s = it->next();
    }
    if (!s.ok()) rc = Fail(s, "scan");
  } else if (count->parsed()) {
    uint64_t n = 0;
    if (!above.empty()) s = codec.Key(above, &k);
    if (s.ok() && !below.empty()) s = codec.Key(below, &k2);
    if (s.ok()) {
      if (!above.empty() && !below.empty()) s = kv->count_between(k, k2, &n);
      else if (!above.empty()) s = kv->count_above(k, &n);
      else if (!below.empty()) s = kv->count_below(k2, &n);
      else s = kv->count_all(&n);
    }
    if (s.ok()) std::cout << n << "\n";
    else rc = Fail(s, "count");
  } else if (load->parsed()) {
    rc = Load(kv.get(), file, format, progress && !no_progress);
  } else if (dump->parsed()) {
    rc = Dump(kv.get(), file, format);
  } else if (info->parsed()) {
    IndexStats st;
    s = kv->stats(&st);
    if (!s.ok()) {
      rc = Fail(s, "info");
    } else {
      const IndexInfo& i = kv->info();
      nlohmann::json j = {{"engine", i.name},
                          {"persistent", i.persistent},
                          {"ordered", i.ordered},
                          {"concurrent", i.concurrent},
                          {"key_kind", kv->key_kind() == KeyKind::kU64 ? "u64" : "bytes"},
                          {"value_kind", kv->value_kind() == ValueKind::kU64 ? "u64" : "bytes"},
                          {"records", st.records},
                          {"pm_bytes", st.pm_bytes},
                          {"dram_bytes", st.dram_bytes},
                          {"recovery_seconds", st.recovery_seconds}};
      if (json) {
        std::cout << j.dump(2) << "\n";
      } else {
        for (auto& [name, val] : j.items()) std::cout << name << ": " << (val.is_string() ? val.get<std::string>() : val.dump()) << "\n";
      }
    }
  }
  Status cs = kv->close();
  if (!cs.ok() && rc == kOk) rc = Fail(cs, "close");
  return rc;
}
