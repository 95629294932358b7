// Frames crossing between Python and the native message paths, in both directions, without
// copies: Python frames (zmq.Frame, bytes, arrays) held as buffers for the core, and messages
// received natively handed to Python as read-only arrays. Call with the GIL held.
#pragma once

#include <memory>
#include <vector>

#include "bindings/common.h"
#include "core/libzmq.h"
#include "core/codec.h"

namespace memoire {

// The buffers of one message's Python frames, each exported (so it cannot move) until this is
// destroyed, which needs the GIL: see Owned().
class HeldFrames {
 public:
  HeldFrames() = default;
  HeldFrames(const HeldFrames&) = delete;
  HeldFrames& operator=(const HeldFrames&) = delete;
  ~HeldFrames() {
    for (Py_buffer& v : views_) PyBuffer_Release(&v);
  }
  // False (and the Python error cleared) when `obj` does not export a contiguous buffer.
  bool Add(PyObject* obj) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      return false;
    }
    views_.push_back(v);
    frames_.push_back({static_cast<const uint8_t*>(v.buf), static_cast<uint64_t>(v.len)});
    return true;
  }
  const std::vector<codec::Frame>& frames() const { return frames_; }

  // An owner for the core: its last holder may be a thread without the GIL.
  static std::shared_ptr<const void> Owned(std::unique_ptr<HeldFrames> held) {
    return std::shared_ptr<const void>(held.release(), [](const void* p) {
      py::gil_scoped_acquire gil;
      delete static_cast<const HeldFrames*>(p);
    });
  }

 private:
  std::vector<Py_buffer> views_;
  std::vector<codec::Frame> frames_;
};

// A message received natively, as one read-only uint8 array per frame, all keeping it alive.
inline py::list FramesToArrays(const std::shared_ptr<libzmq::Frames>& frames) {
  auto* keep = new std::shared_ptr<libzmq::Frames>(frames);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<libzmq::Frames>*>(p); });
  py::list out;
  for (size_t i = 0; i < frames->size(); ++i)
    out.append(ReadOnlyView(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(frames->bytes(i))},
                            frames->data(i), owner));
  return out;
}

}  // namespace memoire
