// Binds core/chunk_ingest.h as memoire._core.ChunkIngest for the server's PULL worker: one call
// per received message takes the frames (zmq.Frame, bytes: anything with the buffer protocol),
// holds their buffers while the core's streams point into them, and runs the checks, the stream
// bookkeeping and any commit with the GIL released.
#include "core/chunk_ingest.h"

#include <atomic>
#include <cstdio>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/common.h"
#include "core/libzmq.h"
#include "bindings/frames.h"
#include "core/circular_buffer.h"
#include "core/codec.h"
#include "core/episode_store.h"
#include "core/transition_store.h"

namespace memoire {
namespace {

class PyChunkIngest {
 public:
  // Whatever keeps a message's bytes alive: Python frames or libzmq's messages.
  using Owner = std::shared_ptr<const void>;

  // `transition`: the JAX store's adapter when `store` is one (its priority is settable).
  PyChunkIngest(std::shared_ptr<EpisodeStore> store,
                std::shared_ptr<TransitionEpisodeStore> transition,
                const ChunkIngest::Options& options)
      : store_(std::move(store)), transition_(std::move(transition)) {
    ThrowIfError(ChunkIngest::Make(store_, options, &core_));
  }

  // [(name, dtype, row shape)] of the row columns a chunk carries, in order.
  py::list RowSpec() const {
    py::list out;
    for (const codec::ArraySpec& s : store_->row_spec()) {
      py::tuple row(s.shape.size() - 1);
      for (size_t d = 1; d < s.shape.size(); ++d) row[d - 1] = s.shape[d];
      out.append(py::make_tuple(s.name, ToNumpy(s.dtype), row));
    }
    return out;
  }

  double priority() const { return JaxStore().priority(); }
  void set_priority(double v) { ThrowIfError(JaxStore().set_priority(v)); }

  // ([(uuid, episode, rows, info or None)], records lost to the log's bound).
  py::tuple TakeCommitted() {
    int64_t dropped = 0;
    const std::vector<ChunkIngest::Committed> got = core_->TakeCommitted(&dropped);
    py::list out;
    for (const ChunkIngest::Committed& c : got) {
      py::object info = c.has_info ? py::object(py::make_tuple(c.info[0], c.info[1], c.info[2]))
                                   : py::object(py::none());
      out.append(py::make_tuple(c.uuid, c.episode, c.rows, info));
    }
    return py::make_tuple(out, dropped);
  }

  // None for a message that is not a current-version chunk or keepalive (or whose frames
  // export no buffer); else (outcome, rows, reason, reason_count, detail) with outcome 1
  // staged, 2 committed, 3 rejected (reason None: the quiet tail of an episode already
  // reported lost), 4 keepalive.
  py::object Ingest(const py::sequence& frames, const py::object& now_obj) {
    const double now = now_obj.is_none() ? Now() : now_obj.cast<double>();
    const size_t n = frames.size();
    auto held = std::make_unique<HeldFrames>();
    // Other messages (caches, logs) go back at once, without a GIL round trip.
    if (n == 0 || !held->Add(frames[0].ptr()) || !Ingestible(held->frames()[0]))
      return py::none();
    for (size_t k = 1; k < n; ++k)
      if (!held->Add(frames[k].ptr())) return py::none();
    const std::vector<ChunkIngest::Frame> fr = held->frames();
    Owner owner = HeldFrames::Owned(std::move(held));
    ChunkIngest::Result r;
    {
      GilRelease release;
      Take(std::move(owner), fr, now, &r);
    }
    if (r.outcome == ChunkIngest::Outcome::kRejected && !r.quiet)
      return py::make_tuple(static_cast<int>(r.outcome), r.rows, ChunkIngest::ReasonName(r.reason),
                            r.reason_count, r.detail);
    return py::make_tuple(static_cast<int>(r.outcome), r.rows, py::none(), 0, py::none());
  }

