// _core.Feed: the prefetching feed (core/prefetch.h) over a TransitionStore (the JAX face) or a
// CircularBuffer (the TF face). Python-facing batches are numpy views of a ring slot; the slot
// goes back to the samplers when the last view of the batch is dropped.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/batch_views.h"
#include "bindings/common.h"
#include "bindings/device_feed.h"
#include "core/stream_source.h"
#include "core/circular_buffer.h"
#include "core/prefetch.h"
#include "core/replay_memory.h"
#include "core/rng.h"
#include "core/transition_store.h"

namespace memoire {

// bindings/circular_buffer.cc: checks Dopamine's transition element arrays for a batch of n.
CircularBuffer::Outputs OutputsFrom(const CircularBuffer& self, const py::list& outs, int64_t n);

namespace {

// The sources of a sampling stream given as a feed's source: a StreamSource, or a non-empty
// list or tuple of them (one per connection); empty for any other source.
std::vector<std::shared_ptr<StreamSource>> StreamSourcesOf(const py::object& source) {
  std::vector<std::shared_ptr<StreamSource>> out;
  if (py::isinstance<StreamSource>(source)) {
    out.push_back(source.cast<std::shared_ptr<StreamSource>>());
  } else if (py::isinstance<py::list>(source) || py::isinstance<py::tuple>(source)) {
    for (const py::handle& h : source) {
      if (!py::isinstance<StreamSource>(h))
        ThrowInvalid("source: expected a list of a stream's StreamSources, got an element of "
                     "type " + py::str(py::type::of(h).attr("__name__")).cast<std::string>());
      out.push_back(h.cast<std::shared_ptr<StreamSource>>());
    }
    if (out.empty()) ThrowInvalid("source: expected a stream's StreamSources, got an empty list");
  }
  return out;
}

// Keeps a taken slot until the last array of its batch is gone.
struct RingLease {
  std::shared_ptr<Prefetcher> ring;
  int slot;
};

class PyFeed {
 public:
  PyFeed(const py::object& source, const py::list& templates, int64_t batch_size, int depth,
         int threads, uint64_t seed, int64_t frames_granule) {
    if (batch_size < 1)
      ThrowInvalid("batch_size: expected >= 1, got " + std::to_string(batch_size));
    Prefetcher::Options o;
    o.depth = depth;
    o.threads = threads;
    // Short: memoire.feed retries once after a garbage collection (a device copy may hold
    // the last reference to a batch in a cycle), then raises.
    o.held_wait_ms = 250;
    // A sampling stream comes as its connections' sources (one, or a list of several).
    const std::vector<std::shared_ptr<StreamSource>> streams = StreamSourcesOf(source);
    const bool sized_here = py::isinstance<ReplayMemory>(source) || !streams.empty();
    for (const py::handle& h : sized_here ? py::list() : templates) {
      py::array a = py::array::ensure(h);
      if (!a) ThrowInvalid("templates: expected numpy arrays");
      BatchPart part;
      part.dtype = FromNumpy(a.dtype(), "templates");
      part.shape = ShapeOf(a);
      part.bytes = static_cast<size_t>(a.nbytes());
      layout_.parts.push_back(part);
    }
    Prefetcher::Fill fill;
    if (frames_granule < 0)
      ThrowInvalid("frames_granule: expected >= 0, got " + std::to_string(frames_granule));
    if (frames_granule > 0 && !py::isinstance<TransitionStore>(source))
      ThrowInvalid("frames_granule: distinct frames are drawn from a TransitionStore only");
    if (py::isinstance<TransitionStore>(source)) {
      auto store = source.cast<std::shared_ptr<TransitionStore>>();
      if (frames_granule > 0) {
        CheckDistinctLayout(*store, templates, batch_size, frames_granule);
        fill = DistinctFill(store, batch_size, frames_granule, threads, seed);
      } else {
        CheckStoreLayout(*store, templates, batch_size);
        fill = StoreFill(store, batch_size, threads, seed);
      }
    } else if (py::isinstance<ReplayMemory>(source)) {
      auto rm = source.cast<std::shared_ptr<ReplayMemory>>();
      const ReplayMemory::Options mo = rm->options();
      frame_stack_ = mo.frame_stack;
      layout_ = MemoryBatchLayout(rm->schema(), batch_size, mo.frame_stack,
                                  mo.cache_flags.data(), /*totals=*/false);
      fill = MemoryFill(rm, batch_size);
    } else if (!streams.empty()) {
      // A sampling stream: batches come from the server, stacked into the slot on arrival by
      // one thread per connection (thread t receives connection t's).
      const StreamLayout& l = streams[0]->layout();
      for (const auto& src : streams) {
        if (src->shared_memory())
          ThrowInvalid("source: a shared-memory stream needs no feed (its slots are the ring)");
        if (src->layout().batch_size != l.batch_size ||
            src->layout().frame_stack != l.frame_stack || src->layout().flags != l.flags ||
            !(src->layout().schema == l.schema))
          ThrowInvalid("source: the stream's connections have different batch layouts");
      }
      if (batch_size != l.batch_size)
        ThrowInvalid("batch_size: the stream was opened for " + std::to_string(l.batch_size) +
                     ", got " + std::to_string(batch_size));
      if (threads != static_cast<int>(streams.size()))
        ThrowInvalid("threads: a stream is received by one thread per connection (" +
                     std::to_string(streams.size()) + "), got " + std::to_string(threads));
      layout_ = MemoryBatchLayout(l.schema, batch_size, l.frame_stack, l.flags.data(),
                                  /*totals=*/true);
      fill = [streams](int t, uint8_t* const* p) { return streams[t]->Fill(0, p); };
      stop_ = [streams] {
        for (const auto& src : streams) src->Stop();
      };
    } else if (py::isinstance<CircularBuffer>(source)) {
      auto cb = source.cast<std::shared_ptr<CircularBuffer>>();
      OutputsFrom(*cb, templates, batch_size);  // ValueError on a wrong layout
      fill = CircularFill(cb, batch_size, threads);
    } else {
      ThrowInvalid("source: expected a TransitionStore, CircularBuffer, ReplayMemory or a "
                   "stream's StreamSources, got " +
                   py::str(py::type::of(source).attr("__name__")).cast<std::string>());
    }
    for (const BatchPart& part : layout_.parts) o.part_bytes.push_back(part.bytes);
    std::unique_ptr<Prefetcher> p;
    ThrowIfError(Prefetcher::Make(o, std::move(fill), &p));
    ring_ = std::shared_ptr<Prefetcher>(std::move(p));
  }

