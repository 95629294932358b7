// ReplayMemory under threads, and its reader-writer lock (core/rw_lock.h): several samplers
// copy batches at once while a writer adds, closes and evicts episodes; no sampled row is torn
// (every field of an entry encodes its id, so a row mixing two entries is caught), and the
// writer keeps making progress while the samplers sample without pause. Counts only, no time.
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/replay_memory.h"
#include "core/rw_lock.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

// s: int64[kStateElems] (one large row, so a batch is copied with the helper thread too), a and
// p float32 scalars, r, v, q float32[1], i int32. Entry `pos` stores pos in every element of
// s, a, r, p, v and i (q is computed at close; the test leaves it out).
constexpr int64_t kStateElems = 4096;  // 32 KiB rows: a batch of 16 (prev + next) is 1 MiB

std::unique_ptr<ReplayMemory> MakeMemory(int64_t max_step) {
  Schema schema;
  CHECK(Schema::Make({{"s", DType::kInt64, {kStateElems}},
                      {"a", DType::kFloat32, {}},
                      {"r", DType::kFloat32, {1}},
                      {"p", DType::kFloat32, {}},
                      {"v", DType::kFloat32, {1}},
                      {"q", DType::kFloat32, {1}},
                      {"i", DType::kInt32, {}}},
                     &schema).ok());
  std::unique_ptr<ReplayMemory> m;
  CHECK(ReplayMemory::Make(schema, max_step, &m).ok());
  m->Seed(7);
  return m;
}

// Adds one closed episode of `len` entries starting at absolute position `first`.
bool AddEpisode(ReplayMemory* m, int64_t first, int64_t len) {
  std::vector<int64_t> s(static_cast<size_t>(len * kStateElems));
  std::vector<float> f(len), one(len, 1.0f);
  std::vector<int32_t> i(len);
  for (int64_t k = 0; k < len; ++k) {
    const int64_t pos = first + k;
    std::fill_n(s.begin() + k * kStateElems, kStateElems, pos);
    f[k] = static_cast<float>(pos);
    i[k] = static_cast<int32_t>(pos);
  }
  const void* fields[ReplayMemory::kNumFields] = {s.data(), f.data(), f.data(), f.data(),
                                                  f.data(), nullptr,  i.data()};
  return m->NewEpisode().ok() && m->AddEntries(len, fields, one.data()).ok() &&
         m->CloseEpisode(1.0f, /*update_value=*/false, /*update_weight=*/false, true).ok();
}