  // The PULL worker's loop body with the GIL released: waits up to timeout_ms for a message on
  // `socket` (pyzmq's Socket.underlying; requires attach_libzmq), then takes what is queued,
  // up to max_messages; chunks go straight from libzmq into the ingest. A stored episode stops
  // the call (so that the server's counters, which a learner may pace itself by, follow at
  // once), and so does the first other message, which comes back as read-only uint8 arrays.
  // Returns (episodes stored, rows stored, [(reason, reason_count, detail)] of rejected
  // chunks, frames of the other message or None).
  py::tuple Receive(uintptr_t socket, int timeout_ms, int max_messages) {
    if (!libzmq::Attached()) throw std::runtime_error("receive: libzmq is not attached");
    int64_t episodes = 0, rows = 0;
    std::vector<ChunkIngest::Result> rejected;
    std::shared_ptr<libzmq::Frames> other;
    std::string error;
    {
      GilRelease release;
      ChunkIngest::Result r;
      ListenNow();  // the wait below is listening time
      error = libzmq::ReceiveEach(
          reinterpret_cast<void*>(socket), timeout_ms, max_messages,
          [&](std::shared_ptr<libzmq::Frames> frames, const std::vector<codec::Frame>& fr) {
            if (!Ingestible(fr[0])) {
              other = std::move(frames);
              return false;
            }
            Take(std::move(frames), fr, Now(), &r);
            if (r.outcome == ChunkIngest::Outcome::kCommitted && r.rows > 0) {
              ++episodes;
              rows += r.rows;
              return false;  // a stored episode is reported at once (wait_rows_in, the learner's pace)
            }
            if (r.outcome == ChunkIngest::Outcome::kRejected && !r.quiet)
              rejected.push_back(std::move(r));
            return true;
          });
      ListenNow();
    }
    if (!error.empty()) throw std::runtime_error("receive: " + error);
    py::list rejections;
    for (const ChunkIngest::Result& r : rejected)
      rejections.append(py::make_tuple(ChunkIngest::ReasonName(r.reason), r.reason_count, r.detail));
    AppendLost(&rejections);
    return py::make_tuple(episodes, rows, rejections,
                          other ? py::object(FramesToArrays(other)) : py::object(py::none()));
  }

  // Drops stale streams (see ChunkIngest::Reap) and frees their frames.
  void Reap(const py::object& now_obj) {
    const double now = now_obj.is_none() ? Now() : now_obj.cast<double>();
    GilRelease release;
    std::vector<uint64_t> released;
    core_->Reap(now, &released);
    Release(released);
  }

  // The owner reads at `now` (see ChunkIngest::Listen); frees the frames of dropped streams.
  // Returns [(reason, reason_count, detail)] of the episodes dropped as peer_lost since the
  // last report (here, or by a message's own listening).
  py::list Listen(const py::object& now_obj) {
    const double now = now_obj.is_none() ? Now() : now_obj.cast<double>();
    {
      GilRelease release;
      std::vector<uint64_t> released;
      core_->Listen(now, &released);
      Release(released);
    }
    py::list out;
    AppendLost(&out);
    return out;
  }

  // Appends (reason, count, detail) for each episode dropped as peer_lost since the last call.
  void AppendLost(py::list* out) {
    const auto lost = core_->TakeLost();
    if (lost.empty()) return;
    const int64_t count = core_->counters().rejected[ChunkIngest::kPeerLost];
    for (const auto& [uuid, episode] : lost) {
      char who[24];
      std::snprintf(who, sizeof(who), "%08llx", static_cast<unsigned long long>(uuid));
      out->append(py::make_tuple(ChunkIngest::ReasonName(ChunkIngest::kPeerLost), count,
                                 "dropped episode " + std::to_string(episode) + " from " + who +
                                     ": not heard from for peer_timeout"));
    }
  }

  // [(uuid, seconds silent, episode, episodes lost, rows lost, returns so far)]: see
  // ChunkIngest::TakeReturned.
  py::list TakeReturned() {
    py::list out;
    for (const ChunkIngest::Returned& r : core_->TakeReturned())
      out.append(py::make_tuple(r.uuid, r.silent, r.episode, r.episodes, r.rows, r.count));
    return out;
  }

  py::dict Counters() const {
    const ChunkIngest::Counters c = core_->counters();
    py::dict rejected;
    for (int k = 0; k < ChunkIngest::kNumReasons; ++k)
      if (c.rejected[k]) rejected[ChunkIngest::ReasonName(k)] = c.rejected[k];
    py::dict out;
    out["chunks"] = c.chunks;
    out["keepalives"] = c.keepalives;
    out["open_streams"] = c.open_streams;
    out["open_bytes"] = c.open_bytes;
    out["rejected"] = rejected;
    {
      std::lock_guard<std::mutex> l(owners_mu_);
      out["frames_held"] = owners_.size();
    }
    return out;
  }

