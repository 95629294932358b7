// StreamBatch: SampleDistinct + encode + unstack gives Sample's batch byte for byte, and a
// corrupted message is refused before any row is read through it. The shared-memory path's
// pieces: a slot's layout holds Sample's parts without overlap, and the sampler publishes its
// batches in draw order through the ring, within the slots, refusing a dishonest credit.
#include "core/stream_batch.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "core/replay_memory.h"
#include "core/stream_ring.h"
#include "core/stream_rows_sampler.h"
#include "core/stream_sampler.h"
#include "tests/small_memory.h"
#include "tests/testing.h"

using namespace memoire;
using memoire_test::MakeSmallMemory;

namespace {

constexpr int F = ReplayMemory::kNumFields;

void Fill(ReplayMemory& m) {
  int64_t first = 0;
  for (int64_t len : {9, 4, 15, 2, 11}) {
    std::vector<int64_t> s(len);
    std::vector<float> a(len), r(len), w(len);
    std::vector<int32_t> info(len);
    for (int64_t k = 0; k < len; ++k) {
      s[k] = first + k;
      a[k] = static_cast<float>(k % 3);
      r[k] = static_cast<float>(k) * 0.5f;
      w[k] = 0.1f + static_cast<float>((first + k) % 7);
      info[k] = static_cast<int32_t>(len);
    }
    const void* fields[F] = {s.data(), a.data(), r.data(), a.data(), r.data(), nullptr,
                             info.data()};
    CHECK(m.NewEpisode().ok());
    CHECK(m.AddEntries(len, fields, w.data()).ok());
    CHECK(m.CloseEpisode(1.0f, false, false, len % 2 == 1).ok());
    first += len;
  }
}

// The learner's parts: prev[7], next[7], weight, prob, done, id, num_sampleable, total_weight.
struct Parts {
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<uint8_t*> ptrs;
  Parts(const Schema& schema, int64_t n, int fs) {
    for (int side = 0; side < 2; ++side)
      for (int f = 0; f < F; ++f) bufs.emplace_back(n * fs * schema.field(f).bytes());
    for (size_t b : {sizeof(float), sizeof(double), size_t(1), sizeof(int64_t)})
      bufs.emplace_back(n * b);
    bufs.emplace_back(8);
    bufs.emplace_back(8);
    for (auto& b : bufs) ptrs.push_back(b.data());
  }
};

// A batch, numbered, with its message's frames (views of it: kept together).
struct Encoded {
  StreamBatch batch;
  std::string header;
  std::vector<codec::Frame> frames;
};

std::unique_ptr<Encoded> Encode(const StreamBatch& b, const Schema& schema, int64_t seq) {
  auto e = std::make_unique<Encoded>();
  e->batch = b;
  e->batch.seq = seq;
  std::vector<codec::Frame> data;
  CHECK(EncodeStreamBatch(e->batch, schema, &e->header, &data).ok());
  e->frames.push_back({reinterpret_cast<const uint8_t*>(e->header.data()), e->header.size()});
  e->frames.insert(e->frames.end(), data.begin(), data.end());
  return e;
}

void SameAsSample(int fs, int ms) {
  auto a = MakeSmallMemory(64, 5), b = MakeSmallMemory(64, 5);
  for (ReplayMemory* m : {a.get(), b.get()}) {
    ReplayMemory::Options o = m->options();
    o.frame_stack = fs;
    o.multi_step = ms;
    o.priority_exponent = 0.5;
    CHECK(m->SetOptions(o).ok());
    Fill(*m);
  }
  const int64_t n = 6;
  StreamLayout layout;
  layout.schema = a->schema();
  layout.batch_size = n;
  layout.frame_stack = fs;
  layout.multi_step = ms;
  layout.flags.fill(1);
  const auto send = StreamSends(layout);
  codec::Limits limits;
  for (int64_t seq = 0; seq < 20; ++seq) {
    Parts want(a->schema(), n, fs), got(a->schema(), n, fs);
    ReplayMemory::SampleOut out;
    for (int f = 0; f < F; ++f) {
      out.prev[f] = want.ptrs[f];
      out.next[f] = want.ptrs[F + f];
    }
    out.weight = reinterpret_cast<float*>(want.ptrs[2 * F]);
    out.prob = reinterpret_cast<double*>(want.ptrs[2 * F + 1]);
    out.done = want.ptrs[2 * F + 2];
    out.id = reinterpret_cast<int64_t*>(want.ptrs[2 * F + 3]);
    CHECK(a->Sample(n, out).ok());
    StreamBatch sb;
    sb.send = send;
    CHECK(b->SampleDistinct(n, &sb).ok());
    CHECK(sb.window == fs + (ms < fs ? ms : fs));
    CHECK(sb.distinct >= 1 && sb.distinct <= n * sb.window);
    auto e = Encode(sb, b->schema(), seq);
    int64_t got_seq = -1;
    Status s = UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits,
                                  got.ptrs.data(), &got_seq);
    CHECK(s.ok());
    CHECK(got_seq == seq);
    for (size_t p = 0; p < 2 * F + 4; ++p) CHECK(want.bufs[p] == got.bufs[p]);
  }
}

