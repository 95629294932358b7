// Binds core/cache_ring.h for the server's cache mode (memoire/server.py): a received CACHE
// message goes in with one call (its header checked natively, its frames held, not copied) and
// a batch comes out with one call (rows gathered with the GIL released).
#include "core/cache_ring.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "bindings/frames.h"
#include "core/libzmq.h"
#include "core/codec.h"
#include "core/protocol.h"

namespace memoire {
namespace {

// The 0-d values of a cache message, after its columns in the wire spec.
using protocol::kCacheScalars;
constexpr size_t kScalars = protocol::kNumCacheScalars;  // uuid, num_sampleable, total_weight
static_assert(kScalars == 3, "GetBatch fills the three cache values by type");

using ColumnSpecs = std::vector<std::tuple<std::string, py::object, std::vector<int64_t>>>;

class PyCacheRing {
 public:
  PyCacheRing(const ColumnSpecs& columns, int64_t cache_size, int64_t n_caches, uint64_t seed,
              uint64_t max_payload_bytes)
      : n_caches_(n_caches), rng_(seed) {
    if (n_caches < 1) throw py::value_error("n_caches: expected >= 1, got " + std::to_string(n_caches));
    limits_.max_payload_bytes = max_payload_bytes;
    Relayout(columns, cache_size);
  }

  bool allow_nonfinite() const { return allow_nonfinite_.load(); }
  void set_allow_nonfinite(bool v) { allow_nonfinite_.store(v); }

  // Starts over with another layout (the settings changed): held caches are dropped, and a
  // get_batch waiting on the old layout goes on waiting on the new one.
  void Relayout(const ColumnSpecs& columns, int64_t cache_size) {
    if (cache_size < 1) throw py::value_error("cache_size: expected >= 1, got " + std::to_string(cache_size));
    auto next = std::make_shared<Layout>();
    std::vector<Field> fields;
    for (const auto& [name, dtype, shape] : columns)
      fields.push_back({name, FromNumpy(py::dtype::from_args(dtype), name), shape});
    next->spec = CacheMessageSpec(fields, cache_size);
    std::shared_ptr<Layout> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      next->ring = std::make_shared<CacheRing>(std::move(fields), cache_size, n_caches_, rng_.Next());
      old = std::move(current_);
      current_ = std::move(next);
    }
    if (old) old->ring->Close();  // wakes its waiters, who move to the new layout
  }

  // Checks a CACHE message's frames (Python frames) against the ring's layout and holds them.
  void Insert(const py::list& frames) {
    auto held = std::make_unique<HeldFrames>();
    for (size_t i = 0; i < frames.size(); ++i)
      if (!held->Add(frames[i].ptr()))
        ThrowIfError(Error(Code::kDataLoss, "frame ", i, " is not a contiguous bytes-like object"));
    const std::vector<codec::Frame> fr = held->frames();
    ThrowIfError(InsertFrames(fr, HeldFrames::Owned(std::move(held))));
  }

  // Receives from a PULL socket (pyzmq's `Socket.underlying`) with the GIL released: waits up
  // to timeout_ms for a message, then takes what is queued, up to max_messages. Caches go into
  // the ring; the first other message (or a cache that does not fit) stops the call and is
  // handed back. Returns (caches held, frames of that message or None).
  py::tuple Receive(uintptr_t socket, int timeout_ms, int max_messages) {
    if (!libzmq::Attached()) throw std::runtime_error("receive: libzmq is not attached");
    int64_t held = 0;
    std::shared_ptr<libzmq::Frames> other;
    std::string error;
    {
      GilRelease release;
      error = libzmq::ReceiveEach(
          reinterpret_cast<void*>(socket), timeout_ms, max_messages,
          [&](std::shared_ptr<libzmq::Frames> frames, const std::vector<codec::Frame>& fr) {
            // A cache that does not fit goes back too: the settings may have changed since
            // this call began, which the Python side applies before it checks it again.
            if (!codec::IsCurrent(fr[0], codec::MsgType::kCache) || !InsertFrames(fr, frames).ok()) {
              other = std::move(frames);
              return false;
            }
            ++held;
            return true;
          });
    }
    if (!error.empty()) throw std::runtime_error("receive: " + error);
    return py::make_tuple(held, other ? py::object(FramesToArrays(other)) : py::object(py::none()));
  }

