// Binds core::ReplayMemory as memoire._core.ReplayMemory. The public class (docstrings, the
// older constructor, Batch objects) is memoire.memory.ReplayMemory, a Python subclass.
#include "core/replay_memory.h"

#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "bindings/common.h"
#include "core/libzmq.h"

namespace memoire {
namespace {

using RM = ReplayMemory;

// The constructor's template names (the seed's), which are also read-only properties.
constexpr const char* kBufNames[RM::kNumFields] = {"state_buf", "action_buf", "reward_buf",
                                                   "prob_buf",  "value_buf",  "qvest_buf",
                                                   "info_buf"};

std::shared_ptr<RM> MakeMemory(const std::vector<py::object>& templates, int64_t max_step,
                               bool vector_prob, bool compress_states) {
  std::vector<Field> fields;
  for (int f = 0; f < RM::kNumFields; ++f) {
    Field fd = FieldFromTemplate(kBufNames[f], templates[f]);
    fd.name = RM::kFieldNames[f];
    fields.push_back(fd);
  }
  Schema schema;
  ThrowIfError(Schema::Make(fields, &schema));
  std::unique_ptr<RM> m;
  ThrowIfError(RM::Make(schema, max_step, &m, vector_prob, compress_states));
  return std::shared_ptr<RM>(std::move(m));
}

template <typename F>
void Modify(RM& m, F&& change) {
  RM::Options o = m.options();
  change(o);
  ThrowIfError(m.SetOptions(o));
}

std::vector<float> PerRewardElement(const RM& m, const py::handle& value, const char* what) {
  auto a = InArray<float>::ensure(value);
  if (!a) throw py::value_error(std::string(what) + ": expected a number or an array of numbers");
  if (a.size() == 1) return std::vector<float>(m.reward_elems(), a.data()[0]);
  if (a.size() != m.reward_elems())
    throw py::value_error(std::string(what) + ": expected a scalar or " +
                          std::to_string(m.reward_elems()) + " values (one per reward element), got " +
                          std::to_string(a.size()));
  return std::vector<float>(a.data(), a.data() + a.size());
}

// A zeroed template of field f: exactly its dtype and shape (a 0-d array for shape []).
py::array ReadField(const RM& m, int f) {
  py::array a = NewArray(m.schema().field(f), {});
  std::memset(a.mutable_data(), 0, static_cast<size_t>(a.nbytes()));
  return a;
}

// Converts the six user rows (s, a, r, p, v, i) and adds them.
void AddRows(RM& m, int64_t n, const std::vector<py::handle>& rows, const py::handle& init_w,
             bool batched) {
  const char* const* kNames = RM::kFieldNames;
  RowScratch scratch;
  const void* ptrs[RM::kNumFields] = {};
  int user = 0;
  for (int f = 0; f < RM::kNumFields; ++f) {
    if (f == RM::kQvest) continue;
    if (!batched) {
      ptrs[f] = scratch.Row(rows[user++], m.schema().field(f), kNames[f]);
    } else {
      Field fd = m.schema().field(f);
      fd.shape.insert(fd.shape.begin(), n);
      ptrs[f] = scratch.Row(rows[user++], fd, kNames[f]);
    }
  }
  Field wf{"init_w", DType::kFloat32, {}};
  if (batched) wf.shape = {n};
  const float* wp = static_cast<const float*>(scratch.Row(init_w, wf, "init_w"));
  CallReleased([&] { return m.AddEntries(n, ptrs, wp); });
}

}  // namespace

namespace {

// Where each output of a sample of n transitions lies in one block: 64-byte aligned parts,
// disabled cache fields left out.
struct SampleBlock {
  static constexpr size_t kNone = ~size_t(0);  // a field the cache flags leave out
  size_t prev[ReplayMemory::kNumFields], next[ReplayMemory::kNumFields];
  size_t weight = 0, prob = 0, done = 0, id = 0, total = 0;

  SampleBlock(const ReplayMemory& rm, const ReplayMemory::Options& o, int64_t n) {
    for (int f = 0; f < ReplayMemory::kNumFields; ++f) {
      const size_t bytes = static_cast<size_t>(n) * o.frame_stack * rm.schema().field(f).bytes();
      prev[f] = o.cache_flags[f] ? Place(bytes) : kNone;
      next[f] = o.cache_flags[ReplayMemory::kNumFields + f] ? Place(bytes) : kNone;
    }
    weight = Place(n * sizeof(float));
    prob = Place(n * sizeof(double));
    done = Place(static_cast<size_t>(n));
    id = Place(n * sizeof(int64_t));
  }