TEST(DistinctRowsStackIntoSampleBatches) {
  SameAsSample(3, 1);
  SameAsSample(2, 4);
  SameAsSample(1, 1);
  SameAsSample(4, 2);
}

// A memory that compresses its states: s uint8[48] (a run of one value per entry, so each
// block is a real LZ4 sequence, not a raw row), the other fields as the small memory's.
std::unique_ptr<ReplayMemory> MakeCompressedMemory(uint64_t seed) {
  Schema schema;
  CHECK(Schema::Make({{"s", DType::kUInt8, {48}},
                      {"a", DType::kFloat32, {}},
                      {"r", DType::kFloat32, {1}},
                      {"p", DType::kFloat32, {}},
                      {"v", DType::kFloat32, {1}},
                      {"q", DType::kFloat32, {1}},
                      {"i", DType::kInt32, {}}},
                     &schema).ok());
  std::unique_ptr<ReplayMemory> m;
  CHECK(ReplayMemory::Make(schema, 64, &m, /*vector_prob=*/false, /*compress_states=*/true).ok());
  m->Seed(seed);
  ReplayMemory::Options o = m->options();
  o.frame_stack = 3;
  CHECK(m->SetOptions(o).ok());
  for (int64_t len : {9, 4, 15}) {
    std::vector<uint8_t> s(len * 48);
    std::vector<float> a(len), w(len, 1.0f);
    std::vector<int32_t> info(len);
    for (int64_t k = 0; k < len; ++k) {
      std::memset(&s[k * 48], static_cast<int>(7 * k + len), 40);  // a run, then 8 zeros
      a[k] = static_cast<float>(k);
      info[k] = static_cast<int32_t>(k);
    }
    const void* fields[F] = {s.data(), a.data(), a.data(), a.data(), a.data(), nullptr,
                             info.data()};
    CHECK(m->NewEpisode().ok());
    CHECK(m->AddEntries(len, fields, w.data()).ok());
    CHECK(m->CloseEpisode(1.0f, false, false, true).ok());
  }
  return m;
}

