#include "bindings/common.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <type_traits>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace memoire {

namespace {
// Raw references kept for the life of the process: a static py::object would be destroyed
// after the interpreter has finalised.
PyObject* g_protocol_error = nullptr;
PyObject* g_capacity_error = nullptr;
}  // namespace

void RegisterErrors(py::module_& m) {
  // Both subclass ValueError: a malformed message and an episode that cannot fit are bad input.
  g_protocol_error = PyErr_NewException("memoire._core.ProtocolError", PyExc_ValueError, nullptr);
  g_capacity_error = PyErr_NewException("memoire._core.CapacityError", PyExc_ValueError, nullptr);
  m.add_object("ProtocolError", py::handle(g_protocol_error).inc_ref());
  m.add_object("CapacityError", py::handle(g_capacity_error).inc_ref());
  m.attr("ProtocolError").attr("__doc__") =
      "A message or file that does not follow memoire's format (truncated, wrong version, "
      "bounds). Subclass of ValueError.";
  m.attr("CapacityError").attr("__doc__") =
      "The data cannot fit the memory (an episode longer than max_step). Subclass of ValueError.";
}

void ThrowIfError(const Status& s) {
  if (s.ok()) return;
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case Code::kOk: return;
    case Code::kInvalidArgument: type = PyExc_ValueError; break;
    case Code::kOutOfRange: type = PyExc_IndexError; break;
    case Code::kNotFound: type = PyExc_KeyError; break;
    case Code::kFailedPrecondition: type = PyExc_RuntimeError; break;
    case Code::kResourceExhausted: type = g_capacity_error; break;
    case Code::kDataLoss: type = g_protocol_error; break;
    case Code::kInternal: type = PyExc_RuntimeError; break;
  }
  // KeyError's argument is the key (Python's convention); other types take the message.
  // Messages may quote bytes from a peer (a malformed name): never fail on invalid UTF-8.
  const std::optional<int64_t> key = s.detail("key");
  py::object arg = (s.code() == Code::kNotFound && key)
                       ? py::object(py::int_(*key))
                       : py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
                             s.message().data(), static_cast<Py_ssize_t>(s.message().size()),
                             "backslashreplace"));
  if (!arg) throw py::error_already_set();
  py::object exc = py::reinterpret_steal<py::object>(
      PyObject_CallFunctionObjArgs(type, arg.ptr(), nullptr));
  if (!exc) throw py::error_already_set();
  for (const Status::Detail& d : s.details())
    if (PyObject_SetAttrString(exc.ptr(), d.first, py::int_(d.second).ptr()) != 0)
      throw py::error_already_set();
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

void ThrowInvalid(const std::string& message) {
  ThrowIfError(Status(Code::kInvalidArgument, message));
  std::abort();  // unreachable: ThrowIfError raised
}

void CheckCount(int64_t n, const char* what) {
  if (n < 0) ThrowInvalid(std::string(what) + ": expected >= 0, got " + std::to_string(n));
}

void CheckLength(int64_t got, int64_t want, const char* what, const char* per) {
  if (got != want)
    ThrowIfError(Error(Code::kInvalidArgument, what, ": expected ", want, " values (one per ", per,
                       "), got ", got)
                     .With("expected", want)
                     .With("received", got));
}

const uint8_t* BytesIn(const py::array& a, size_t bytes, const char* what) {
  if (!(a.flags() & py::array::c_style))
    ThrowInvalid(std::string(what) + ": expected a C-contiguous array");
  if (static_cast<size_t>(a.nbytes()) != bytes)
    ThrowInvalid(std::string(what) + ": expected " + std::to_string(bytes) + " bytes, got " +
                 std::to_string(a.nbytes()));
  return static_cast<const uint8_t*>(a.data());
}

uint8_t* BytesOut(py::array& a, size_t bytes, const char* what) {
  if (!a.writeable()) ThrowInvalid(std::string(what) + ": output must be writeable");
  return const_cast<uint8_t*>(BytesIn(a, bytes, what));
}

py::dtype ToNumpy(DType t) {
  // Parsing a dtype name costs microseconds; build each once (kept for the process's life).
  static PyObject* cache[kNumDTypes] = {};
  const int i = static_cast<int>(t);
  if (cache[i] == nullptr) cache[i] = py::dtype(std::string(DTypeName(t))).release().ptr();
  return py::reinterpret_borrow<py::dtype>(cache[i]);
}