  // {name: array} of n rows: one array per column (dtype[n, *row_shape]) and uuid,
  // num_sampleable and total_weight per row. A batch that is one whole cache, when no `out`
  // fits, is made of read-only views of the received frames (no copy).
  py::dict GetBatch(int64_t n, bool reuse, double timeout, const py::object& out) {
    if (n < 1) throw py::value_error("batch_size: expected >= 1, got " + std::to_string(n));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, timeout));
    while (true) {
      std::shared_ptr<Layout> layout = Current();
      const CacheRing& ring = *layout->ring;
      const std::vector<Field>& columns = ring.columns();
      const size_t k = columns.size();
      std::vector<py::array> arrays = Given(columns, n, out);
      // A stratified cache taken whole is a sample as it is; a part of one is not (its rows
      // come in memory order), so only whole caches are lent without a copy.
      const bool may_lend = arrays.empty() && !reuse && n == ring.cache_size();
      std::vector<CacheRing::Part> parts;
      bool relaid = false;
      Status s;
      {
        GilRelease release;
        const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
        s = layout->ring->Take(n, reuse, std::max(0.0, left), &parts);
        relaid = !s.ok() && Current() != layout;
      }
      if (relaid && std::chrono::steady_clock::now() < deadline) continue;
      ThrowIfError(s);
      py::dict result;
      if (may_lend && parts.size() == 1) {
        auto* hold = new std::shared_ptr<const CacheRing::Cache>(parts[0].cache);
        py::capsule owner(hold, [](void* p) { delete static_cast<std::shared_ptr<const CacheRing::Cache>*>(p); });
        for (size_t c = 0; c < k; ++c) {
          std::vector<py::ssize_t> shape{n};
          shape.insert(shape.end(), columns[c].shape.begin(), columns[c].shape.end());
          result[py::str(columns[c].name)] =
              ReadOnlyView(ToNumpy(columns[c].dtype), shape, (*hold)->columns[c], owner);
        }
        for (size_t c = k; c < k + kScalars; ++c) arrays.push_back(NewArray(Column(columns, c), {n}));
        parts[0].rows.clear();  // Gather below fills only the per-row cache values
      } else if (arrays.empty()) {
        for (size_t c = 0; c < k + kScalars; ++c) arrays.push_back(NewArray(Column(columns, c), {n}));
      }
      std::vector<uint8_t*> cols;
      for (size_t c = 0; c + kScalars < arrays.size(); ++c) cols.push_back(static_cast<uint8_t*>(arrays[c].mutable_data()));
      auto* uuid = static_cast<uint64_t*>(arrays[arrays.size() - 3].mutable_data());
      auto* ns = static_cast<int64_t*>(arrays[arrays.size() - 2].mutable_data());
      auto* tw = static_cast<double*>(arrays[arrays.size() - 1].mutable_data());
      {
        GilRelease release;
        if (cols.empty()) {  // lent: the cache values of its n rows
          std::fill(uuid, uuid + n, parts[0].cache->uuid);
          std::fill(ns, ns + n, parts[0].cache->num_sampleable);
          std::fill(tw, tw + n, parts[0].cache->total_weight);
        } else {
          ring.Gather(parts, cols.data(), uuid, ns, tw);
        }
        parts.clear();  // the last reference to an evicted cache may go here (its owner takes the GIL)
      }
      for (size_t c = 0; c + kScalars < arrays.size(); ++c) result[py::str(columns[c].name)] = arrays[c];
      for (size_t j = 0; j < kScalars; ++j) result[kCacheScalars[j].name] = arrays[arrays.size() - kScalars + j];
      return result;
    }
  }

  void Close() { Current()->ring->Close(); }
  int64_t held() { return Current()->ring->held(); }
  int64_t unused_rows() { return Current()->ring->unused_rows(); }

 private:
  struct Layout {
    std::shared_ptr<CacheRing> ring;
    std::vector<codec::ArraySpec> spec;  // of a cache message
  };

  std::shared_ptr<Layout> Current() {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }

  // Checks a CACHE message (header frame, then data frames) and holds it. No Python.
  Status InsertFrames(const std::vector<codec::Frame>& frames, std::shared_ptr<const void> owner) {
    std::shared_ptr<Layout> layout = Current();
    const std::vector<Field>& columns = layout->ring->columns();
    auto cache = std::make_shared<CacheRing::Cache>();
    MEMOIRE_RETURN_IF_ERROR(DecodeCacheMessage(frames.data(), frames.size(), limits_, columns,
                                               layout->spec, cache.get()));
    MEMOIRE_RETURN_IF_ERROR(CheckFinite(columns, cache->columns, layout->ring->cache_size(),
                                        cache->total_weight));
    cache->owner = std::move(owner);
    layout->ring->Insert(std::move(cache));
    return Status::OK();
  }

  // The memory's rule (ReplayMemory::CheckFinite) for a cache: weight, prob and total_weight
  // finite, and the r, p, v, q stacks unless allow_nonfinite. kInvalidArgument names the first.
  Status CheckFinite(const std::vector<Field>& columns, const std::vector<const uint8_t*>& data,
                     int64_t rows, double total_weight) const {
    if (!std::isfinite(total_weight))
      return Error(Code::kInvalidArgument, "total_weight: expected a finite value, got ",
                   total_weight);
    const bool allow = allow_nonfinite_.load();
    for (size_t c = 0; c < columns.size(); ++c) {
      const std::string& name = columns[c].name;
      const bool weight = name == "weight" || name == "prob";
      const std::string tail = name.size() > 2 ? name.substr(name.size() - 2) : "";
      if (!weight && (allow || (tail != "/r" && tail != "/p" && tail != "/v" && tail != "/q")))
        continue;
      double x = 0;
      const int64_t per_row = columns[c].num_elements();
      const int64_t j = FirstNonFinite(columns[c].dtype, data[c], rows * per_row, &x);
      if (j >= 0)
        return Error(Code::kInvalidArgument, name, ": expected finite values, got ", x, " (row ",
                     j / std::max<int64_t>(per_row, 1), ")");
    }
    return Status::OK();
  }

  // Column c of a batch: a cache column, then uuid, num_sampleable and total_weight.
  static Field Column(const std::vector<Field>& columns, size_t c) {
    const size_t k = columns.size();
    return c < k ? columns[c] : Field{kCacheScalars[c - k].name, kCacheScalars[c - k].dtype, {}};
  }

  // The arrays of `out` ({name: array}) when every one still fits n rows, else none.
  static std::vector<py::array> Given(const std::vector<Field>& columns, int64_t n,
                                      const py::object& out) {
    std::vector<py::array> arrays;
    if (!py::isinstance<py::dict>(out)) return arrays;
    py::dict given = out;
    for (size_t c = 0; c < columns.size() + kScalars; ++c) {
      const Field f = Column(columns, c);
      py::object a = given.attr("get")(f.name);
      if (!py::isinstance<py::array>(a)) return {};
      py::array arr = a;
      std::vector<int64_t> want{n};
      want.insert(want.end(), f.shape.begin(), f.shape.end());
      if (!arr.writeable() || !(arr.flags() & py::array::c_style) || ShapeOf(arr) != want ||
          !arr.dtype().equal(ToNumpy(f.dtype)))
        return {};
      arrays.push_back(std::move(arr));
    }
    return arrays;
  }

  const int64_t n_caches_;
  codec::Limits limits_;
  std::atomic<bool> allow_nonfinite_{false};
  std::mutex mu_;
  std::shared_ptr<Layout> current_;
  Rng rng_;  // seeds each layout's ring
};

}  // namespace