// The stored LZ4 blocks travel as they are and unstack into Sample's batch, also without a
// caller's scratch (the decoded rows then live in the call: under AddressSanitizer, reading
// them after their scope was a heap use-after-free).
TEST(CompressedRowsUnstackWithoutAScratch) {
  auto a = MakeCompressedMemory(9), b = MakeCompressedMemory(9);
  const int64_t n = 5;
  StreamLayout layout;
  layout.schema = a->schema();
  layout.batch_size = n;
  layout.frame_stack = 3;
  layout.flags.fill(1);
  layout.compressed_state = true;
  codec::Limits limits;
  for (int64_t seq = 0; seq < 8; ++seq) {
    Parts want(a->schema(), n, 3), got(a->schema(), n, 3);
    ReplayMemory::SampleOut out;
    for (int f = 0; f < F; ++f) {
      out.prev[f] = want.ptrs[f];
      out.next[f] = want.ptrs[F + f];
    }
    out.weight = reinterpret_cast<float*>(want.ptrs[2 * F]);
    out.prob = reinterpret_cast<double*>(want.ptrs[2 * F + 1]);
    out.done = want.ptrs[2 * F + 2];
    out.id = reinterpret_cast<int64_t*>(want.ptrs[2 * F + 3]);
    CHECK(a->Sample(n, out).ok());
    StreamBatch sb;
    sb.send = StreamSends(layout);
    sb.compressed_state = true;
    CHECK(b->SampleDistinct(n, &sb).ok());
    size_t blocks = 0;
    for (uint32_t size : sb.state_sizes) blocks += size;
    CHECK(blocks < static_cast<size_t>(sb.distinct) * 48);  // compressed, not raw rows
    auto e = Encode(sb, b->schema(), seq);
    int64_t got_seq = -1;
    CHECK(UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits,
                             got.ptrs.data(), &got_seq, /*scratch=*/nullptr).ok());
    CHECK(got_seq == seq);
    for (size_t p = 0; p < 2 * F + 4; ++p) CHECK(want.bufs[p] == got.bufs[p]);
  }
}

TEST(CorruptedMessagesAreRefused) {
  auto m = MakeSmallMemory(64, 1);
  ReplayMemory::Options o = m->options();
  o.frame_stack = 2;
  CHECK(m->SetOptions(o).ok());
  Fill(*m);
  StreamLayout layout;
  layout.schema = m->schema();
  layout.batch_size = 4;
  layout.frame_stack = 2;
  layout.flags.fill(1);
  StreamBatch sb;
  sb.send = StreamSends(layout);
  CHECK(m->SampleDistinct(4, &sb).ok());
  Parts got(m->schema(), 4, 2);
  codec::Limits limits;
  int64_t seq;
  // An index past the rows.
  StreamBatch bad = sb;
  bad.index[5] = static_cast<int32_t>(bad.distinct);
  auto e = Encode(bad, m->schema(), 0);
  CHECK(UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits, got.ptrs.data(),
                           &seq).code() == Code::kDataLoss);
  // A data frame shorter than its header says.
  e = Encode(sb, m->schema(), 0);
  e->frames.back().size -= 1;
  CHECK(UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits, got.ptrs.data(),
                           &seq).code() == Code::kDataLoss);
  // Another batch size than the stream's.
  layout.batch_size = 5;
  e = Encode(sb, m->schema(), 0);
  CHECK(UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits, got.ptrs.data(),
                           &seq).code() == Code::kDataLoss);
  // A window agreed at open that the memory's settings no longer give.
  StreamBatch stale;
  stale.send = sb.send;
  stale.window = 7;
  CHECK(m->SampleDistinct(4, &stale).code() == Code::kFailedPrecondition);
}

TEST(StreamSlotLayoutHoldsSampleParts) {
  auto m = MakeSmallMemory(64, 1);
  StreamLayout layout;
  layout.schema = m->schema();
  layout.batch_size = 5;
  layout.frame_stack = 3;
  layout.flags.fill(1);
  layout.flags[2] = 0;  // no prev reward stack
  const BatchLayout st = StreamSlotLayout(layout);
  Parts want(m->schema(), 5, 3);
  CHECK(st.parts.size() == want.bufs.size());
  size_t end = 0;
  for (size_t p = 0; p < st.parts.size(); ++p) {
    CHECK(st.parts[p].offset % BatchLayout::kPartAlign == 0);
    CHECK(st.parts[p].offset >= end);  // in order, no overlap
    CHECK(st.parts[p].bytes == (p == 2 ? 0 : want.bufs[p].size()));
    CHECK(st.parts[p].none == (p == 2));
    end = st.parts[p].offset + st.parts[p].bytes;
  }
  CHECK(end <= st.slot_bytes);
  CHECK(st.slot_bytes % BatchLayout::kSlotAlign == 0);
  CHECK(st.batch_size() == 5);
  // The same layout without the stream's totals: the feed's ring of a local memory.
  const BatchLayout local =
      MemoryBatchLayout(m->schema(), 5, 3, layout.flags.data(), /*totals=*/false);
  CHECK(local.parts.size() == st.parts.size() - 2);
  for (size_t p = 0; p < local.parts.size(); ++p) CHECK(local.parts[p].bytes == st.parts[p].bytes);
}

