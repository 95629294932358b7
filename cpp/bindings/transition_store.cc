// Binds core::TransitionStore as memoire._core.TransitionStore: raw byte rows in, caller-owned
// numpy outputs filled with the GIL released. The public class (dtypes, shapes, Dopamine's
// types) is memoire.dopamine_compat.jax_replay_buffer.ReplayBuffer.
#include "core/transition_store.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings/common.h"

namespace memoire {
using TS = TransitionStore;

void BindTransitionStore(py::module_& m) {
  py::class_<TS, std::shared_ptr<TS>>(m, "TransitionStore", R"doc(
Frame-deduplicating store behind memoire's Dopamine JAX ReplayBuffer (see
cpp/core/transition_store.h). Private: use memoire.dopamine_compat.jax_replay_buffer.
Thread-safe: every method takes the store's lock; copies run with the GIL released.
)doc")
      .def(py::init([](int64_t max_capacity, int stack_size, int update_horizon, double gamma,
                       bool fix_terminal_duplicates, bool prioritized, int64_t tree_capacity,
                       size_t frame_bytes, size_t elem_bytes, size_t action_bytes) {
             TS::Options o;
             o.max_capacity = max_capacity;
             o.stack_size = stack_size;
             o.update_horizon = update_horizon;
             o.gamma = gamma;
             o.fix_terminal_duplicates = fix_terminal_duplicates;
             o.prioritized = prioritized;
             o.tree_capacity = tree_capacity;
             o.frame_bytes = frame_bytes;
             o.elem_bytes = elem_bytes;
             o.action_bytes = action_bytes;
             std::unique_ptr<TS> s;
             ThrowIfError(TS::Make(o, &s));
             return std::shared_ptr<TS>(std::move(s));
           }),
           py::arg("max_capacity"), py::arg("stack_size"), py::arg("update_horizon"),
           py::arg("gamma"), py::arg("fix_terminal_duplicates"), py::arg("prioritized"),
           py::arg("tree_capacity"), py::arg("frame_bytes"), py::arg("elem_bytes"),
           py::arg("action_bytes"))
      .def_property_readonly("add_count", &TS::add_count)
      .def_property_readonly_static("MAX_ADD_COUNT", [](py::object) { return TS::kMaxAddCount; })
      .def_property_readonly("size", &TS::size)
      .def_property_readonly("tree_root", &TS::tree_root)
      .def_property_readonly("num_nodes", &TS::num_nodes)
      .def_property_readonly("frame_capacity", &TS::frame_capacity)
      .def("add",
           [](TS& t, const py::array& frame, const py::array& action, double reward,
              bool terminal, bool episode_end, double priority) {
             const uint8_t* f = BytesIn(frame, t.options().frame_bytes, "observation");
             const uint8_t* a = BytesIn(action, t.options().action_bytes, "action");
             int64_t emitted = 0;
             CallReleased([&] {
               return t.Add(f, a, reward, terminal, episode_end, priority, &emitted);
             });
             return emitted;
           },
           py::arg("frame"), py::arg("action"), py::arg("reward"), py::arg("terminal"),
           py::arg("episode_end"), py::arg("priority"),
           "Adds one step; returns how many elements it yielded.")
      .def("add_batch",
           [](TS& t, const py::array& frames, const py::array& actions, const py::handle& rewards,
              const py::array& terminals, const py::array& episode_ends,
              const py::object& priorities) {
             const auto& o = t.options();
             auto r = ArrayOf<double>(rewards, "rewards");
             const size_t k = r.size();
             const uint8_t* f = BytesIn(frames, k * o.frame_bytes, "observations");
             const uint8_t* a = BytesIn(actions, k * o.action_bytes, "actions");
             const uint8_t* te = BytesIn(terminals, k, "is_terminal");
             const uint8_t* ee = BytesIn(episode_ends, k, "episode_end");
             InArray<double> pr;
             const double* p = nullptr;
             if (!priorities.is_none()) {
               pr = ArrayOf<double>(priorities, "priorities");
               CheckLength(pr.size(), k, "priorities", "step");
               p = pr.data();
             }
             py::array_t<int64_t> emitted(k);
             int64_t* e = emitted.mutable_data();
             CallReleased([&] {
               return t.AddBatch(static_cast<int64_t>(k), f, a, r.data(), te, ee, p, e);
             });
             return emitted;
           },
           py::arg("frames"), py::arg("actions"), py::arg("rewards"), py::arg("terminals"),
           py::arg("episode_ends"), py::arg("priorities"),
           "Adds k steps in one call (k = len(rewards)): frames [k, frame bytes], actions\n"
           "[k, action bytes], float64 rewards [k], 1-byte terminals and episode ends [k],\n"
           "float64 priorities [k] or None. Returns int64 [k]: elements each step yielded.")
      .def("keys_at",
           [](const TS& t, const py::handle& indices) {
             auto idx = ArrayOf<int64_t>(indices, "indices");
             py::array_t<int32_t> keys(idx.size());
             int32_t* k = keys.mutable_data();
             CallReleased([&] { return t.KeysAt(idx.data(), idx.size(), k); });
             return keys;
           },
           py::arg("indices"), "int32 keys at dense indices (uniform draws).")
      .def("query",
           [](const TS& t, const py::handle& targets) {
             auto tg = ArrayOf<double>(targets, "targets");
             py::array_t<int32_t> keys(tg.size());
             py::array_t<double> probs(tg.size());
             int32_t* k = keys.mutable_data();
             double* p = probs.mutable_data();
             CallReleased([&] { return t.Query(tg.data(), tg.size(), k, p); });
             return py::make_tuple(keys, probs);
           },
           py::arg("targets"), "(int32 keys, float64 probabilities) for prefix-sum targets.")
      .def("update",
           [](TS& t, const py::handle& keys, const py::handle& values) {
             auto k = ArrayOf<int64_t>(keys, "keys");
             auto v = ArrayOf<double>(values, "priorities");
             CheckLength(v.size(), k.size(), "priorities", "key");
             CallReleased([&] { return t.Update(k.data(), v.data(), k.size()); });
           },
           py::arg("keys"), py::arg("values"))
      .def("priorities",
           [](const TS& t, const py::handle& keys) {
             auto k = ArrayOf<int64_t>(keys, "keys");
             py::array_t<double> out(k.size());
             double* o = out.mutable_data();
             CallReleased([&] { return t.Priorities(k.data(), k.size(), o); });
             return out;
           },
           py::arg("keys"))
      .def("gather",
           [](const TS& t, const py::handle& keys, py::array state, py::array action,
              py::array reward, py::array next_state, py::array terminal, py::array episode_end) {
             auto k = ArrayOf<int64_t>(keys, "keys");
             const size_t n = k.size();
             const auto& o = t.options();
             const size_t sb = n * o.frame_bytes * o.stack_size;
             uint8_t* s = BytesOut(state, sb, "state");
             uint8_t* a = BytesOut(action, n * o.action_bytes, "action");
             uint8_t* r = BytesOut(reward, n * sizeof(double), "reward");
             uint8_t* ns = BytesOut(next_state, sb, "next_state");
             uint8_t* te = BytesOut(terminal, n, "is_terminal");
             uint8_t* ee = BytesOut(episode_end, n, "episode_end");
             CallReleased([&] {
               return t.Gather(k.data(), n, s, a, reinterpret_cast<double*>(r), ns, te, ee);
             });
           },
           py::arg("keys"), py::arg("state"), py::arg("action"), py::arg("reward"),
           py::arg("next_state"), py::arg("is_terminal"), py::arg("episode_end"),
           "Fills the outputs with the elements of `keys` (KeyError(key) for a key not stored).")
      .def("clear", [](TS& t) {
        GilRelease r;
        t.Clear();
      })
      .def("clear_trajectory", &TS::ClearTrajectory,
           "Drops the accumulator's partial trajectory; elements stay.")
      .def("export_sampler",
           [](const TS& t) {
             py::array_t<int64_t> keys(t.size());
             py::object nodes = py::none();
             double* np = nullptr;
             if (t.options().prioritized) {
               py::array_t<double> a(t.num_nodes());
               np = a.mutable_data();
               nodes = a;
             }
             t.ExportSampler(keys.mutable_data(), np);
             return py::make_tuple(keys, nodes);
           },
           "(int64 key_by_index, float64 tree nodes or None).")
      .def("export_window",
           [](const TS& t) {
             const auto& o = t.options();
             const int64_t w = t.window_size();
             py::array_t<uint8_t> frames({w, static_cast<int64_t>(o.frame_bytes)});
             py::array_t<uint8_t> actions({w, static_cast<int64_t>(o.action_bytes)});
             py::array_t<double> rewards(w);
             py::array_t<bool> terminals(w), episode_ends(w);
             t.ExportWindow(frames.mutable_data(), actions.mutable_data(),
                            rewards.mutable_data(),
                            reinterpret_cast<uint8_t*>(terminals.mutable_data()),
                            reinterpret_cast<uint8_t*>(episode_ends.mutable_data()));
             return py::make_tuple(frames, actions, rewards, terminals, episode_ends);
           },
           "The accumulator's steps as raw rows: (frames, actions, rewards, terminals, ends).")
      .def("import_state",
           [](TS& t, int64_t add_count, py::array states, py::array actions, py::array rewards,
              py::array next_states, py::array terminals, py::array episode_ends,
              const py::handle& key_by_index, const py::object& nodes, py::array win_frames,
              py::array win_actions, py::array win_rewards, py::array win_terminals,
              py::array win_episode_ends) {
             const auto& o = t.options();
             auto kbi = ArrayOf<int64_t>(key_by_index, "key_by_index");
             const size_t m = kbi.size();
             const size_t sb = m * o.frame_bytes * o.stack_size;
             const uint8_t* s = BytesIn(states, sb, "states");
             const uint8_t* a = BytesIn(actions, m * o.action_bytes, "actions");
             const uint8_t* r = BytesIn(rewards, m * sizeof(double), "rewards");
             const uint8_t* ns = BytesIn(next_states, sb, "next_states");
             const uint8_t* te = BytesIn(terminals, m, "terminals");
             const uint8_t* ee = BytesIn(episode_ends, m, "episode_ends");
             const double* nd = nullptr;
             InArray<double> nodes_arr;
             if (!nodes.is_none()) {
               nodes_arr = ArrayOf<double>(nodes, "sum tree nodes");
               CheckLength(nodes_arr.size(), t.num_nodes(), "sum tree nodes", "node");
               nd = nodes_arr.data();
             }
             const size_t w = win_rewards.size();
             const uint8_t* wf = BytesIn(win_frames, w * o.frame_bytes, "accumulator observations");
             const uint8_t* wa = BytesIn(win_actions, w * o.action_bytes, "accumulator actions");
             const uint8_t* wr = BytesIn(win_rewards, w * sizeof(double), "accumulator rewards");
             const uint8_t* wt = BytesIn(win_terminals, w, "accumulator terminals");
             const uint8_t* we = BytesIn(win_episode_ends, w, "accumulator episode ends");
             CallReleased([&] {
               return t.Import(add_count, m, s, a, reinterpret_cast<const double*>(r), ns, te,
                               ee, kbi.data(), nd, w, wf, wa,
                               reinterpret_cast<const double*>(wr), wt, we);
             });
           });
}

}  // namespace memoire
