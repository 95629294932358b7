// The host ring of a _core.Feed (bindings/feed.cc) as the device feed (bindings/device_feed.cc)
// builds on it: the Prefetcher and what each of its parts is.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "core/prefetch.h"

namespace memoire {
namespace py = pybind11;

struct FeedRing {
  std::shared_ptr<Prefetcher> ring;
  std::vector<py::dtype> dtypes;
  std::vector<std::vector<py::ssize_t>> shapes;
  std::vector<bool> none;  // a part handed out as None (no bytes)
};
// TypeError unless `feed` is a _core.Feed; RuntimeError when it is closed.
FeedRing FeedRingOf(const py::object& feed);

}  // namespace memoire