  // SampleOut pointing into `base` (64-byte aligned), for the fields the options enable,
  // sized for the options' frame_stack.
  ReplayMemory::SampleOut Outputs(uint8_t* base, int frame_stack) const {
    ReplayMemory::SampleOut out;
    out.frame_stack = frame_stack;
    for (int f = 0; f < ReplayMemory::kNumFields; ++f) {
      out.prev[f] = prev[f] == kNone ? nullptr : base + prev[f];
      out.next[f] = next[f] == kNone ? nullptr : base + next[f];
    }
    out.weight = reinterpret_cast<float*>(base + weight);
    out.prob = reinterpret_cast<double*>(base + prob);
    out.done = base + done;
    out.id = reinterpret_cast<int64_t*>(base + id);
    return out;
  }

 private:
  size_t Place(size_t bytes) {
    const size_t at = total;
    total += (bytes + 63) / 64 * 64;
    return at;
  }
};

}  // namespace

void BindReplayMemory(py::module_& m) {
  py::class_<RM, std::shared_ptr<RM>> c(m, "ReplayMemory");
  c.def(py::init([](py::object s, py::object a, py::object r, py::object p, py::object v,
                    py::object q, py::object i, int64_t max_step, bool vector_prob,
                    bool compress_states) {
          return MakeMemory({s, a, r, p, v, q, i}, max_step, vector_prob, compress_states);
        }),
        py::arg("state_buf"), py::arg("action_buf"), py::arg("reward_buf"), py::arg("prob_buf"),
        py::arg("value_buf"), py::arg("qvest_buf"), py::arg("info_buf"), py::arg("max_step"),
        py::kw_only(), py::arg("vector_prob") = false, py::arg("compress_states") = false);

  // Read-only.
  for (int f = 0; f < RM::kNumFields; ++f)
    c.def_property_readonly(kBufNames[f], [f](const RM& self) { return ReadField(self, f); });
  c.def_property_readonly("entry_size", [](const RM& self) { return self.schema().row_bytes(); });
  c.def_property_readonly("max_step", &RM::max_step);
  c.def_property("uuid", &RM::uuid, &RM::set_uuid);
  c.def_property_readonly("memory_bytes", &RM::memory_bytes);
  c.def_property_readonly("compress_states", &RM::compress_states);
  c.def_property_readonly("stored_state_bytes", &RM::stored_state_bytes);

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
  MEMOIRE_OPTION(allow_nonfinite, bool)
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
        auto a = InArray<uint8_t>::ensure(v);
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
    // Outputs are sized from the settings read here; if another thread changes frame_stack
    // before Sample takes the lock, Sample refuses (writing nothing) and we size again.
    for (int attempt = 0;; ++attempt) {
      const RM::Options o = self.options();
      const SampleBlock L(self, o, n);
      // All outputs are views into one allocation: one malloc per batch instead of 18, and
      // (for Atari-sized stacks) no allocator trimming and re-faulting of fresh pages on every
      // call, which cost more than the copies themselves. From the buffer pool: warm pages of
      // batches already dropped, not fresh ones.
      py::array block = NewArray(Field{"block", DType::kUInt8, {}}, {static_cast<int64_t>(L.total + 64)});
      uint8_t* base = static_cast<uint8_t*>(block.mutable_data());
      base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
      auto view = [&](const py::dtype& dt, std::vector<py::ssize_t> shape, size_t at) {
        return py::array(dt, shape, static_cast<const void*>(base + at), block);
      };
      py::tuple prev(static_cast<size_t>(RM::kNumFields)), next(static_cast<size_t>(RM::kNumFields));
      for (int f = 0; f < RM::kNumFields; ++f) {
        const Field& fd = self.schema().field(f);
        std::vector<py::ssize_t> shape{n, o.frame_stack};
        shape.insert(shape.end(), fd.shape.begin(), fd.shape.end());
        prev[f] = o.cache_flags[f] ? py::object(view(ToNumpy(fd.dtype), shape, L.prev[f])) : py::none();
        next[f] = o.cache_flags[RM::kNumFields + f]
                      ? py::object(view(ToNumpy(fd.dtype), shape, L.next[f])) : py::none();
      }
      py::array weight = view(py::dtype::of<float>(), {n}, L.weight);
      py::array prob = view(py::dtype::of<double>(), {n}, L.prob);
      py::array done = view(py::dtype::of<bool>(), {n}, L.done);
      py::array id = view(py::dtype::of<int64_t>(), {n}, L.id);
      RM::SampleOut out = L.Outputs(base, o.frame_stack);
      int frame_stack_now = o.frame_stack;
      out.frame_stack_now = &frame_stack_now;
      Status s;
      {
        GilRelease release;
        s = self.Sample(n, out);
      }
      if (!s.ok() && attempt < 100 && frame_stack_now != o.frame_stack) continue;
      ThrowIfError(s);
      return py::make_tuple(prev, next, weight, prob, done, id);
    }
  }, py::arg("batch_size"));

  // The client's push_cache without Python in the loop: samples a cache straight into one
  // pooled block and sends it as a CACHE message (frames in the order of `header`, which the
  // caller builds for the same settings) on a PUSH socket through pyzmq's libzmq, without
  // copying the large frames and without the GIL.
  c.def("_push_cache", [](RM& self, uintptr_t socket, const py::bytes& header, int64_t n,
                          uint64_t uuid, int timeout_ms) {
    if (!libzmq::Attached()) throw std::runtime_error("_push_cache: libzmq is not attached");
    if (n < 1) throw py::value_error("cache_size: expected >= 1, got " + std::to_string(n));
    const std::string head = header;
    bool sent = false;
    CallReleased([&] {
      const RM::Options o = self.options();
      const SampleBlock L(self, o, n);
      std::shared_ptr<uint8_t> block = PooledBytes(L.total);
      RM::SampleOut out = L.Outputs(block.get(), o.frame_stack);
      MEMOIRE_RETURN_IF_ERROR(self.Sample(n, out));
      const int64_t num_sampleable = self.num_sampleable();
      const double total_weight = self.total_weight();
      // Frames in the order of core/protocol.h's cache layout, which `header` describes.
      std::vector<libzmq::OutFrame> frames{{head.data(), head.size()}};
      const uint8_t* base = block.get();
      for (int f = 0; f < RM::kNumFields; ++f) {
        const size_t bytes = static_cast<size_t>(n) * o.frame_stack * self.schema().field(f).bytes();
        if (o.cache_flags[f]) frames.push_back({base + L.prev[f], bytes});
        if (o.cache_flags[RM::kNumFields + f]) frames.push_back({base + L.next[f], bytes});
      }
      frames.push_back({base + L.weight, n * sizeof(float)});
      frames.push_back({base + L.prob, n * sizeof(double)});
      frames.push_back({base + L.done, static_cast<size_t>(n)});
      frames.push_back({base + L.id, n * sizeof(int64_t)});
      frames.push_back({&uuid, 8});  // small frames are copied before Send returns
      frames.push_back({&num_sampleable, 8});
      frames.push_back({&total_weight, 8});
      sent = libzmq::Send(reinterpret_cast<void*>(socket), frames, timeout_ms, block);
      return Status::OK();
    });
    return sent;
  }, py::arg("socket"), py::arg("header"), py::arg("cache_size"), py::arg("uuid"),
     py::arg("timeout_ms"));

  // Checkpoints: memoire.memory.ReplayMemory.save/load open the files (atomic rename, safe
  // opens); these stream to and from the descriptor without the GIL.
  c.def("_save_fd", [](const RM& self, int fd) {
    CallReleased([&] { return self.SaveTo(fd); });
  }, py::arg("fd"));
  c.def("_load_fd", [](RM& self, int fd) {
    CallReleased([&] { return self.LoadFrom(fd); });
  }, py::arg("fd"));
  c.def_static("_checkpoint_checksum", [](const py::bytes& data, int section) {
    const std::string bytes = data;
    return RM::CheckpointChecksum(bytes.data(), bytes.size(), section);
  }, py::arg("data"), py::arg("section"));

  c.def("update_weights",
        [](RM& self, const py::handle& ids, const py::handle& weights) {
          auto i = InArray<int64_t>::ensure(ids);
          auto w = InArray<float>::ensure(weights);
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
