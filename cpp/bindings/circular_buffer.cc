// Binds core::CircularBuffer as memoire._core.CircularBuffer, the one native object behind
// memoire.dopamine_compat's OutOfGraph(Prioritized)ReplayBuffer. Only conversions live here:
// the argument checks of Dopamine's add (count and shapes, as ValueErrors whose details let the
// compat layer word them as Dopamine does) and numpy's setitem casting, numpy outputs for
// sampling. Loops run in the core with the GIL released; errors are the core's Statuses.
#include "core/circular_buffer.h"

#include <pybind11/stl.h>

#include <climits>
#include <cmath>
#include <memory>
#include <sstream>

#include "bindings/common.h"

namespace memoire {
namespace {

using CB = CircularBuffer;

py::object NumpyAttr(const char* name) {
  return py::module_::import("numpy").attr(name);
}

// A Python tuple's text: "(84, 84)", "(3,)", "()".
std::string PyShapeText(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

// Dopamine's _check_add_types shape of one add argument: an ndarray's shape, np.array(x).shape
// for a tuple or list, () for anything else. `as_array` receives the array when one was made.
std::vector<int64_t> DopamineShape(const py::handle& obj, py::object* as_array) {
  if (py::isinstance<py::array>(obj)) {
    *as_array = py::reinterpret_borrow<py::object>(obj);
    return ShapeOf(py::reinterpret_borrow<py::array>(obj));
  }
  if (PyTuple_Check(obj.ptr()) || PyList_Check(obj.ptr())) {
    static PyObject* np_array = NumpyAttr("array").release().ptr();
    py::object a = py::reinterpret_steal<py::object>(
        PyObject_CallFunctionObjArgs(np_array, obj.ptr(), nullptr));
    if (!a) throw py::error_already_set();
    *as_array = a;
    return ShapeOf(py::reinterpret_borrow<py::array>(a));
  }
  return {};
}

// A ValueError for add argument `arg` (the schema field's index, or the priority's: the field
// count) of shape `got` where `want` was expected; detail "field" is `arg`.
[[noreturn]] void ThrowShape(const std::string& name, int64_t arg, const std::vector<int64_t>& got,
                             const std::vector<int64_t>& want) {
  ThrowIfError(Error(Code::kInvalidArgument, name, ": expected shape ", PyShapeText(want),
                     ", got ", PyShapeText(got))
                   .With("field", arg));
  std::abort();  // unreachable
}

// Writes a Python int/float/bool scalar into `out` as dtype t when numpy would store exactly
// that value; false when numpy's own conversion must decide (then the caller falls back).
bool FastScalar(const py::handle& obj, DType t, uint8_t* out) {
  PyObject* o = obj.ptr();
  if (PyBool_Check(o)) {
    const bool v = o == Py_True;
    switch (t) {
      case DType::kFloat32: { float f = v; std::memcpy(out, &f, 4); return true; }
      case DType::kFloat64: { double d = v; std::memcpy(out, &d, 8); return true; }
      case DType::kFloat16: return false;
      default:
        std::memset(out, 0, ItemSize(t));
        out[0] = v;  // little-endian
        return true;
    }
  }
  if (PyFloat_CheckExact(o)) {
    const double v = PyFloat_AS_DOUBLE(o);
    if (t == DType::kFloat32) { float f = static_cast<float>(v); std::memcpy(out, &f, 4); return true; }
    if (t == DType::kFloat64) { std::memcpy(out, &v, 8); return true; }
    return false;
  }
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    auto put = [&](auto x, long long lo, long long hi) {
      if (v < lo || v > hi) return false;
      decltype(x) y = static_cast<decltype(x)>(v);
      std::memcpy(out, &y, sizeof(y));
      return true;
    };
    switch (t) {
      case DType::kInt8: return put(int8_t{}, INT8_MIN, INT8_MAX);
      case DType::kUInt8: return put(uint8_t{}, 0, UINT8_MAX);
      case DType::kInt16: return put(int16_t{}, INT16_MIN, INT16_MAX);
      case DType::kUInt16: return put(uint16_t{}, 0, UINT16_MAX);
      case DType::kInt32: return put(int32_t{}, INT32_MIN, INT32_MAX);
      case DType::kUInt32: return put(uint32_t{}, 0, UINT32_MAX);
      case DType::kInt64: return put(int64_t{}, LLONG_MIN, LLONG_MAX);
      case DType::kUInt64: return put(uint64_t{}, 0, LLONG_MAX);
      default: return false;
    }
  }
  return false;
}

// One converted add argument: a pointer to field-shaped bytes and what keeps them alive.
struct Row {
  py::object keep;
  const void* ptr = nullptr;
  alignas(8) uint8_t scalar[16];
};

// numpy's `store[cursor] = obj` for one field: the bytes obj becomes in dtype f.dtype.
void ConvertRow(const py::handle& obj, const py::object& as_array, const Field& f, Row* row) {
  if (as_array) {
    py::array a = py::reinterpret_borrow<py::array>(as_array);
    if (a.dtype().equal(ToNumpy(f.dtype)) && (a.flags() & py::array::c_style)) {
      row->keep = a;
      row->ptr = a.data();
      return;
    }
  } else if (f.shape.empty() && FastScalar(obj, f.dtype, row->scalar)) {
    row->ptr = row->scalar;
    return;
  }
  static PyObject* np_empty = NumpyAttr("empty").release().ptr();
  std::vector<py::ssize_t> shape(f.shape.begin(), f.shape.end());
  py::tuple shape_t = py::cast(shape);
  py::object tmp = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(
      np_empty, shape_t.ptr(), ToNumpy(f.dtype).ptr(), nullptr));
  if (!tmp) throw py::error_already_set();
  if (PyObject_SetItem(tmp.ptr(), Py_Ellipsis, (as_array ? as_array : py::reinterpret_borrow<py::object>(obj)).ptr()) != 0)
    throw py::error_already_set();
  row->keep = tmp;
  row->ptr = py::reinterpret_borrow<py::array>(tmp).data();
}

void AddOne(CB& self, std::vector<py::handle> args, py::handle priority,
            const py::handle& episode_end) {
  const Schema& schema = self.schema();
  const size_t nf = schema.size();
  const bool prioritized = self.options().prioritized;
  const size_t expected = nf + (prioritized ? 1 : 0);
  const size_t received = args.size() + (priority.is_none() ? 0 : 1);
  if (received != expected)
    ThrowIfError(Error(Code::kInvalidArgument, "add: expected ", expected, " arguments, got ",
                       received)
                     .With("expected", static_cast<int64_t>(expected))
                     .With("received", static_cast<int64_t>(received)));
  if (prioritized && priority.is_none()) {  // given positionally, after the extras
    priority = args.back();
    args.pop_back();
  }
  // Shapes first, all of them, as Dopamine's _check_add_types does.
  std::vector<py::object> arrays(nf);
  for (size_t f = 0; f < nf; ++f) {
    std::vector<int64_t> got = DopamineShape(args[f], &arrays[f]);
    if (got != schema.field(f).shape)
      ThrowShape(schema.field(f).name, static_cast<int64_t>(f), got, schema.field(f).shape);
  }
  double p = 0.0;
  if (prioritized) {
    py::object unused;
    std::vector<int64_t> got = DopamineShape(priority, &unused);
    if (!got.empty()) ThrowShape("priority", static_cast<int64_t>(nf), got, {});
  }
  // `episode_end or terminal`, with Python's truth rules.
  int end = PyObject_IsTrue(episode_end.ptr());
  if (end < 0) throw py::error_already_set();
  if (!end) {
    end = PyObject_IsTrue(args[CB::kTerminal].ptr());
    if (end < 0) throw py::error_already_set();
  }
  Row rows[16];
  std::vector<Row> more(nf > 16 ? nf : 0);
  const void* ptrs_small[16];
  std::vector<const void*> ptrs_more(nf > 16 ? nf : 0);
  const void** ptrs = nf > 16 ? ptrs_more.data() : ptrs_small;
  for (size_t f = 0; f < nf; ++f) {
    Row* r = nf > 16 ? &more[f] : &rows[f];
    ConvertRow(args[f], arrays[f], schema.field(f), r);
    ptrs[f] = r->ptr;
  }
  if (prioritized) {
    p = PyFloat_AsDouble(priority.ptr());
    if (p == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  }
  CallReleased([&] { return self.Add(ptrs, end != 0, p); });
}

}  // namespace

// Checks `outs` (Dopamine's transition elements for a batch of n, in order) and points an
// Outputs at them. Shared with the feed (bindings/feed.cc).
CB::Outputs OutputsFrom(const CB& self, const py::list& outs, int64_t n) {
  const Schema& schema = self.schema();
  const size_t extras = schema.size() - CB::kFirstExtra;
  const size_t want = 8 + extras + (self.options().prioritized ? 1 : 0);
  CheckLength(static_cast<int64_t>(outs.size()), static_cast<int64_t>(want), "outputs",
              "transition element");
  const Field& obs = schema.field(CB::kObservation);
  std::vector<int64_t> state_shape{n};
  state_shape.insert(state_shape.end(), obs.shape.begin(), obs.shape.end());
  state_shape.push_back(self.options().stack_size);
  auto lead = [&](const Field& f) {
    std::vector<int64_t> s{n};
    s.insert(s.end(), f.shape.begin(), f.shape.end());
    return s;
  };
  auto ptr = [&](size_t i, DType t, const std::vector<int64_t>& shape, const char* what) {
    py::array a = outs[i].cast<py::array>();
    CheckOutput(a, t, shape, what);
    return static_cast<uint8_t*>(a.mutable_data());
  };
  CB::Outputs o;
  o.state = ptr(0, obs.dtype, state_shape, "state");
  o.action = ptr(1, schema.field(CB::kAction).dtype, lead(schema.field(CB::kAction)), "action");
  o.reward = ptr(2, schema.field(CB::kReward).dtype, lead(schema.field(CB::kReward)), "reward");
  o.next_state = ptr(3, obs.dtype, state_shape, "next_state");
  o.next_action = ptr(4, schema.field(CB::kAction).dtype, lead(schema.field(CB::kAction)), "next_action");
  o.next_reward = ptr(5, schema.field(CB::kReward).dtype, lead(schema.field(CB::kReward)), "next_reward");
  o.terminal = ptr(6, schema.field(CB::kTerminal).dtype, {n}, "terminal");
  o.indices = reinterpret_cast<int32_t*>(ptr(7, DType::kInt32, {n}, "indices"));
  for (size_t e = 0; e < extras; ++e) {
    const Field& f = schema.field(CB::kFirstExtra + e);
    o.extras.push_back(ptr(8 + e, f.dtype, lead(f), f.name.c_str()));
  }
  if (self.options().prioritized)
    o.probabilities = reinterpret_cast<float*>(ptr(8 + extras, DType::kFloat32, {n}, "sampling_probabilities"));
  return o;
}


void BindCircularBuffer(py::module_& m) {
  py::class_<CB, std::shared_ptr<CB>> c(m, "CircularBuffer", R"doc(
Storage and sampling of Dopamine's TF-era circular (and prioritized) replay buffer.

Private: use memoire.dopamine_compat.OutOfGraphReplayBuffer. Thread-safe.
)doc");
  c.def(py::init([](const std::vector<std::tuple<std::string, py::object, std::vector<int64_t>>>& fields,
                    int64_t capacity, int stack_size, int update_horizon, double gamma,
                    int64_t max_sample_attempts, bool prioritized, bool episode_end_breaks_stacks,
                    uint64_t seed) {
          std::vector<Field> fs;
          for (const auto& [name, dtype, shape] : fields) {
            Field f;
            f.name = name;
            f.dtype = FromNumpy(py::dtype::from_args(dtype), name);
            f.shape = shape;
            fs.push_back(f);
          }
          Schema schema;
          ThrowIfError(Schema::Make(fs, &schema));
          CB::Options o;
          o.capacity = capacity;
          o.stack_size = stack_size;
          o.update_horizon = update_horizon;
          o.gamma = gamma;
          o.max_sample_attempts = max_sample_attempts;
          o.prioritized = prioritized;
          o.episode_end_breaks_stacks = episode_end_breaks_stacks;
          o.seed = seed;
          std::unique_ptr<CB> out;
          ThrowIfError(CB::Make(schema, o, &out));
          return std::shared_ptr<CB>(std::move(out));
        }),
        py::arg("fields"), py::arg("capacity"), py::arg("stack_size"), py::arg("update_horizon"),
        py::arg("gamma"), py::arg("max_sample_attempts"), py::arg("prioritized"),
        py::arg("episode_end_breaks_stacks"), py::arg("seed"));

  c.def("add",
        [](CB& self, py::handle obs, py::handle action, py::handle reward, py::handle terminal,
           py::tuple extras, py::handle priority, py::handle episode_end) {
          std::vector<py::handle> args{obs, action, reward, terminal};
          for (auto e : extras) args.push_back(e);
          AddOne(self, args, priority, episode_end);
        },
        py::arg("observation"), py::arg("action"), py::arg("reward"), py::arg("terminal"),
        py::arg("extras"), py::arg("priority"), py::arg("episode_end"),
        "One Dopamine add(): checks count and shapes, casts like numpy's setitem, stores.");
  c.def("add_batch",
        [](CB& self, const py::list& columns, const py::handle& episode_end,
           const py::handle& priorities) {
          const Schema& schema = self.schema();
          CheckLength(static_cast<int64_t>(columns.size()), static_cast<int64_t>(schema.size()),
                      "add_batch: columns", "field");
          auto ends = ArrayOf<uint8_t>(episode_end, "episode_end");
          if (ends.ndim() != 1) ThrowInvalid("episode_end: expected a 1-D array");
          const int64_t k = ends.shape(0);
          std::vector<py::array> keep;
          std::vector<const void*> ptrs;
          for (size_t f = 0; f < schema.size(); ++f) {
            Field fd = schema.field(f);
            fd.shape.insert(fd.shape.begin(), k);
            keep.push_back(CoerceRow(columns[f], fd, schema.field(f).name));
            ptrs.push_back(keep.back().data());
          }
          InArray<double> pr;
          const double* pp = nullptr;
          if (!priorities.is_none()) {
            pr = ArrayOf<double>(priorities, "priorities");
            if (pr.ndim() != 1) ThrowInvalid("priorities: expected a 1-D array");
            CheckLength(pr.shape(0), k, "priorities", "row");
            pp = pr.data();
          }
          const uint8_t* ep = ends.data();
          CallReleased([&] { return self.AddBatch(k, ptrs.data(), ep, pp); });
        },
        py::arg("columns"), py::arg("episode_end"), py::arg("priorities"),
        "k adds at once: columns[f] is [k, *shape_f]; episode_end uint8[k]; priorities float64[k].");

  c.attr("MAX_ADD_COUNT") = CB::kMaxAddCount;
  c.def_property("add_count", &CB::add_count, [](CB& self, const py::int_& v) {
    int overflow = 0;
    const long long count = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow)  // beyond int64: the core's range check would never see it
      ThrowInvalid("add_count: expected 0 <= add_count <= 2**62, got " +
                   py::str(v).cast<std::string>());
    ThrowIfError(self.set_add_count(count));
  });
  c.def_property("next_is_episode_start", &CB::next_is_episode_start,
                 &CB::set_next_is_episode_start);
  c.def_property_readonly("capacity", &CB::capacity);
  c.def_property_readonly("padded_leaves", &CB::padded_leaves);
  c.def("seed", &CB::Seed, py::arg("seed"));

