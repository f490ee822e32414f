// fastfair_line_prefix.h: the pm-model crash-state enumerator shared by the
// fastfair line-prefix crash tests (fastfair_prefix_crash_test,
// fastfair_prefix_repair_test). docs/persistence.md's model: a crash keeps,
// for each cache line, a prefix of the 8-byte stores made to it since its
// last flush+fence; lines flushed and then fenced are durable. Unlike
// kit::DurableImage (whole lines at fences), this reaches a line holding part
// of its stores and lines made durable by one fence in any order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"

namespace fftest {

// Stores (split into aligned 8-byte pieces), flushes and fences made to one
// pool while installed as the observer, in order.
class LineRecorder : public pmindex::pm::Observer {
 public:
  struct Piece {
    uint64_t off;
    std::string bytes;  // at most 8 bytes, within one aligned word
  };
  struct Event {
    int type;  // 0 store piece, 1 flush of a line, 2 fence
    Piece p;
  };
  explicit LineRecorder(pmindex::pm::Pool* pool) : base_(pool->base()), size_(pool->size()) {}
  void OnStore(const void* a, size_t n) override;
  void OnNonTemporalStore(const void* a, size_t n) override { OnStore(a, n); }
  void OnFlush(const void* line) override;
  void OnFence() override { events.push_back({2, {}}); }
  void OnLoad(const void*, size_t) override {}
  std::vector<Event> events;

 private:
  const char* base_;
  uint64_t size_;
};

struct LinePrefixRun {
  int images = 0;  // crash images checked
  int bad = 0;     // ... for which verify returned an error
};

// Every crash state of `events` applied to the image `durable` (the pool's
// bytes before them, all durable): before the first event and after each,
// every combination of per-line prefixes of the stores not yet durable. Each
// state is written to `image_path` (a file of `file_size` bytes, the pool
// file's size) and verify() is called; a non-empty result is a bad image
// (the first three are reported as test failures, tagged with `name` and
// the per-line prefix lengths). Each verify() is bounded by 60 s (a
// watchdog thread): past that (a broken build looping on an image) the
// image is reported and the process exits with status 1. max_per_point > 0 bounds the combinations
// checked at one point: beyond it, a fixed pseudo-random sample of that
// many (always including "none" and "all").
LinePrefixRun ForEachLinePrefixImage(std::string durable, uint64_t file_size,
                                     const std::vector<LineRecorder::Event>& events, const std::string& image_path,
                                     const std::string& name, const std::function<std::string()>& verify,
                                     uint64_t max_per_point = 0);

}  // namespace fftest