  ChunkIngest& core() { return *core_; }

 private:
  // A message the ingest takes: a current-version CHUNK or KEEPALIVE.
  static bool Ingestible(const codec::Frame& header) {
    return codec::IsCurrent(header, codec::MsgType::kChunk) ||
           codec::IsCurrent(header, codec::MsgType::kKeepalive);
  }

  // Listen at the steady clock's now, freeing what it drops. Called without the GIL.
  void ListenNow() {
    std::vector<uint64_t> released;
    core_->Listen(Now(), &released);
    Release(released);
  }

  static double Now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Ingests one message, keeping `owner` while the core points into its frames, and frees the
  // owners the core let go of. Called without the GIL.
  void Take(Owner owner, const std::vector<ChunkIngest::Frame>& frames, double now,
            ChunkIngest::Result* r) {
    const uint64_t id = next_owner_.fetch_add(1);
    {
      std::lock_guard<std::mutex> l(owners_mu_);  // before the call: another thread may release it
      owners_.emplace(id, std::move(owner));
    }
    core_->Ingest(id, frames.data(), frames.size(), now, r);
    Release(r->released);
  }

  // Frees the owners the core let go of. Called without the GIL.
  void Release(const std::vector<uint64_t>& released) {
    std::vector<Owner> gone;  // freed after the lock: a Python owner takes the GIL to go
    std::lock_guard<std::mutex> l(owners_mu_);
    for (uint64_t o : released) {
      auto it = owners_.find(o);
      if (it == owners_.end()) continue;
      gone.push_back(std::move(it->second));
      owners_.erase(it);
    }
  }

  TransitionEpisodeStore& JaxStore() const {
    if (!transition_)
      ThrowIfError(Error(Code::kFailedPrecondition,
                         "priority: only an ingest into a TransitionStore has one"));
    return *transition_;
  }

