// The sampling stream's native ends: see bindings/stream.h and core/stream_batch.h.
#include "bindings/stream.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/common.h"
#include "bindings/libzmq.h"
#include "core/replay_memory.h"

namespace memoire {

namespace {

constexpr int kSliceMs = 5;  // a waiting receive checks for posts and Stop this often
// The ERROR kind of a failed draw (memoire/server/sampling_service.py DRAW_ERROR): unlike a
// refusal, it spent a credit.
constexpr const char* kDrawError = "SampleError";

void SendStrings(void* socket, const std::vector<std::string>& frames, int timeout_ms) {
  std::vector<libzmq::OutFrame> out;
  for (const std::string& f : frames) out.push_back({f.data(), f.size()});
  libzmq::Send(socket, out, timeout_ms, nullptr);  // a full queue drops it: the timeout tells
}

}  // namespace

void StreamSource::FlushLocked() {
  std::deque<std::vector<std::string>> q;
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    q.swap(queue_);
  }
  for (const auto& frames : q) SendStrings(opt_.socket, frames, opt_.timeout_ms);
  if (owed_ >= opt_.credit_chunk) {
    SendStrings(opt_.socket, opt_.credit_message, opt_.timeout_ms);
    owed_ -= opt_.credit_chunk;
    credit_returned_.fetch_add(opt_.credit_chunk);
  }
}

void StreamSource::Post(std::vector<std::string> frames) {
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    queue_.push_back(std::move(frames));
  }
  // Send now unless the feed's thread holds the socket (it flushes within kSliceMs then).
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (io.owns_lock()) FlushLocked();
}

Status StreamSource::Fill(int thread, uint8_t* const* parts) {
  if (thread != 0) return Error(Code::kInternal, "stream: one receiving thread per stream");
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(opt_.timeout_ms);
  auto next_ping = start + std::chrono::milliseconds(opt_.ping_ms);
  libzmq::Frames frames;
  while (true) {
    if (stopping_.load()) return Error(Code::kFailedPrecondition, "the stream is closed");
    int rc;
    {
      std::lock_guard<std::mutex> io(io_mu_);
      FlushLocked();
      const auto now = Clock::now();
      if (now >= next_ping) {
        // A restarted server does not know this stream: the ping makes it say so.
        SendStrings(opt_.socket, opt_.ping_message, kSliceMs);
        next_ping = now + std::chrono::milliseconds(opt_.ping_ms);
      }
      rc = libzmq::Receive(opt_.socket, kSliceMs, &frames);
    }
    if (rc < 0) return Error(Code::kFailedPrecondition, "stream: socket error: ", libzmq::LastError());
    if (rc == 1) break;
    if (Clock::now() >= deadline)
      return Error(Code::kFailedPrecondition, "stream: no batch from the server within ",
                   opt_.timeout_ms, " ms (is it running? a dead or unreachable server is "
                   "noticed this way)")
          .With("timeout", opt_.timeout_ms);
  }
  std::vector<codec::Frame> views(frames.size());
  for (size_t i = 0; i < views.size(); ++i) views[i] = {frames.data(i), frames.bytes(i)};
  std::string kind, reason;
  const bool error = ReadErrorMessage(views.data(), views.size(), &kind, &reason);
  if (!error || kind == kDrawError) {
    // The server spent one credit on this message (a batch or a failed draw): give it back.
    std::lock_guard<std::mutex> io(io_mu_);
    ++owed_;
    FlushLocked();
  }
  if (error && kind == kDrawError)
    return Error(Code::kFailedPrecondition, "stream: the server's draw failed: ", reason)
        .With("server_error", 1);
  if (error)
    return Error(Code::kFailedPrecondition, "stream: the server refused: ", kind, ": ", reason)
        .With("server_error", 1);
  int64_t seq = -1;
  MEMOIRE_RETURN_IF_ERROR(
      UnstackStreamBatch(views.data(), views.size(), opt_.layout, opt_.limits, parts, &seq));
  last_seq_.store(seq);
  received_.fetch_add(1);
  return Status::OK();
}

namespace {

// Keeps a sent batch's bytes until libzmq's I/O thread has sent them.
struct SentBatch {
  StreamBatch batch;
  std::string header;
};

// Samples `count` batches of n from `rm` and sends each to `identity` on a ROUTER socket.
// Returns (sent, error): error is the failed draw's Status when one failed (nothing more is
// sent after it), OK otherwise.
std::pair<int64_t, Status> SendBatches(ReplayMemory* rm, void* socket, const std::string& identity,
                                       int64_t n, int64_t count, int64_t seq0, int window,
                                       const std::array<uint8_t, protocol::kNumFields>& send,
                                       int timeout_ms) {
  int64_t sent = 0;
  for (; sent < count; ++sent) {
    auto b = std::make_shared<SentBatch>();
    b->batch.window = window;
    b->batch.send = send;
    Status s = rm->SampleDistinct(n, &b->batch);
    std::vector<codec::Frame> data;
    if (s.ok()) s = EncodeStreamBatch(b->batch, rm->schema(), seq0 + sent, &b->header, &data);
    if (!s.ok()) return {sent, s};
    std::vector<libzmq::OutFrame> out{{identity.data(), identity.size()},
                                      {b->header.data(), b->header.size()}};
    for (const codec::Frame& f : data) out.push_back({f.data, f.size});
    if (!libzmq::Send(socket, out, timeout_ms, std::shared_ptr<const void>(b, b.get())))
      return {sent, Error(Code::kFailedPrecondition, "stream: send failed: ", libzmq::LastError())};
  }
  return {sent, Status::OK()};
}

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
    out.emplace_back(static_cast<const char*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
  }
  return out;
}

}  // namespace