  ~PyFeed() {
    // Joins the samplers (they never take the GIL, so holding it cannot deadlock them).
    if (stop_) stop_();
    if (ring_) ring_->Close();
  }

  // The next ready batch as a tuple of arrays (the templates' dtypes and shapes), or the error
  // its draw met (the synchronous path's exception type).
  py::tuple Take() {
    if (!ring_) ThrowIfError(Error(Code::kFailedPrecondition, "the feed is closed"));
    std::shared_ptr<Prefetcher> ring = ring_;
    int slot = -1;
    Status s;
    {
      GilRelease release;
      s = ring->Take(&slot);
    }
    if (!s.ok()) {
      if (slot >= 0) ring->Release(slot);
      ThrowIfError(s);
    }
    py::capsule lease(new RingLease{ring, slot}, [](void* p) {
      auto* l = static_cast<RingLease*>(p);
      l->ring->Release(l->slot);
      delete l;
    });
    return BatchViews(layout_, ring->parts(slot), lease);
  }

  void Close() {
    if (!ring_) return;
    std::shared_ptr<Prefetcher> ring = ring_;
    if (stop_) stop_();  // a stream's receive in progress returns at once
    {
      GilRelease release;
      ring->Close();
    }
  }

  int depth() const { return ring_->depth(); }
  // For a device ring (bindings/device_feed.cc): the host ring and its parts.
  const std::shared_ptr<Prefetcher>& ring() const { return ring_; }
  const std::vector<BatchPart>& parts() const { return layout_.parts; }
  int threads() const { return ring_->threads(); }
  int64_t taken() const { return ring_->taken(); }
  int64_t filled() const { return ring_->filled(); }

 private:
  // ValueError unless `templates` is SampleGather's layout for a batch of n.
  static void CheckStoreLayout(const TransitionStore& t, const py::list& templates, int64_t n) {
    CheckLength(static_cast<int64_t>(templates.size()), 8, "templates", "output");
    const auto& o = t.options();
    auto arr = [&](int i) { return templates[i].cast<py::array>(); };
    CheckOutput(arr(0), DType::kInt32, {n}, "keys");
    CheckOutput(arr(1), DType::kFloat64, {n}, "probabilities");
    CheckOutput(arr(4), DType::kFloat64, {n}, "reward");
    CheckOutput(arr(6), DType::kBool, {n}, "is_terminal");
    CheckOutput(arr(7), DType::kBool, {n}, "episode_end");
    const size_t sb = static_cast<size_t>(n) * o.frame_bytes * o.stack_size;
    py::array state = arr(2), action = arr(3), next_state = arr(5);
    BytesOut(state, sb, "state");
    BytesOut(action, static_cast<size_t>(n) * o.action_bytes, "action");
    BytesOut(next_state, sb, "next_state");
  }

