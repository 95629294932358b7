// DeviceRing over the host stand-in engine: every host batch reaches a device slot once, in
// order; host-side parts land in the mirror; a trimmed part copies only its count's rows; a
// failed draw travels as the slot's Status; a fully held ring fails instead of hanging; Close
// with slots taken is clean and slots released after Close are ignored safely; TryTake takes
// only what is ready; narrowed parts arrive as 32-bit values (float64 rounded as numpy does);
// the CUDA loader names what it found.
#include "core/device_ring.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing.h"

using memoire::Code;
using memoire::CudaRuntime;
using memoire::DeviceRing;
using memoire::MakeHostCopyEngine;
using memoire::NarrowFloat64;
using memoire::Prefetcher;
using memoire::PrefetcherBatches;
using memoire::Status;

namespace {

// Part 0: a running counter (int64); part 1: int32 count = counter % 5 (host-side); part 2:
// 8 rows of 16 bytes, row r = counter + r; every 7th draw fails.
std::shared_ptr<Prefetcher> Source(int depth) {
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  Prefetcher::Options o;
  o.depth = depth;
  o.threads = 1;
  o.part_bytes = {8, 8, 8 * 16};
  std::unique_ptr<Prefetcher> p;
  Status s = Prefetcher::Make(
      o,
      [next](int, uint8_t* const* parts) {
        const int64_t v = next->fetch_add(1);
        std::memcpy(parts[0], &v, 8);
        const int32_t c[2] = {0, static_cast<int32_t>(v % 5)};
        std::memcpy(parts[1], c, 8);
        for (int r = 0; r < 8; ++r) std::memset(parts[2] + 16 * r, static_cast<int>(v + r), 16);
        if (v % 7 == 6) return Status(Code::kInvalidArgument, "draw " + std::to_string(v));
        return Status::OK();
      },
      &p);
  CHECK(s.ok());
  return std::shared_ptr<Prefetcher>(std::move(p));
}

std::shared_ptr<DeviceRing> Ring(std::shared_ptr<Prefetcher> host, int slots) {
  DeviceRing::Options o;
  o.slots = slots;
  o.to_device = {true, false, true};
  o.trim_part = 2;
  o.trim_count_part = 1;
  o.trim_count_index = 1;
  o.trim_unit = 16;
  o.held_wait_ms = 50;
  std::shared_ptr<DeviceRing> r;
  CHECK(DeviceRing::Make(o, PrefetcherBatches(std::move(host)), MakeHostCopyEngine(), &r).ok());
  return r;
}

}  // namespace

TEST(EveryBatchArrivesOnceInOrderWithMirrorTrimAndErrors) {
  auto ring = Ring(Source(3), 3);
  for (int64_t i = 0; i < 300; ++i) {
    int slot = -1;
    Status s = ring->Take(&slot);
    CHECK(slot >= 0);
    if (i % 7 == 6) {
      CHECK(s.code() == Code::kInvalidArgument);
      CHECK(s.message() == "draw " + std::to_string(i));
    } else {
      CHECK(s.ok());
      int64_t v;
      std::memcpy(&v, ring->device_part(slot, 0), 8);
      CHECK(v == i);
      int32_t c[2];
      std::memcpy(c, ring->host_part(slot, 1), 8);
      CHECK(c[1] == i % 5);
      CHECK(ring->copied_bytes(slot, 2) == static_cast<size_t>(16 * (i % 5)));
      for (int r = 0; r < i % 5; ++r) CHECK(ring->device_part(slot, 2)[16 * r + 15] == static_cast<uint8_t>(i + r));
      CHECK(reinterpret_cast<uintptr_t>(ring->device_part(slot, 2)) % 64 == 0);
    }
    ring->Release(slot, -1);
  }
  CHECK(ring->taken() == 300);
  CHECK(ring->held() == 0);
  ring->Close();
}

