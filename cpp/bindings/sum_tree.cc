// Binds core::SumTree with its own seedable generator, for Python code that needs a
// priority tree over its own slots (the Dopamine-compatible prioritized buffers).
#include <pybind11/stl.h>

#include <cmath>

#include "bindings/common.h"
#include "core/rng.h"
#include "core/sum_tree.h"

namespace memoire {
namespace {

struct PySumTree {
  explicit PySumTree(int64_t capacity, uint64_t seed) : tree(capacity), rng(seed) {}
  SumTree tree;
  Rng rng;
};

py::array_t<int64_t> CheckedIndices(const PySumTree& t, const py::handle& obj) {
  auto idx = InArray<int64_t>::ensure(obj);
  if (!idx) throw py::value_error("indices: expected an array of integers");
  const int64_t* p = idx.data();
  for (py::ssize_t k = 0; k < idx.size(); ++k)
    if (p[k] < 0 || p[k] >= t.tree.capacity())
      throw py::index_error("indices: expected values in [0, " +
                            std::to_string(t.tree.capacity()) + "), got " + std::to_string(p[k]));
  return idx;
}

}  // namespace

void BindSumTree(py::module_& m) {
  py::class_<PySumTree>(m, "SumTree", R"doc(
Priorities of `capacity` slots in a double-precision sum tree: O(log n) set and sample.

Thread-compatible: guard concurrent use with your own lock.
)doc")
      .def(py::init<int64_t, uint64_t>(), py::arg("capacity"), py::arg("seed") = 0)
      .def_property_readonly("capacity", [](const PySumTree& t) { return t.tree.capacity(); })
      .def_property_readonly("total", [](const PySumTree& t) { return t.tree.Total(); })
      .def_property("max_recorded_priority",
                    [](const PySumTree& t) { return t.tree.max_recorded(); },
                    [](PySumTree& t, double v) { t.tree.set_max_recorded(v); })
      .def("seed", [](PySumTree& t, uint64_t s) { t.rng.Seed(s); }, py::arg("seed"))
      .def("set",
           [](PySumTree& t, const py::handle& indices, const py::handle& values) {
             auto idx = CheckedIndices(t, indices);
             auto val = InArray<double>::ensure(values);
             if (!val) throw py::value_error("priorities: expected an array of numbers");
             if (val.size() != idx.size() && val.size() != 1)
               throw py::value_error("priorities: expected " + std::to_string(idx.size()) +
                                     " values (one per index), got " + std::to_string(val.size()));
             const double* v = val.data();
             for (py::ssize_t k = 0; k < val.size(); ++k)
               if (!(v[k] >= 0) || !std::isfinite(v[k]))
                 throw py::value_error("priorities: expected finite values >= 0, got " +
                                       std::to_string(v[k]));
             const int64_t* i = idx.data();
             const bool scalar = val.size() == 1;
             py::gil_scoped_release release;
             for (py::ssize_t k = 0; k < idx.size(); ++k) t.tree.Set(i[k], scalar ? v[0] : v[k]);
           },
           py::arg("indices"), py::arg("priorities"),
           "Sets priorities (float64, finite, >= 0) of slots `indices` (int64[n]).")
      .def("get",
           [](PySumTree& t, const py::handle& indices) {
             auto idx = CheckedIndices(t, indices);
             py::array_t<double> out(idx.size());
             const int64_t* i = idx.data();
             double* o = out.mutable_data();
             for (py::ssize_t k = 0; k < idx.size(); ++k) o[k] = t.tree.Get(i[k]);
             return out;
           },
           py::arg("indices"), "Priorities (float64[n]) of slots `indices`.")
      .def("sample",
           [](PySumTree& t, int64_t n, bool stratified) {
             if (n < 1) throw py::value_error("batch_size: expected >= 1");
             py::array_t<int64_t> out(n);
             int64_t* o = out.mutable_data();
             CallReleased([&] { return t.tree.Sample(t.rng, n, stratified, o); });
             return out;
           },
           py::arg("batch_size"), py::arg("stratified") = true,
           "Slots (int64[batch_size]) drawn in proportion to priority.")
      .def("find", [](const PySumTree& t, double mass) { return t.tree.Find(mass); },
           py::arg("mass"), "The slot whose cumulative priority range holds `mass`; -1 if empty.")
      .def("clear", [](PySumTree& t) { t.tree.Clear(); });
}

}  // namespace memoire
