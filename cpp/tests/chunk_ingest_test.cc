// ChunkIngest: stream rules and their counters, stored contents equal to a memory fed the same
// episodes directly, malformed messages rejected with the memory unchanged, and every owner
// released exactly once.
#include "core/chunk_ingest.h"

#include <cmath>
#include <limits>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/small_memory.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

std::shared_ptr<ReplayMemory> MakeMemory(int64_t max_step) {
  return memoire_test::MakeSmallMemory(max_step, 3);
}

// The rows of `n` entries starting at value `start`: every field derived from the position.
struct Rows {
  std::vector<int64_t> s;
  std::vector<float> a, r, p, v, w;
  std::vector<int32_t> i;
  Rows(int64_t start, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
      s.push_back(start + k);
      a.push_back(float(k % 3));
      r.push_back(float((start + k) % 5) - 2.0f);
      p.push_back(0.5f);
      v.push_back(0.25f * float(k % 4));
      i.push_back(int32_t(start + k) * 7);
      w.push_back(1.0f + float(k % 2));
    }
  }
  int64_t n() const { return static_cast<int64_t>(s.size()); }
  const void* const* fields() {
    ptrs_[0] = s.data(); ptrs_[1] = a.data(); ptrs_[2] = r.data(); ptrs_[3] = p.data();
    ptrs_[4] = v.data(); ptrs_[5] = nullptr; ptrs_[6] = i.data();
    return ptrs_;
  }
  const void* ptrs_[7] = {};
};

// A chunk message as owned byte strings: frames[0] the header.
struct Msg {
  std::vector<std::string> frames;
  std::vector<ChunkIngest::Frame> view() const {
    std::vector<ChunkIngest::Frame> out;
    for (const std::string& f : frames)
      out.push_back({reinterpret_cast<const uint8_t*>(f.data()), f.size()});
    return out;
  }
};

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
template <typename T>
std::string Scalar(T x) { return std::string(reinterpret_cast<const char*>(&x), sizeof(T)); }

Msg Chunk(uint64_t uuid, int64_t episode, int64_t index, const Rows& rows, uint8_t flags,
          float multiplier = 1.0f, DType s_dtype = DType::kInt64) {
  codec::Message m;
  m.type = codec::MsgType::kChunk;
  m.flags = flags;
  const int64_t n = rows.n();
  auto add = [&](const char* name, DType dt, std::vector<int64_t> shape) {
    codec::Entry e;
    e.name = name;
    e.dtype = dt;
    e.shape = std::move(shape);
    m.entries.push_back(e);
  };
  add("s", s_dtype, {n});
  add("a", DType::kFloat32, {n});
  add("r", DType::kFloat32, {n, 1});
  add("p", DType::kFloat32, {n});
  add("v", DType::kFloat32, {n, 1});
  add("i", DType::kInt32, {n});
  add("init_w", DType::kFloat32, {n});
  add("uuid", DType::kUInt64, {});
  add("episode", DType::kInt64, {});
  add("index", DType::kInt64, {});
  add("multiplier", DType::kFloat32, {});
  CHECK(codec::Finalize(&m).ok());
  Msg out;
  out.frames.emplace_back();
  CHECK(codec::EncodeHeader(m, &out.frames[0]).ok());
  std::string s = Bytes(rows.s);
  if (s_dtype != DType::kInt64) s.resize(n * ItemSize(s_dtype));
  out.frames.push_back(s);
  for (const auto* f : {&rows.a, &rows.r, &rows.p, &rows.v}) out.frames.push_back(Bytes(*f));
  out.frames.push_back(Bytes(rows.i));
  out.frames.push_back(Bytes(rows.w));
  out.frames.push_back(Scalar(uuid));
  out.frames.push_back(Scalar(episode));
  out.frames.push_back(Scalar(index));
  out.frames.push_back(Scalar(multiplier));
  return out;
}

constexpr uint8_t kClose = ChunkIngest::kLast | ChunkIngest::kTerminal |
                           ChunkIngest::kUpdateValue | ChunkIngest::kUpdateWeight;