TEST(HoldingEverySlotFailsAndReleasingFeedsAgain) {
  auto ring = Ring(Source(2), 2);
  int a = -1, b = -1, c = -1;
  ring->Take(&a);
  ring->Take(&b);
  CHECK(a >= 0 && b >= 0 && a != b);
  Status s = ring->Take(&c);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(c == -1);
  CHECK(s.detail("held").value_or(0) == 2);
  ring->Release(a, -1);
  ring->Release(a, -1);  // a second release is ignored
  CHECK(ring->held() == 1);
  ring->Take(&c);
  CHECK(c == a);
  ring->Release(b, -1);
  ring->Release(c, -1);
}

TEST(CloseWithSlotsTakenIsCleanAndLateReleasesAreSafe) {
  int held = -1;
  std::shared_ptr<DeviceRing> ring = Ring(Source(4), 3);
  ring->Take(&held);
  ring->Close();
  ring->Close();  // idempotent
  int after = -1;
  CHECK(ring->Take(&after).code() == Code::kFailedPrecondition);
  CHECK(after == -1);
  int64_t v;
  std::memcpy(&v, ring->device_part(held, 0), 8);  // still valid
  CHECK(v == 0);
  ring->Release(held, -1);
  ring.reset();  // frees the slots
}

TEST(ClosingTheHostRingEndsTheDeviceRing) {
  auto host = Source(2);
  auto ring = Ring(host, 2);
  host->Close();
  // Batches copied before the close are handed out (at most the ring's 2), then Take reports
  // the close.
  int handed = 0;
  for (;;) {
    int slot = -1;
    Status s = ring->Take(&slot);
    if (slot < 0) {
      CHECK(s.code() == Code::kFailedPrecondition);
      CHECK(s.message().find("closed") != std::string::npos);
      break;
    }
    ring->Release(slot, -1);
    CHECK(++handed <= 2);
  }
}

TEST(TryTakeTakesOnlyWhatIsReady) {
  auto ring = Ring(Source(2), 2);
  int slot = -1;
  Status s;
  // The copy thread fills the first slot soon; TryTake never waits for it.
  while (!ring->TryTake(&slot, &s)) {
  }
  CHECK(slot >= 0 && s.ok());
  int64_t v;
  std::memcpy(&v, ring->device_part(slot, 0), 8);
  CHECK(v == 0);
  int other = -1;
  while (!ring->TryTake(&other, &s)) {
  }
  CHECK(other >= 0 && other != slot);
  int none = -1;
  CHECK(!ring->TryTake(&none, &s));  // both lent: nothing can be ready
  CHECK(none == -1);
  ring->Release(slot, -1);
  ring->Release(other, -1);
  ring->Close();
  CHECK(!ring->TryTake(&none, &s));  // closed
}

