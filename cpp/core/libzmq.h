// pyzmq's own libzmq, reached from C++ so that hot message paths (a cache received by the
// server, a cache sent by a client) run without the GIL and without a Python object per frame.
//
// memoire does not link libzmq: Attach() binds to the copy pyzmq has already loaded (its path
// comes from Python), so the socket handles pyzmq hands out (`Socket.underlying`) are valid
// here. Only the stable C API of libzmq 4 is used. When Attach() fails, memoire stays on its
// pure-pyzmq path.
//
// Thread safety: a socket is used by one thread at a time, as libzmq requires; the functions
// here never take the GIL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/codec.h"

namespace memoire {
namespace libzmq {

// libzmq's zmq_msg_t: 64 opaque bytes, pointer-aligned.
struct alignas(sizeof(void*)) Msg {
  unsigned char opaque[64];
};

// True once the library at `path` (already loaded by pyzmq) is bound; *error says why not.
bool Attach(const std::string& path, std::string* error);
bool Attached();

// A received multipart message; frames are closed on destruction.
class Frames {
 public:
  Frames() = default;
  Frames(const Frames&) = delete;
  Frames& operator=(const Frames&) = delete;
  ~Frames();
  size_t size() const { return msgs_.size(); }
  const uint8_t* data(size_t i) const;
  size_t bytes(size_t i) const;

 private:
  friend int Receive(void* socket, int timeout_ms, Frames* out);
  std::vector<Msg*> msgs_;
};

// Waits up to timeout_ms (0: no wait) for a message on `socket` and receives all of its frames.
// Returns 1 when one was received, 0 when none came in time, -1 on a socket error (errno text
// in the log of the caller).
int Receive(void* socket, int timeout_ms, Frames* out);

// Waits up to timeout_ms until `socket` has a message or the file descriptor `fd` (-1: none,
// e.g. an eventfd another thread writes to wake this one) is readable. Returns a bit mask
// (1: the socket, 2: fd; 0 when neither in time), -1 on a socket error.
int WaitReadable(void* socket, int fd, int timeout_ms);

// Sends frames as one multipart message, waiting up to timeout_ms for room. Small frames are
// copied into libzmq's messages; large ones are sent without a copy, `keep` holding their bytes
// alive until libzmq's I/O thread lets go (so `keep` must not need the GIL to be released).
// Returns false when the message could not be queued in time (nothing was sent).
struct OutFrame {
  const void* data;
  size_t bytes;
};
bool Send(void* socket, const std::vector<OutFrame>& frames, int timeout_ms,
          const std::shared_ptr<const void>& keep);

std::string LastError();

// Receives messages on `socket`: waits up to timeout_ms for the first, then takes those already
// queued, up to max_messages, handing each to take(frames, views of their bytes), which
// returns false to stop. Returns the socket error's text, or "" when there was none.
template <typename Take>
std::string ReceiveEach(void* socket, int timeout_ms, int max_messages, Take take) {
  std::vector<codec::Frame> views;
  for (int k = 0; k < max_messages; ++k) {
    auto frames = std::make_shared<Frames>();
    const int rc = Receive(socket, k == 0 ? timeout_ms : 0, frames.get());
    if (rc <= 0) return rc < 0 ? LastError() : "";
    views.resize(frames->size());
    for (size_t i = 0; i < views.size(); ++i) views[i] = {frames->data(i), frames->bytes(i)};
    if (!take(std::move(frames), views)) return "";
  }
  return "";
}

}  // namespace libzmq
}  // namespace memoire
