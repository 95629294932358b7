// Binds core/chunk_ingest.h as memoire._core.ChunkIngest for the server's PULL worker: one call
// per received message takes the frames (zmq.Frame, bytes: anything with the buffer protocol),
// holds their buffers while the core's streams point into them, and runs the checks, the stream
// bookkeeping and any commit with the GIL released.
#include "core/chunk_ingest.h"

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bindings/common.h"

namespace memoire {
namespace {

// Buffers of one message's frames, held (each with a reference to its frame) until the core
// releases them. Created and destroyed with the GIL held.
class HeldFrames {
 public:
  HeldFrames() = default;
  HeldFrames(const HeldFrames&) = delete;
  HeldFrames& operator=(const HeldFrames&) = delete;
  ~HeldFrames() {
    for (Py_buffer& v : views_) PyBuffer_Release(&v);
  }
  // False (and the Python error cleared) when `obj` does not export a buffer.
  bool Add(PyObject* obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      return false;
    }
    views_.push_back(v);
    return true;
  }
  std::vector<ChunkIngest::Frame> frames() const {
    std::vector<ChunkIngest::Frame> out(views_.size());
    for (size_t k = 0; k < views_.size(); ++k)
      out[k] = {static_cast<const uint8_t*>(views_[k].buf), static_cast<uint64_t>(views_[k].len)};
    return out;
  }

 private:
  std::vector<Py_buffer> views_;
};

class PyChunkIngest {
 public:
  PyChunkIngest(std::shared_ptr<ReplayMemory> memory, uint64_t max_message_bytes,
                int64_t max_streams, double stream_timeout) {
    ChunkIngest::Options o;
    o.max_message_bytes = max_message_bytes;
    o.max_streams = max_streams;
    o.stream_timeout = stream_timeout;
    ThrowIfError(ChunkIngest::Make(std::move(memory), o, &core_));
  }

  // None for a message that is not a current-version chunk (or whose frames export no
  // buffer); else (outcome, rows, reason, reason_count, detail) with outcome 1 staged,
  // 2 committed, 3 rejected.
  py::object Ingest(const py::sequence& frames, const py::object& now_obj) {
    const double now = now_obj.is_none()
                           ? std::chrono::duration<double>(
                                 std::chrono::steady_clock::now().time_since_epoch()).count()
                           : now_obj.cast<double>();
    auto held = std::make_unique<HeldFrames>();
    const size_t n = frames.size();
    if (n == 0 || !held->Add(frames[0].ptr())) return py::none();
    // Other messages (caches, logs) go back at once, without a GIL round trip.
    uint16_t version = 0;
    uint8_t type = 0;
    const ChunkIngest::Frame header = held->frames()[0];
    if (!codec::PeekVersion(header.data, header.size, &version, &type) ||
        version != codec::kWireVersion || type != static_cast<uint8_t>(codec::MsgType::kChunk))
      return py::none();
    for (size_t k = 1; k < n; ++k)
      if (!held->Add(frames[k].ptr())) return py::none();
    const std::vector<ChunkIngest::Frame> fr = held->frames();
    const uint64_t owner = next_owner_++;
    held_.emplace(owner, std::move(held));  // before the call: another thread may release it
    ChunkIngest::Result r;
    {
      py::gil_scoped_release release;
      core_->Ingest(owner, fr.data(), fr.size(), now, &r);
    }
    for (uint64_t o : r.released) held_.erase(o);
    if (r.outcome == ChunkIngest::Outcome::kNotChunk) return py::none();
    if (r.outcome != ChunkIngest::Outcome::kRejected)
      return py::make_tuple(static_cast<int>(r.outcome), r.rows, py::none(), 0, py::none());
    return py::make_tuple(static_cast<int>(r.outcome), r.rows, ChunkIngest::ReasonName(r.reason),
                          r.reason_count, r.detail);
  }

  py::dict Counters() const {
    const ChunkIngest::Counters c = core_->counters();
    py::dict rejected;
    for (int k = 0; k < ChunkIngest::kNumReasons; ++k)
      if (c.rejected[k]) rejected[ChunkIngest::ReasonName(k)] = c.rejected[k];
    py::dict out;
    out["chunks"] = c.chunks;
    out["open_streams"] = c.open_streams;
    out["rejected"] = rejected;
    out["frames_held"] = held_.size();
    return out;
  }

  ChunkIngest& core() { return *core_; }

 private:
  std::unique_ptr<ChunkIngest> core_;
  std::unordered_map<uint64_t, std::unique_ptr<HeldFrames>> held_;  // guarded by the GIL
  uint64_t next_owner_ = 1;                                         // guarded by the GIL
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
Central mode's receiving end (core/chunk_ingest.h): checks episode-chunk messages against a
memory's schema, keeps per-actor streams and commits finished episodes into the memory.
Rejections are counted by reason ("malformed", "abandoned_episode", "out_of_order_chunk",
"stream_limit", "stale_episode", "episode_too_long", "bad_episode"). Thread-safe.
)doc");
  c.def(py::init<std::shared_ptr<ReplayMemory>, uint64_t, int64_t, double>(), py::arg("memory"),
        py::arg("max_message_bytes") = uint64_t(1) << 30, py::arg("max_streams") = 4096,
        py::arg("stream_timeout") = 600.0);
  c.def("ingest", &PyChunkIngest::Ingest, py::arg("frames"), py::arg("now") = py::none(),
        "Takes one received message ([header, data...]). None when it is not a current-version "
        "chunk; else (outcome, rows, reason, reason_count, detail): outcome 1 staged (rows of "
        "the chunk), 2 committed (rows of the stored episode; 0: an empty episode, nothing "
        "stored), 3 rejected (reason name, how many so far, what was wrong). `now`: monotonic "
        "seconds (default: the steady clock). Never raises for what a peer sent.");
  c.def("counters", &PyChunkIngest::Counters,
        "{'chunks', 'open_streams', 'rejected': {reason: count}, 'frames_held'}.");
  c.def_property(
      "max_streams", [](PyChunkIngest& self) { return self.core().options().max_streams; },
      [](PyChunkIngest& self, int64_t v) { SetOption(self, &ChunkIngest::Options::max_streams, v); });
  c.def_property(
      "stream_timeout", [](PyChunkIngest& self) { return self.core().options().stream_timeout; },
      [](PyChunkIngest& self, double v) {
        SetOption(self, &ChunkIngest::Options::stream_timeout, v);
      });
  c.def_property(
      "max_message_bytes",
      [](PyChunkIngest& self) { return self.core().options().max_message_bytes; },
      [](PyChunkIngest& self, uint64_t v) {
        SetOption(self, &ChunkIngest::Options::max_message_bytes, v);
      });
}

}  // namespace memoire
