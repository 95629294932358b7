// Shared binding helpers: the one place where Status becomes a Python exception, and the
// conversions between numpy arrays and core Fields. Bindings only convert; logic lives in core/.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>
#if defined(__GLIBCXX__)
#include <cxxabi.h>  // abi::__forced_unwind
#endif

#include "core/schema.h"
#include "core/status.h"

namespace memoire {
namespace py = pybind11;

// Releases the GIL for a scope (every blocking or heavy call does so), like
// py::gil_scoped_release, except at interpreter exit. Then CPython (3.13 and older) ends a
// daemon thread that asks for the GIL back with pthread_exit, a forced unwind: through
// pybind11's noexcept destructor that is std::terminate ("terminate called without an active
// exception", exit 134), and an unwind let through would free Python objects without the GIL
// (a crash). A thread that returns from memoire's native code while the interpreter ends is
// parked here instead, until the process is gone (what CPython 3.14 does itself).
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() {
#if defined(__GLIBCXX__)
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      for (;;) pause();
    }
#else
    PyEval_RestoreThread(state_);
#endif
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// An input array as core loops read it: C-contiguous, of T, and aligned (a view of a received
// message may start at any byte), converted or copied by InArray<T>::ensure when it is not.
template <typename T>
using InArray = py::array_t<T, py::array::c_style | py::array::forcecast |
                                   py::detail::npy_api::NPY_ARRAY_ALIGNED_>;

// The one place a Status becomes a Python exception (call with the GIL held): the code picks
// the type (see core/status.h), a kNotFound's "key" detail is the KeyError's argument, others
// take the message, and every detail becomes an attribute (`except KeyError as e: e.key`).
void ThrowIfError(const Status& s);
// ThrowIfError of kInvalidArgument(message): for the argument checks below.
[[noreturn]] void ThrowInvalid(const std::string& message);

// Shared argument checks (ValueError naming `what`): n >= 0; `got` values where `want` were
// expected, one per `per` (details "expected" and "received"); and the bytes of a
// C-contiguous array of exactly `bytes` bytes (writeable, for BytesOut).
void CheckCount(int64_t n, const char* what);
void CheckLength(int64_t got, int64_t want, const char* what, const char* per);
const uint8_t* BytesIn(const py::array& a, size_t bytes, const char* what);
uint8_t* BytesOut(py::array& a, size_t bytes, const char* what);

// `h` as a C-contiguous aligned array of T (converted when it is not), else ValueError.
template <typename T>
InArray<T> ArrayOf(const py::handle& h, const char* what) {
  auto a = InArray<T>::ensure(h);
  if (!a) ThrowInvalid(std::string(what) + ": expected an array of numbers");
  return a;
}

// Runs `f` (returning Status) with the GIL released, then raises on error with the GIL held.
template <typename F>
void CallReleased(F&& f) {
  Status s;
  {
    GilRelease release;
    s = f();
  }
  ThrowIfError(s);
}

py::dtype ToNumpy(DType t);
// Fails with ValueError naming `what` when numpy's dtype has no core equivalent.
DType FromNumpy(const py::dtype& dt, const std::string& what);
std::vector<int64_t> ShapeOf(const py::array& a);
// "uint8[84,84,4]": an array's dtype and shape, for error messages.
std::string DescribeArray(const py::array& a);
// A Field described by a template array (its dtype and shape; the values are ignored).
Field FieldFromTemplate(const std::string& name, const py::handle& tmpl);

// `obj` as a C-contiguous array of exactly field's dtype and shape. Values of another dtype are
// cast when numpy's 'same_kind' casting allows it (a Python float into float32, an int into
// int32); anything else raises ValueError("<what>: expected uint8[84,84], got float64[3]").
py::array CoerceRow(const py::handle& obj, const Field& f, const std::string& what);

// Rows converted for one add call: holds converted arrays alive and scalars in place.
class RowScratch {
 public:
  // A pointer to `obj` as one row of `f` (see CoerceRow). A Python bool/int/float for a scalar
  // field is converted in place without building an array (the common per-step add).
  const void* Row(const py::handle& obj, const Field& f, const std::string& what);

 private:
  std::vector<py::array> arrays_;
  std::vector<std::unique_ptr<uint64_t>> scalars_;
};

// Checks that `a` is a writeable C-contiguous array of `dtype` with `shape`, else ValueError.
void CheckOutput(const py::array& a, DType dtype, const std::vector<int64_t>& shape,
                 const std::string& what);

// `bytes` (64-byte aligned) from the recycled buffer pool behind NewArray; the block goes back
// when the last reference drops, from any thread (no GIL needed).
std::shared_ptr<uint8_t> PooledBytes(size_t bytes);

// A read-only C-contiguous array over `data`, which `owner` keeps alive.
py::array ReadOnlyView(const py::dtype& dtype, const std::vector<py::ssize_t>& shape,
                       const void* data, const py::handle& owner);

// A new C-contiguous array of field's dtype with shape leading + field.shape.
py::array NewArray(const Field& f, std::vector<int64_t> leading, const std::vector<int64_t>& trailing_extra = {});

}  // namespace memoire
