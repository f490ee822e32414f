// pmcheck's simulator: replay a recorded log (record.cc) into crash images,
// and verify each image's recovery in a forked child (issue 5, "Simulator";
// the child side is verify.cc, the driver checker.cc).
//
// Failure model (docs/pmcheck.md): at a crash PM holds every flushed line; a
// line stored to since its last flush holds its durable content plus a prefix
// of the stores made to it since (stores to one line reach PM in program
// order); only aligned 8-byte pieces are atomic, so each logged store is split
// at 8-byte boundaries into pieces, and a 64-byte AtomicLineWrite is one piece.
// A flush (clwb/clflushopt) covers the stores made to its line so far; they
// become durable at the next fence of the flushing thread, and until then a
// crash may keep any prefix of them, as for an unflushed line. Non-temporal
// stores are pending until the next fence of the storing thread. So a missing
// fence between a flush and a dependent store shows up in crash images (and
// the lint reports an op that returns with unfenced flushes).
// Images per crash point: 0 keeps no pending piece, 1 all of them, 2.. a
// seeded mix per line; then, where it differs from 0 and 1, the unfenced
// image: each line keeps its pending pieces up to the first one a flush has
// covered (flushed, not yet fenced), so every such store is dropped while
// the lines nobody flushed keep theirs; a missing fence before a dependent
// store is found at every point inside the window, not by chance.
// Read rule: a version a completed Find/Scan returned, written by an op still
// in flight, must survive every later crash (Expectation::read_inflight).
// Recovery crashes: for a sample of images the child records the recovery
// itself and replays it into crash images (CrashRecovery), each recovered
// again and held to the first crash's expectations (every point of the
// recovery, or a sample of --recovery-images images per recovery).
// Replay invariants: `durable` is the image a crash right after event i would
// leave if no pending piece reached PM; pending[line] holds, in program order,
// the pieces stored to the line and not yet made durable by a fence.
// This file writes PM only in the sense of writing crash-image files; it
// never stores to a live pool.
//
// Thread-safety: Record runs the workload's threads under the recorder;
// Replay runs on one thread and forks one child per crash image.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "checker_internal.h"
#include "core/index_util.h"
#include "pm/image_file.h"
#include "pmindex/pm/persist.h"
#include "recorder.h"
#include "shared_history.h"

namespace pmcheck {

using pmindex::Slice;
using pmindex::Status;
namespace pm = pmindex::pm;

namespace {

// ---------------------------------------------------------------------------
// Replay.
struct Piece {
  uint64_t off;
  uint32_t size;
  bool nt;
  int16_t tid;   // the storing thread (NT pieces are drained by its fences)
  uint64_t seq;  // replay order, to tell which pieces a flush covered
  uint64_t src;  // arena offset
};

class Replayer {
 public:
  // fixed: replaying a recorded recovery (a double crash): every image is
  // held to these expectations, those of the first crash.
  Replayer(const Config& c, Target* target, const Workload& wl, const Recorder& rec, Report* report,
           const Expectation* fixed = nullptr)
      : c_(c), target_(target), wl_(wl), rec_(rec), report_(report), fixed_(fixed),
        shared_(FirstSharedWrite(wl), uint32_t(wl.num_keys()) - FirstSharedWrite(wl)) {
    durable_ = rec.initial;
    // Pages that may hold non-zero bytes: the initial image's, then every
    // page a piece is written to (WriteImage writes only these).
    for (size_t off = 0; off < durable_.size(); off += kPage) {
      const size_t n = std::min(kPage, durable_.size() - off);
      if (std::any_of(durable_.begin() + off, durable_.begin() + off + n, [](char ch) { return ch != 0; })) MarkPages(off, 1);
    }
    committed_.assign(wl.num_keys(), 0);
    acked_.assign(wl.num_keys(), 0);
  }