  // ValueError unless `templates` is SampleDistinctFrames's layout for a batch of n: keys
  // int32[n], probabilities f64[n], frames (capacity frames), index int32[n, 2, stack],
  // counts int32[2], action, reward f64[n], is_terminal bool[n], episode_end bool[n].
  static void CheckDistinctLayout(const TransitionStore& t, const py::list& templates, int64_t n,
                                  int64_t granule) {
    CheckLength(static_cast<int64_t>(templates.size()), 9, "templates", "output");
    const auto& o = t.options();
    auto arr = [&](int i) { return templates[i].cast<py::array>(); };
    CheckOutput(arr(0), DType::kInt32, {n}, "keys");
    CheckOutput(arr(1), DType::kFloat64, {n}, "probabilities");
    CheckOutput(arr(3), DType::kInt32, {n, 2, o.stack_size}, "index");
    CheckOutput(arr(4), DType::kInt32, {2}, "counts");
    CheckOutput(arr(6), DType::kFloat64, {n}, "reward");
    CheckOutput(arr(7), DType::kBool, {n}, "is_terminal");
    CheckOutput(arr(8), DType::kBool, {n}, "episode_end");
    py::array frames = arr(2), action = arr(5);
    const int64_t cap = TransitionStore::DistinctFramesCapacity(n, o.stack_size, granule);
    BytesOut(frames, static_cast<size_t>(cap) * o.frame_bytes, "frames");
    BytesOut(action, static_cast<size_t>(n) * o.action_bytes, "action");
  }

  // One generator per sampler thread (no lock): thread t's stream is seeded seed + t.
  static std::shared_ptr<std::vector<Rng>> ThreadRngs(int threads, uint64_t seed) {
    auto rngs = std::make_shared<std::vector<Rng>>();
    for (int t = 0; t < threads; ++t) rngs->emplace_back(seed + static_cast<uint64_t>(t));
    return rngs;
  }

  static Prefetcher::Fill DistinctFill(std::shared_ptr<TransitionStore> store, int64_t n,
                                       int64_t granule, int threads, uint64_t seed) {
    auto rngs = ThreadRngs(threads, seed);
    return [store, rngs, n, granule](int t, uint8_t* const* p) {
      return store->SampleDistinctFrames(
          &(*rngs)[t], n, granule, reinterpret_cast<int32_t*>(p[0]),
          reinterpret_cast<double*>(p[1]), p[2], reinterpret_cast<int32_t*>(p[3]),
          reinterpret_cast<int32_t*>(p[4]), p[5], reinterpret_cast<double*>(p[6]), p[7], p[8]);
    };
  }

  static Prefetcher::Fill StoreFill(std::shared_ptr<TransitionStore> store, int64_t n,
                                    int threads, uint64_t seed) {
    auto rngs = ThreadRngs(threads, seed);
    return [store, rngs, n](int t, uint8_t* const* p) {
      return store->SampleGather(&(*rngs)[t], n, reinterpret_cast<int32_t*>(p[0]),
                                 reinterpret_cast<double*>(p[1]), p[2], p[3],
                                 reinterpret_cast<double*>(p[4]), p[5], p[6], p[7]);
    };
  }

  Prefetcher::Fill MemoryFill(std::shared_ptr<ReplayMemory> rm, int64_t n) {
    const BatchLayout layout = layout_;
    const int frame_stack = frame_stack_;
    return [rm, n, layout, frame_stack](int, uint8_t* const* p) {
      ReplayMemory::SampleOut out;
      layout.Point(p, &out);
      out.frame_stack = frame_stack;
      int now = frame_stack;
      out.frame_stack_now = &now;
      Status s = rm->Sample(n, out);
      // The memory's frame_stack changed since the feed was sized: say so with the detail
      // "frame_stack" (the setting now; memoire.feed rebuilds the ring for the new layout).
      if (!s.ok() && now != frame_stack) s.With("frame_stack", now);
      return s;
    };
  }

  static Prefetcher::Fill CircularFill(std::shared_ptr<CircularBuffer> cb, int64_t n,
                                       int threads) {
    auto scratch = std::make_shared<std::vector<std::vector<int64_t>>>(
        threads, std::vector<int64_t>(n));
    const size_t extras = cb->schema().size() - CircularBuffer::kFirstExtra;
    const bool prioritized = cb->options().prioritized;
    return [cb, scratch, n, extras, prioritized](int t, uint8_t* const* p) {
      // The order OutputsFrom checked: Dopamine's transition elements.
      CircularBuffer::Outputs o;
      o.state = p[0];
      o.action = p[1];
      o.reward = p[2];
      o.next_state = p[3];
      o.next_action = p[4];
      o.next_reward = p[5];
      o.terminal = p[6];
      o.indices = reinterpret_cast<int32_t*>(p[7]);
      for (size_t e = 0; e < extras; ++e) o.extras.push_back(p[8 + e]);
      if (prioritized) o.probabilities = reinterpret_cast<float*>(p[8 + extras]);
      return cb->SampleAndGather(n, o, (*scratch)[t].data());
    };
  }

