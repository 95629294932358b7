// The host ring a device feed (bindings/device_feed.cc) copies from, and what each of its parts
// is: a _core.Feed's Prefetcher (bindings/feed.cc), or a shared-memory stream's slots, where the
// server writes each batch (core/stream_source.h).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "core/device_ring.h"

namespace memoire {
namespace py = pybind11;

struct FeedRing {
  std::shared_ptr<HostBatches> batches;
  std::vector<py::dtype> dtypes;
  std::vector<std::vector<py::ssize_t>> shapes;
  std::vector<bool> none;  // a part handed out as None (no bytes)
};
// A _core.Feed's ring, or a shared-memory StreamSource's slots; TypeError for anything else,
// RuntimeError when the feed is closed.
FeedRing FeedRingOf(const py::object& feed);
// A shared-memory StreamSource's slots (core/stream_source.h); ValueError for a stream whose rows
// come in messages.
FeedRing StreamSlotsOf(const py::object& source);

}  // namespace memoire