  void Run() {
    std::vector<int64_t> points;
    for (size_t i = 0; i < rec_.events.size(); ++i) {
      Ev k = rec_.events[i].kind;
      if (k == Ev::kStore || k == Ev::kNT || k == Ev::kLine || k == Ev::kFlush || k == Ev::kFence) points.push_back(int64_t(i));
    }
    report_->crash_points = points.size();
    std::vector<int64_t> chosen;
    if (c_.only_point >= 0) {
      chosen.push_back(c_.only_point);
    } else if (c_.image_budget > 0) {
      // Enough randomly chosen points for the image budget: a point with no
      // dirty line yields one image, the others images_per_point (and the
      // unfenced image). The read rule's points come first.
      std::vector<uint8_t> first;
      std::vector<uint32_t> per_point = ImagesAtPoints(points, &first);
      std::vector<size_t> order(points.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937_64 rng(c_.seed * 31 + 7);
      std::shuffle(order.begin(), order.end(), rng);
      std::stable_partition(order.begin(), order.end(), [&](size_t i) { return first[i] != 0; });
      uint64_t images = 0;
      for (size_t i = 0; i < order.size() && images < c_.image_budget; ++i) {
        chosen.push_back(points[order[i]]);
        images += per_point[order[i]];
      }
      std::sort(chosen.begin(), chosen.end());
    } else if (c_.points < 0 || uint64_t(c_.points) >= points.size()) {
      chosen = points;
    } else if (c_.points > 0) {
      // The read rule's points first, then a seeded sample of the others.
      std::vector<uint8_t> first;
      ImagesAtPoints(points, &first);
      std::vector<int64_t> rest;
      for (size_t i = 0; i < points.size(); ++i) {
        if (first[i] && chosen.size() < size_t(c_.points)) chosen.push_back(points[i]);
        else rest.push_back(points[i]);
      }
      std::mt19937_64 rng(c_.seed * 31 + 7);
      for (size_t i = 0; chosen.size() < size_t(c_.points); ++i) {
        size_t j = i + rng() % (rest.size() - i);
        std::swap(rest[i], rest[j]);
        chosen.push_back(rest[i]);
      }
      std::sort(chosen.begin(), chosen.end());
    }
    std::vector<int64_t> windows = WindowPoints();
    if (c_.recovery_crashes > 0) {
      // Spread the recorded recoveries over the run's images.
      uint64_t total = 0;
      for (uint32_t n : ImagesAtPoints(chosen)) total += n;
      rc_stride_ = std::max<uint64_t>(1, total / c_.recovery_crashes);
      rc_next_ = rc_stride_ / 2;
    }
    size_t next = 0, wnext = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto last_progress = t0;
    for (size_t i = 0; i < rec_.events.size() && (next < chosen.size() || wnext < windows.size()); ++i) {
      Apply(rec_.events[i]);
      const bool point = next < chosen.size() && int64_t(i) == chosen[next];
      const bool window = wnext < windows.size() && int64_t(i) == windows[wnext];
      if (!point && !window) continue;
      if (point) ++next, CheckPoint(int64_t(i));
      if (window) ++wnext, CheckWindow(int64_t(i));
      if (c_.stop_after > 0 && report_->total_failures() >= c_.stop_after) break;
      if (c_.progress) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_progress > std::chrono::seconds(5)) {
          last_progress = now;
          std::fprintf(stderr, "pmcheck %s: point %zu/%zu, %llu images, %llu failures, %.0f s\n", c_.index.c_str(), next,
                       chosen.size(), static_cast<unsigned long long>(report_->images),
                       static_cast<unsigned long long>(report_->total_failures()),
                       std::chrono::duration<double>(now - t0).count());
        }
      }
    }
  }

