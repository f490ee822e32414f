// Test support (not part of the library): the durable image of every fence
// of an operation under test, saved to files for the crash tests to open.
// While During(op) runs, each fence of the pool's threads writes the
// DurableImage (kit/test_observer.h) to <tag>.img<n>; once op has returned,
// ForEach hands the saved paths to a check, in fence order, and removes the
// files. Images are verified outside the observer callback, so a check may
// open them like pools after a power failure.
//
//   testutil::FenceImages fences(sim, tag);
//   Status s = fences.During([&] { return idx->Remove(k); });
//   fences.ForEach([&](const std::string& img, int fence) { ... });
//
// Thread-safety: one test thread makes, runs and destroys it; the fences
// may come from any thread (DurableImage's on_fence contract).
#pragma once

#include <string>
#include <utility>

#include "kit/test_observer.h"
#include "pmindex/pm/pool.h"

namespace pmindex::testutil {

class FenceImages {
 public:
  FenceImages(internal::kit::DurableImage* sim, std::string tag) : sim_(sim), tag_(std::move(tag)) {
    sim_->on_fence = [this](uint64_t) {
      if (!recording_) return;
      const std::string img = Path(saved_++);
      pm::Pool::Remove(img);
      sim_->Write(img);
    };
  }
  ~FenceImages() {
    sim_->on_fence = nullptr;
    for (int x = 0; x < saved_; x++) pm::Pool::Remove(Path(x));
  }
  FenceImages(const FenceImages&) = delete;
  FenceImages& operator=(const FenceImages&) = delete;

  // Runs op() with the image of each of its fences saved; returns op's
  // result.
  template <class Op>
  auto During(Op op) {
    recording_ = true;
    auto r = op();
    recording_ = false;
    return r;
  }
  // Calls check(path, fence) for every image saved since the last call and
  // removes it; returns how many there were.
  template <class Check>
  int ForEach(Check check) {
    const int n = saved_;
    for (int x = 0; x < n; x++) {
      const std::string img = Path(x);
      check(img, x);
      pm::Pool::Remove(img);
    }
    saved_ = 0;
    return n;
  }

 private:
  std::string Path(int x) const { return tag_ + ".img" + std::to_string(x); }
  internal::kit::DurableImage* sim_;
  const std::string tag_;
  bool recording_ = false;
  int saved_ = 0;
};

}  // namespace pmindex::testutil