// A slot's bytes as laid out by `l`, for comparisons.
struct SlotBuffer {
  explicit SlotBuffer(size_t bytes)
      : p(static_cast<uint8_t*>(std::aligned_alloc(BatchLayout::kSlotAlign, bytes))) {
    std::memset(p, 0, bytes);
  }
  ~SlotBuffer() { std::free(p); }
  uint8_t* p;
};

bool SameParts(const BatchLayout& l, const uint8_t* a, const uint8_t* b) {
  for (const BatchPart& part : l.parts)
    if (!part.none && std::memcmp(a + part.offset, b + part.offset, part.bytes) != 0) return false;
  return true;
}

// The stream's shared block as a test maps it: the ring, then the slots.
struct SharedBlock {
  SharedBlock(const BatchLayout& l, int64_t slots)
      : ring_bytes(StreamRing::Bytes(slots)), buf(ring_bytes + l.slot_bytes * slots) {
    StreamRing::Init(buf.p, slots);
    CHECK(StreamRing::Attach(buf.p, slots, &learner).ok());
  }
  uint8_t* slot(const BatchLayout& l, int64_t s) { return buf.p + ring_bytes + s * l.slot_bytes; }
  size_t ring_bytes;
  SlotBuffer buf;
  StreamRing learner;  // the learner's end
};