DType FromNumpy(const py::dtype& dt, const std::string& what) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  auto fail = [&]() -> DType {
    ThrowInvalid(what + ": dtype " + std::string(py::str(dt)) +
                          " is not supported (expected bool, int8-64, uint8-64 or float16-64)");
  };
  switch (kind) {
    case 'b': return DType::kBool;
    case 'i':
      if (size == 1) return DType::kInt8;
      if (size == 2) return DType::kInt16;
      if (size == 4) return DType::kInt32;
      if (size == 8) return DType::kInt64;
      return fail();
    case 'u':
      if (size == 1) return DType::kUInt8;
      if (size == 2) return DType::kUInt16;
      if (size == 4) return DType::kUInt32;
      if (size == 8) return DType::kUInt64;
      return fail();
    case 'f':
      if (size == 2) return DType::kFloat16;
      if (size == 4) return DType::kFloat32;
      if (size == 8) return DType::kFloat64;
      return fail();
    default: return fail();
  }
}

std::vector<int64_t> ShapeOf(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

Field FieldFromTemplate(const std::string& name, const py::handle& tmpl) {
  py::array a = py::array::ensure(tmpl);
  if (!a) ThrowInvalid(name + ": expected a numpy array as buffer template");
  Field f;
  f.name = name;
  f.dtype = FromNumpy(a.dtype(), name);
  f.shape = ShapeOf(a);
  return f;
}

std::string DescribeArray(const py::array& a) {
  std::ostringstream os;
  os << std::string(py::str(a.dtype())) << "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) os << (i ? "," : "") << a.shape(i);
  os << "]";
  return os.str();
}

py::array CoerceRow(const py::handle& obj, const Field& f, const std::string& what) {
  py::array a = py::array::ensure(obj);
  if (!a) ThrowInvalid(what + ": expected an array-like of " + f.Describe());
  if (ShapeOf(a) != f.shape)
    ThrowInvalid(what + ": expected " + f.Describe() + ", got " + DescribeArray(a));
  py::dtype want = ToNumpy(f.dtype);
  if (!a.dtype().is(want) && !a.dtype().equal(want)) {
    static PyObject* can_cast = py::object(py::module_::import("numpy").attr("can_cast")).release().ptr();
    if (!py::handle(can_cast)(a.dtype(), want, "same_kind").cast<bool>())
      ThrowInvalid(what + ": expected " + f.Describe() + ", got " + DescribeArray(a) +
                            " (no same_kind cast)");
    a = a.attr("astype")(want);
  }
  constexpr int kLaidOut = py::array::c_style | py::detail::npy_api::NPY_ARRAY_ALIGNED_;
  if ((a.flags() & kLaidOut) != kLaidOut) a = py::array::ensure(a, kLaidOut);
  return a;
}

namespace {

template <typename T>
bool StoreNumber(const py::handle& obj, void* dst) {
  if constexpr (std::is_floating_point_v<T>) {
    const double v = PyFloat_AsDouble(obj.ptr());
    if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return false; }
    *static_cast<T*>(dst) = static_cast<T>(v);
    return true;
  } else {
    if (PyFloat_Check(obj.ptr())) return false;  // int fields take ints only (numpy's same_kind)
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return false; }
    if (v < static_cast<long long>(std::numeric_limits<T>::min()) ||
        static_cast<unsigned long long>(v) > static_cast<unsigned long long>(std::numeric_limits<T>::max()))
      return false;  // out of range: let numpy's path report it
    *static_cast<T*>(dst) = static_cast<T>(v);
    return true;
  }
}

// Converts a Python bool/int/float into one scalar of `t`; false when it does not apply.
bool StoreScalar(const py::handle& obj, DType t, void* dst) {
  PyObject* o = obj.ptr();
  if (!(PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o))) return false;
  switch (t) {
    case DType::kBool:
      if (!PyBool_Check(o)) return false;
      *static_cast<uint8_t*>(dst) = o == Py_True;
      return true;
    case DType::kInt8: return StoreNumber<int8_t>(obj, dst);
    case DType::kUInt8: return StoreNumber<uint8_t>(obj, dst);
    case DType::kInt16: return StoreNumber<int16_t>(obj, dst);
    case DType::kUInt16: return StoreNumber<uint16_t>(obj, dst);
    case DType::kInt32: return StoreNumber<int32_t>(obj, dst);
    case DType::kUInt32: return StoreNumber<uint32_t>(obj, dst);
    case DType::kInt64: return StoreNumber<int64_t>(obj, dst);
    case DType::kUInt64: return StoreNumber<uint64_t>(obj, dst);
    case DType::kFloat32: return StoreNumber<float>(obj, dst);
    case DType::kFloat64: return StoreNumber<double>(obj, dst);
    default: return false;  // float16: numpy converts
  }
}

}  // namespace

