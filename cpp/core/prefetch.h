// Prefetcher: sampler threads that fill batches ahead of a consumer, into a small ring of
// reusable host buffers. Generic: what a batch is and how it is drawn is the caller's `Fill`
// callback; the ring only owns memory, threads and the hand-over.
//
// Model. `depth` slots; each slot holds one buffer per part (part sizes in bytes fixed at
// construction, each 64-byte aligned, allocated once). A slot cycles
//   free -> filling (one sampler thread runs Fill into it) -> ready -> taken (the consumer reads
//   it) -> free (Release).
// `threads` sampler threads each loop: wait for a free slot, Fill it without any lock of the
// prefetcher held, queue it as ready. Take hands out the oldest ready slot (FIFO in completion
// order; with one thread that is draw order). A Fill that fails stores its Status in the slot:
// Take returns that Status with the slot (the consumer releases it as any other), and the
// sampler goes on with the next slot. So the consumer sees each draw's outcome, in order, at
// most `depth` draws after it was made.
//
// Staleness: a change to the source (a priority update) made after Take returned batch k is
// seen by every draw that starts after it. Draws made before it sit in the ring's other slots
// (ready, or filling under the source's lock), so at most `depth` batches taken after batch k
// were drawn before the change, whatever the number of threads.
//
// Page-locking: each slot's parts are one block (block(slot), block_bytes()), so a device ring
// (core/device_ring.h) page-locks the ring with one cudaHostRegister per slot and copies it
// from there; without one the ring is ordinary aligned host memory.
//
// Shutdown: Close() (and the destructor) stops the samplers, wakes every waiter and joins the
// threads; a Fill in progress completes first. After Close, Take returns kFailedPrecondition.
// Slots still taken stay valid until released or until the Prefetcher is destroyed.
//
// Thread-safety: thread-safe. Take/Release may be called from any thread; Fill runs on the
// sampler threads, concurrently with itself when threads > 1 (each call on a different slot).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"

namespace memoire {

class Prefetcher {
 public:
  struct Options {
    int depth = 4;                    // slots in the ring, >= 1
    int threads = 1;                  // sampler threads, 1 <= threads <= depth
    std::vector<size_t> part_bytes;   // one buffer of each size per slot (0 allowed)
    // How long Take waits while the consumer holds every slot before it gives up: a release
    // may still come from another thread (an asynchronous device copy dropping its source).
    int64_t held_wait_ms = 2000;
  };
  // Fills one batch into parts[i] (part_bytes[i] bytes each, 64-byte aligned). `thread` is the
  // calling sampler's index in [0, threads): it lets the callback keep per-thread state (a
  // generator) without a lock. Called without any lock of the Prefetcher held.
  using Fill = std::function<Status(int thread, uint8_t* const* parts)>;

  // kInvalidArgument on depth < 1 or threads outside [1, depth]; starts the threads.
  static Status Make(const Options& o, Fill fill, std::unique_ptr<Prefetcher>* out);
  ~Prefetcher();  // Close()
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Blocks until a slot is ready, then hands it out: *slot is its index, the return value its
  // Fill's Status. Returns kFailedPrecondition (writing nothing) when closed, or when every slot
  // stayed taken for held_wait_ms (the consumer holds the whole ring: waiting would not end).
  Status Take(int* slot);
  // The parts of `slot` (valid while the Prefetcher lives).
  uint8_t* const* parts(int slot) const { return slot_parts_[slot].data(); }
  // The block holding every part of `slot` (parts in order, each at a 64-byte aligned offset;
  // the block page-aligned, whole pages), and its size in bytes: what a device ring page-locks.
  uint8_t* block(int slot) const { return blocks_[slot].get(); }
  size_t block_bytes() const { return block_bytes_; }
  const std::vector<size_t>& part_bytes() const { return opt_.part_bytes; }
  // Gives a taken slot back to the samplers. Ignores a slot that is not taken.
  void Release(int slot);
  // Stops and joins the sampler threads (idempotent).
  void Close();

  int depth() const { return opt_.depth; }
  bool closed() const;  // Close was called
  int threads() const { return opt_.threads; }
  int64_t taken() const;  // batches handed out by Take so far
  int64_t filled() const;  // Fill calls completed so far (ok or not)

 private:
  enum class State { kFree, kFilling, kReady, kTaken };
  Prefetcher(const Options& o, Fill fill);
  void Run(int thread);

  const Options opt_;
  const Fill fill_;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> blocks_;  // one per slot
  std::vector<std::vector<uint8_t*>> slot_parts_;
  size_t block_bytes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable free_cv_;   // a slot became free, or closing
  std::condition_variable ready_cv_;  // a slot became ready, or closing
  std::vector<State> state_;          // guarded by mu_
  std::vector<Status> status_;        // guarded by mu_ (written by the filler before kReady)
  std::deque<int> free_, ready_;      // guarded by mu_
  int64_t taken_ = 0, filled_ = 0;    // guarded by mu_
  int held_ = 0;                      // slots in kTaken; guarded by mu_
  bool closing_ = false;              // guarded by mu_
  std::vector<std::thread> threads_;
  std::mutex join_mu_;                // serialises Close's joins
};

}  // namespace memoire
