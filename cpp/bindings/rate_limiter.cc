// Binds core/rate_limiter.h as memoire._core.RateLimiter: every wait runs with the GIL
// released; a wait that runs out raises TimeoutError naming the limiter's state.
#include "core/rate_limiter.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "bindings/common.h"

namespace memoire {
namespace {

double Seconds(const py::object& timeout) {
  if (timeout.is_none()) return std::numeric_limits<double>::infinity();
  const double t = timeout.cast<double>();
  if (std::isnan(t) || t < 0) ThrowInvalid("timeout: expected seconds >= 0 or None, got " + std::to_string(t));
  return t;
}

[[noreturn]] void RaiseTimeout(const RateLimiter& self, const char* side, double timeout) {
  PyErr_SetString(PyExc_TimeoutError,
                  ("rate limiter: " + std::string(side) + " blocked for " + std::to_string(timeout) +
                   " s (" + self.Describe() + ")").c_str());
  throw py::error_already_set();
}

}  // namespace

void BindRateLimiter(py::module_& m) {
  py::class_<RateLimiter, std::shared_ptr<RateLimiter>> c(m, "RateLimiter", R"doc(
Keeps samples per insert within a band, with Reverb's semantics (core/rate_limiter.h); the
Python face is memoire.rate_limiter. Thread-safe; waits release the GIL.
)doc");
  c.def(py::init([](double samples_per_insert, int64_t min_size_to_sample, double min_diff,
                    double max_diff) {
          RateLimiter::Options o;
          o.samples_per_insert = samples_per_insert;
          o.min_size_to_sample = min_size_to_sample;
          o.min_diff = min_diff;
          o.max_diff = max_diff;
          std::unique_ptr<RateLimiter> out;
          ThrowIfError(RateLimiter::Make(o, &out));
          return std::shared_ptr<RateLimiter>(std::move(out));
        }),
        py::arg("samples_per_insert"), py::arg("min_size_to_sample"), py::arg("min_diff"),
        py::arg("max_diff"));
  c.def("can_insert", &RateLimiter::CanInsert, py::arg("n") = 1);
  c.def("can_sample", &RateLimiter::CanSample, py::arg("n") = 1);
  c.def(
      "await_sample",
      [](RateLimiter& self, int64_t n, const py::object& timeout, bool raise) {
        const double t = Seconds(timeout);
        bool granted = false;
        CallReleased([&] { return self.AwaitSample(n, t, &granted); });
        if (!granted && raise) RaiseTimeout(self, "sample", t);
        return granted;
      },
      py::arg("n"), py::arg("timeout") = py::none(), py::arg("raise_on_timeout") = true,
      "Waits up to `timeout` seconds (None: no bound) until n transitions may be sampled and "
      "counts them. TimeoutError (or False, without raise_on_timeout) when the wait runs out "
      "or the limiter is cancelled; ValueError for an n the band can never allow.");
  c.def(
      "wait_can_sample",
      [](RateLimiter& self, int64_t n, const py::object& timeout) {
        const double t = Seconds(timeout);
        GilRelease release;
        return self.WaitCanSample(n, t);
      },
      py::arg("n"), py::arg("timeout"),
      "Waits up to `timeout` seconds until n transitions could be sampled; counts nothing.");
  c.def(
      "await_insert",
      [](RateLimiter& self, const py::object& timeout, bool raise) {
        const double t = Seconds(timeout);
        bool ok;
        {
          GilRelease release;
          ok = self.AwaitInsert(t);
        }
        if (!ok && raise) RaiseTimeout(self, "insert", t);
        return ok;
      },
      py::arg("timeout") = py::none(), py::arg("raise_on_timeout") = true,
      "Waits up to `timeout` seconds until one transition may be inserted (counts nothing: "
      "call inserted() once stored). TimeoutError (or False) when the wait runs out.");
  c.def("inserted", &RateLimiter::Inserted, py::arg("n"), "Counts n stored transitions.");
  c.def("record_sample_wait", &RateLimiter::RecordSampleWait, py::arg("seconds"),
        py::arg("timed_out"), "Adds a deferred sample's wait to the counters.");
  c.def("cancel", &RateLimiter::Cancel, py::call_guard<GilRelease>(),
        "Wakes every wait (they fail) and fails later ones at once.");
  c.def("describe", &RateLimiter::Describe);
  c.def_property_readonly("samples_per_insert",
                          [](const RateLimiter& s) { return s.options().samples_per_insert; });
  c.def_property_readonly("min_size_to_sample",
                          [](const RateLimiter& s) { return s.options().min_size_to_sample; });
  c.def_property_readonly("min_diff", [](const RateLimiter& s) { return s.options().min_diff; });
  c.def_property_readonly("max_diff", [](const RateLimiter& s) { return s.options().max_diff; });
  c.def("counters", [](const RateLimiter& self) {
    const RateLimiter::Counters k = self.counters();
    py::dict d;
    d["inserts"] = k.inserts;
    d["samples"] = k.samples;
    d["insert_blocked"] = k.insert_blocked;
    d["sample_blocked"] = k.sample_blocked;
    d["insert_timeouts"] = k.insert_timeouts;
    d["sample_timeouts"] = k.sample_timeouts;
    d["insert_blocked_s"] = k.insert_blocked_s;
    d["sample_blocked_s"] = k.sample_blocked_s;
    d["inserts_waiting"] = k.inserts_waiting;
    d["samples_waiting"] = k.samples_waiting;
    return d;
  });
}

}  // namespace memoire