const void* RowScratch::Row(const py::handle& obj, const Field& f, const std::string& what) {
  if (f.shape.empty()) {
    scalars_.emplace_back(new uint64_t(0));
    if (StoreScalar(obj, f.dtype, scalars_.back().get())) return scalars_.back().get();
    scalars_.pop_back();
  }
  // Fast path: already a C-contiguous array of the exact dtype and shape.
  if (py::isinstance<py::array>(obj)) {
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if ((a.flags() & py::array::c_style) && a.dtype().equal(ToNumpy(f.dtype)) &&
        a.ndim() == static_cast<py::ssize_t>(f.shape.size()) &&
        std::equal(f.shape.begin(), f.shape.end(), a.shape())) {
      arrays_.push_back(a);
      return arrays_.back().data();
    }
  }
  arrays_.push_back(CoerceRow(obj, f, what));
  return arrays_.back().data();
}

void CheckOutput(const py::array& a, DType dtype, const std::vector<int64_t>& shape,
                 const std::string& what) {
  Field f{what, dtype, shape};
  if (!a.dtype().equal(ToNumpy(dtype)) || ShapeOf(a) != shape)
    ThrowInvalid(what + ": expected output " + f.Describe() + ", got " + DescribeArray(a));
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    ThrowInvalid(what + ": output must be a writeable C-contiguous array");
}

namespace {

// Output buffers of sampled batches are large (an Atari batch of 32 is ~1.8 MB) and are dropped
// after every learner step. Fresh allocations of that size come from mmap, so each call would
// page-fault its whole output in again (the cost dominated sampling). The pool keeps released
// buffers, by size, with their pages mapped, and hands them out again. Thread-safe.
class BufferPool {
 public:
  static constexpr size_t kMinPooled = 64 * 1024;       // smaller arrays: numpy's allocator
  static constexpr size_t kMaxCached = 512ull << 20;    // bytes kept idle at most

  void* Take(size_t bytes) {
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return p;
      }
    }
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) return nullptr;
    return p;
  }

  void Give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> l(mu_);
    if (cached_ + bytes > kMaxCached) {
      std::free(p);
      return;
    }
    free_[bytes].push_back(p);
    cached_ += bytes;
  }

  static size_t RoundUp(size_t bytes) { return (bytes + 4095) & ~size_t(4095); }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};

BufferPool& Pool() {
  static BufferPool* pool = new BufferPool();  // never destroyed: arrays may outlive statics
  return *pool;
}

struct PooledBlock {
  void* data;
  size_t bytes;
};

}  // namespace

py::array ReadOnlyView(const py::dtype& dtype, const std::vector<py::ssize_t>& shape,
                       const void* data, const py::handle& owner) {
  py::array a(dtype, shape, {}, data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

std::shared_ptr<uint8_t> PooledBytes(size_t bytes) {
  const size_t rounded = BufferPool::RoundUp(std::max<size_t>(bytes, 1));
  void* data = Pool().Take(rounded);
  if (data == nullptr) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(data),
                                  [rounded](uint8_t* p) { Pool().Give(p, rounded); });
}

py::array NewArray(const Field& f, std::vector<int64_t> leading,
                   const std::vector<int64_t>& trailing_extra) {
  std::vector<py::ssize_t> shape(leading.begin(), leading.end());
  shape.insert(shape.end(), f.shape.begin(), f.shape.end());
  shape.insert(shape.end(), trailing_extra.begin(), trailing_extra.end());
  size_t bytes = ItemSize(f.dtype);
  for (py::ssize_t d : shape) bytes *= static_cast<size_t>(d);
  if (bytes < BufferPool::kMinPooled) return py::array(ToNumpy(f.dtype), shape);
  const size_t rounded = BufferPool::RoundUp(bytes);
  void* data = Pool().Take(rounded);
  if (data == nullptr) throw std::bad_alloc();
  auto* block = new PooledBlock{data, rounded};
  py::capsule owner(block, [](void* b) {
    auto* blk = static_cast<PooledBlock*>(b);
    Pool().Give(blk->data, blk->bytes);
    delete blk;
  });
  return py::array(ToNumpy(f.dtype), shape, {}, data, owner);
}

void BindBufferPool(py::module_& m) {
  m.def(
      "empty",
      [](const std::vector<int64_t>& shape, const py::object& dtype) {
        Field f{"empty", FromNumpy(py::dtype::from_args(dtype), "dtype"), {}};
        return NewArray(f, shape);
      },
      py::arg("shape"), py::arg("dtype"),
      R"doc(Like numpy.empty, from memoire's recycled buffer pool: arrays of 64 KiB or more reuse
the warm pages of arrays already released, instead of page-faulting fresh memory.)doc");
}

}  // namespace memoire
