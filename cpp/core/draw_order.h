// DrawOrder: the outcomes of a stream's sampler threads, handed on in the memory's draw order
// while their copies overlap (core/stream_sampler.h, core/stream_rows_sampler.h). A thread
// takes its place when the memory draws its batch (ReplayMemory's on_draw, under the memory's
// draw lock, so places follow the draws), or once it is done when it drew nothing (a failed or
// refused draw); it fills its entry after the copy and marks it finished, and the finished
// entries at the front then leave, in order.
//
// Thread safety: none of its own: the owner's lock guards every call. An entry's address stays
// valid until it leaves (a deque keeps its other elements in place, and only finished entries
// at the front leave).
#pragma once

#include <cstdint>
#include <deque>

namespace memoire {

template <typename T>
class DrawOrder {
 public:
  struct Entry {
    T value{};
    bool finished = false;
  };
  // A new place at the back.
  Entry* Place() {
    q_.emplace_back();
    return &q_.back();
  }
  // Hands each finished entry at the front to take(T&), in order, and drops it; how many.
  template <typename Take>
  int64_t TakeFinished(Take&& take) {
    int64_t taken = 0;
    while (!q_.empty() && q_.front().finished) {
      take(q_.front().value);
      q_.pop_front();
      ++taken;
    }
    return taken;
  }

 private:
  std::deque<Entry> q_;
};

}  // namespace memoire
