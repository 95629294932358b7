// Binds core/gather.h GatherRows for the learner's cache batches (memoire/server.py get_batch):
// one call copies the chosen rows of every array of a cache into a batch, with the GIL
// released, instead of one np.take per array.
#include "core/gather.h"

#include <algorithm>
#include <string>
#include <vector>

#include "bindings/common.h"

namespace memoire {
namespace {

// Checks everything before any byte is copied, so a bad call changes nothing.
void GatherRowsPy(const py::list& sources, const py::array& rows_obj, const py::list& outputs,
                  int64_t offset) {
  if (sources.size() != outputs.size())
    throw py::value_error("gather_rows: expected as many outputs as sources, got " +
                          std::to_string(outputs.size()) + " outputs for " +
                          std::to_string(sources.size()) + " sources");
  const char kind = rows_obj.dtype().kind();
  if (rows_obj.ndim() != 1 || (kind != 'i' && kind != 'u'))
    throw py::value_error("gather_rows: rows: expected a 1-d integer array, got " +
                          DescribeArray(rows_obj));
  auto rows = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(rows_obj);
  const int64_t n = rows.shape(0);
  const int64_t* r = rows.data();
  int64_t lo = 0, hi = -1;  // the range of the row numbers (empty when n == 0)
  for (int64_t b = 0; b < n; ++b) {
    if (b == 0 || r[b] < lo) lo = r[b];
    if (b == 0 || r[b] > hi) hi = r[b];
  }
  struct Job {
    const uint8_t* src;
    uint8_t* out;
    size_t row_bytes;
    bool broadcast;  // a 0-d source: its value goes to every output row
  };
  std::vector<Job> jobs;
  std::vector<py::array> keep;  // references held while the GIL is released
  jobs.reserve(sources.size());
  keep.reserve(2 * sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    // Checks stay cheap (no allocation) on the good path: this runs once per array per batch.
    auto what = [i] { return "gather_rows: pair " + std::to_string(i); };
    // A source is an array or a scalar (a numpy scalar becomes a 0-d array); outputs must be
    // arrays, or the rows would go into a temporary.
    const bool src_is_array = py::isinstance<py::array>(sources[i]);
    py::array src = src_is_array ? py::reinterpret_borrow<py::array>(sources[i])
                                 : py::array::ensure(sources[i]);
    if (!src || !py::isinstance<py::array>(outputs[i]) || (!src_is_array && src.ndim() != 0))
      throw py::value_error(what() + ": expected numpy arrays (or a scalar source), got " +
                            std::string(py::str(py::type::of(sources[i]))) + " and " +
                            std::string(py::str(py::type::of(outputs[i]))));
    py::array out = py::reinterpret_borrow<py::array>(outputs[i]);
    if (!(out.flags() & py::array::c_style) || !out.writeable() || out.ndim() < 1)
      throw py::value_error(what() + ": output must be a writeable C-contiguous array with a "
                                     "batch axis, got " + DescribeArray(out));
    if (!(src.flags() & py::array::c_style))
      throw py::value_error(what() + ": source must be C-contiguous");
    if (!src.dtype().equal(out.dtype()))
      throw py::value_error(what() + ": expected a source of the output's dtype " +
                            DescribeArray(out) + ", got " + DescribeArray(src));
    const bool broadcast = src.ndim() == 0;
    if (broadcast ? out.ndim() != 1
                  : (src.ndim() != out.ndim() ||
                     !std::equal(src.shape() + 1, src.shape() + src.ndim(), out.shape() + 1)))
      throw py::value_error(what() + (broadcast ? ": a 0-d source needs a 1-d output, got "
                                                : ": expected rows of the output's shape ") +
                            DescribeArray(out) + ", got source " + DescribeArray(src));
    if (offset < 0 || offset + n > out.shape(0))
      throw py::value_error(what() + ": rows [" + std::to_string(offset) + ", " +
                            std::to_string(offset + n) + ") do not fit an output of " +
                            std::to_string(out.shape(0)) + " rows");
    if (!broadcast && n > 0 && (lo < 0 || hi >= src.shape(0)))
      throw py::value_error(what() + ": row numbers must lie in [0, " +
                            std::to_string(src.shape(0)) + "), got " +
                            std::to_string(lo < 0 ? lo : hi));
    const size_t rb = static_cast<size_t>(out.nbytes()) / static_cast<size_t>(out.shape(0) ? out.shape(0) : 1);
    jobs.push_back({static_cast<const uint8_t*>(src.data()),
                    static_cast<uint8_t*>(out.mutable_data()) + offset * rb, rb, broadcast});
    keep.push_back(std::move(src));
    keep.push_back(std::move(out));
  }
  py::gil_scoped_release release;
  const std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  for (const Job& j : jobs) GatherRows(j.src, j.row_bytes, j.broadcast ? zeros.data() : r, n, j.out);
}

}  // namespace

void BindGather(py::module_& m) {
  m.def("gather_rows", &GatherRowsPy, py::arg("sources"), py::arg("rows"), py::arg("outputs"),
        py::arg("offset") = 0, R"doc(
outputs[i][offset + b] = sources[i][rows[b]] for every pair i and b < len(rows), copied with
the GIL released. A 0-d source is written to every output row instead. Sources and outputs
are C-contiguous arrays of equal dtype and row shape (outputs writeable); rows is a 1-d
integer array. Raises ValueError, having copied nothing, when any of that does not hold or a
row number or the output range is out of bounds.
)doc");
}

}  // namespace memoire