// Notices until `want` came (or 2 s passed), then 5 ms more: whatever was published.
std::vector<StreamRing::Notice> Notices(StreamRing* learner, size_t want) {
  std::vector<StreamRing::Notice> got;
  StreamRing::Notice n;
  for (int wait = 0; wait < 2000 && got.size() < want; ++wait) {
    while (learner->PollNotice(&n)) got.push_back(n);
    if (got.size() < want) learner->WaitNotices(1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  while (learner->PollNotice(&n)) got.push_back(n);
  return got;
}

StreamLayout SmallLayout(const ReplayMemory& m, int64_t batch_size) {
  StreamLayout layout;
  layout.schema = m.schema();
  layout.batch_size = batch_size;
  layout.frame_stack = m.options().frame_stack;
  layout.multi_step = m.options().multi_step;
  layout.flags.fill(1);
  return layout;
}

// A sampler's options over `block` for batches of `layout` from `m`, `slots` slots.
StreamSampler::Options SamplerOptions(std::unique_ptr<ReplayMemory> m, const StreamLayout& layout,
                                      SharedBlock* block, int64_t slots, int threads) {
  StreamSampler::Options o;
  o.memory = std::shared_ptr<ReplayMemory>(std::move(m));
  o.layout = StreamSlotLayout(layout);
  o.frame_stack = layout.frame_stack;
  o.control = block->buf.p;
  o.base = block->slot(o.layout, 0);
  o.slots = slots;
  o.threads = threads;
  o.counts = std::make_shared<StreamCounts>();
  return o;
}

TEST(StreamSamplerDrawsInOrderWithinItsSlotsWithAnyThreads) {
  for (int threads : {1, 4}) {
    auto m = MakeSmallMemory(64, 3);
    auto ref = MakeSmallMemory(64, 3);  // same seed, same contents: get_batch's draws
    Fill(*m);
    Fill(*ref);
    const StreamLayout layout = SmallLayout(*m, 4);
    const BatchLayout l = StreamSlotLayout(layout);
    const int64_t kSlots = 3;
    SharedBlock block(l, kSlots);
    SlotBuffer want(l.slot_bytes);
    std::vector<uint8_t*> want_parts(l.parts.size());
    l.PartsAt(want.p, want_parts.data());
    const StreamSampler::Options o = SamplerOptions(std::move(m), layout, &block, kSlots, threads);
    std::unique_ptr<StreamSampler> s;
    CHECK(StreamSampler::Make(o, &s).ok());
    int64_t next_seq = 0;
    for (int round = 0; round < 10; ++round) {
      // The slots bound the draws: exactly kSlots notices, then nothing until one is back.
      const std::vector<StreamRing::Notice> got = Notices(&block.learner, kSlots);
      CHECK(static_cast<int64_t>(got.size()) == kSlots);
      CHECK(s->held() == kSlots);
      for (const StreamRing::Notice& n : got) {
        CHECK(n.error_bytes == 0);
        CHECK(n.seq == next_seq++);  // in draw order, numbered without gaps
        ReplayMemory::SampleOut so;
        l.Point(want_parts.data(), &so);
        CHECK(ref->Sample(4, so).ok());
        CHECK(SameParts(l, block.slot(l, n.slot), want.p));
      }
      for (const StreamRing::Notice& n : got) block.learner.PublishCredit(n.slot);
    }
    s->Stop();
    CHECK(o.counts->batches.load() >= 30 && o.counts->batches.load() <= 30 + kSlots);
    CHECK(o.counts->draw_errors.load() == 0);
    CHECK(s->refusal().empty());
  }
}

// Waits (at most 2 s) until `counts` shows `want` batches drawn, then 20 ms more: the count.
int64_t DrawnSettles(const StreamCounts& counts, int64_t want) {
  for (int wait = 0; wait < 2000 && counts.batches.load() < want; ++wait)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return counts.batches.load();
}

TEST(StreamSamplerKeepsOnlyAheadBatchesUntakenWithinItsSlots) {
  for (int threads : {1, 4}) {
    auto m = MakeSmallMemory(64, 3);
    Fill(*m);
    const StreamLayout layout = SmallLayout(*m, 2);
    const BatchLayout l = StreamSlotLayout(layout);
    SharedBlock block(l, 6);
    StreamSampler::Options o = SamplerOptions(std::move(m), layout, &block, 6, threads);
    o.ahead = 2;
    std::unique_ptr<StreamSampler> s;
    CHECK(StreamSampler::Make(o, &s).ok());
    CHECK(DrawnSettles(*o.counts, 2) == 2);  // 6 free slots, but 2 ahead of the learner
    StreamRing::Notice n;
    std::vector<int64_t> held;
    CHECK(block.learner.PollNotice(&n) && n.seq == 0);  // taken (and held): one more drawn
    held.push_back(n.slot);
    CHECK(DrawnSettles(*o.counts, 3) == 3);
    for (int k = 1; k < 4; ++k) {
      CHECK(DrawnSettles(*o.counts, k + 2) == k + 2);  // always 2 ahead of what was taken
      CHECK(block.learner.PollNotice(&n) && n.seq == k);
      held.push_back(n.slot);
    }
    // 4 taken and held, 2 untaken: every slot is out; the slots bound the draws, not ahead.
    CHECK(DrawnSettles(*o.counts, 6) == 6);
    CHECK(s->held() == 6);
    // A slot back, but 2 still untaken: no draw until the learner takes one.
    block.learner.PublishCredit(held[0]);
    CHECK(DrawnSettles(*o.counts, 7) == 6);
    CHECK(block.learner.PollNotice(&n) && n.seq == 4);
    CHECK(DrawnSettles(*o.counts, 7) == 7);
    CHECK(o.counts->draw_errors.load() == 0);
    s->Stop();
  }
}

TEST(StreamSamplerFailedDrawSpendsTheSlotAndSaysWhyInIt) {
  auto m = MakeSmallMemory(64, 3);  // empty: nothing sampleable
  const StreamLayout layout = SmallLayout(*m, 2);
  const BatchLayout l = StreamSlotLayout(layout);
  SharedBlock block(l, 2);
  StreamSampler::Options o = SamplerOptions(std::move(m), layout, &block, 2, 2);
  o.error_pause_ms = 1000;  // one error per slot, then a pause
  std::unique_ptr<StreamSampler> s;
  CHECK(StreamSampler::Make(o, &s).ok());
  const std::vector<StreamRing::Notice> got = Notices(&block.learner, 1);
  CHECK(!got.empty());
  // Either thread's failed draw may be queued first (a failed draw takes its place when it
  // fails), so the error may come in either slot: the reason is in the slot it names.
  CHECK(got[0].seq == -1 && (got[0].slot == 0 || got[0].slot == 1));
  CHECK(got[0].error_bytes > 0);
  const std::string why(reinterpret_cast<const char*>(block.slot(l, got[0].slot)),
                        got[0].error_bytes);
  CHECK(why.find("no sampleable") != std::string::npos);
  CHECK(s->held() >= 1);
  s->Stop();
}

TEST(StreamSamplerRefusesADishonestCreditAndDrawsNoMore) {
  // A slot the learner does not hold, a slot outside the stream, a head that jumps past the
  // capacity: each stops the stream's draws for good, says why and calls `wake`.
  for (int bad = 0; bad < 3; ++bad) {
    auto m = MakeSmallMemory(64, 3);
    Fill(*m);
    const StreamLayout layout = SmallLayout(*m, 2);
    const BatchLayout l = StreamSlotLayout(layout);
    SharedBlock block(l, 2);
    StreamSampler::Options o = SamplerOptions(std::move(m), layout, &block, 2, 2);
    std::atomic<int> woken{0};
    o.wake = [&woken] { woken.fetch_add(1); };
    std::unique_ptr<StreamSampler> s;
    CHECK(StreamSampler::Make(o, &s).ok());
    std::vector<StreamRing::Notice> got = Notices(&block.learner, 2);
    CHECK(got.size() == 2);
    block.learner.PublishCredit(got[0].slot);  // honest: drawn again
    got = Notices(&block.learner, 1);
    CHECK(got.size() == 1 && got[0].seq == 2);
    // Written as a raw peer would, all at once: slot held twice, outside, a jump.
    const StreamRing::Offsets off = StreamRing::OffsetsOf(2);
    uint32_t* head = reinterpret_cast<uint32_t*>(block.buf.p + off.credit_head);
    int64_t* credits = reinterpret_cast<int64_t*>(block.buf.p + off.credits);
    const uint32_t h = __atomic_load_n(head, __ATOMIC_ACQUIRE);
    if (bad == 0) credits[h % 2] = credits[(h + 1) % 2] = got[0].slot;
    if (bad == 1) credits[h % 2] = 7;
    __atomic_store_n(head, h + (bad == 0 ? 2 : bad == 1 ? 1 : 3), __ATOMIC_RELEASE);
    for (int wait = 0; wait < 2000 && s->refusal().empty(); ++wait)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(!s->refusal().empty());
    CHECK(woken.load() == 1);
    const int64_t drawn = o.counts->batches.load();
    CHECK(drawn == 3);  // the honest draws only
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(o.counts->batches.load() == drawn);
    s->Stop();
  }
}

}  // namespace

// Waits (at most 2 s) until the sampler has `want` outcomes ready, appending them to *got.
void TakeReady(StreamRowsSampler* s, size_t want, std::vector<StreamRowsSampler::Outcome>* got) {
  for (int wait = 0; wait < 2000 && got->size() < want; ++wait) {
    s->TakeReady(got);
    if (got->size() < want) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(StreamRowsSamplerDrawsInOrderWithinItsCreditWithAnyThreads) {
  // Batch seq k is the k-th draw (get_batch's k-th batch for the same seed and contents) with
  // 1 or 4 threads; the threads draw only against credit, and `ready` is called.
  for (int threads : {1, 4}) {
    auto m = MakeSmallMemory(64, 3);
    auto ref = MakeSmallMemory(64, 3);
    Fill(*m);
    Fill(*ref);
    const int64_t n = 4;
    StreamLayout layout = SmallLayout(*m, n);
    std::atomic<int> readies{0};
    StreamRowsSampler::Options o;
    o.memory = std::shared_ptr<ReplayMemory>(std::move(m));
    o.batch_size = n;
    o.send = StreamSends(layout);
    o.credit = 3;
    o.threads = threads;
    o.counts = std::make_shared<StreamCounts>();
    o.ready = [&] { readies.fetch_add(1); };
    std::unique_ptr<StreamRowsSampler> s;
    CHECK(StreamRowsSampler::Make(o, &s).ok());
    int64_t next_seq = 0;
    codec::Limits limits;
    for (int round = 0; round < 10; ++round) {
      std::vector<StreamRowsSampler::Outcome> got;
      TakeReady(s.get(), 3, &got);
      CHECK(got.size() == 3);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      s->TakeReady(&got);
      CHECK(got.size() == 3);  // the credit bounds the draws
      CHECK(s->outstanding() == 0);
      for (const StreamRowsSampler::Outcome& out : got) {
        CHECK(out.batch != nullptr && out.error.empty());
        CHECK(out.batch->seq == next_seq++);  // in draw order, numbered without gaps
        Parts want(layout.schema, n, layout.frame_stack), have(layout.schema, n, layout.frame_stack);
        ReplayMemory::SampleOut so;
        for (int f = 0; f < F; ++f) {
          so.prev[f] = want.ptrs[f];
          so.next[f] = want.ptrs[F + f];
        }
        so.id = reinterpret_cast<int64_t*>(want.ptrs[2 * F + 3]);
        CHECK(ref->Sample(n, so).ok());
        auto e = Encode(*out.batch, layout.schema, out.batch->seq);
        int64_t seq = -1;
        CHECK(UnstackStreamBatch(e->frames.data(), e->frames.size(), layout, limits,
                                 have.ptrs.data(), &seq).ok());
        for (int p = 0; p < 2 * F; ++p) CHECK(want.bufs[p] == have.bufs[p]);
        CHECK(want.bufs[2 * F + 3] == have.bufs[2 * F + 3]);  // the ids
      }
      s->Grant(3);
    }
    s->Stop();
    CHECK(readies.load() >= 1);
    CHECK(o.counts->batches.load() >= 30 && o.counts->batches.load() <= 33);
    CHECK(o.counts->draw_errors.load() == 0);
  }
}

TEST(StreamRowsSamplerFailedDrawSpendsTheCreditAndSaysWhy) {
  auto m = MakeSmallMemory(64, 3);  // empty: nothing sampleable
  StreamRowsSampler::Options o;
  o.memory = std::shared_ptr<ReplayMemory>(std::move(m));
  o.batch_size = 2;
  o.send.fill(1);
  o.credit = 2;
  o.threads = 2;
  o.error_pause_ms = 1000;  // each thread's first draw fails, then the stream pauses
  o.counts = std::make_shared<StreamCounts>();
  std::unique_ptr<StreamRowsSampler> s;
  CHECK(StreamRowsSampler::Make(o, &s).ok());
  std::vector<StreamRowsSampler::Outcome> got;
  TakeReady(s.get(), 1, &got);
  CHECK(!got.empty() && got[0].batch == nullptr);
  CHECK(got[0].error.find("no sampleable") != std::string::npos);
  CHECK(s->outstanding() + static_cast<int64_t>(got.size()) <= 2);  // spent, not refunded
  s->Stop();
  CHECK(o.counts->draw_errors.load() >= 1);
}

TEST_MAIN()
