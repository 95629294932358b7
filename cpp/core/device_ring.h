// DeviceRing: batches copied ahead from a ring of host batches into a ring of device slots, by
// one native copy thread, for a learner that takes them as device arrays (zero-copy, DLPack).
//
// Model. A HostBatches ring (the Prefetcher: sampler threads fill page-lockable host slots)
// feeds `slots` device slots. The copy thread loops: wait for a free device slot, take the next
// host batch, order the copy after the consumer's last use of the device slot (the release
// event), copy each part on the engine's own stream (parts marked host-side -- metadata such as
// keys -- go to the slot's host mirror instead), record the copy's event, wait for it on its
// own thread, give the host slot back and publish the device slot as ready. No lock is held while
// copying and nothing here touches Python.
// A device slot cycles free -> filling -> ready -> taken -> free: Take hands the oldest ready one
// out (with the Status of its draw: a failed draw travels as the slot's Status, not copied);
// the consumer orders its stream after the copy (ConsumerWait: the DLPack `__dlpack__(stream)`
// call), and Release (the DLPack deleter, from any thread) records the release event on the
// consumer's stream and frees the slot.
//
// A consumer that cannot hold 64-bit values (JAX with x64 off) gets them narrowed on the copy
// thread (Options::narrow): so arrays imported once per slot are already in the consumer's
// dtypes, and nothing converts them on the learner's thread.
//
// CopyEngine hides how bytes move: the CUDA engine (cudaMemcpyAsync on a non-blocking stream of
// its own, events; core/cuda_runtime.h) or the host stand-in (memcpy into host "device" slots),
// which tests the same ring, ownership and ordering code without a GPU.
//
// Staleness: a batch is drawn before it enters the host ring, so after a change to the source,
// at most host slots + device slots batches handed out later were drawn before it.
//
// Lifetime: the ring owns its device slots and the host ring's page-locking; callers keep it in
// a shared_ptr and every handed-out slot holds one (a lease), so memory outlives Close until
// the last array is freed. Close closes the host ring (a source whose fill blocks, such as a
// stream's receive, must be stopped before) and joins the copy thread.
//
// Thread-safety: thread-safe. Take, Release, ConsumerWait may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/prefetch.h"
#include "core/status.h"

namespace memoire {

// A ring of host batches in page-lockable memory (each slot one block holding every part): a
// feed's Prefetcher, or a shared-memory sampling stream's slots (StreamSlots,
// core/stream_source.h).
class HostBatches {
 public:
  virtual ~HostBatches() = default;
  // Blocks until a batch is ready: *slot and its draw's Status (a failed draw keeps its slot,
  // to be released as any other, or comes with none: *slot < 0 and the error). *slot < 0
  // with closed() true when the ring is closed.
  virtual Status Take(int* slot) = 0;
  virtual bool closed() const = 0;
  virtual void Release(int slot) = 0;
  virtual uint8_t* const* parts(int slot) const = 0;
  virtual const std::vector<size_t>& part_bytes() const = 0;
  virtual int slots() const = 0;
  virtual uint8_t* block(int slot) const = 0;
  virtual size_t block_bytes() const = 0;
  virtual void Close() = 0;  // Take returns (no slot) from now on
};

// The Prefetcher as a HostBatches.
std::shared_ptr<HostBatches> PrefetcherBatches(std::shared_ptr<Prefetcher> ring);

// How bytes reach a device slot. Slot indices are the DeviceRing's.
// Streams are DLPack's integers: 1 the legacy default stream, 2 the per-thread default stream,
// another value a stream handle, -1 no ordering asked for.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual int dl_device_type() const = 0;  // DLPack: 1 kDLCPU (host stand-in), 2 kDLCUDA
  virtual int device_id() const = 0;
  // Events etc. for `slots` slots; called once, before any other call below.
  virtual Status Prepare(int slots) = 0;
  virtual Status Alloc(size_t bytes, void** ptr) = 0;  // a device slot's memory
  virtual void Free(void* ptr) = 0;
  virtual Status PinHost(void* ptr, size_t bytes) = 0;  // page-lock a host block, once
  virtual void UnpinHost(void* ptr) = 0;
  virtual Status BindThread() = 0;  // on the copy thread, before its first copy
  // On the copy thread: the next copies into `slot` run after the consumer's use of it.
  virtual Status BeforeWrite(int slot) = 0;
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;  // asynchronous
  virtual Status Record(int slot) = 0;  // the copies into `slot` so far end at its event
  virtual Status WaitCopied(int slot) = 0;  // blocks the calling thread until that event
  // The consumer's `stream` waits for the copies into `slot` (never blocks the caller).
  virtual Status ConsumerWait(int slot, int64_t stream) = 0;
  // The consumer let go of `slot`: its later work on `stream` is what the next copy waits for.
  virtual void Released(int slot, int64_t stream) = 0;
};

// float64 -> float32 as numpy's astype: rounded to nearest even, beyond float32's range +-inf
// (from 2**128 - 2**103 up; FLT_MAX below that), NaN stays NaN. Written out because a C++ cast
// of a double beyond float's range is undefined.
float NarrowFloat64(double x);