// Feeds messages, keeping each one alive until the ingest releases it.
struct Feeder {
  ChunkIngest* ingest;
  std::map<uint64_t, Msg> alive;
  std::map<uint64_t, int> released;  // owner -> times released
  uint64_t next = 1;
  double now = 0;
  ChunkIngest::Result Feed(const Msg& m) {
    const uint64_t owner = next++;
    alive[owner] = m;
    const auto fr = alive[owner].view();
    ChunkIngest::Result r;
    ingest->Ingest(owner, fr.data(), fr.size(), now, &r);
    for (uint64_t o : r.released) {
      ++released[o];
      alive.erase(o);
    }
    return r;
  }
};

// Samples n entries of each memory with the same seed; true when every output is equal.
bool SameContents(ReplayMemory& a, ReplayMemory& b, int64_t n) {
  if (a.size() != b.size() || a.num_episode() != b.num_episode() ||
      a.num_sampleable() != b.num_sampleable() || a.total_weight() != b.total_weight())
    return false;
  a.Seed(11);
  b.Seed(11);
  std::vector<int64_t> sa(n), sb(n), ia(n), ib(n);
  std::vector<float> wa(n), wb(n), qa(n), qb(n);
  ReplayMemory::SampleOut oa, ob;
  oa.prev[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(sa.data());
  ob.prev[ReplayMemory::kState] = reinterpret_cast<uint8_t*>(sb.data());
  oa.prev[ReplayMemory::kQvest] = reinterpret_cast<uint8_t*>(qa.data());
  ob.prev[ReplayMemory::kQvest] = reinterpret_cast<uint8_t*>(qb.data());
  oa.weight = wa.data(); ob.weight = wb.data(); oa.id = ia.data(); ob.id = ib.data();
  if (!a.Sample(n, oa).ok() || !b.Sample(n, ob).ok()) return false;
  return sa == sb && ia == ib && wa == wb && qa == qb;
}

}  // namespace

TEST(InterleavedActorsStoreWhatADirectMemoryStores) {
  auto mem = MakeMemory(100);
  auto direct = MakeMemory(100);
  std::unique_ptr<ChunkIngest> ingest;
  CHECK(ChunkIngest::Make(mem, {}, &ingest).ok());
  Feeder f{ingest.get()};
  Rows a0(0, 4), a1(4, 3), b0(100, 5), b1(105, 0);
  CHECK(f.Feed(Chunk(1, 1, 0, a0, 0)).outcome == ChunkIngest::Outcome::kStaged);
  CHECK(f.Feed(Chunk(2, 7, 0, b0, 0)).outcome == ChunkIngest::Outcome::kStaged);
  CHECK(mem->size() == 0);  // nothing stored before an episode's last chunk
  auto r = f.Feed(Chunk(2, 7, 1, b1, kClose, 0.5f));  // an empty closing chunk
  CHECK(r.outcome == ChunkIngest::Outcome::kCommitted && r.rows == 5);
  r = f.Feed(Chunk(1, 1, 1, a1, ChunkIngest::kLast | ChunkIngest::kUpdateValue));  // truncated
  CHECK(r.outcome == ChunkIngest::Outcome::kCommitted && r.rows == 7);

  CHECK(direct->NewEpisode().ok());
  CHECK(direct->AddEntries(5, b0.fields(), b0.w.data()).ok());
  CHECK(direct->CloseEpisode(0.5f, true, true, true).ok());
  CHECK(direct->NewEpisode().ok());
  CHECK(direct->AddEntries(4, a0.fields(), a0.w.data()).ok());
  CHECK(direct->AddEntries(3, a1.fields(), a1.w.data()).ok());
  CHECK(direct->CloseEpisode(1.0f, true, false, false).ok());
  CHECK(SameContents(*mem, *direct, 64));
  const auto c = ingest->counters();
  CHECK(c.chunks == 4 && c.open_streams == 0);
  for (int k = 0; k < ChunkIngest::kNumReasons; ++k) CHECK(c.rejected[k] == 0);
  CHECK(f.alive.empty() && f.released.size() == 4);
  for (auto& [o, times] : f.released) CHECK(times == 1);
}

