// Binds core::ReplayMemory as memoire._core.ReplayMemory. The public class (docstrings, the
// seed-000 constructor, Batch objects) is memoire.memory.ReplayMemory, a Python subclass.
#include "core/replay_memory.h"

#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "bindings/common.h"

namespace memoire {
namespace {

using RM = ReplayMemory;

std::shared_ptr<RM> MakeMemory(const std::vector<py::object>& templates, int64_t max_step) {
  std::vector<Field> fields;
  for (int f = 0; f < RM::kNumFields; ++f) {
    static const char* kBufNames[RM::kNumFields] = {"state_buf", "action_buf", "reward_buf",
                                                    "prob_buf",  "value_buf",  "qvest_buf",
                                                    "info_buf"};
    Field fd = FieldFromTemplate(kBufNames[f], templates[f]);
    fd.name = RM::kFieldNames[f];
    fields.push_back(fd);
  }
  Schema schema;
  ThrowIfError(Schema::Make(fields, &schema));
  std::unique_ptr<RM> m;
  ThrowIfError(RM::Make(schema, max_step, &m));
  return std::shared_ptr<RM>(std::move(m));
}

template <typename F>
void Modify(RM& m, F&& change) {
  RM::Options o = m.options();
  change(o);
  ThrowIfError(m.SetOptions(o));
}

std::vector<float> PerRewardElement(const RM& m, const py::handle& value, const char* what) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(value);
  if (!a) throw py::value_error(std::string(what) + ": expected a number or an array of numbers");
  if (a.size() == 1) return std::vector<float>(m.reward_elems(), a.data()[0]);
  if (a.size() != m.reward_elems())
    throw py::value_error(std::string(what) + ": expected a scalar or " +
                          std::to_string(m.reward_elems()) + " values (one per reward element), got " +
                          std::to_string(a.size()));
  return std::vector<float>(a.data(), a.data() + a.size());
}

py::array ReadField(const RM& m, int f) {
  // A zeroed template. (Not `array * 0`: for a 0-d array that yields a numpy scalar, which
  // came back as a float64 array whatever the field's dtype.)
  py::array a = NewArray(m.schema().field(f), {});
  std::memset(a.mutable_data(), 0, static_cast<size_t>(a.nbytes()));
  return a;
}

// Converts the six user rows (s, a, r, p, v, i) and adds them.
void AddRows(RM& m, int64_t n, const std::vector<py::handle>& rows, const py::handle& init_w,
             bool batched) {
  static const char* kNames[RM::kNumFields] = {"s", "a", "r", "p", "v", "q", "i"};
  std::vector<py::array> keep;
  const void* ptrs[RM::kNumFields] = {};
  int user = 0;
  for (int f = 0; f < RM::kNumFields; ++f) {
    if (f == RM::kQvest) continue;
    Field fd = m.schema().field(f);
    if (batched) fd.shape.insert(fd.shape.begin(), n);
    keep.push_back(CoerceRow(rows[user++], fd, kNames[f]));
    ptrs[f] = keep.back().data();
  }
  auto w = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(init_w);
  if (!w || w.size() != (batched ? n : 1))
    throw py::value_error(std::string("init_w: expected ") +
                          (batched ? std::to_string(n) + " weights" : "one number"));
  const float* wp = w.data();
  CallReleased([&] { return m.AddEntries(n, ptrs, wp); });
}

}  // namespace