  c.def("is_valid", [](const CB& self, int64_t i) { return self.IsValid(i); }, py::arg("index"));
  c.def("is_valid_many",
        [](const CB& self, const py::handle& idx) {
          auto a = ArrayOf<int64_t>(idx, "indices");
          py::array_t<bool> out(a.size());
          const int64_t* ip = a.data();
          uint8_t* op = reinterpret_cast<uint8_t*>(out.mutable_data());
          const int64_t n = a.size();
          {
            GilRelease release;
            self.IsValidMany(ip, n, op);
          }
          return out;
        },
        py::arg("indices"), "bool[n]: Dopamine's is_valid_transition of each index.");

  c.def("sample_indices",
        [](CB& self, int64_t n) {
          CheckCount(n, "batch_size");
          py::array_t<int64_t> out(n);
          int64_t* op = out.mutable_data();
          CallReleased([&] { return self.SampleIndices(n, op); });
          return out;
        },
        py::arg("batch_size"));
  c.def("gather",
        [](const CB& self, const py::handle& indices, const py::list& outs) {
          auto idx = ArrayOf<int64_t>(indices, "indices");
          const int64_t n = idx.size();
          CB::Outputs o = OutputsFrom(self, outs, n);
          const int64_t* ip = idx.data();
          CallReleased([&] { return self.Gather(ip, n, o); });
        },
        py::arg("indices"), py::arg("outputs"),
        "Fills `outputs` (Dopamine's transition elements, in order) for `indices`.");
  c.def("sample_into",
        [](CB& self, int64_t n, const py::list& outs) {
          CheckCount(n, "batch_size");
          CB::Outputs o = OutputsFrom(self, outs, n);
          py::array_t<int64_t> idx(n);
          int64_t* ip = idx.mutable_data();
          CallReleased([&] { return self.SampleAndGather(n, o, ip); });
          return idx;
        },
        py::arg("batch_size"), py::arg("outputs"),
        "Samples `batch_size` valid indices and fills `outputs`; returns the indices.");

