// The sampling stream's Python face: conversions around the learner's end (StreamSource,
// core/stream_source.h), the server's (StreamHub and its shared memory, core/stream_hub.h), and
// the ring's layout for tests. The stream's behaviour is in those core files.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/batch_views.h"
#include "bindings/common.h"
#include "bindings/device_feed.h"
#include "core/libzmq.h"
#include "core/rate_limiter.h"
#include "core/replay_memory.h"
#include "core/stream_hub.h"
#include "core/stream_source.h"

namespace memoire {

namespace {

StreamLayout LayoutFrom(const py::list& templates, int64_t batch_size, int frame_stack,
                        int multi_step, const std::vector<bool>& flags) {
  StreamLayout l;
  CheckLength(static_cast<int64_t>(templates.size()), protocol::kNumFields, "templates", "field");
  CheckLength(static_cast<int64_t>(flags.size()), 2 * protocol::kNumFields, "flags", "stack");
  std::vector<Field> fields;
  for (int f = 0; f < protocol::kNumFields; ++f)
    fields.push_back(FieldFromTemplate(protocol::kFieldNames[f], templates[f]));
  ThrowIfError(Schema::Make(fields, &l.schema));
  l.batch_size = batch_size;
  l.frame_stack = frame_stack;
  l.multi_step = multi_step;
  for (size_t i = 0; i < flags.size(); ++i) l.flags[i] = flags[i];
  ThrowIfError(l.Check());
  return l;
}

std::vector<std::string> Strings(const py::list& frames) {
  std::vector<std::string> out;
  for (const py::handle& h : frames) {
    py::buffer_info info = py::reinterpret_borrow<py::buffer>(h).request();
    out.emplace_back(static_cast<const char*>(info.ptr),
                     static_cast<size_t>(info.size * info.itemsize));
  }
  return out;
}

// A shared-memory batch handed out: its slot, held until the last view is dropped.
struct SlotLease {
  std::shared_ptr<StreamSource> source;
  int64_t slot;
};

}  // namespace

FeedRing StreamSlotsOf(const py::object& source) {
  auto src = source.cast<std::shared_ptr<StreamSource>>();
  if (!src->shared_memory())
    ThrowInvalid("source: the stream's rows travel in messages (a device feed copies from a "
                 "_core.Feed over it)");
  FeedRing out{std::make_shared<StreamSlots>(src), {}, {}, {}};
  for (const BatchPart& p : src->slot_layout().parts) {
    out.dtypes.push_back(ToNumpy(p.dtype));
    out.shapes.emplace_back(p.shape.begin(), p.shape.end());
    out.none.push_back(p.none);
  }
  return out;
}

void BindStream(py::module_& m) {
  py::class_<StreamSource, std::shared_ptr<StreamSource>>(m, "StreamSource", R"doc(
A learner's end of a sampling stream (private: use memoire.stream.SamplingStream). Rows in the
messages: a source for _core.Feed that receives each batch from a connected DEALER socket and
stacks it into the ring. Shared memory (shm_path given): `take` hands out views of the slot the
server wrote the batch into.

StreamSource(socket, templates, batch_size, frame_stack, multi_step, flags, timeout_ms,
ping_ms, credit_chunk, credit_message, ping_message, max_payload_bytes, shm_path, shm_slots,
shm_slot_bytes): `socket` is the
DEALER's `underlying` address (requires attach_libzmq; Python keeps the socket open and does not
use it while the source lives); templates, the 7 field templates; flags, the 14 cache flags;
credit_message / ping_message, encoded frames of a credit of credit_chunk / of 0; shm_path
(non-empty): the server's StreamShm (its ring, then shm_slots slots of shm_slot_bytes), mapped
read-write.
)doc")
      .def(py::init([](uintptr_t socket, const py::list& templates, int64_t batch_size,
                       int frame_stack, int multi_step, const std::vector<bool>& flags,
                       int timeout_ms, int ping_ms, int64_t credit_chunk,
                       const py::list& credit_message, const py::list& ping_message,
                       uint64_t max_payload_bytes, const std::string& shm_path,
                       int64_t shm_slots, uint64_t shm_slot_bytes, bool compressed_state) {
             if (!libzmq::Attached())
               ThrowIfError(Error(Code::kFailedPrecondition, "the sampling stream needs the "
                                  "native message path (pyzmq's libzmq, see memoire.transport."
                                  "native_libzmq)"));
             if (socket == 0) ThrowInvalid("socket: expected a socket address, got 0");
             if (timeout_ms < 1 || ping_ms < 1 || credit_chunk < 1)
               ThrowInvalid("timeout_ms, ping_ms and credit_chunk: expected >= 1");
             StreamSource::Options o;
             o.socket = reinterpret_cast<void*>(socket);
             o.layout = LayoutFrom(templates, batch_size, frame_stack, multi_step, flags);
             o.layout.compressed_state = compressed_state;
             o.limits.max_payload_bytes = max_payload_bytes;
             o.timeout_ms = timeout_ms;
             o.ping_ms = ping_ms;
             o.credit_chunk = credit_chunk;
             o.credit_message = Strings(credit_message);
             o.ping_message = Strings(ping_message);
             if (!shm_path.empty())
               ThrowIfError(StreamSource::MapSlots(shm_path, shm_slots, shm_slot_bytes, &o));
             return std::make_shared<StreamSource>(std::move(o));
           }),
           py::arg("socket"), py::arg("templates"), py::arg("batch_size"),
           py::arg("frame_stack"), py::arg("multi_step"), py::arg("flags"),
           py::arg("timeout_ms"), py::arg("ping_ms"), py::arg("credit_chunk"),
           py::arg("credit_message"), py::arg("ping_message"),
           py::arg("max_payload_bytes") = uint64_t(1) << 32, py::arg("shm_path") = "",
           py::arg("shm_slots") = 0, py::arg("shm_slot_bytes") = 0,
           py::arg("compressed_state") = false)
      .def("take", [](std::shared_ptr<StreamSource> src) {
             if (!src->shared_memory())
               ThrowInvalid("take: the stream's rows travel in messages (use a Feed)");
             int64_t slot = -1;
             Status s;
             {
               GilRelease release;
               s = src->Next(&slot);
             }
             ThrowIfError(s);
             // The slot goes back to the server once every view of the batch is dropped.
             py::capsule lease(new SlotLease{src, slot}, [](void* p) {
               auto* l = static_cast<SlotLease*>(p);
               l->source->Release(l->slot);
               delete l;
             });
             const BatchLayout& l = src->slot_layout();
             std::vector<uint8_t*> parts(l.parts.size());
             l.PartsAt(src->slot_data(slot), parts.data());
             return BatchViews(l, parts.data(), lease);
           }, R"doc(
Shared memory: the next batch, as views of its slot: prev[7], next[7] (None where the flags
leave a stack out), weight, prob, done, id, num_sampleable int64[1], total_weight f64[1].
The slot goes back to the server when every array is dropped. RuntimeError when the server
refused or its draw failed (attribute server_error), when nothing came within the timeout
(timeout), or when the learner holds every slot (held); ValueError on a malformed notice.
)doc")
      .def("post", [](StreamSource& s, const py::list& frames) {
             std::vector<std::string> f = Strings(frames);
             GilRelease release;
             s.Post(std::move(f));
           }, py::arg("frames"), "Sends an encoded message (its frames) to the server.")
      .def("stop", &StreamSource::Stop, "Ends a receive in progress (the feed then closes).")
      .def_property_readonly(
          "dtypes",
          [](const StreamSource& src) {
            py::list out;
            for (const BatchPart& p : src.slot_layout().parts)
              out.append(p.none ? py::object(py::none()) : py::object(ToNumpy(p.dtype)));
            return out;
          },
          "shared memory: each part's numpy dtype in a slot (None for a part left out); empty "
          "for rows in messages")
      .def_property_readonly("received", &StreamSource::received, "batches received")
      .def_property_readonly("credit_returned", &StreamSource::credit_returned,
                             "credit given back to the server after the first grant")
      .def_property_readonly("last_seq", &StreamSource::last_seq,
                             "the last batch's number (-1 before the first)");