  // The parts handed out: a memory's or stream's batch (core/batch_layout.h), or the templates.
  BatchLayout layout_;
  int frame_stack_ = 0;  // ReplayMemory: the setting the layout was sized for
  std::function<void()> stop_;  // a stream source: ends a receive in progress
  std::shared_ptr<Prefetcher> ring_;
};

}  // namespace

FeedRing FeedRingOf(const py::object& feed) {
  if (py::isinstance<StreamSource>(feed)) return StreamSlotsOf(feed);
  const PyFeed& f = feed.cast<const PyFeed&>();
  if (!f.ring()) ThrowIfError(Error(Code::kFailedPrecondition, "the feed is closed"));
  FeedRing out{PrefetcherBatches(f.ring()), {}, {}, {}};
  for (const BatchPart& p : f.parts()) {
    out.dtypes.push_back(ToNumpy(p.dtype));
    out.shapes.emplace_back(p.shape.begin(), p.shape.end());
    out.none.push_back(p.none);
  }
  return out;
}

void BindFeed(py::module_& m) {
  py::class_<PyFeed>(m, "Feed", R"doc(
Native prefetching feed (private: use memoire.feed.Feed).

Feed(source, templates, batch_size, depth, threads, seed, frames_granule=0): `threads`
sampler threads (no GIL)
draw batches of `batch_size` from `source` (a TransitionStore, a CircularBuffer, a
ReplayMemory, or a sampling stream's StreamSource or list of them: thread t receives the
batches of connection t) into a ring of `depth` slots, each holding one 64-byte aligned
buffer per template array (its dtype and shape). Layouts: TransitionStore [keys int32[n],
probabilities float64[n], state, action, reward float64[n], next_state, is_terminal bool[n],
episode_end bool[n]], or with frames_granule > 0 the distinct frames of the stacks
(TransitionStore::SampleDistinctFrames) [keys, probabilities, frames dtype[capacity, *obs],
index int32[n, 2, stack], counts int32[2] (distinct, padded: distinct rounded up to a multiple
of frames_granule), action, reward, is_terminal, episode_end]; CircularBuffer Dopamine's transition elements in order; ReplayMemory
(templates ignored) prev[7], next[7] (None where the cache flags leave a field out), weight,
prob, done, id; a stream's (templates ignored) the same and num_sampleable int64[1],
total_weight float64[1]. take() returns the next batch as a tuple of arrays viewing a slot;
the slot is reused once every array of the batch is dropped. A failed draw raises on the take that
receives it. Thread-safe.
)doc")
      .def(py::init<const py::object&, const py::list&, int64_t, int, int, uint64_t, int64_t>(),
           py::arg("source"), py::arg("templates"), py::arg("batch_size"), py::arg("depth"),
           py::arg("threads"), py::arg("seed"), py::arg("frames_granule") = 0)
      .def_static("distinct_frames_capacity", &TransitionStore::DistinctFramesCapacity,
                  py::arg("batch_size"), py::arg("stack_size"), py::arg("granule"),
                  "Frames a slot holds with frames_granule: 2 * batch_size * stack_size "
                  "rounded up to a multiple of granule.")
      .def("take", &PyFeed::Take,
           "The next batch (tuple of arrays); blocks until one is ready. Raises the draw's error "
           "(KeyError, IndexError, RuntimeError, ValueError as the synchronous path), or "
           "RuntimeError when closed or when every slot is held by a batch still referenced.")
      .def("close", &PyFeed::Close, "Stops and joins the sampler threads (idempotent).")
      .def_property_readonly(
          "dtypes",
          [](const PyFeed& f) {
            py::list out;
            for (const BatchPart& p : f.parts())
              out.append(p.none ? py::object(py::none()) : py::object(ToNumpy(p.dtype)));
            return out;
          },
          "each part's numpy dtype (None for a part handed out as None)")
      .def_property_readonly("depth", &PyFeed::depth)
      .def_property_readonly("threads", &PyFeed::threads)
      .def_property_readonly("taken", &PyFeed::taken, "batches handed out so far")
      .def_property_readonly("filled", &PyFeed::filled, "draws completed so far (ok or not)");
}

}  // namespace memoire