  c.def("set_priorities",
        [](CB& self, const py::handle& indices, const py::handle& priorities) {
          auto idx = ArrayOf<int64_t>(indices, "indices");
          auto pr = ArrayOf<double>(priorities, "priorities");
          CheckLength(pr.size(), idx.size(), "priorities", "index");
          const int64_t* ip = idx.data();
          const double* pp = pr.data();
          const int64_t n = idx.size();
          CallReleased([&] { return self.SetPriorities(ip, pp, n); });
        },
        py::arg("indices"), py::arg("priorities"));
  c.def("get_priorities",
        [](const CB& self, const py::handle& indices) {
          auto idx = ArrayOf<int64_t>(indices, "indices");
          py::array_t<double> out(idx.size());
          const int64_t* ip = idx.data();
          double* op = out.mutable_data();
          const int64_t n = idx.size();
          CallReleased([&] { return self.GetPriorities(ip, n, op); });
          return out;
        },
        py::arg("indices"));
  c.def_property("max_recorded_priority", &CB::max_recorded_priority,
                 &CB::set_max_recorded_priority);
  c.def_property_readonly("total_priority", &CB::total_priority);
  c.def("sample_tree",
        [](CB& self, int64_t n, bool stratified) {
          CheckCount(n, "batch_size");
          py::array_t<int64_t> out(n);
          int64_t* op = out.mutable_data();
          CallReleased([&] { return self.SampleTree(n, stratified, op); });
          return out;
        },
        py::arg("batch_size"), py::arg("stratified"));