void BindStream(py::module_& m) {
  py::class_<StreamSource, std::shared_ptr<StreamSource>>(m, "StreamSource", R"doc(
A learner's end of a sampling stream (private: use memoire.stream.SamplingStream): a source for
_core.Feed that receives each batch from a connected DEALER socket and stacks it into the ring.

StreamSource(socket, templates, batch_size, frame_stack, multi_step, flags, timeout_ms,
ping_ms, credit_chunk, credit_message, ping_message, max_payload_bytes): `socket` is the
DEALER's `underlying` address (requires attach_libzmq; Python keeps the socket open and does not
use it while the source lives); templates, the 7 field templates; flags, the 14 cache flags;
credit_message / ping_message, encoded frames of a credit of credit_chunk / of 0.
)doc")
      .def(py::init([](uintptr_t socket, const py::list& templates, int64_t batch_size,
                       int frame_stack, int multi_step, const std::vector<bool>& flags,
                       int timeout_ms, int ping_ms, int64_t credit_chunk,
                       const py::list& credit_message, const py::list& ping_message,
                       uint64_t max_payload_bytes) {
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
             o.limits.max_payload_bytes = max_payload_bytes;
             o.timeout_ms = timeout_ms;
             o.ping_ms = ping_ms;
             o.credit_chunk = credit_chunk;
             o.credit_message = Strings(credit_message);
             o.ping_message = Strings(ping_message);
             return std::make_shared<StreamSource>(std::move(o));
           }),
           py::arg("socket"), py::arg("templates"), py::arg("batch_size"),
           py::arg("frame_stack"), py::arg("multi_step"), py::arg("flags"),
           py::arg("timeout_ms"), py::arg("ping_ms"), py::arg("credit_chunk"),
           py::arg("credit_message"), py::arg("ping_message"),
           py::arg("max_payload_bytes") = uint64_t(1) << 32)
      .def("post", [](StreamSource& s, const py::list& frames) {
             std::vector<std::string> f = Strings(frames);
             py::gil_scoped_release release;
             s.Post(std::move(f));
           }, py::arg("frames"), "Sends an encoded message (its frames) to the server.")
      .def("stop", &StreamSource::Stop, "Ends a receive in progress (the feed then closes).")
      .def_property_readonly("received", &StreamSource::received, "batches received")
      .def_property_readonly("credit_returned", &StreamSource::credit_returned,
                             "credit given back to the server after the first grant")
      .def_property_readonly("last_seq", &StreamSource::last_seq,
                             "the last batch's number (-1 before the first)");

  m.def("stream_send",
        [](ReplayMemory& rm, uintptr_t socket, const py::bytes& identity, int64_t batch_size,
           int64_t count, int64_t seq0, int window, const std::vector<bool>& send,
           int timeout_ms) -> py::tuple {
          if (!libzmq::Attached())
            ThrowIfError(Error(Code::kFailedPrecondition, "stream_send: needs attach_libzmq"));
          CheckLength(static_cast<int64_t>(send.size()), protocol::kNumFields, "send", "field");
          std::array<uint8_t, protocol::kNumFields> s{};
          for (int f = 0; f < protocol::kNumFields; ++f) s[f] = send[f];
          const std::string id = identity;
          std::pair<int64_t, Status> r;
          {
            py::gil_scoped_release release;
            r = SendBatches(&rm, reinterpret_cast<void*>(socket), id, batch_size, count, seq0,
                            window, s, timeout_ms);
          }
          py::object error = py::none();
          if (!r.second.ok()) error = py::str(r.second.message());
          return py::make_tuple(r.first, error);
        },
        py::arg("memory"), py::arg("socket"), py::arg("identity"), py::arg("batch_size"),
        py::arg("count"), py::arg("seq0"), py::arg("window"), py::arg("send"),
        py::arg("timeout_ms"), R"doc(
Samples `count` batches of `batch_size` from `memory` (ReplayMemory.SampleDistinct: each
distinct row once) and sends each as a STREAM_BATCH (numbered seq0, seq0 + 1, ...) to
`identity` on a ROUTER socket (its `underlying` address), with the GIL released. `window`:
the stream's window (0: the memory's now), `send`: the 7 fields to send. Returns (sent, error):
error is None, or the message of the draw or send that failed (nothing is sent after it).
)doc");
}

}  // namespace memoire
