// Binds core/cache_ring.h for the server's cache mode (memoire/server.py): a received CACHE
// message goes in with one call (its header checked natively, its frames held, not copied) and
// a batch comes out with one call (rows gathered with the GIL released).
#include "core/cache_ring.h"

#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/common.h"
#include "core/codec.h"

namespace memoire {
namespace {

// The 0-d values of a cache message, after its columns in the wire spec.
constexpr const char* kScalarNames[3] = {"uuid", "num_sampleable", "total_weight"};
const DType kScalarTypes[3] = {DType::kUInt64, DType::kInt64, DType::kFloat64};

class PyCacheRing {
 public:
  PyCacheRing(const std::vector<std::tuple<std::string, py::object, std::vector<int64_t>>>& columns,
              int64_t cache_size, int64_t n_caches, uint64_t seed, uint64_t max_payload_bytes)
      : ring_(MakeColumns(columns), cache_size, n_caches, seed) {
    if (cache_size < 1) throw py::value_error("cache_size: expected >= 1, got " + std::to_string(cache_size));
    if (n_caches < 1) throw py::value_error("n_caches: expected >= 1, got " + std::to_string(n_caches));
    limits_.max_payload_bytes = max_payload_bytes;
    for (const Field& f : ring_.columns()) {
      std::vector<int64_t> shape{cache_size};
      shape.insert(shape.end(), f.shape.begin(), f.shape.end());
      spec_.push_back({f.name, f.dtype, shape, false});
    }
    for (int k = 0; k < 3; ++k) spec_.push_back({kScalarNames[k], kScalarTypes[k], {}, false});
  }