void BindCacheRing(py::module_& m) {
  m.def("attach_libzmq", [](const std::string& path) -> py::object {
    std::string error;
    if (libzmq::Attach(path, &error)) return py::none();
    return py::str(error);
  }, py::arg("path"), "Binds the libzmq that pyzmq loaded (its file path) for the native paths; "
                      "returns None, or why it could not.");

  py::class_<PyCacheRing>(m, "CacheRing", R"doc(
The caches a server holds in cache mode (core/cache_ring.h): the newest n_caches received
CACHE messages, held without copying, and batches gathered from them.

columns: [(name, dtype, row_shape)] of the per-row arrays of a cache, in wire order; a cache
message carries each as dtype[cache_size, *row_shape], plus 0-d uuid (uint64),
num_sampleable (int64) and total_weight (float64).
)doc")
      .def(py::init<const ColumnSpecs&, int64_t, int64_t, uint64_t, uint64_t>(),
           py::arg("columns"), py::arg("cache_size"), py::arg("n_caches"), py::arg("seed"),
           py::arg("max_payload_bytes") = uint64_t(1) << 32)
      .def("insert", &PyCacheRing::Insert, py::arg("frames"), R"doc(
Checks the frames of a CACHE message (header, then data frames; bytes-like objects such as
zmq.Frame) against the layout and holds them, evicting the oldest cache when n_caches are
held. Raises ProtocolError (holding nothing) when they do not match, ValueError when a
weight, prob or total_weight, or (unless allow_nonfinite) an r, p, v or q value is NaN or
infinite.)doc")
      .def("receive", &PyCacheRing::Receive, py::arg("socket"), py::arg("timeout_ms"),
           py::arg("max_messages") = 256, R"doc(
Receives from a PULL socket (its `underlying` address; requires attach_libzmq) with the GIL
released: waits up to timeout_ms for a message, then takes what is queued (up to
max_messages). Caches go into the ring. Returns (caches held, frames of the first message it
did not hold -- another kind, or a cache that does not fit -- as read-only uint8 arrays, or
None). Raises RuntimeError on a socket error.)doc")
      .def("get_batch", &PyCacheRing::GetBatch, py::arg("n"), py::arg("reuse"),
           py::arg("timeout"), py::arg("out") = py::none(), R"doc(
{name: array} of n rows: one array per column (dtype[n, *row_shape]) and uuid,
num_sampleable, total_weight per row. Without reuse each row is used once, oldest cache
first, in a random order per cache; with reuse rows are drawn uniformly with replacement.
Waits up to `timeout` seconds (GIL released) for enough rows. `out`: a dict returned
before, filled in place when every array still fits, else ignored. Raises RuntimeError (taking nothing) when there are too few
rows, ValueError when n < 1.)doc")
      .def("relayout", &PyCacheRing::Relayout, py::arg("columns"), py::arg("cache_size"),
           "Starts over with another layout (settings changed): held caches are dropped; a "
           "waiting get_batch waits on for the new layout.")
      .def("close", &PyCacheRing::Close,
           "Wakes every waiting get_batch, which then raises; later ones raise at once.")
      .def_property(
          "allow_nonfinite", &PyCacheRing::allow_nonfinite, &PyCacheRing::set_allow_nonfinite,
          "Hold caches whose r, p, v, q stacks hold NaN or infinities (default False).")
      .def_property_readonly("held", &PyCacheRing::held)
      .def_property_readonly("unused_rows", &PyCacheRing::unused_rows);
}

}  // namespace memoire