  std::shared_ptr<EpisodeStore> store_;
  std::shared_ptr<TransitionEpisodeStore> transition_;
  std::unique_ptr<ChunkIngest> core_;
  mutable std::mutex owners_mu_;
  std::unordered_map<uint64_t, Owner> owners_;  // guarded by owners_mu_
  std::atomic<uint64_t> next_owner_{1};
};

template <typename T>
void SetOption(PyChunkIngest& self, T ChunkIngest::Options::*member, T value) {
  ChunkIngest::Options o = self.core().options();
  o.*member = value;
  ThrowIfError(self.core().SetOptions(o));
}

}  // namespace

void BindChunkIngest(py::module_& m) {
  py::class_<PyChunkIngest> c(m, "ChunkIngest", R"doc(
The one receiving end of experience (core/chunk_ingest.h): checks episode-chunk messages
against a store's row columns, keeps per-actor streams and commits finished episodes whole into
the store (memoire's ReplayMemory, Dopamine's CircularBuffer or TransitionStore).
Rejections are counted by reason ("malformed", "abandoned_episode", "out_of_order_chunk",
"stream_limit", "stale_episode", "episode_too_long", "bad_episode", "stream_bytes",
"open_bytes", "nonfinite", "peer_lost"). Liveness: an actor not heard from (no chunk, no
KEEPALIVE message) for peer_timeout seconds of the owner's listening loses its open episode
(peer_lost), never another actor's. Thread-safe.
)doc");
  auto options = [](uint64_t max_message_bytes, int64_t max_open_episodes,
                    double open_episode_timeout, int64_t max_episode_bytes,
                    int64_t max_open_bytes, double peer_timeout) {
    ChunkIngest::Options o;
    o.peer_timeout = peer_timeout;
    o.max_message_bytes = max_message_bytes;
    o.max_open_episodes = max_open_episodes;
    o.open_episode_timeout = open_episode_timeout;
    o.max_episode_bytes = max_episode_bytes;
    o.max_open_bytes = max_open_bytes;
    return o;
  };
  // The budgets every constructor takes, after its store's own arguments.
#define MEMOIRE_INGEST_LIMIT_ARGS                                                        \
  py::arg("max_message_bytes") = uint64_t(1) << 30, py::arg("max_open_episodes") = 4096, \
      py::arg("open_episode_timeout") = 600.0,                                             \
      py::arg("max_episode_bytes") = int64_t(256) << 20,                                   \
      py::arg("max_open_bytes") = int64_t(1) << 30, py::arg("peer_timeout") = 10.0
  c.def(py::init([options](std::shared_ptr<ReplayMemory> memory, uint64_t mmb, int64_t ms,
                           double st, int64_t msb, int64_t mob, double pt) {
          if (!memory) ThrowIfError(Error(Code::kInvalidArgument, "memory: expected a ReplayMemory"));
          return new PyChunkIngest(EpisodeStoreOf(std::move(memory)), nullptr,
                                   options(mmb, ms, st, msb, mob, pt));
        }),
        py::arg("memory"), MEMOIRE_INGEST_LIMIT_ARGS,
        "Into memoire's episodic memory: rows s, a, r, p, v, i and init_w float32.");
  c.def(py::init([options](std::shared_ptr<CircularBuffer> buffer, bool allow_nonfinite,
                           uint64_t mmb, int64_t ms, double st, int64_t msb, int64_t mob,
                           double pt) {
          if (!buffer) ThrowIfError(Error(Code::kInvalidArgument, "buffer: expected a CircularBuffer"));
          return new PyChunkIngest(EpisodeStoreOf(std::move(buffer), allow_nonfinite), nullptr,
                                   options(mmb, ms, st, msb, mob, pt));
        }),
        py::arg("buffer"), py::kw_only(), py::arg("allow_nonfinite") = false,
        MEMOIRE_INGEST_LIMIT_ARGS,
        "Into Dopamine's TF circular or prioritized buffer: rows of its schema (observation, "
        "action, reward, terminal, extras); an episode's last row ends it (episode_end); new "
        "rows get the largest recorded priority. Non-finite rewards are refused unless "
        "allow_nonfinite.");
  c.def(py::init([options](std::shared_ptr<TransitionStore> store, const py::object& obs_dtype,
                           const std::vector<int64_t>& obs_shape, const py::object& action_dtype,
                           const std::vector<int64_t>& action_shape, bool allow_nonfinite,
                           uint64_t mmb, int64_t ms, double st, int64_t msb, int64_t mob,
                           double pt) {
          std::unique_ptr<TransitionEpisodeStore> t;
          ThrowIfError(TransitionEpisodeStore::Make(
              std::move(store), FromNumpy(py::dtype::from_args(obs_dtype), "observation_dtype"), obs_shape,
              FromNumpy(py::dtype::from_args(action_dtype), "action_dtype"), action_shape, allow_nonfinite, &t));
          std::shared_ptr<TransitionEpisodeStore> shared(std::move(t));
          return new PyChunkIngest(shared, shared, options(mmb, ms, st, msb, mob, pt));
        }),
        py::arg("store"), py::kw_only(), py::arg("observation_dtype"),
        py::arg("observation_shape"), py::arg("action_dtype"), py::arg("action_shape"),
        py::arg("allow_nonfinite") = false, MEMOIRE_INGEST_LIMIT_ARGS,
        "Into Dopamine's JAX buffer (a TransitionStore): rows observation, action (the given "
        "dtypes and shapes), reward float64, terminal bool; an episode's last row ends it; new "
        "elements get `priority` (prioritized stores).");
#undef MEMOIRE_INGEST_LIMIT_ARGS
  c.def_property_readonly("row_spec", &PyChunkIngest::RowSpec,
                          "[(name, numpy dtype, row shape)]: the row columns of a chunk, in order.");
  c.def_property("priority", &PyChunkIngest::priority, &PyChunkIngest::set_priority,
                 "The leaf value new elements of a prioritized TransitionStore get (finite, "
                 ">= 0); RuntimeError for other stores.");
  c.def("take_committed", &PyChunkIngest::TakeCommitted,
        "([(uuid, episode, rows, info)], dropped): the episodes stored since the last call, "
        "oldest first (at most 4096 kept; `dropped` counts the ones lost to that bound); info "
        "is the last chunk's (return, length, terminated) or None.");
  c.def("take_returned", &PyChunkIngest::TakeReturned,
        "[(uuid, seconds silent, episode, episodes lost, rows lost, returns so far)]: actors "
        "heard from again since the last call after they lost their open episode to "
        "peer_timeout (a healed partition, a process that woke), oldest first; the rest of "
        "a lost episode that arrives after its actor's return is dropped without a report "
        "(counted as out_of_order_chunk).");
  c.def("ingest", &PyChunkIngest::Ingest, py::arg("frames"), py::arg("now") = py::none(),
        "Takes one received message ([header, data...]). None when it is not a current-version "
        "chunk; else (outcome, rows, reason, reason_count, detail): outcome 1 staged (rows of "
        "the chunk), 2 committed (rows of the stored episode; 0: an empty episode, nothing "
        "stored), 3 rejected (reason name, how many so far, what was wrong; None for the rest "
        "of an episode already reported lost, see take_returned). `now`: monotonic "
        "seconds (default: the steady clock). Never raises for what a peer sent.");
  c.def("receive", &PyChunkIngest::Receive, py::arg("socket"), py::arg("timeout_ms"),
        py::arg("max_messages") = 64,
        "Receives from a PULL socket (its `underlying` address; requires attach_libzmq) with "
        "the GIL released: waits up to timeout_ms for a message, then takes what is queued (up "
        "to max_messages); chunks are ingested as by ingest(). A stored episode or the first "
        "other message stops the call. Returns (episodes stored, rows stored, "
        "[(reason, reason_count, detail)] of rejected chunks, frames of the other message as "
        "read-only uint8 arrays or None). "
        "Raises RuntimeError on a socket error.");
  c.def("reap", &PyChunkIngest::Reap, py::arg("now") = py::none(),
        "Drops open episodes silent for open_episode_timeout seconds (counted as stale_episode), as "
        "ingest does when a chunk comes; call it when none come. Looks at most every "
        "min(10, open_episode_timeout) seconds, so it is cheap to call often.");
  c.def("listen", &PyChunkIngest::Listen, py::arg("now") = py::none(),
        "Says that the owner reads its socket at `now` (monotonic seconds; default: the steady "
        "clock): advances the listening time (a gap since the last read counts at most "
        "min(0.5, peer_timeout / 4) s) and drops the open episode of every actor not heard "
        "from (no chunk, no keepalive) for peer_timeout seconds of it (counted as peer_lost). "
        "ingest() and receive() listen themselves; call it after a poll that found nothing, "
        "never while not reading (a limiter holding inserts back). Returns "
        "[(reason, reason_count, detail)] of the episodes dropped as peer_lost since the last "
        "report (receive() reports them too).");
  c.def(
      "open_streams",
      [](PyChunkIngest& self) {
        py::list out;
        for (const ChunkIngest::OpenStream& o : self.core().OpenStreams())
          out.append(py::make_tuple(o.uuid, o.episode, o.rows));
        return out;
      },
      "[(uuid, episode, rows so far)] of the open streams (unfinished episodes), unordered.");
  c.def("counters", &PyChunkIngest::Counters,
        "{'chunks', 'keepalives', 'open_streams', 'open_bytes', 'rejected': {reason: count}, "
        "'frames_held'}.");
  c.def_property(
      "max_episode_bytes",
      [](PyChunkIngest& self) { return self.core().options().max_episode_bytes; },
      [](PyChunkIngest& self, int64_t v) {
        SetOption(self, &ChunkIngest::Options::max_episode_bytes, v);
      });
  c.def_property(
      "max_open_bytes", [](PyChunkIngest& self) { return self.core().options().max_open_bytes; },
      [](PyChunkIngest& self, int64_t v) {
        SetOption(self, &ChunkIngest::Options::max_open_bytes, v);
      });
  c.def_property(
      "max_open_episodes",
      [](PyChunkIngest& self) { return self.core().options().max_open_episodes; },
      [](PyChunkIngest& self, int64_t v) {
        SetOption(self, &ChunkIngest::Options::max_open_episodes, v);
      });
  c.def_property(
      "open_episode_timeout",
      [](PyChunkIngest& self) { return self.core().options().open_episode_timeout; },
      [](PyChunkIngest& self, double v) {
        SetOption(self, &ChunkIngest::Options::open_episode_timeout, v);
      });
  c.def_property(
      "peer_timeout", [](PyChunkIngest& self) { return self.core().options().peer_timeout; },
      [](PyChunkIngest& self, double v) { SetOption(self, &ChunkIngest::Options::peer_timeout, v); });
  c.def_property(
      "max_message_bytes",
      [](PyChunkIngest& self) { return self.core().options().max_message_bytes; },
      [](PyChunkIngest& self, uint64_t v) {
        SetOption(self, &ChunkIngest::Options::max_message_bytes, v);
      });
}

}  // namespace memoire