  py::class_<ServerShm, std::shared_ptr<ServerShm>>(m, "StreamShm", R"doc(
A server's shared memory for one sampling stream (a new file in /dev/shm, mode 0600, removed
by the learner once mapped, or when this object goes). StreamShm(memory, batch_size, slots):
the stream's ring (core/stream_ring.h, ring_bytes), then room for `slots` batches of the
memory's layout now (frame_stack, cache_flags), each written as the learner reads it
(core/batch_layout.h; slot_bytes a whole number of pages).
)doc")
      .def(py::init([](const ReplayMemory& rm, int64_t batch_size, int64_t slots) {
             if (batch_size < 1 || slots < 1)
               ThrowInvalid("batch_size and slots: expected >= 1");
             std::shared_ptr<ServerShm> shm;
             ThrowIfError(ServerShm::Create(MemoryStreamLayout(rm, batch_size), slots, &shm));
             return shm;
           }),
           py::arg("memory"), py::arg("batch_size"), py::arg("slots"))
      .def_static("slot_bytes_for", [](const ReplayMemory& rm, int64_t batch_size) {
             if (batch_size < 1) ThrowInvalid("batch_size: expected >= 1");
             return StreamSlotLayout(MemoryStreamLayout(rm, batch_size)).slot_bytes;
           }, py::arg("memory"), py::arg("batch_size"),
           "The bytes of one slot for batches of batch_size from memory as it is set now.")
      .def_property_readonly("path", [](const ServerShm& s) { return s.region->path(); })
      .def_property_readonly("bytes", [](const ServerShm& s) { return s.region->bytes(); })
      .def_property_readonly("slot_bytes",
                             [](const ServerShm& s) { return s.slot_layout.slot_bytes; })
      .def_property_readonly("slots", [](const ServerShm& s) { return s.slots; })
      .def_property_readonly("ring_bytes",
                             [](const ServerShm& s) { return StreamRing::Bytes(s.slots); },
                             "bytes of the ring before the slots");
  m.attr("STREAM_RING_VERSION") = StreamRing::kVersion;
  m.def("stream_ring_offsets", [](int64_t slots) {
          if (slots < 1) ThrowInvalid("slots: expected >= 1");
          const StreamRing::Offsets o = StreamRing::OffsetsOf(slots);
          return py::dict(py::arg("notice_head") = o.notice_head,
                          py::arg("notice_waiters") = o.notice_waiters,
                          py::arg("credit_head") = o.credit_head,
                          py::arg("notice_tail") = o.notice_tail,
                          py::arg("learner_events") = o.learner_events,
                          py::arg("server_waiters") = o.server_waiters,
                          py::arg("notices") = o.notices, py::arg("credits") = o.credits,
                          py::arg("bytes") = StreamRing::Bytes(slots));
        }, py::arg("slots"), R"doc(
Where a shared-memory stream's ring keeps its words (byte offsets in the mapping; for tests that
play a raw peer): notice_head, credit_head, notice_tail, learner_events, *_waiters (uint32),
notices (slots entries of int64
seq, slot, error_bytes, reserved), credits (slots int64 entries), bytes (the ring's size).
)doc");

  py::class_<StreamHub, std::shared_ptr<StreamHub>>(m, "StreamHub", R"doc(
The native side of a stream worker's ROUTER socket (private: memoire/server/sampling_service.py).
StreamHub(socket): `socket` is the ROUTER's `underlying` address (requires attach_libzmq); only
the worker's thread uses the socket, in `poll` and between polls. Shared-memory streams are
sampled by native threads (core/stream_sampler.h) that trade notices and slots with their
learner through the stream's ring: `add` starts one; `refusals` names those that refused a
credit and stopped.
)doc")
      .def(py::init([](uintptr_t socket) {
             if (!libzmq::Attached())
               ThrowIfError(Error(Code::kFailedPrecondition, "StreamHub: needs attach_libzmq"));
             if (socket == 0) ThrowInvalid("socket: expected a socket address, got 0");
             std::shared_ptr<StreamHub> hub;
             ThrowIfError(StreamHub::Make(reinterpret_cast<void*>(socket), &hub));
             return hub;
           }),
           py::arg("socket"))
      .def("add",
           [](StreamHub& h, const py::bytes& identity, std::shared_ptr<ReplayMemory> rm,
              std::shared_ptr<ServerShm> shm, int threads, int64_t ahead,
              std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms) {
             if (!rm || !shm) ThrowInvalid("add: expected a ReplayMemory and a StreamShm");
             if (threads < 1 || threads > 256)
               ThrowInvalid("threads: expected 1..256, got " + std::to_string(threads));
             if (ahead < 0) ThrowInvalid("ahead: expected >= 0, got " + std::to_string(ahead));
             const std::string id = identity;
             Status s;
             {
               GilRelease release;  // Add may stop a previous sampler (joins)
               s = h.Add(id, std::move(rm), std::move(shm), threads, ahead, std::move(limiter),
                         error_pause_ms, limited_pause_ms);
             }
             ThrowIfError(s);
           },
           py::arg("identity"), py::arg("memory"), py::arg("shm"), py::arg("threads"),
           py::arg("ahead"), py::arg("limiter"), py::arg("error_pause_ms"),
           py::arg("limited_pause_ms"),
           "Starts `threads` sampler threads for the peer `identity`, writing into `shm`'s "
           "slots (all free now), keeping at most `ahead` batches drawn and not taken by the "
           "learner (0: up to the slots), obeying `limiter` (None: no limiter).")
      .def("add_rows",
           [](StreamHub& h, const py::bytes& identity, std::shared_ptr<ReplayMemory> rm,
              int64_t batch_size, int window, const std::vector<bool>& send,
              bool compressed_state, int64_t credit, int threads,
              std::shared_ptr<RateLimiter> limiter, int error_pause_ms, int limited_pause_ms,
              int send_timeout_ms) {
             if (!rm) ThrowInvalid("add_rows: expected a ReplayMemory");
             CheckLength(static_cast<int64_t>(send.size()), protocol::kNumFields, "send",
                         "field");
             StreamRowsSampler::Options o;
             o.memory = std::move(rm);
             o.limiter = std::move(limiter);
             o.batch_size = batch_size;
             o.window = window;
             for (int f = 0; f < protocol::kNumFields; ++f) o.send[f] = send[f];
             if (compressed_state && !o.memory->compress_states())
               ThrowInvalid("add_rows: compressed_state needs a memory that compresses states");
             o.compressed_state = compressed_state;
             o.credit = credit;
             o.threads = threads;
             o.error_pause_ms = error_pause_ms;
             o.limited_pause_ms = limited_pause_ms;
             const std::string id = identity;
             Status s;
             {
               GilRelease release;  // AddRows may stop a previous sampler (joins)
               s = h.AddRows(id, std::move(o), send_timeout_ms);
             }
             ThrowIfError(s);
           },
           py::arg("identity"), py::arg("memory"), py::arg("batch_size"), py::arg("window"),
           py::arg("send"), py::arg("compressed_state"), py::arg("credit"), py::arg("threads"),
           py::arg("limiter"),
           py::arg("error_pause_ms"), py::arg("limited_pause_ms"), py::arg("send_timeout_ms"),
           "Starts `threads` sampler threads for the peer `identity`'s rows stream: batches "
           "of `batch_size` distinct rows (the 7 fields `send` says, windows of `window`; "
           "states as the memory's LZ4 blocks with `compressed_state`), "
           "`credit` granted now, obeying `limiter` (None: no limiter); `poll` sends them.")
      .def("grant",
           [](StreamHub& h, const py::bytes& identity, int64_t k) {
             if (k < 0) ThrowInvalid("grant: expected k >= 0, got " + std::to_string(k));
             std::shared_ptr<StreamRowsSampler> s = h.FindRows(identity);
             if (!s) return false;
             s->Grant(k);
             return true;
           },
           py::arg("identity"), py::arg("k"),
           "`k` more batches for the peer's rows stream; False when it has none.")
      .def("outstanding",
           [](StreamHub& h, const py::bytes& identity) -> int64_t {
             std::shared_ptr<StreamRowsSampler> s = h.FindRows(identity);
             return s ? s->outstanding() : -1;
           },
           py::arg("identity"),
           "The peer's rows stream's credit not yet sent: undrawn, drawing or queued (-1: no "
           "rows stream).")
      .def("remove",
           [](StreamHub& h, const py::bytes& identity) {
             const std::string id = identity;
             GilRelease release;
             return h.Remove(id);
           },
           py::arg("identity"), "Stops and forgets the peer's sampler; False when none.")
      .def("clear", [](StreamHub& h) {
             GilRelease release;
             h.Clear();
           }, "Stops and forgets every sampler.")
      .def("poll",
           [](StreamHub& h, int timeout_ms) -> py::object {
             std::unique_ptr<libzmq::Frames> frames;
             Status s;
             {
               GilRelease release;
               s = h.Poll(std::max(0, timeout_ms), &frames);
             }
             ThrowIfError(s);
             if (!frames) return py::none();
             py::list out;
             for (size_t i = 0; i < frames->size(); ++i)
               out.append(py::bytes(reinterpret_cast<const char*>(frames->data(i)),
                                    frames->bytes(i)));
             return out;
           },
           py::arg("timeout_ms"), R"doc(
Waits up to timeout_ms (GIL released) for a message: returns its frames (bytes: identity,
then the message), or None at the timeout or when a sampler refused a credit (see
`refusals`). RuntimeError on a socket error.
)doc")
      .def("refusals",
           [](StreamHub& h) {
             py::list out;
             for (auto& [identity, why] : h.Refusals())
               out.append(py::make_tuple(py::bytes(identity), why));
             return out;
           },
           "[(identity, why)] of the samplers that refused their learner's credit (each has "
           "stopped drawing until `remove`).")
      .def("idle_seconds",
           [](StreamHub& h, const py::bytes& identity) {
             std::shared_ptr<StreamSampler> s = h.Find(identity);
             return s ? s->idle_seconds() : -1.0;
           },
           py::arg("identity"), "Seconds since the peer last gave slots back (-1: no sampler).")
      .def("held",
           [](StreamHub& h, const py::bytes& identity) -> int64_t {
             std::shared_ptr<StreamSampler> s = h.Find(identity);
             return s ? s->held() : -1;
           },
           py::arg("identity"), "Slots the peer holds (-1: no sampler).")
      .def("take_counts",
           [](StreamHub& h) {
             StreamCounts& c = h.counts();
             return py::dict(py::arg("stream_batches") = c.batches.exchange(0),
                             py::arg("rows_sampled") = c.rows.exchange(0),
                             py::arg("stream_draw_errors") = c.draw_errors.exchange(0),
                             py::arg("stream_rate_limited") = c.rate_limited.exchange(0),
                             py::arg("stream_send_errors") = c.send_errors.exchange(0));
           },
           "The samplers' counts since the last call (each counted once).")
      .def_property_readonly(
          "samplers_waiting", [](StreamHub& h) { return h.counts().waiting.load(); },
          "Sampler threads waiting for their learner now (credit, a slot, a take).");
}

}  // namespace memoire
