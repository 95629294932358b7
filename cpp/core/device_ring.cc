#include "core/device_ring.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include "core/batch_scheduling.h"
#include "core/slot_wait.h"
#include "core/thread_name.h"

namespace memoire {

namespace {

constexpr size_t kAlign = 64;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class PrefetcherAdapter : public HostBatches {
 public:
  explicit PrefetcherAdapter(std::shared_ptr<Prefetcher> ring) : ring_(std::move(ring)) {}
  Status Take(int* slot) override {
    *slot = -1;
    return ring_->Take(slot);
  }
  void Release(int slot) override { ring_->Release(slot); }
  uint8_t* const* parts(int slot) const override { return ring_->parts(slot); }
  const std::vector<size_t>& part_bytes() const override { return ring_->part_bytes(); }
  int slots() const override { return ring_->depth(); }
  uint8_t* block(int slot) const override { return ring_->block(slot); }
  size_t block_bytes() const override { return ring_->block_bytes(); }
  void Close() override { ring_->Close(); }
  bool closed() const override { return ring_->closed(); }

 private:
  std::shared_ptr<Prefetcher> ring_;
};

// The host stand-in: "device" slots are aligned host memory and a copy is a memcpy.
class HostCopyEngine : public CopyEngine {
 public:
  int dl_device_type() const override { return 1; }  // kDLCPU
  int device_id() const override { return 0; }
  Status Prepare(int) override { return Status::OK(); }
  Status Alloc(size_t bytes, void** ptr) override {
    *ptr = std::aligned_alloc(kAlign, RoundUp(bytes == 0 ? kAlign : bytes));
    if (*ptr == nullptr)
      return Error(Code::kResourceExhausted, "device ring: cannot allocate ", bytes, " bytes");
    return Status::OK();
  }
  void Free(void* ptr) override { std::free(ptr); }
  Status PinHost(void*, size_t) override {
    return Error(Code::kFailedPrecondition, "the host stand-in page-locks nothing");
  }
  void UnpinHost(void*) override {}
  Status BindThread() override { return Status::OK(); }
  Status BeforeWrite(int) override { return Status::OK(); }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::OK();
  }
  Status Record(int) override { return Status::OK(); }
  Status WaitCopied(int) override { return Status::OK(); }
  Status ConsumerWait(int, int64_t) override { return Status::OK(); }
  void Released(int, int64_t) override {}
};

// Makes `device` current on the calling thread (the learner's) and restores its device after:
// the feed must not move a framework's thread to another GPU.
struct DeviceScope {
  const CudaRuntime& rt;
  int previous = -1;
  Status status;
  DeviceScope(const CudaRuntime& r, int device) : rt(r) {
    if (rt.GetDevice(&previous) != 0) previous = -1;
    if (previous != device) status = rt.Check(rt.SetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (previous >= 0) rt.SetDevice(previous);
  }
};

class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(std::shared_ptr<CudaRuntime> rt, int device) : rt_(std::move(rt)), device_(device) {}
  ~CudaCopyEngine() override {
    // Errors ignored: at interpreter exit the runtime may already be unloading.
    for (void* e : copied_) rt_->EventDestroy(e);
    for (void* e : released_) rt_->EventDestroy(e);
    if (stream_ != nullptr) rt_->StreamDestroy(stream_);
  }
  int dl_device_type() const override { return 2; }  // kDLCUDA
  int device_id() const override { return device_; }
  Status Prepare(int slots) override {
    DeviceScope scope(*rt_, device_);
    MEMOIRE_RETURN_IF_ERROR(scope.status);
    MEMOIRE_RETURN_IF_ERROR(rt_->Check(
        rt_->StreamCreateWithFlags(&stream_, CudaRuntime::kStreamNonBlocking),
        "cudaStreamCreateWithFlags"));
    for (int s = 0; s < slots; ++s) {
      void* a = nullptr;
      void* b = nullptr;
      MEMOIRE_RETURN_IF_ERROR(rt_->Check(
          rt_->EventCreateWithFlags(&a, CudaRuntime::kEventDisableTiming), "cudaEventCreate"));
      copied_.push_back(a);
      MEMOIRE_RETURN_IF_ERROR(rt_->Check(
          rt_->EventCreateWithFlags(&b, CudaRuntime::kEventDisableTiming), "cudaEventCreate"));
      released_.push_back(b);
    }
    release_recorded_.assign(slots, 0);
    return Status::OK();
  }
  Status Alloc(size_t bytes, void** ptr) override {
    DeviceScope scope(*rt_, device_);
    MEMOIRE_RETURN_IF_ERROR(scope.status);
    return rt_->Check(rt_->Malloc(ptr, bytes == 0 ? kAlign : bytes), "cudaMalloc");
  }
  void Free(void* ptr) override { rt_->Free(ptr); }
  Status PinHost(void* ptr, size_t bytes) override {
    return rt_->Check(rt_->HostRegister(ptr, bytes, CudaRuntime::kHostRegisterPortable),
                      "cudaHostRegister");
  }
  void UnpinHost(void* ptr) override { rt_->HostUnregister(ptr); }
  Status BindThread() override { return rt_->Check(rt_->SetDevice(device_), "cudaSetDevice"); }
  Status BeforeWrite(int slot) override {
    // Guarded by the ring: Released wrote it before the slot was freed, under its mutex.
    if (!release_recorded_[slot]) return Status::OK();
    release_recorded_[slot] = 0;
    return rt_->Check(rt_->StreamWaitEvent(stream_, released_[slot], 0), "cudaStreamWaitEvent");
  }
  Status Copy(void* dst, const void* src, size_t bytes) override {
    return rt_->Check(
        rt_->MemcpyAsync(dst, src, bytes, CudaRuntime::kMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync");
  }
  Status Record(int slot) override {
    return rt_->Check(rt_->EventRecord(copied_[slot], stream_), "cudaEventRecord");
  }
  Status WaitCopied(int slot) override {
    return rt_->Check(rt_->EventSynchronize(copied_[slot]), "cudaEventSynchronize");
  }
  Status ConsumerWait(int slot, int64_t stream) override {
    if (stream == -1) return Status::OK();
    return rt_->Check(rt_->StreamWaitEvent(reinterpret_cast<void*>(stream), copied_[slot], 0),
                      "cudaStreamWaitEvent (the consumer's stream)");
  }
  void Released(int slot, int64_t stream) override {
    if (stream == -1) return;
    // The consumer's work on the slot so far was queued on `stream`: the next copy waits for it.
    release_recorded_[slot] =
        rt_->EventRecord(released_[slot], reinterpret_cast<void*>(stream)) == 0;
  }

 private:
  std::shared_ptr<CudaRuntime> rt_;
  const int device_;
  void* stream_ = nullptr;
  std::vector<void*> copied_, released_;
  // Not vector<bool>: Released (a deleter's thread, under the ring's mutex) and BeforeWrite (the
  // copy thread) write different slots' flags concurrently, and bits share a word.
  std::vector<uint8_t> release_recorded_;
};

}  // namespace

float NarrowFloat64(double x) {
  constexpr double kMax = std::numeric_limits<float>::max();  // 2**128 - 2**104
  constexpr double kToInfinity = 3.4028235677973366e38;       // 2**128 - 2**103: ties to inf
  if (std::isnan(x)) return static_cast<float>(x);           // defined for NaN; keeps the sign
  const double a = std::fabs(x);
  float y;
  if (a >= kToInfinity) {
    y = std::numeric_limits<float>::infinity();
  } else if (a > kMax) {
    y = std::numeric_limits<float>::max();
  } else {
    y = static_cast<float>(a);
  }
  return std::signbit(x) ? -y : y;
}

std::shared_ptr<HostBatches> PrefetcherBatches(std::shared_ptr<Prefetcher> ring) {
  return std::make_shared<PrefetcherAdapter>(std::move(ring));
}

std::unique_ptr<CopyEngine> MakeHostCopyEngine() { return std::make_unique<HostCopyEngine>(); }

Status MakeCudaCopyEngine(std::shared_ptr<CudaRuntime> rt, int device,
                          std::unique_ptr<CopyEngine>* out) {
  if (!rt) return Error(Code::kInvalidArgument, "CUDA runtime: not loaded");
  if (device < 0 || device >= rt->device_count())
    return Error(Code::kInvalidArgument, "device: expected a CUDA device in [0, ",
                 rt->device_count(), "), got ", device);
  *out = std::make_unique<CudaCopyEngine>(std::move(rt), device);
  return Status::OK();
}

DeviceRing::DeviceRing(const Options& o, std::shared_ptr<HostBatches> host,
                       std::unique_ptr<CopyEngine> engine)
    : opt_(o), host_(std::move(host)), engine_(std::move(engine)) {}

Status DeviceRing::Make(const Options& o, std::shared_ptr<HostBatches> host,
                        std::unique_ptr<CopyEngine> engine, std::shared_ptr<DeviceRing>* out) {
  if (!host || !engine) return Error(Code::kInvalidArgument, "device ring: no host ring or engine");
  if (o.slots < 1)
    return Error(Code::kInvalidArgument, "device slots: expected >= 1, got ", o.slots);
  const std::vector<size_t>& bytes = host->part_bytes();
  const int parts = static_cast<int>(bytes.size());
  Options opt = o;
  if (opt.to_device.empty()) opt.to_device.assign(parts, true);
  if (static_cast<int>(opt.to_device.size()) != parts)
    return Error(Code::kInvalidArgument, "to_device: expected ", parts, " flags, got ",
                 opt.to_device.size());
  if (opt.narrow.empty()) opt.narrow.assign(parts, kNarrowNone);
  if (static_cast<int>(opt.narrow.size()) != parts)
    return Error(Code::kInvalidArgument, "narrow: expected ", parts, " flags, got ",
                 opt.narrow.size());
  for (int p = 0; p < parts; ++p) {
    if (opt.narrow[p] == kNarrowNone) continue;
    if (opt.narrow[p] > kNarrowInt || !opt.to_device[p] || bytes[p] % 8 != 0 || p == opt.trim_part)
      return Error(Code::kInvalidArgument,
                   "narrow: expected 64-bit parts on the device (not trimmed), got part ", p);
  }
  if (opt.trim_part >= 0) {
    if (opt.trim_part >= parts || opt.trim_count_part < 0 || opt.trim_count_part >= parts ||
        opt.to_device[opt.trim_count_part] || opt.trim_count_index < 0 ||
        static_cast<size_t>(opt.trim_count_index + 1) * sizeof(int32_t) >
            bytes[opt.trim_count_part])
      return Error(Code::kInvalidArgument,
                   "trim: expected a part and a host-side int32 count part, got parts ",
                   opt.trim_part, ", ", opt.trim_count_part);
  }
  std::shared_ptr<DeviceRing> r(new DeviceRing(opt, std::move(host), std::move(engine)));
  size_t off = 0;
  for (size_t b : bytes) {
    r->offsets_.push_back(off);
    off += RoundUp(b);
  }
  const size_t block = r->host_->block_bytes();
  MEMOIRE_RETURN_IF_ERROR(r->engine_->Prepare(opt.slots));
  for (int s = 0; s < opt.slots; ++s) {
    void* d = nullptr;
    MEMOIRE_RETURN_IF_ERROR(r->engine_->Alloc(block, &d));
    r->device_.push_back(static_cast<uint8_t*>(d));
    void* m = std::aligned_alloc(kAlign, RoundUp(block == 0 ? kAlign : block));
    if (m == nullptr)
      return Error(Code::kResourceExhausted, "device ring: cannot allocate ", block, " bytes");
    r->mirror_.emplace_back(static_cast<uint8_t*>(m), std::free);
    r->copied_.emplace_back(bytes.size(), 0);
    r->state_.push_back(State::kFree);
    r->status_.emplace_back();
    r->free_.push_back(s);
  }
  // Page-locked, the copies are asynchronous DMA; a block that cannot be locked (a limit on
  // locked memory) is still copied correctly, staged by the driver, so it is not an error.
  for (int s = 0; s < r->host_->slots(); ++s)
    if (r->engine_->PinHost(r->host_->block(s), block).ok()) r->pinned_.push_back(r->host_->block(s));
  r->thread_ = std::thread(&DeviceRing::Run, r.get());
  NameThread(r->thread_, "memoire-copy");
  *out = std::move(r);
  return Status::OK();
}

DeviceRing::~DeviceRing() {
  Close();
  for (uint8_t* d : device_) engine_->Free(d);
  for (uint8_t* p : pinned_) engine_->UnpinHost(p);
}

Status DeviceRing::CopyIn(int slot, int host_slot, int64_t* moved) {
  const std::vector<size_t>& bytes = host_->part_bytes();
  uint8_t* const* src = host_->parts(host_slot);
  MEMOIRE_RETURN_IF_ERROR(engine_->BeforeWrite(slot));
  // Host-side parts first: the trim count is read from the mirror's copy.
  for (size_t p = 0; p < bytes.size(); ++p)
    if (!opt_.to_device[p]) {
      std::memcpy(host_part(slot, static_cast<int>(p)), src[p], bytes[p]);
      copied_[slot][p] = bytes[p];
    }
  *moved = 0;
  for (size_t p = 0; p < bytes.size(); ++p) {
    if (!opt_.to_device[p]) continue;
    size_t n = bytes[p];
    if (static_cast<int>(p) == opt_.trim_part) {
      int32_t count;
      std::memcpy(&count, host_part(slot, opt_.trim_count_part) + opt_.trim_count_index * 4, 4);
      const size_t want = static_cast<size_t>(count < 0 ? 0 : count) * opt_.trim_unit;
      if (want > n)
        return Error(Code::kInternal, "device ring: trimmed part of ", want, " bytes exceeds ", n);
      n = want;
    }
    const uint8_t* from = src[p];
    if (opt_.narrow[p] != kNarrowNone) {
      // Into the slot's mirror (unused by a device part), then half the bytes travel.
      uint8_t* to = host_part(slot, static_cast<int>(p));
      const size_t count = n / 8;
      if (opt_.narrow[p] == kNarrowFloat) {
        for (size_t i = 0; i < count; ++i) {
          double x;
          std::memcpy(&x, src[p] + 8 * i, 8);
          const float y = NarrowFloat64(x);
          std::memcpy(to + 4 * i, &y, 4);
        }
      } else {
        for (size_t i = 0; i < count; ++i) {
          uint64_t x;
          std::memcpy(&x, src[p] + 8 * i, 8);
          const uint32_t y = static_cast<uint32_t>(x);
          std::memcpy(to + 4 * i, &y, 4);
        }
      }
      from = to;
      n = count * 4;
    }
    copied_[slot][p] = n;
    if (n > 0) MEMOIRE_RETURN_IF_ERROR(engine_->Copy(device_part(slot, static_cast<int>(p)), from, n));
    *moved += static_cast<int64_t>(n);
  }
  return engine_->Record(slot);
}

void DeviceRing::Run() {
  // Background work, as the samplers': woken by a learner's release, it runs when the learner
  // sleeps or on another core, instead of preempting the learner (core/batch_scheduling.h).
  SetBatchScheduling(true);
  Status bound = engine_->BindThread();
  for (;;) {
    int slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      copier_waits_ = true;
      free_cv_.wait(lock, [&] { return closing_ || !free_.empty(); });
      copier_waits_ = false;
      if (closing_) break;
      slot = free_.front();
      free_.pop_front();
      state_[slot] = State::kFilling;
    }
    int host_slot = -1;
    Status s = host_->Take(&host_slot);
    if (host_slot < 0 && (s.ok() || host_->closed())) {  // the host ring closed: so does this
      std::lock_guard<std::mutex> lock(mu_);
      state_[slot] = State::kFree;
      free_.push_front(slot);
      break;
    }
    if (host_slot < 0) {  // a failed draw that came without a slot: this slot carries it
      {
        std::lock_guard<std::mutex> lock(mu_);
        status_[slot] = std::move(s);
        state_[slot] = State::kReady;
        ready_.push_back(slot);
      }
      ready_cv_.notify_one();
      continue;
    }
    int64_t moved = 0;
    if (s.ok()) s = bound;
    if (s.ok()) {
      try {
        s = CopyIn(slot, host_slot, &moved);
      } catch (const std::exception& e) {
        s = Error(Code::kInternal, "device copy failed: ", e.what());
      }
    }
    // The slot is published once its copy is complete (the copy thread waits, not the
    // learner): a consumer that names no stream, or a stream its work does not run on, still
    // reads a whole batch. The consumer's stream also waits on the copy's event (DLPack), which
    // then costs nothing. And the host slot is refilled only once the copy has read it.
    if (s.ok()) s = engine_->WaitCopied(slot);
    const bool copied = s.ok();
    host_->Release(host_slot);
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_[slot] = std::move(s);
      state_[slot] = State::kReady;
      ready_.push_back(slot);
      if (copied) {
        ++copied_count_;
        last_bytes_ = moved;
      }
    }
    ready_cv_.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    host_closed_ = true;
  }
  ready_cv_.notify_all();
}