TEST(OrderingRulesDropStreamsAndCountReasons) {
  auto mem = MakeMemory(100);
  ChunkIngest::Options o;
  o.max_open_episodes = 2;
  o.open_episode_timeout = 5.0;
  std::unique_ptr<ChunkIngest> ingest;
  CHECK(ChunkIngest::Make(mem, o, &ingest).ok());
  Feeder f{ingest.get()};
  Rows rows(0, 3);
  // A stream must start at index 0.
  auto r = f.Feed(Chunk(1, 1, 1, rows, 0));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected &&
        std::string(ChunkIngest::ReasonName(r.reason)) == "out_of_order_chunk" && r.reason_count == 1);
  // A skipped index drops the stream.
  CHECK(f.Feed(Chunk(1, 1, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  r = f.Feed(Chunk(1, 1, 2, rows, kClose));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kOutOfOrderChunk);
  CHECK(ingest->counters().open_streams == 0);
  // Another episode of the same actor abandons the open one, and starts its own.
  CHECK(f.Feed(Chunk(1, 2, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  CHECK(f.Feed(Chunk(1, 3, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  CHECK(ingest->counters().rejected[ChunkIngest::kAbandonedEpisode] == 1);
  // A third stream beyond max_open_episodes=2 drops the least recently seen one (actor 1).
  f.now = 1.0;
  CHECK(f.Feed(Chunk(2, 1, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  f.now = 2.0;
  CHECK(f.Feed(Chunk(3, 1, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  CHECK(ingest->counters().rejected[ChunkIngest::kStreamLimit] == 1);
  r = f.Feed(Chunk(1, 3, 1, rows, kClose));  // actor 1's stream is gone
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kOutOfOrderChunk);
  // Streams silent for longer than open_episode_timeout are reaped by a later chunk.
  f.now = 20.0;
  CHECK(f.Feed(Chunk(4, 1, 0, rows, 0)).outcome == ChunkIngest::Outcome::kStaged);
  auto c = ingest->counters();
  CHECK(c.rejected[ChunkIngest::kStaleEpisode] == 2 && c.open_streams == 1);
  // An episode longer than the memory's max_step is dropped before anything is stored.
  Rows big(0, 98);
  r = f.Feed(Chunk(4, 1, 1, big, kClose));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kEpisodeTooLong);
  CHECK(mem->size() == 0 && mem->num_episode() == 0 && !mem->episode_open());
  c = ingest->counters();
  CHECK(c.open_streams == 0 && c.rejected[ChunkIngest::kOutOfOrderChunk] == 3);
  CHECK(f.alive.empty());
  for (auto& [owner, times] : f.released) CHECK(times == 1);
}

TEST(BadEpisodesAndMalformedMessagesChangeNothing) {
  auto mem = MakeMemory(50);
  std::unique_ptr<ChunkIngest> ingest;
  CHECK(ChunkIngest::Make(mem, {}, &ingest).ok());
  Feeder f{ingest.get()};
  // Fill the ring, so that a bad episode would have to evict to be stored.
  for (int e = 0; e < 5; ++e)
    CHECK(f.Feed(Chunk(9, e, 0, Rows(10 * e, 10), kClose)).outcome ==
          ChunkIngest::Outcome::kCommitted);
  auto reference = MakeMemory(50);
  for (int e = 0; e < 5; ++e) {
    Rows rows(10 * e, 10);
    CHECK(reference->NewEpisode().ok());
    CHECK(reference->AddEntries(10, rows.fields(), rows.w.data()).ok());
    CHECK(reference->CloseEpisode(1.0f, true, true, true).ok());
  }
  CHECK(SameContents(*mem, *reference, 32));
  // A non-finite init_w, or a NaN reward in a later chunk: nonfinite; a negative multiplier:
  // bad_episode; nothing evicted either way.
  Rows nan_rows(0, 6);
  nan_rows.w[3] = std::nanf("");
  auto r = f.Feed(Chunk(1, 1, 0, nan_rows, kClose));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kNonFinite);
  CHECK(r.detail.find("init_w") != std::string::npos);
  Rows nan_reward(0, 6);
  nan_reward.r[5] = std::numeric_limits<float>::infinity();
  CHECK(f.Feed(Chunk(1, 5, 0, Rows(0, 6), 0)).outcome == ChunkIngest::Outcome::kStaged);
  r = f.Feed(Chunk(1, 5, 1, nan_reward, kClose));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kNonFinite);
  CHECK(r.detail.find("r: expected finite") != std::string::npos);
  r = f.Feed(Chunk(1, 2, 0, Rows(0, 6), kClose, -1.0f));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kBadEpisode);
  CHECK(SameContents(*mem, *reference, 32) && !mem->episode_open());
  CHECK(ingest->counters().open_bytes == 0);
  // Malformed: wrong dtype, truncated header, a missing frame, a short frame.
  const Msg good = Chunk(1, 3, 0, Rows(0, 4), kClose);
  std::vector<Msg> bad;
  bad.push_back(Chunk(1, 3, 0, Rows(0, 4), kClose, 1.0f, DType::kInt32));
  bad.push_back(good);
  bad.back().frames[0].resize(30);
  bad.push_back(good);
  bad.back().frames.pop_back();
  bad.push_back(good);
  bad.back().frames[1].resize(8);
  for (const Msg& m : bad) {
    r = f.Feed(m);
    CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kMalformed);
  }
  CHECK(ingest->counters().rejected[ChunkIngest::kMalformed] == 4);
  CHECK(SameContents(*mem, *reference, 32));
  // Another message type, or a foreign frame, is not for ChunkIngest.
  Msg log = good;
  log.frames[0][6] = static_cast<char>(codec::MsgType::kLog);
  CHECK(f.Feed(log).outcome == ChunkIngest::Outcome::kNotChunk);
  CHECK(f.Feed(Msg{{"hello"}}).outcome == ChunkIngest::Outcome::kNotChunk);
  CHECK(f.Feed(good).outcome == ChunkIngest::Outcome::kCommitted);  // still serving
  CHECK(f.alive.empty());
  for (auto& [owner, times] : f.released) CHECK(times == 1);
}

TEST(ByteBudgetsBoundOpenStreams) {
  auto mem = MakeMemory(1000);
  std::unique_ptr<ChunkIngest> ingest;
  ChunkIngest::Options o;
  const int64_t chunk_bytes = [] {
    int64_t b = ChunkIngest::kChunkOverhead;
    for (const std::string& fr : Chunk(1, 1, 0, Rows(0, 0), 0).frames) b += fr.size();
    return b;
  }();
  o.max_episode_bytes = 10 * chunk_bytes;  // ten empty chunks per stream
  o.max_open_bytes = 25 * chunk_bytes;
  CHECK(ChunkIngest::Make(mem, o, &ingest).ok());
  Feeder f{ingest.get()};
  // A flood of empty chunks under one sender: the eleventh drops its stream.
  ChunkIngest::Result r;
  for (int k = 0; k < 11; ++k) r = f.Feed(Chunk(7, 1, k, Rows(0, 0), 0));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kStreamBytes);
  CHECK(ingest->counters().open_bytes == 0 && f.alive.empty());
  // Three senders of 9, 8 and 5 chunks fit 25; a fourth's fourth chunk drops the largest
  // (the nine), not the newcomer.
  for (int k = 0; k < 9; ++k) f.Feed(Chunk(1, 1, k, Rows(0, 0), 0));
  for (int k = 0; k < 8; ++k) f.Feed(Chunk(2, 1, k, Rows(0, 0), 0));
  for (int k = 0; k < 5; ++k) f.Feed(Chunk(3, 1, k, Rows(0, 0), 0));
  CHECK(ingest->counters().open_bytes == 22 * chunk_bytes);
  for (int k = 0; k < 4; ++k)
    CHECK(f.Feed(Chunk(4, 1, k, Rows(0, 0), 0)).outcome == ChunkIngest::Outcome::kStaged);
  auto c = ingest->counters();
  CHECK(c.rejected[ChunkIngest::kOpenBytes] == 1 && c.open_streams == 3);
  CHECK(c.open_bytes == 17 * chunk_bytes);
  // A stream that is itself the largest is dropped with its chunk.
  o.max_open_bytes = 17 * chunk_bytes;
  CHECK(ingest->SetOptions(o).ok());
  r = f.Feed(Chunk(2, 1, 8, Rows(0, 0), 0));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.reason == ChunkIngest::kOpenBytes);
  CHECK(ingest->counters().open_bytes == 9 * chunk_bytes);
  // Still serving: a real episode is stored.
  CHECK(f.Feed(Chunk(5, 1, 0, Rows(0, 4), kClose)).outcome == ChunkIngest::Outcome::kCommitted);
  // Reap drops silent streams without a chunk coming.
  f.now = 1000;
  std::vector<uint64_t> released;
  ingest->Reap(f.now, &released);
  CHECK(ingest->counters().open_streams == 0 && ingest->counters().open_bytes == 0);
  CHECK(released.size() == 9);
}

// A KEEPALIVE message of `uuid`; `bad` gives its uuid entry another dtype.
Msg Keepalive(uint64_t uuid, bool bad = false) {
  codec::Message m;
  m.type = codec::MsgType::kKeepalive;
  codec::Entry e;
  e.name = "uuid";
  e.dtype = bad ? DType::kInt64 : DType::kUInt64;
  m.entries.push_back(e);
  CHECK(codec::Finalize(&m).ok());
  Msg out;
  out.frames.emplace_back();
  CHECK(codec::EncodeHeader(m, &out.frames[0]).ok());
  out.frames.push_back(Scalar(uuid));
  return out;
}

TEST(LivenessDropsExactlyTheSilentActorsEpisode) {
  auto mem = MakeMemory(1000);
  std::unique_ptr<ChunkIngest> ingest;
  ChunkIngest::Options o;
  o.peer_timeout = 2.0;  // listen gaps count at most 0.5 s
  CHECK(ChunkIngest::Make(mem, o, &ingest).ok());
  Feeder f{ingest.get()};
  f.Feed(Chunk(1, 1, 0, Rows(0, 2), 0));
  f.Feed(Chunk(2, 1, 0, Rows(0, 2), 0));
  f.Feed(Chunk(3, 1, 0, Rows(0, 2), 0));
  std::vector<uint64_t> released;
  // Actor 1 keeps sending chunks, actor 2 keepalives only; actor 3 is silent. The owner
  // reads every 0.25 s for 3 s.
  for (int k = 1; k <= 12; ++k) {
    f.now = 0.25 * k;
    if (k % 4 == 0) f.Feed(Chunk(1, 1, k / 4, Rows(0, 1), 0));
    CHECK(f.Feed(Keepalive(2)).outcome == ChunkIngest::Outcome::kKeepalive);
    ingest->Listen(f.now, &released);  // (a drop may come from a message's own listening)
  }
  CHECK(ingest->counters().rejected[ChunkIngest::kPeerLost] == 1);
  CHECK(ingest->counters().open_streams == 2 && ingest->counters().keepalives == 12);
  // Not reading for five minutes counts 0.5 s: the live actors' episodes stay open.
  f.now = 300;
  CHECK(ingest->Listen(f.now, &released) == 0 && ingest->counters().open_streams == 2);
  // A malformed keepalive is refused and counted; it keeps nothing alive.
  CHECK(f.Feed(Keepalive(2, /*bad=*/true)).reason == ChunkIngest::kMalformed);
  CHECK(ingest->counters().keepalives == 12);
  // Both survivors store their episodes whole; actor 3's next chunk finds its start lost.
  CHECK(f.Feed(Chunk(1, 1, 4, Rows(0, 2), kClose)).outcome == ChunkIngest::Outcome::kCommitted);
  CHECK(f.Feed(Chunk(2, 1, 1, Rows(0, 2), kClose)).outcome == ChunkIngest::Outcome::kCommitted);
  CHECK(f.Feed(Chunk(3, 1, 1, Rows(0, 2), kClose)).reason == ChunkIngest::kOutOfOrderChunk);
  CHECK(mem->num_episode() == 2 && mem->size() == (2 + 3 + 2) + (2 + 2));
  CHECK(std::string(ChunkIngest::ReasonName(ChunkIngest::kPeerLost)) == "peer_lost");
  for (const auto& kv : f.released) CHECK(kv.second == 1);
  CHECK(f.alive.empty() || released.size() == 1);  // actor 3's frames went one way or the other
}

TEST(AnActorBackAfterItsEpisodeWentIsReportedOnceAndTheRestIsQuiet) {
  auto mem = MakeMemory(1000);
  std::unique_ptr<ChunkIngest> ingest;
  ChunkIngest::Options o;
  o.peer_timeout = 1.0;
  CHECK(ChunkIngest::Make(mem, o, &ingest).ok());
  Feeder f{ingest.get()};
  std::vector<uint64_t> released;
  f.Feed(Chunk(7, 3, 0, Rows(0, 2), 0));
  f.Feed(Chunk(8, 1, 0, Rows(0, 2), 0));
  for (int k = 1; k <= 8; ++k) {  // actor 8 keeps alive, actor 7 is silent
    f.now = 0.25 * k;
    f.Feed(Keepalive(8));
    ingest->Listen(f.now, &released);
  }
  CHECK(ingest->counters().rejected[ChunkIngest::kPeerLost] == 1);
  CHECK(ingest->TakeReturned().empty());  // gone, not back
  // Back at 5: the rest of episode 3 is dropped, quietly; the return is reported once.
  f.now = 5.0;
  ChunkIngest::Result r = f.Feed(Chunk(7, 3, 1, Rows(0, 2), 0));
  CHECK(r.outcome == ChunkIngest::Outcome::kRejected && r.quiet);
  CHECK(r.reason == ChunkIngest::kOutOfOrderChunk);
  CHECK(f.Feed(Chunk(7, 3, 2, Rows(0, 2), kClose)).quiet);
  std::vector<ChunkIngest::Returned> back = ingest->TakeReturned();
  CHECK(back.size() == 1 && back[0].uuid == 7 && back[0].episode == 3);
  CHECK(back[0].episodes == 1 && back[0].rows == 2 && back[0].count == 1);
  CHECK(std::abs(back[0].silent - 5.0) < 1e-9);  // from its chunk at 0
  // Its next episode is stored; another actor's out-of-order chunk is not quiet.
  CHECK(f.Feed(Chunk(7, 4, 0, Rows(0, 2), kClose)).outcome == ChunkIngest::Outcome::kCommitted);
  r = f.Feed(Chunk(9, 1, 2, Rows(0, 2), 0));
  CHECK(r.reason == ChunkIngest::kOutOfOrderChunk && !r.quiet);
  CHECK(ingest->TakeReturned().empty() && mem->num_episode() == 1);
}

TEST(OptionsAreValidated) {
  std::unique_ptr<ChunkIngest> ingest;
  ChunkIngest::Options o;
  o.max_open_episodes = 0;
  CHECK(!ChunkIngest::Make(MakeMemory(10), o, &ingest).ok());
  o.max_open_episodes = 1;
  o.open_episode_timeout = 0;
  CHECK(!ChunkIngest::Make(MakeMemory(10), o, &ingest).ok());
  o.open_episode_timeout = 1;
  o.max_episode_bytes = 0;
  CHECK(!ChunkIngest::Make(MakeMemory(10), o, &ingest).ok());
  o.max_episode_bytes = 1;
  o.max_open_bytes = 0;
  CHECK(!ChunkIngest::Make(MakeMemory(10), o, &ingest).ok());
  o.max_open_bytes = 1;
  o.peer_timeout = 0;
  CHECK(!ChunkIngest::Make(MakeMemory(10), o, &ingest).ok());
  CHECK(!ChunkIngest::Make(std::shared_ptr<ReplayMemory>(), {}, &ingest).ok());
}

TEST_MAIN()