  c.def("episode_ends", &CB::EpisodeEnds);
  c.def("set_episode_ends",
        [](CB& self, const std::vector<int64_t>& ends) { ThrowIfError(self.SetEpisodeEnds(ends)); },
        py::arg("slots"));
  c.def("restore_from",
        [](CB& self, CB& staging, int64_t add_count, const std::vector<int64_t>& ends,
           const py::handle& leaves, double max_recorded) {
          InArray<double> lv;
          const double* lp = nullptr;
          if (!leaves.is_none()) {
            lv = ArrayOf<double>(leaves, "restore_from: priorities");
            CheckLength(lv.size(), self.capacity(), "restore_from: priorities", "slot");
            lp = lv.data();
          }
          CallReleased(
              [&] { return self.RestoreFrom(&staging, add_count, ends, lp, max_recorded); });
        },
        py::arg("staging"), py::arg("add_count"), py::arg("episode_ends"), py::arg("priorities"),
        py::arg("max_recorded_priority"),
        "Replaces the whole state, taking the columns of `staging` (a buffer of the same fields "
        "and capacity, filled through its column() views) without copying them; `staging` is "
        "left reading zeros. Checked first; a failed call changes nothing.");
  c.def("column",
        [](py::object self_obj, int f) {
          CB& self = self_obj.cast<CB&>();
          const int64_t fields = static_cast<int64_t>(self.schema().size());
          if (f < 0 || f >= fields)
            ThrowIfError(Error(Code::kOutOfRange, "column: expected a field in [0, ", fields,
                               "), got ", f)
                             .With("index", f)
                             .With("bound", fields));
          const Field& fd = self.schema().field(f);
          std::vector<py::ssize_t> shape{self.capacity()};
          shape.insert(shape.end(), fd.shape.begin(), fd.shape.end());
          return py::array(ToNumpy(fd.dtype), shape, self.column(f), self_obj);
        },
        py::arg("field"),
        "A numpy view of field `field`'s storage [capacity, *shape]; alive as long as the view.");
}

}  // namespace memoire