TEST(NarrowingRoundsFloat64AsNumpyAndKeepsTheIntegersLowWord) {
  const float inf = std::numeric_limits<float>::infinity();
  const float max = std::numeric_limits<float>::max();
  CHECK(NarrowFloat64(1.5) == 1.5f);
  CHECK(NarrowFloat64(-0.0) == 0.0f && std::signbit(NarrowFloat64(-0.0)));
  CHECK(NarrowFloat64(1e300) == inf && NarrowFloat64(-1e300) == -inf);
  CHECK(NarrowFloat64(3.4028235677973366e38) == inf);  // the tie above FLT_MAX: to even, inf
  CHECK(NarrowFloat64(3.4028235677973362e38) == max);  // just below the tie
  CHECK(NarrowFloat64(static_cast<double>(max)) == max);
  CHECK(std::isnan(NarrowFloat64(std::nan(""))));
  CHECK(NarrowFloat64(1.0 + std::ldexp(1.0, -24)) == 1.0f);  // a tie at 1: to even
  CHECK(NarrowFloat64(1.0 + std::ldexp(3.0, -24)) == 1.0f + std::ldexp(1.0f, -22));

  // A ring narrowing part 0 (the int64 counter) and a float64 part: the device holds 4 bytes
  // per value.
  auto next = std::make_shared<std::atomic<int64_t>>(0);
  Prefetcher::Options po;
  po.depth = 2;
  po.threads = 1;
  po.part_bytes = {8, 16};
  std::unique_ptr<Prefetcher> p;
  CHECK(Prefetcher::Make(
            po,
            [next](int, uint8_t* const* parts) {
              const int64_t v = next->fetch_add(1) + (int64_t{5} << 32);
              std::memcpy(parts[0], &v, 8);
              const double d[2] = {0.1 * static_cast<double>(v & 0xffff), -1e300};
              std::memcpy(parts[1], d, 16);
              return Status::OK();
            },
            &p)
            .ok());
  DeviceRing::Options o;
  o.slots = 2;
  o.narrow = {DeviceRing::kNarrowInt, DeviceRing::kNarrowFloat};
  std::shared_ptr<DeviceRing> ring;
  CHECK(DeviceRing::Make(o, PrefetcherBatches(std::shared_ptr<Prefetcher>(std::move(p))),
                         MakeHostCopyEngine(), &ring)
            .ok());
  for (int i = 0; i < 20; ++i) {
    int slot = -1;
    CHECK(ring->Take(&slot).ok());
    int32_t low;
    std::memcpy(&low, ring->device_part(slot, 0), 4);
    CHECK(low == i);  // the low word of (5 << 32) + i
    float f[2];
    std::memcpy(f, ring->device_part(slot, 1), 8);
    CHECK(f[0] == static_cast<float>(0.1 * i) && f[1] == -inf);
    CHECK(ring->copied_bytes(slot, 0) == 4 && ring->copied_bytes(slot, 1) == 8);
    ring->Release(slot, -1);
  }
  ring->Close();
}

TEST(BadOptionsAreRefused) {
  DeviceRing::Options o;
  o.slots = 0;
  std::shared_ptr<DeviceRing> r;
  CHECK(DeviceRing::Make(o, PrefetcherBatches(Source(2)), MakeHostCopyEngine(), &r).code() ==
        Code::kInvalidArgument);
  o.slots = 2;
  o.to_device = {true};
  CHECK(DeviceRing::Make(o, PrefetcherBatches(Source(2)), MakeHostCopyEngine(), &r).code() ==
        Code::kInvalidArgument);
  o.to_device = {true, true, true};
  o.trim_part = 2;
  o.trim_count_part = 1;  // on the device: its count cannot be read on the host
  CHECK(DeviceRing::Make(o, PrefetcherBatches(Source(2)), MakeHostCopyEngine(), &r).code() ==
        Code::kInvalidArgument);
  o.trim_part = -1;
  o.narrow = {DeviceRing::kNarrowFloat, DeviceRing::kNarrowNone};  // 2 flags for 3 parts
  CHECK(DeviceRing::Make(o, PrefetcherBatches(Source(2)), MakeHostCopyEngine(), &r).code() ==
        Code::kInvalidArgument);
  o.to_device = {true, false, true};
  o.narrow = {DeviceRing::kNarrowNone, DeviceRing::kNarrowInt, DeviceRing::kNarrowNone};
  CHECK(DeviceRing::Make(o, PrefetcherBatches(Source(2)), MakeHostCopyEngine(), &r).code() ==
        Code::kInvalidArgument);  // a host-side part is not narrowed
  CHECK(r == nullptr);
}

TEST(TheCudaLoaderNamesWhatItFound) {
  std::shared_ptr<CudaRuntime> rt;
  Status s = CudaRuntime::Load({"/nonexistent/libcudart.so.99"}, &rt);
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(s.message().find("/nonexistent/libcudart.so.99") != std::string::npos);
  CHECK(s.message().find('\n') == std::string::npos);
  s = CudaRuntime::Load({"libm.so.6"}, &rt);  // loads, but is no CUDA runtime
  CHECK(s.code() == Code::kFailedPrecondition);
  CHECK(s.message().find("lacks cudaMalloc") != std::string::npos);
  CHECK(rt == nullptr);
}

TEST_MAIN()
