// The numpy views of a batch laid out by core/batch_layout.h: one array per part (None for a
// part the cache flags leave out), each keeping `keep` (the slot's lease) alive. Used by the
// feed (bindings/feed.cc) and the shared-memory stream (bindings/stream.cc).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "bindings/common.h"
#include "core/batch_layout.h"

namespace memoire {

inline pybind11::tuple BatchViews(const BatchLayout& layout, uint8_t* const* data,
                                  const pybind11::object& keep) {
  namespace py = pybind11;
  py::tuple out(layout.parts.size());
  for (size_t p = 0; p < layout.parts.size(); ++p) {
    const BatchPart& part = layout.parts[p];
    if (part.none) {
      out[p] = py::none();
      continue;
    }
    std::vector<py::ssize_t> shape(part.shape.begin(), part.shape.end());
    out[p] = py::array(ToNumpy(part.dtype), shape, data[p], keep);
  }
  return out;
}

}  // namespace memoire