TEST(SamplersAndAWriterNeverTearABatchAndTheWriterProgresses) {
  constexpr int64_t kMaxStep = 96;  // small: the writer keeps evicting rows being sampled
  constexpr int64_t kLen = 8, kBatch = 16, kEpisodes = 300, kSamplerCap = 200000;
  constexpr int kSamplers = 3;
  auto m = MakeMemory(kMaxStep);
  int64_t tail = 0;
  for (int e = 0; e < kMaxStep / kLen; ++e, tail += kLen) CHECK(AddEpisode(m.get(), tail, kLen));

  std::atomic<bool> writer_done{false};
  std::atomic<int64_t> torn{0}, batches{0}, failed{0}, episodes_while_sampling{0};
  std::atomic<int> samplers_running{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kSamplers; ++t) {
    threads.emplace_back([&] {
      ++samplers_running;
      std::vector<int64_t> prev_s(kBatch * kStateElems), next_s(kBatch * kStateElems), id(kBatch);
      std::vector<float> prev_a(kBatch), prev_r(kBatch), prev_p(kBatch), prev_v(kBatch);
      std::vector<float> next_r(kBatch);
      std::vector<int32_t> prev_i(kBatch), next_i(kBatch);
      ReplayMemory::SampleOut out;
      out.prev[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(prev_s.data());
      out.next[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(next_s.data());
      out.prev[ReplayMemory::kAction] = reinterpret_cast<uint8_t*>(prev_a.data());
      out.prev[ReplayMemory::kReward] = reinterpret_cast<uint8_t*>(prev_r.data());
      out.prev[ReplayMemory::kProb] = reinterpret_cast<uint8_t*>(prev_p.data());
      out.prev[ReplayMemory::kValue] = reinterpret_cast<uint8_t*>(prev_v.data());
      out.prev[ReplayMemory::kInfo] = reinterpret_cast<uint8_t*>(prev_i.data());
      out.next[ReplayMemory::kReward] = reinterpret_cast<uint8_t*>(next_r.data());
      out.next[ReplayMemory::kInfo] = reinterpret_cast<uint8_t*>(next_i.data());
      out.id = id.data();
      // Samples without pause until the writer is done (bounded: a starved writer fails the
      // test by its count below, not by hanging it).
      for (int64_t k = 0; k < kSamplerCap && !writer_done.load(); ++k) {
        if (!m->Sample(kBatch, out).ok()) {
          ++failed;
          continue;
        }
        ++batches;
        for (int64_t b = 0; b < kBatch; ++b) {
          const int64_t p = id[b];
          bool ok = prev_a[b] == float(p) && prev_r[b] == float(p) && prev_p[b] == float(p) &&
                    prev_v[b] == float(p) && prev_i[b] == p && next_r[b] == float(p + 1) &&
                    next_i[b] == p + 1;
          for (int64_t e = 0; e < kStateElems && ok; ++e)
            ok = prev_s[b * kStateElems + e] == p && next_s[b * kStateElems + e] == p + 1;
          if (!ok) ++torn;
        }
      }
      --samplers_running;
    });
  }
  // The writer: episodes (each an add, a close and evictions) while the samplers run.
  while (samplers_running.load() < kSamplers) std::this_thread::yield();
  int64_t written = 0;
  for (int e = 0; e < kEpisodes; ++e, tail += kLen) {
    if (!AddEpisode(m.get(), tail, kLen)) break;
    ++written;
    if (samplers_running.load() == kSamplers) ++episodes_while_sampling;
  }
  writer_done = true;
  for (std::thread& t : threads) t.join();
  CHECK(written == kEpisodes);
  CHECK(torn.load() == 0);
  CHECK(failed.load() == 0);
  CHECK(batches.load() > 0);
  // Every sampler stops only once the writer is done (or at its cap, far beyond what 300
  // episodes need when the writer is not starved): all of the writer's episodes went in while
  // all samplers were sampling.
  CHECK(episodes_while_sampling.load() == kEpisodes);
  CHECK(m->total_added() == static_cast<uint64_t>(tail));
}

TEST(ConcurrentSamplesDrawInOneOrder) {
  // Two memories with the same seed and contents: one sampled by 4 threads at once (each
  // noting its draw's place through on_draw), one sampled in turn. The k-th draw's ids match.
  constexpr int64_t kBatch = 8, kDraws = 400;
  auto a = MakeMemory(256), b = MakeMemory(256);
  for (int64_t first = 0; first < 240; first += 12) {
    CHECK(AddEpisode(a.get(), first, 12));
    CHECK(AddEpisode(b.get(), first, 12));
  }
  std::vector<std::vector<int64_t>> by_order(kDraws);
  std::atomic<int64_t> next{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<int64_t> id(kBatch), s(kBatch * kStateElems);
      for (int64_t k = 0; k < kDraws / 4; ++k) {
        ReplayMemory::SampleOut out;
        out.id = id.data();
        out.prev[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(s.data());
        int64_t place = -1;
        out.on_draw = [&] { place = next.fetch_add(1); };
        if (!a->Sample(kBatch, out).ok() || place < 0) {
          ++failed;
          continue;
        }
        by_order[place] = id;  // each place is written by one thread only
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(failed.load() == 0);
  CHECK(next.load() == kDraws);
  std::vector<int64_t> id(kBatch);
  int64_t same = 0;
  for (int64_t k = 0; k < kDraws; ++k) {
    ReplayMemory::SampleOut out;
    out.id = id.data();
    CHECK(b->Sample(kBatch, out).ok());
    same += by_order[k] == id;
  }
  CHECK(same == kDraws);
}

TEST(RwLockAWaitingWriterBarsNewReaders) {
  RwLock lock;
  lock.lock_shared();  // a reader holds it
  std::atomic<bool> writer_in{false};
  std::thread writer([&] {
    lock.lock();
    writer_in = true;
    lock.unlock();
  });
  // Once the writer waits, a new reader is refused (before that, readers may still join).
  bool refused = false;
  for (int64_t k = 0; k < 10000000 && !refused; ++k) {
    if (lock.try_lock_shared()) {
      lock.unlock_shared();
      std::this_thread::yield();
    } else {
      refused = true;
    }
  }
  CHECK(refused);
  CHECK(!writer_in.load());  // the first reader still holds it
  lock.unlock_shared();
  writer.join();
  CHECK(writer_in.load());
  // Free again: readers share it, a writer is refused while they hold it.
  CHECK(lock.try_lock_shared());
  CHECK(lock.try_lock_shared());
  CHECK(!lock.try_lock());
  lock.unlock_shared();
  lock.unlock_shared();
  CHECK(lock.try_lock());
  CHECK(!lock.try_lock_shared());
  lock.unlock();
}

}  // namespace

TEST_MAIN()
