#include "bindings/common.h"

#include <sstream>

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
    case Code::kFailedPrecondition: type = PyExc_RuntimeError; break;
    case Code::kResourceExhausted: type = g_capacity_error; break;
    case Code::kDataLoss: type = g_protocol_error; break;
    case Code::kInternal: type = PyExc_RuntimeError; break;
  }
  PyErr_SetString(type, s.message().c_str());
  throw py::error_already_set();
}

py::dtype ToNumpy(DType t) { return py::dtype(std::string(DTypeName(t))); }

DType FromNumpy(const py::dtype& dt, const std::string& what) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  auto fail = [&]() -> DType {
    throw py::value_error(what + ": dtype " + std::string(py::str(dt)) +
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
  if (!a) throw py::value_error(name + ": expected a numpy array as buffer template");
  Field f;
  f.name = name;
  f.dtype = FromNumpy(a.dtype(), name);
  f.shape = ShapeOf(a);
  return f;
}

namespace {
std::string DescribeArray(const py::array& a) {
  std::ostringstream os;
  os << std::string(py::str(a.dtype())) << "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) os << (i ? "," : "") << a.shape(i);
  os << "]";
  return os.str();
}
}  // namespace

py::array CoerceRow(const py::handle& obj, const Field& f, const std::string& what) {
  py::array a = py::array::ensure(obj);
  if (!a) throw py::value_error(what + ": expected an array-like of " + f.Describe());
  if (ShapeOf(a) != f.shape)
    throw py::value_error(what + ": expected " + f.Describe() + ", got " + DescribeArray(a));
  py::dtype want = ToNumpy(f.dtype);
  if (!a.dtype().is(want) && !a.dtype().equal(want)) {
    static PyObject* can_cast = py::object(py::module_::import("numpy").attr("can_cast")).release().ptr();
    if (!py::handle(can_cast)(a.dtype(), want, "same_kind").cast<bool>())
      throw py::value_error(what + ": expected " + f.Describe() + ", got " + DescribeArray(a) +
                            " (no same_kind cast)");
    a = a.attr("astype")(want);
  }
  if (!(a.flags() & py::array::c_style)) a = py::array::ensure(a, py::array::c_style);
  return a;
}

void CheckOutput(const py::array& a, DType dtype, const std::vector<int64_t>& shape,
                 const std::string& what) {
  Field f{what, dtype, shape};
  if (!a.dtype().equal(ToNumpy(dtype)) || ShapeOf(a) != shape)
    throw py::value_error(what + ": expected output " + f.Describe() + ", got " + DescribeArray(a));
  if (!(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(what + ": output must be a writeable C-contiguous array");
}

py::array NewArray(const Field& f, std::vector<int64_t> leading,
                   const std::vector<int64_t>& trailing_extra) {
  std::vector<py::ssize_t> shape(leading.begin(), leading.end());
  shape.insert(shape.end(), f.shape.begin(), f.shape.end());
  shape.insert(shape.end(), trailing_extra.begin(), trailing_extra.end());
  return py::array(ToNumpy(f.dtype), shape);
}

}  // namespace memoire