  // Checks a CACHE message's frames against the ring's layout and holds them.
  void Insert(const py::list& frames) {
    const size_t n_frames = frames.size();
    if (n_frames == 0) throw_protocol("empty message (no header frame)");
    std::vector<const uint8_t*> data(n_frames);
    std::vector<uint64_t> sizes(n_frames);
    for (size_t i = 0; i < n_frames; ++i) {
      // The bytes stay put while the frame object lives (held below), so the view can go.
      Py_buffer view;
      if (PyObject_GetBuffer(frames[i].ptr(), &view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        throw_protocol("frame " + std::to_string(i) + " is not a contiguous bytes-like object");
      }
      data[i] = static_cast<const uint8_t*>(view.buf);
      sizes[i] = static_cast<uint64_t>(view.len);
      PyBuffer_Release(&view);
    }
    codec::Message msg;
    ThrowIfError(codec::DecodeHeader(data[0], sizes[0], sizes.data() + 1, n_frames - 1, limits_, &msg));
    if (msg.type != codec::MsgType::kCache)
      throw_protocol(std::string("expected a cache message, got ") +
                     codec::MsgTypeName(static_cast<uint8_t>(msg.type)));
    int64_t batch = -1;
    ThrowIfError(codec::CheckArrays(msg, spec_, /*allow_extra=*/false, &batch));
    auto cache = std::make_shared<CacheRing::Cache>();
    cache->columns.assign(ring_.columns().size(), nullptr);
    const uint8_t* scalars[3] = {nullptr, nullptr, nullptr};
    for (const codec::Entry& e : msg.entries) {  // the check proved every spec entry present
      const uint8_t* p = data[1 + e.frame];
      for (size_t c = 0; c < ring_.columns().size(); ++c)
        if (e.name == ring_.columns()[c].name) cache->columns[c] = p;
      for (int k = 0; k < 3; ++k)
        if (e.name == kScalarNames[k]) scalars[k] = p;
    }
    std::memcpy(&cache->uuid, scalars[0], 8);
    std::memcpy(&cache->num_sampleable, scalars[1], 8);
    std::memcpy(&cache->total_weight, scalars[2], 8);
    // The frames stay alive while the ring or a batch being gathered uses them; the last user
    // may be a thread without the GIL.
    auto* keep = new py::object(frames);
    cache->owner = std::shared_ptr<const void>(keep, [](const void* p) {
      py::gil_scoped_acquire gil;
      delete static_cast<const py::object*>(p);
    });
    ring_.Insert(std::move(cache));
  }

  // [columns..., uuid, num_sampleable, total_weight], each with n rows.
  py::list GetBatch(int64_t n, bool reuse, double timeout, const py::object& out) {
    if (n < 1) throw py::value_error("batch_size: expected >= 1, got " + std::to_string(n));
    std::vector<py::array> arrays = Outputs(n, out);
    std::vector<uint8_t*> cols;
    for (size_t c = 0; c < ring_.columns().size(); ++c)
      cols.push_back(static_cast<uint8_t*>(arrays[c].mutable_data()));
    const size_t k = ring_.columns().size();
    auto* uuid = static_cast<uint64_t*>(arrays[k].mutable_data());
    auto* ns = static_cast<int64_t*>(arrays[k + 1].mutable_data());
    auto* tw = static_cast<double*>(arrays[k + 2].mutable_data());
    std::vector<CacheRing::Part> parts;
    CallReleased([&] {
      Status s = ring_.Take(n, reuse, timeout, &parts);
      if (s.ok()) ring_.Gather(parts, cols.data(), uuid, ns, tw);
      parts.clear();  // the last reference to an evicted cache may go here (its deleter takes the GIL)
      return s;
    });
    py::list result;
    for (auto& a : arrays) result.append(std::move(a));
    return result;
  }

  py::list Names() const {
    py::list names;
    for (const Field& f : ring_.columns()) names.append(f.name);
    for (const char* s : kScalarNames) names.append(s);
    return names;
  }

  CacheRing& ring() { return ring_; }

 private:
  static std::vector<Field> MakeColumns(
      const std::vector<std::tuple<std::string, py::object, std::vector<int64_t>>>& columns) {
    std::vector<Field> out;
    for (const auto& [name, dtype, shape] : columns)
      out.push_back({name, FromNumpy(py::dtype::from_args(dtype), name), shape});
    return out;
  }

  [[noreturn]] static void throw_protocol(const std::string& why) {
    ThrowIfError(Status(Code::kDataLoss, why));
    throw std::logic_error("unreachable");
  }

  // The arrays of `out` when they fit a batch of n rows exactly, else new ones.
  std::vector<py::array> Outputs(int64_t n, const py::object& out) const {
    const size_t k = ring_.columns().size();
    auto field = [&](size_t i) -> Field {
      return i < k ? ring_.columns()[i] : Field{kScalarNames[i - k], kScalarTypes[i - k], {}};
    };
    std::vector<py::array> arrays;
    if (!out.is_none() && py::isinstance<py::list>(out) && py::len(out) == k + 3) {
      py::list given = out;
      for (size_t i = 0; i < k + 3; ++i) {
        const Field f = field(i);
        if (!py::isinstance<py::array>(given[i])) break;
        py::array a = given[i];
        std::vector<int64_t> want{n};
        want.insert(want.end(), f.shape.begin(), f.shape.end());
        if (!a.writeable() || !(a.flags() & py::array::c_style) || ShapeOf(a) != want ||
            !a.dtype().equal(ToNumpy(f.dtype)))
          break;
        arrays.push_back(std::move(a));
      }
      if (arrays.size() == k + 3) return arrays;
      arrays.clear();
    }
    for (size_t i = 0; i < k + 3; ++i) arrays.push_back(NewArray(field(i), {n}));
    return arrays;
  }

  CacheRing ring_;
  std::vector<codec::ArraySpec> spec_;
  codec::Limits limits_;
};

}  // namespace

void BindCacheRing(py::module_& m) {
  py::class_<PyCacheRing>(m, "CacheRing", R"doc(
The caches a server holds in cache mode (core/cache_ring.h): the newest n_caches received
CACHE messages, held without copying, and batches gathered from them.

columns: [(name, dtype, row_shape)] of the per-row arrays of a cache, in wire order; a cache
message carries each as dtype[cache_size, *row_shape], plus 0-d uuid (uint64),
num_sampleable (int64) and total_weight (float64).
)doc")
      .def(py::init<const std::vector<std::tuple<std::string, py::object, std::vector<int64_t>>>&,
                    int64_t, int64_t, uint64_t, uint64_t>(),
           py::arg("columns"), py::arg("cache_size"), py::arg("n_caches"), py::arg("seed"),
           py::arg("max_payload_bytes") = uint64_t(1) << 32)
      .def("insert", &PyCacheRing::Insert, py::arg("frames"), R"doc(
Checks the frames of a CACHE message (header, then data frames; bytes-like objects such as
zmq.Frame) against the layout and holds them, evicting the oldest cache when n_caches are
held. Raises ProtocolError (holding nothing) when they do not match.)doc")
      .def("get_batch", &PyCacheRing::GetBatch, py::arg("n"), py::arg("reuse"),
           py::arg("timeout"), py::arg("out") = py::none(), R"doc(
n rows: [one array per column (dtype[n, *row_shape]), uuid, num_sampleable, total_weight
(per row)]. Without reuse each row is used once, oldest cache first, in a random order per
cache; with reuse rows are drawn uniformly with replacement. Waits up to `timeout` seconds
(GIL released) for enough rows. `out`: a list returned before, filled in place when every
array still fits, else ignored. Raises RuntimeError (taking nothing) when there are too few
rows, ValueError when n < 1.)doc")
      .def("close", [](PyCacheRing& self) { self.ring().Close(); },
           "Wakes every waiting get_batch, which then raises; later ones raise at once.")
      .def_property_readonly("names", &PyCacheRing::Names,
                             "Names of the arrays get_batch returns, in order.")
      .def_property_readonly("held", [](PyCacheRing& self) { return self.ring().held(); })
      .def_property_readonly("unused_rows", [](PyCacheRing& self) { return self.ring().unused_rows(); })
      .def_property_readonly("cache_size", [](PyCacheRing& self) { return self.ring().cache_size(); });
}

}  // namespace memoire
