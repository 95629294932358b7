// RwLock: a writer-preferring reader-writer lock. Many readers (lock_shared) may hold it at
// once; a writer (lock) holds it alone. A writer that waits bars new readers, so writers do not
// starve under continuous reading (std::shared_mutex on glibc prefers readers: a memory sampled
// at full speed by several threads would hold its actors' inserts back indefinitely).
// Not recursive: a thread holding it in either mode must not take it again.
// Meets the standard Lockable and SharedLockable requirements (std::lock_guard,
// std::unique_lock, std::shared_lock).
//
// Thread safety: thread-safe (that is its purpose).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace memoire {

class RwLock {
 public:
  RwLock() = default;
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;

  void lock() {
    std::unique_lock<std::mutex> l(mu_);
    ++writers_waiting_;
    writer_cv_.wait(l, [this] { return !writer_ && readers_ == 0; });
    --writers_waiting_;
    writer_ = true;
  }
  bool try_lock() {
    std::lock_guard<std::mutex> l(mu_);
    if (writer_ || readers_ != 0) return false;
    writer_ = true;
    return true;
  }
  void unlock() {
    bool writers;
    {
      std::lock_guard<std::mutex> l(mu_);
      writer_ = false;
      writers = writers_waiting_ != 0;
    }
    // A waiting writer goes first; readers are woken only when none waits (those woken now
    // would wait again behind the writer).
    if (writers) {
      writer_cv_.notify_one();
    } else {
      reader_cv_.notify_all();
    }
  }
  void lock_shared() {
    std::unique_lock<std::mutex> l(mu_);
    reader_cv_.wait(l, [this] { return !writer_ && writers_waiting_ == 0; });
    ++readers_;
  }
  bool try_lock_shared() {
    std::lock_guard<std::mutex> l(mu_);
    if (writer_ || writers_waiting_ != 0) return false;
    ++readers_;
    return true;
  }
  void unlock_shared() {
    bool wake_writer;
    {
      std::lock_guard<std::mutex> l(mu_);
      wake_writer = --readers_ == 0 && writers_waiting_ != 0;
    }
    if (wake_writer) writer_cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable writer_cv_;
  std::condition_variable reader_cv_;
  int64_t readers_ = 0;          // readers holding the lock
  int64_t writers_waiting_ = 0;  // writers in lock(), not yet holding it
  bool writer_ = false;          // a writer holds the lock
};

}  // namespace memoire
