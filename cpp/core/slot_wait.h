// The consumer's wait of a ring of slots (the feed's host ring, the device ring): for a slot to
// be ready, unless the consumer itself holds every slot, which nothing but the consumer can end.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace memoire {

// Waits on `cv` (with `lock` held) until `ready()` is true; returns true then. While `held`
// equals `slots` (the consumer holds them all), waits at most `held_wait_ms` and returns false
// if it still does and nothing is ready: the caller reports the held ring. The deadline starts
// when every slot is seen held and resets once one is not. `held` is read under `lock`.
template <class Ready>
bool WaitForSlot(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, const int& held,
                 int slots, int64_t held_wait_ms, Ready ready) {
  std::chrono::steady_clock::time_point until{};
  bool timing = false;
  for (;;) {
    if (ready()) return true;
    if (held < slots) {
      timing = false;
      cv.wait(lock);
      continue;
    }
    if (!timing) {
      until = std::chrono::steady_clock::now() + std::chrono::milliseconds(held_wait_ms);
      timing = true;
    }
    if (cv.wait_until(lock, until) == std::cv_status::timeout && held == slots && !ready())
      return false;
  }
}

}  // namespace memoire