Status DeviceRing::Take(int* slot) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForSlot(lock, ready_cv_, held_, opt_.slots, opt_.held_wait_ms,
              [this] { return closing_ || !ready_.empty() || host_closed_; });
  if (closing_ || (ready_.empty() && host_closed_))
    return Error(Code::kFailedPrecondition, "the feed is closed");
  if (ready_.empty())
    return Error(Code::kFailedPrecondition, "every one of the feed's ", opt_.slots,
                 " device slots is held by a batch still in use: drop a batch (or raise "
                 "device_slots)")
        .With("held", opt_.slots);
  return TakeLocked(slot);
}

bool DeviceRing::TryTake(int* slot, Status* status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_ || ready_.empty()) return false;
  *status = TakeLocked(slot);
  return true;
}

Status DeviceRing::TakeLocked(int* slot) {
  const int s = ready_.front();
  ready_.pop_front();
  state_[s] = State::kTaken;
  ++held_;
  ++taken_;
  *slot = s;
  return status_[s];
}

void DeviceRing::Release(int slot, int64_t stream) {
  bool wake_copier, wake_takers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < 0 || slot >= opt_.slots || state_[slot] != State::kTaken) return;
    engine_->Released(slot, stream);
    state_[slot] = State::kFree;
    status_[slot] = Status::OK();
    wake_takers = held_-- == opt_.slots;  // a Take may wait on a fully held ring
    free_.push_back(slot);
    wake_copier = copier_waits_;
  }
  // Only the waits that this release can end are woken: a wake-up is a system call on the
  // learner's thread, which releases a slot with every batch.
  if (wake_copier) free_cv_.notify_one();
  if (wake_takers) ready_cv_.notify_all();
}

void DeviceRing::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  free_cv_.notify_all();
  ready_cv_.notify_all();
  host_->Close();  // the copy thread may wait in its Take
  std::lock_guard<std::mutex> join(join_mu_);
  if (thread_.joinable()) thread_.join();
}

size_t DeviceRing::copied_bytes(int slot, int part) const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_[slot][part];
}

int64_t DeviceRing::last_copy_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_bytes_;
}

int DeviceRing::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

int64_t DeviceRing::taken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_;
}

int64_t DeviceRing::copied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_count_;
}

}  // namespace memoire