void BindReplayMemory(py::module_& m) {
  py::class_<RM, std::shared_ptr<RM>> c(m, "ReplayMemory");
  c.def(py::init([](py::object s, py::object a, py::object r, py::object p, py::object v,
                    py::object q, py::object i, int64_t max_step) {
          return MakeMemory({s, a, r, p, v, q, i}, max_step);
        }),
        py::arg("state_buf"), py::arg("action_buf"), py::arg("reward_buf"), py::arg("prob_buf"),
        py::arg("value_buf"), py::arg("qvest_buf"), py::arg("info_buf"), py::arg("max_step"));

  // Read-only.
  static const char* kBufProps[RM::kNumFields] = {"state_buf", "action_buf", "reward_buf",
                                                  "prob_buf",  "value_buf",  "qvest_buf",
                                                  "info_buf"};
  for (int f = 0; f < RM::kNumFields; ++f)
    c.def_property_readonly(kBufProps[f], [f](const RM& self) { return ReadField(self, f); });
  c.def_property_readonly("entry_size", [](const RM& self) { return self.schema().row_bytes(); });
  c.def_property_readonly("max_step", &RM::max_step);
  c.def_property("uuid", &RM::uuid, &RM::set_uuid);
  c.def_property_readonly("memory_bytes", &RM::memory_bytes);

  // Read-write settings.
#define MEMOIRE_OPTION(name, type)                                                      \
  c.def_property(                                                                       \
      #name, [](const RM& self) { return self.options().name; },                        \
      [](RM& self, type v) { Modify(self, [&](RM::Options& o) { o.name = v; }); });
  MEMOIRE_OPTION(priority_exponent, double)
  MEMOIRE_OPTION(priority_epsilon, double)
  MEMOIRE_OPTION(mix_lambda, double)
  MEMOIRE_OPTION(frame_stack, int)
  MEMOIRE_OPTION(multi_step, int)
  MEMOIRE_OPTION(cache_size, int64_t)
  MEMOIRE_OPTION(max_episode, int64_t)
  MEMOIRE_OPTION(reuse_cache, bool)
#undef MEMOIRE_OPTION
  c.def_property(
      "discount_factor",
      [](const RM& self) { auto v = self.options().discount_factor; return py::array_t<float>(v.size(), v.data()); },
      [](RM& self, const py::handle& v) {
        auto vals = PerRewardElement(self, v, "discount_factor");
        Modify(self, [&](RM::Options& o) { o.discount_factor = vals; });
      });
  c.def_property(
      "reward_coeff",
      [](const RM& self) { auto v = self.options().reward_coeff; return py::array_t<float>(v.size(), v.data()); },
      [](RM& self, const py::handle& v) {
        auto vals = PerRewardElement(self, v, "reward_coeff");
        Modify(self, [&](RM::Options& o) { o.reward_coeff = vals; });
      });
  c.def_property(
      "cache_flags",
      [](const RM& self) {
        auto v = self.options().cache_flags;
        py::array_t<bool> out(v.size());
        for (size_t k = 0; k < v.size(); ++k) out.mutable_data()[k] = v[k] != 0;
        return out;
      },
      [](RM& self, const py::handle& v) {
        auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(v);
        if (!a) throw py::value_error("cache_flags: expected 14 booleans");
        std::vector<uint8_t> flags(a.data(), a.data() + a.size());
        for (auto& x : flags) x = x != 0;
        Modify(self, [&](RM::Options& o) { o.cache_flags = flags; });
      });

  c.def("seed", &RM::Seed, py::arg("seed"));
  c.def("num_episode", &RM::num_episode);
  c.def_property_readonly("size", &RM::size);
  c.def_property_readonly("num_sampleable", &RM::num_sampleable);
  c.def_property_readonly("total_weight", &RM::total_weight);
  c.def_property_readonly("episode_open", &RM::episode_open);
  c.def_property_readonly("open_length", &RM::open_length);
  c.def_property_readonly("total_added", &RM::total_added);
  c.def("info", &RM::Info);

  c.def("new_episode", [](RM& self) { CallReleased([&] { return self.NewEpisode(); }); });
  c.def("add_entry",
        [](RM& self, py::handle s, py::handle a, py::handle r, py::handle p, py::handle v,
           py::handle i, py::handle init_w) { AddRows(self, 1, {s, a, r, p, v, i}, init_w, false); },
        py::arg("s"), py::arg("a"), py::arg("r"), py::arg("p"), py::arg("v"), py::arg("i"),
        py::arg("init_w") = 1.0);
  c.def("add_entries",
        [](RM& self, py::handle s, py::handle a, py::handle r, py::handle p, py::handle v,
           py::handle i, py::handle init_w) {
          py::array sa = py::array::ensure(s);
          if (!sa || sa.ndim() < 1) throw py::value_error("s: expected an array with a leading batch axis");
          AddRows(self, sa.shape(0), {s, a, r, p, v, i}, init_w, true);
        },
        py::arg("s"), py::arg("a"), py::arg("r"), py::arg("p"), py::arg("v"), py::arg("i"),
        py::arg("init_w"));
  c.def("close_episode",
        [](RM& self, float mult, bool update_value, bool update_weight, bool terminal) {
          CallReleased([&] { return self.CloseEpisode(mult, update_value, update_weight, terminal); });
        },
        py::arg("episodic_weight_multiplier") = 1.0f, py::arg("do_update_value") = true,
        py::arg("do_update_weight") = true, py::arg("terminal") = true);

  // _sample(n) -> (prev tuple, next tuple, weight, prob, done, id); disabled fields are None.
  c.def("_sample", [](RM& self, int64_t n) {
    if (n < 1) throw py::value_error("batch_size: expected >= 1, got " + std::to_string(n));
    const RM::Options o = self.options();
    RM::SampleOut out;
    py::tuple prev(static_cast<size_t>(RM::kNumFields)), next(static_cast<size_t>(RM::kNumFields));
    for (int f = 0; f < RM::kNumFields; ++f) {
      const Field& fd = self.schema().field(f);
      if (o.cache_flags[f]) {
        py::array a = NewArray(fd, {n, o.frame_stack});
        out.prev[f] = static_cast<uint8_t*>(a.mutable_data());
        prev[f] = a;
      } else {
        prev[f] = py::none();
      }
      if (o.cache_flags[RM::kNumFields + f]) {
        py::array a = NewArray(fd, {n, o.frame_stack});
        out.next[f] = static_cast<uint8_t*>(a.mutable_data());
        next[f] = a;
      } else {
        next[f] = py::none();
      }
    }
    py::array_t<float> weight(n);
    py::array_t<double> prob(n);
    py::array_t<bool> done(n);
    py::array_t<int64_t> id(n);
    out.weight = weight.mutable_data();
    out.prob = prob.mutable_data();
    out.done = reinterpret_cast<uint8_t*>(done.mutable_data());
    out.id = id.mutable_data();
    CallReleased([&] { return self.Sample(n, out); });
    return py::make_tuple(prev, next, weight, prob, done, id);
  }, py::arg("batch_size"));

  c.def("update_weights",
        [](RM& self, const py::handle& ids, const py::handle& weights) {
          auto i = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ids);
          auto w = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(weights);
          if (!i || !w || i.size() != w.size())
            throw py::value_error("update_weights: expected ids (int64[n]) and weights (float32[n]) of one length");
          int64_t updated = 0;
          const int64_t* ip = i.data();
          const float* wp = w.data();
          CallReleased([&] { return self.UpdateWeights(i.size(), ip, wp, &updated); });
          return updated;
        },
        py::arg("ids"), py::arg("weights"));
}

}  // namespace memoire
