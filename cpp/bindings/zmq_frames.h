// A message received natively (libzmq::Frames) handed to Python without copying: one read-only
// uint8 array per frame, all keeping the message alive. Call with the GIL held.
#pragma once

#include <memory>

#include "bindings/common.h"
#include "bindings/libzmq.h"

namespace memoire {

inline py::list FramesToArrays(const std::shared_ptr<libzmq::Frames>& frames) {
  auto* keep = new std::shared_ptr<libzmq::Frames>(frames);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<libzmq::Frames>*>(p); });
  py::list out;
  for (size_t i = 0; i < frames->size(); ++i) {
    py::array a(py::dtype::of<uint8_t>(), {static_cast<py::ssize_t>(frames->bytes(i))}, {},
                frames->data(i), owner);
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    out.append(std::move(a));
  }
  return out;
}

}  // namespace memoire