 private:
  // --window-images: the points just before fences (FenceWindows), taken
  // round-robin over the window shapes, rarest first, until the budget's
  // images; with --point, that point (its window images are built if any).
  std::vector<int64_t> WindowPoints() {
    if (c_.window_images == 0) return {};
    if (c_.only_point >= 0) return {c_.only_point};
    const std::vector<std::vector<int64_t>> groups = FenceWindows(rec_, c_.seed);
    report_->window_shapes += groups.size();
    std::vector<int64_t> all;
    for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    std::vector<uint32_t> n;
    ImagesAtPoints(all, nullptr, &n);
    std::vector<int64_t> out;
    std::unordered_set<int64_t> taken;
    uint64_t images = 0;
    for (size_t round = 0; images < c_.window_images; ++round) {
      bool more = false;
      for (const auto& g : groups) {
        if (round >= g.size() || images >= c_.window_images) continue;
        more = true;
        const int64_t p = g[round];
        const uint32_t k = n[size_t(std::lower_bound(all.begin(), all.end(), p) - all.begin())];
        if (k == 0 || !taken.insert(p).second) continue;
        out.push_back(p);
        images += k;
      }
      if (!more) break;
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // For each crash point: how many images it yields (a dry replay), and,
  // if first is set, whether it is the first point after a completed read
  // returned a version whose op is still in flight (the read rule's
  // points: sampling takes them before any other).
  // window, if set: how many fence-window images each point yields.
  std::vector<uint32_t> ImagesAtPoints(const std::vector<int64_t>& points, std::vector<uint8_t>* first = nullptr,
                                       std::vector<uint32_t>* window = nullptr) {
    Report scratch;
    Replayer dry(c_, target_, wl_, rec_, &scratch);
    std::vector<uint32_t> out;
    out.reserve(points.size());
    if (first) first->assign(points.size(), 0);
    if (window) window->assign(points.size(), 0);
    size_t next = 0;
    for (size_t i = 0; i < rec_.events.size() && next < points.size(); ++i) {
      dry.Apply(rec_.events[i]);
      if (int64_t(i) != points[next]) continue;
      if (first && dry.read_pending_) (*first)[next] = 1;
      dry.read_pending_ = false;
      ++next;
      if (window) (*window)[next - 1] = uint32_t(std::min<size_t>(kWindowDepth, std::max<size_t>(dry.pending_.size(), 1) - 1));
      uint32_t n = 1;
      if (!dry.pending_.empty()) {
        std::vector<uint64_t> lines = dry.DirtyLines();
        std::vector<size_t> keep;
        n = uint32_t(c_.images_per_point) + (dry.UnfencedDropped(lines, &keep) ? 1 : 0);
      }
      out.push_back(n);
    }
    return out;
  }

  std::vector<uint64_t> DirtyLines() const {
    std::vector<uint64_t> lines;
    for (const auto& [l, v] : pending_) lines.push_back(l);
    std::sort(lines.begin(), lines.end());
    return lines;
  }

  // The unfenced image: per dirty line, the longest prefix of its pending
  // pieces that holds no piece a flush has covered (flushed, not yet fenced
  // by the flushing thread). Every flushed-but-unfenced store is dropped and
  // every other pending store kept, except the stores after a dropped one in
  // the same line (a line persists a prefix of its stores). True if this
  // image differs from image 0 (keep none) and image 1 (keep all), i.e. the
  // point has both kinds of line; only then is it built.
  bool UnfencedDropped(const std::vector<uint64_t>& lines, std::vector<size_t>* keep) const {
    if (!c_.unfenced_image) return false;
    std::unordered_map<uint64_t, uint64_t> upto;  // line -> last piece a pending flush covers
    for (const auto& [tid, m] : flushed_)
      for (const auto& [line, seq] : m) upto[line] = std::max(upto[line], seq);
    keep->assign(lines.size(), 0);
    bool some = false, all = true;
    for (size_t i = 0; i < lines.size(); ++i) {
      const auto& ps = pending_.at(lines[i]);
      auto u = upto.find(lines[i]);
      size_t k = 0;
      while (k < ps.size() && !(u != upto.end() && !ps[k].nt && ps[k].seq <= u->second)) ++k;
      (*keep)[i] = k;
      some |= k > 0;
      all &= k == ps.size();
    }
    return some && !all;
  }

  void AddPieces(const Event& e, bool nt, bool whole) {
    if (whole) {
      pending_[e.off].push_back({e.off, e.size, true, e.tid, ++seq_, e.aux});
      nt_lines_.insert(e.off);
      return;
    }
    uint64_t pos = e.off;
    const uint64_t end = e.off + e.size;
    while (pos < end) {
      uint64_t lim = std::min(end, (pos & ~uint64_t(7)) + 8);
      pending_[pos & ~uint64_t(63)].push_back({pos, uint32_t(lim - pos), nt, e.tid, ++seq_, e.aux + (pos - e.off)});
      if (nt) nt_lines_.insert(pos & ~uint64_t(63));
      pos = lim;
    }
  }
  // Makes durable the pieces of `line` that `pred` selects (keeping the
  // others pending in their order).
  template <typename Pred>
  void Drain(uint64_t line, Pred pred) {
    auto it = pending_.find(line);
    if (it == pending_.end()) return;
    std::vector<Piece> keep;
    for (const Piece& p : it->second) {
      if (pred(p)) Write(durable_, p);
      else keep.push_back(p);
    }
    if (keep.empty()) pending_.erase(it);
    else it->second.swap(keep);
  }
  void Write(std::vector<char>& img, const Piece& p) {
    if (p.off + p.size > img.size()) img.resize(p.off + p.size, 0);
    std::memcpy(img.data() + p.off, rec_.arena.data() + p.src, p.size);
    MarkPages(p.off, p.size);
  }
  void MarkPages(uint64_t off, uint64_t size) {
    if (size == 0) return;
    const uint64_t last = (off + size - 1) / kPage;
    if (last >= touched_.size()) touched_.resize(last + 1, 0);
    for (uint64_t pg = off / kPage; pg <= last; ++pg) touched_[pg] = 1;
  }

  void Apply(const Event& e) {
    switch (e.kind) {
      case Ev::kStore: AddPieces(e, false, false); break;
      case Ev::kNT: AddPieces(e, true, false); break;
      case Ev::kLine: AddPieces(e, true, true); break;
      case Ev::kFlush: {
        // clwb/clflushopt: the line's cached stores so far are written back
        // by the flushing thread's next fence, not before (until then a crash
        // may keep any prefix of them, as for an unflushed line).
        auto it = pending_.find(e.off);
        if (it != pending_.end())
          for (const Piece& p : it->second)
            if (!p.nt) flushed_[e.tid][e.off] = std::max(flushed_[e.tid][e.off], p.seq);
        break;
      }
      case Ev::kFence: {
        // sfence orders this thread's flushes and NT stores only.
        auto f = flushed_.find(e.tid);
        if (f != flushed_.end()) {
          for (const auto& [line, upto] : f->second) Drain(line, [upto = upto](const Piece& p) { return !p.nt && p.seq <= upto; });
          flushed_.erase(f);
        }
        for (auto l = nt_lines_.begin(); l != nt_lines_.end();) {
          Drain(*l, [tid = e.tid](const Piece& p) { return p.nt && p.tid == tid; });
          auto it = pending_.find(*l);
          bool more = false;
          if (it != pending_.end())
            for (const Piece& p : it->second) more |= p.nt;
          l = more ? std::next(l) : nt_lines_.erase(l);
        }
        break;
      }
      case Ev::kOpBegin: {
        const OpRecord& r = rec_.ops[e.aux];
        if (r.op.type != OpType::kCreate) inflight_[e.tid] = e.aux;
        if (r.op.type != OpType::kCreate && wl_.SharedWrite(r.op.kid) && TookEffect(r))
          shared_.WriteBegan(r.op.kid, Workload::After(r.op, r.result, 0), r.begin);
        break;
      }
      case Ev::kOpEnd: {
        const OpRecord& r = rec_.ops[e.aux];
        if (r.op.type == OpType::kCreate) {
          created_ = r.result == Status::Code::kOk;
        } else {
          inflight_.erase(e.tid);
          if (!wl_.SharedWrite(r.op.kid)) {
            uint32_t& cv = committed_[r.op.kid];
            cv = Workload::After(r.op, r.result, cv);
            if (cv > acked_[r.op.kid]) acked_[r.op.kid] = cv;
          } else if (TookEffect(r)) {
            shared_.WriteEnded(r.op.kid, r.begin, r.end);
          }
          for (const auto& [kid, ver] : r.reads) {
            if (!wl_.SharedWrite(kid)) ObserveRead(kid, ver);
            else report_->reads_observed++, shared_.ReadEnded(kid, ver, r.begin);
          }
        }
        break;
      }
      case Ev::kGrow:
        if (e.off > durable_.size()) durable_.resize(e.off, 0);
        break;
    }
  }

  // A write of a shared-write key that took effect (remove: writes absent).
  static bool TookEffect(const OpRecord& r) {
    return r.result == Status::Code::kOk && r.op.type != OpType::kFind && r.op.type != OpType::kScan;
  }
  static uint32_t FirstSharedWrite(const Workload& wl) {
    uint32_t k = uint32_t(wl.num_keys());
    while (k > 0 && wl.SharedWrite(k - 1)) --k;
    return k;
  }

  // The read rule: a completed read returned version ver of kid. If that
  // is the version an op still in flight writes, every later crash must
  // keep it (the op is no longer allowed to be absent).
  void ObserveRead(uint32_t kid, uint32_t ver) {
    report_->reads_observed++;
    if (ver == committed_[kid]) return;
    auto it = inflight_.find(wl_.Owner(kid));
    if (it == inflight_.end()) return;
    const OpRecord& w = rec_.ops[it->second];
    if (w.op.kid != kid || Workload::After(w.op, w.result, committed_[kid]) != ver) return;
    report_->reads_inflight++;
    if (!c_.read_rule) return;
    observed_[kid] = ver;
    read_pending_ = true;
  }

  // The states a crash at this point may recover to.
  Expectation Expect() {
    Expectation ex;
    ex.committed = &committed_;
    ex.acked = &acked_;
    ex.created = created_;
    if (fixed_) return *fixed_;
    ex.shared = shared_.Allowed();
    for (const auto& [tid, recno] : inflight_) {
      const OpRecord& r = rec_.ops[recno];
      if (wl_.SharedWrite(r.op.kid)) continue;  // ex.shared
      const uint32_t before = committed_[r.op.kid];
      const uint32_t after = Workload::After(r.op, r.result, before);
      if (after != before) ex.inflight.emplace_back(r.op.kid, after);
      auto o = observed_.find(r.op.kid);
      if (after != before && o != observed_.end() && o->second == after) ex.read_inflight.push_back(r.op.kid);
    }
    return ex;
  }

  void CheckPoint(int64_t point) {
    report_->points_tried++;
    const std::vector<uint64_t> lines = DirtyLines();
    const int images = lines.empty() ? 1 : std::max(1, c_.images_per_point);
    const Expectation ex = Expect();
    for (int img = 0; img < images; ++img) {
      if (c_.only_image >= 0 && img != c_.only_image) continue;
      // Prefix length per dirty line: image 0 keeps none, image 1 all, the
      // others a seeded mix of none / all / a random prefix.
      std::vector<size_t> keep(lines.size());
      std::mt19937_64 rng(c_.seed ^ (uint64_t(point) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(img) << 48));
      for (size_t i = 0; i < lines.size(); ++i) {
        const size_t n = pending_[lines[i]].size();
        if (img == 0) keep[i] = 0;
        else if (img == 1) keep[i] = n;
        else {
          unsigned r = unsigned(rng() % 3);
          keep[i] = r == 0 ? 0 : r == 1 ? n : size_t(rng() % (n + 1));
        }
      }
      RunImage(point, img, lines, keep, ex);
    }
    // Image images_per_point: the unfenced image (deterministic; see
    // UnfencedDropped), where it differs from images 0 and 1.
    std::vector<size_t> keep;
    if (!lines.empty() && (c_.only_image < 0 || c_.only_image == images) && UnfencedDropped(lines, &keep)) {
      report_->unfenced_images++;
      RunImage(point, images, lines, keep, ex);
    }
  }

  // Fence-window images (--window-images) at a point just before a fence:
  // image images_per_point + k keeps the pending stores of the k dirty
  // lines stored to most recently (whole: a line persists a prefix) and
  // drops every other pending store, k = 1 .. kWindowDepth while fewer than
  // all lines. A missing fence or flush between two stores of a window
  // lets the later one persist alone: one of these images is that crash.
  void CheckWindow(int64_t point) {
    const std::vector<uint64_t> lines = DirtyLines();
    if (lines.size() < 2) return;
    report_->window_points++;
    std::vector<std::pair<uint64_t, size_t>> last;  // (last piece's seq, line index)
    for (size_t i = 0; i < lines.size(); ++i) last.emplace_back(pending_.at(lines[i]).back().seq, i);
    std::sort(last.rbegin(), last.rend());
    const Expectation ex = Expect();
    std::vector<size_t> keep(lines.size(), 0);
    const size_t depth = std::min<size_t>(kWindowDepth, lines.size() - 1);
    for (size_t k = 1; k <= depth; ++k) {
      const size_t i = last[k - 1].second;
      keep[i] = pending_.at(lines[i]).size();
      const int img = std::max(1, c_.images_per_point) + int(k);
      if (c_.only_image >= 0 && img != c_.only_image) continue;
      report_->window_images++;
      RunImage(point, img, lines, keep, ex);
    }
  }

  void RunImage(int64_t point, int img, const std::vector<uint64_t>& lines, const std::vector<size_t>& keep, const Expectation& ex) {
    const std::string path = PoolPath(c_, "img");
    target_->Remove(path);
    report_->images++;
    const bool crash_recovery =
        c_.recovery_crashes > 0 && rc_done_ < c_.recovery_crashes && (c_.only_point >= 0 || report_->images > rc_next_);
    ChildResult r = RunInChild(c_, [&](int fd) {
      std::vector<char>& img_bytes = durable_;  // the child's private copy
      for (size_t i = 0; i < lines.size(); ++i) {
        const auto& ps = pending_.at(lines[i]);
        for (size_t j = 0; j < keep[i]; ++j) Write(img_bytes, ps[j]);
      }
      const auto w0 = std::chrono::steady_clock::now();
      Status s = WriteImage(path, img_bytes, touched_);
      if (c_.verbose)
        Emit(fd, "I timing write " + std::to_string(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count()) + " ms");
      if (!s.ok()) {
        EmitFail(fd, FailKind::kSetup, "writing the crash image: " + s.ToString());
        Emit(fd, "DONE");
        return;
      }
      if (crash_recovery) CrashRecovery(img_bytes, ex, fd);
      VerifyRecovered(target_, path, wl_, ex, fd);
    });
    target_->Remove(path);
    if (alive_fd_ >= 0) Emit(alive_fd_, "I alive");  // keeps a recovery-crashing parent child's timeout fresh
    for (const std::string& i : r.info) {
      if (i.rfind("creation-interrupted", 0) == 0) report_->creation_interrupted++;
      if (i.rfind("recovery-images ", 0) == 0) {
        report_->recoveries_recorded++;
        report_->recovery_images += std::strtoull(i.c_str() + 16, nullptr, 10);
        rc_done_++;
        rc_next_ = report_->images + rc_stride_;
      }
    }
    if (r.failures.empty()) report_->images_recovered++;
    for (Failure& f : r.failures) {
      f.point = point;
      f.image = img;
      f.what += " [" + Context(point) + "]";
      report_->Add(c_, std::move(f));
    }
    if (c_.verbose) {
      std::string timing;
      for (const std::string& i : r.info)
        if (i.rfind("timing ", 0) == 0) timing += " " + i.substr(7);
      std::fprintf(stderr, "point %lld image %d: %zu dirty lines, %zu failures;%s\n", static_cast<long long>(point), img,
                   lines.size(), r.failures.size(), timing.c_str());
    }
  }

  // Child side of --recovery-crashes: recovers a copy of the crash image
  // with a recorder installed before recovery's first store, then replays
  // that recording into crash images of the recovery (every point, the
  // first level's image kinds), each recovered again in a grandchild and
  // verified against ex, the expectations of the first crash. Recovery
  // must be idempotent under any crash. A recovery that changes no byte is
  // not replayed ("recovery-idle"; the parent tries the next image).
  void CrashRecovery(const std::vector<char>& img, const Expectation& ex, int fd) {
    const std::string rpath = PoolPath(c_, "rrec");
    target_->Remove(rpath);
    if (!WriteImage(rpath, img, touched_).ok()) return;
    std::unique_ptr<Recorder> rrec;
    std::unique_ptr<pmindex::Index> idx;
    Recorder::SetThreadId(0);
    Status st = target_->Open(rpath, &idx, [&](char* base, uint64_t max, std::function<uint64_t()> size) {
      rrec = std::make_unique<Recorder>(base, max, std::move(size), true);
      rrec->DropSiteNamed(c_.drop_site);  // a deleted flush/fence in recovery code
      pm::SetObserver(rrec.get());
    });
    if (st.ok() && rrec) rrec->FinalCheck();
    pm::SetObserver(nullptr);
    if (idx) idx->Close();
    idx.reset();
    target_->Remove(rpath);
    if (!st.ok() || !rrec) return;  // the ordinary verification reports it
    // Does the recovery change any byte?
    bool changes = false;
    {
      std::vector<char> now = rrec->initial;
      for (const Event& e : rrec->events) {
        if (e.kind != Ev::kStore && e.kind != Ev::kNT && e.kind != Ev::kLine) continue;
        if (e.off + e.size > now.size()) now.resize(e.off + e.size, 0);
        changes |= std::memcmp(now.data() + e.off, rrec->arena.data() + e.aux, e.size) != 0;
        std::memcpy(now.data() + e.off, rrec->arena.data() + e.aux, e.size);
      }
    }
    for (const Failure& f : rrec->findings)
      if (f.kind == FailKind::kUnloggedStore) EmitFail(fd, f.kind, "during recovery: " + f.what);
    if (!changes) {
      Emit(fd, "I recovery-idle");
      return;
    }
    Config nc = c_;
    nc.points = -1;
    nc.image_budget = c_.recovery_image_budget;
    nc.only_point = -1;
    nc.only_image = -1;
    nc.recovery_crashes = 0;
    nc.window_images = 0;
    nc.verbose = false;
    nc.progress = false;
    Report nr;
    Replayer nested(nc, target_, wl_, *rrec, &nr, &ex);
    nested.alive_fd_ = fd;
    nested.Run();
    Emit(fd, "I recovery-images " + std::to_string(nr.images));
    for (const Failure& f : nr.failures)
      EmitFail(fd, f.kind, "double crash (recovery crashed at its event " + std::to_string(f.point) + ", image " +
                               std::to_string(f.image) + ", then recovered again): " + f.what);
  }

  std::string Context(int64_t point) const {
    std::string s = "crash after event " + std::to_string(point);
    if (fixed_) return "second crash, after recovery event " + std::to_string(point);
    std::string ops;
    for (const auto& [tid, recno] : inflight_) {
      const OpRecord& r = rec_.ops[recno];
      ops += std::string(ops.empty() ? "" : ", ") + OpName(r.op.type) + " " + KeyName(wl_, r.op.kid) + " (op " + std::to_string(recno) +
             ", thread " + std::to_string(tid) + ")";
    }
    if (!created_) ops = "index creation";
    return s + (ops.empty() ? ", between ops" : ", during " + ops);
  }

  // Writes img to a new sparse file: only the pages marked in `touched`
  // (every other page of img is zero). Scanning the whole image for zero
  // pages instead cost 14% of a fault run's time under ASan.
  static Status WriteImage(const std::string& path, const std::vector<char>& img, const std::vector<uint8_t>& touched) {
    int fd = pmindex::pm::CreateFileExclusive(path);
    if (fd < 0) return Status::IOError("open " + path + ": " + std::strerror(errno));
    Status s;
    if (::ftruncate(fd, off_t(img.size())) != 0) s = Status::IOError("ftruncate");
    for (size_t pg = 0; s.ok() && pg < touched.size() && pg * kPage < img.size(); ++pg) {
      if (!touched[pg]) continue;
      const size_t off = pg * kPage, n = std::min(kPage, img.size() - off);
      if (::pwrite(fd, img.data() + off, n, off_t(off)) != ssize_t(n)) s = Status::IOError("pwrite " + path);
    }
    ::close(fd);
    return s;
  }

  const Config& c_;
  Target* target_;
  const Workload& wl_;
  const Recorder& rec_;
  Report* report_;
  const Expectation* fixed_;
  int alive_fd_ = -1;  // nested replay: the first-level child's result pipe
  bool read_pending_ = false;  // a read of an in-flight version since the last crash point
  uint64_t rc_stride_ = 1, rc_next_ = 0, rc_done_ = 0;  // --recovery-crashes: spacing, next image, done
  static constexpr size_t kPage = 4096;
  std::vector<char> durable_;
  std::vector<uint8_t> touched_;  // per page of durable_: may be non-zero
  std::unordered_map<uint64_t, std::vector<Piece>> pending_;
  std::unordered_set<uint64_t> nt_lines_;  // lines holding pending NT pieces
  // Per thread: lines it flushed since its last fence, and the last piece
  // (seq) each flush covered.
  std::unordered_map<int16_t, std::unordered_map<uint64_t, uint64_t>> flushed_;
  uint64_t seq_ = 0;
  std::vector<uint32_t> committed_, acked_;
  std::map<int, size_t> inflight_;
  std::unordered_map<uint32_t, uint32_t> observed_;  // key id -> an in-flight version a completed read returned
  SharedHistory shared_;  // --shared-writes: the keys every thread writes
  bool created_ = false;
};

}  // namespace

void Replay(const Config& c, Target* target, const Workload& wl, const Recorder& rec, Report* report) {
  Replayer rp(c, target, wl, rec, report);
  rp.Run();
}

}  // namespace pmcheck