// memcpy on the copy thread into aligned host memory (DLPack kDLCPU, device 0).
std::unique_ptr<CopyEngine> MakeHostCopyEngine();
// cudaMemcpyAsync on a non-blocking stream of its own on `device`; kFailedPrecondition (the
// runtime's error) when the device cannot be used.
Status MakeCudaCopyEngine(std::shared_ptr<CudaRuntime> rt, int device,
                          std::unique_ptr<CopyEngine>* out);

class DeviceRing {
 public:
  struct Options {
    int slots = 3;  // device slots, >= 1
    // Per part of the host batch: true copies it to the device slot, false to the slot's host
    // mirror (metadata the learner reads on the host). Empty: every part to the device.
    std::vector<bool> to_device;
    // Part `trim_part` copies only counts[trim_count_index] * trim_unit bytes, counts being the
    // int32 values of part `trim_count_part` (read on the host): distinct frames padded to P.
    int trim_part = -1;
    int trim_count_part = -1;
    int trim_count_index = 0;
    size_t trim_unit = 0;
    // Per part on the device (empty: none): narrows 64-bit values to the 32-bit ones a
    // consumer holds (JAX with x64 off), on the copy thread, before the copy: kNarrowFloat
    // float64 -> float32 (NarrowFloat64), kNarrowInt a 64-bit integer to its low 32 bits (as
    // numpy's astype). The device part then holds half the bytes.
    std::vector<uint8_t> narrow;
    // How long Take waits while the consumer holds every device slot before giving up.
    int64_t held_wait_ms = 250;
  };
  static constexpr uint8_t kNarrowNone = 0, kNarrowFloat = 1, kNarrowInt = 2;

  // kInvalidArgument on bad options; the engine's error when memory cannot be had. Page-locks
  // the host ring's blocks and starts the copy thread.
  static Status Make(const Options& o, std::shared_ptr<HostBatches> host,
                     std::unique_ptr<CopyEngine> engine, std::shared_ptr<DeviceRing>* out);
  ~DeviceRing();  // Close(), then frees device memory and unpins the host ring
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  // Blocks until a device slot is ready and hands it out: *slot, and the Status of its draw or
  // copy. kFailedPrecondition (no slot) when closed, when the host ring closed, or when every
  // slot stayed taken for held_wait_ms (detail "held").
  Status Take(int* slot);
  // Take without waiting: false (nothing taken) when no slot is ready yet.
  bool TryTake(int* slot, Status* status);
  // Gives a taken slot back (the DLPack deleter); `stream` as CopyEngine::Released. Ignores a
  // slot that is not taken. Any thread.
  void Release(int slot, int64_t stream);
  Status ConsumerWait(int slot, int64_t stream) { return engine_->ConsumerWait(slot, stream); }
  void Close();

  // Where part `part` of `slot` is: on the device, or in the host mirror (to_device false).
  uint8_t* device_part(int slot, int part) const { return device_[slot] + offsets_[part]; }
  uint8_t* device_block(int slot) const { return device_[slot]; }  // block_bytes() long
  size_t block_bytes() const { return host_->block_bytes(); }
  uint8_t* host_part(int slot, int part) const { return mirror_[slot].get() + offsets_[part]; }
  bool on_device(int part) const { return opt_.to_device[part]; }
  size_t copied_bytes(int slot, int part) const;  // what the last copy moved of the part
  int64_t last_copy_bytes() const;  // bytes the last completed copy moved to the device
  int dl_device_type() const { return engine_->dl_device_type(); }
  int device_id() const { return engine_->device_id(); }
  int slots() const { return opt_.slots; }
  int pinned() const { return static_cast<int>(pinned_.size()); }  // host slots page-locked
  int held() const;
  int64_t copied() const;  // batches copied so far
  int64_t taken() const;   // slots handed out by Take so far

 private:
  enum class State { kFree, kFilling, kReady, kTaken };
  DeviceRing(const Options& o, std::shared_ptr<HostBatches> host,
             std::unique_ptr<CopyEngine> engine);
  void Run();
  Status CopyIn(int slot, int host_slot, int64_t* moved);
  Status TakeLocked(int* slot);  // mu_ held, a slot ready

  Options opt_;
  std::shared_ptr<HostBatches> host_;
  std::unique_ptr<CopyEngine> engine_;
  std::vector<size_t> offsets_;  // of each part in a block
  std::vector<uint8_t*> device_;  // one block per slot
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> mirror_;
  std::vector<uint8_t*> pinned_;  // host blocks page-locked
  std::vector<std::vector<size_t>> copied_;  // per slot, per part

  mutable std::mutex mu_;
  std::condition_variable free_cv_, ready_cv_;
  std::vector<State> state_;     // guarded by mu_
  std::vector<Status> status_;   // guarded by mu_
  std::deque<int> free_, ready_;  // guarded by mu_
  int held_ = 0;                 // guarded by mu_
  int64_t copied_count_ = 0;     // guarded by mu_
  int64_t taken_ = 0;            // guarded by mu_
  int64_t last_bytes_ = 0;       // guarded by mu_
  bool closing_ = false;         // guarded by mu_
  bool host_closed_ = false;     // guarded by mu_: the copy thread has ended
  bool copier_waits_ = false;    // guarded by mu_: the copy thread waits for a free slot
  std::thread thread_;
  std::mutex join_mu_;
};

}  // namespace memoire
