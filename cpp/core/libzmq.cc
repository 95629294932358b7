#include "core/libzmq.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstring>

namespace memoire {
namespace libzmq {
namespace {

// The C API subset, as libzmq 4 declares it (zmq.h).
struct PollItem {
  void* socket;
  int fd;
  short events;
  short revents;
};
constexpr short kPollIn = 1, kPollOut = 2;
constexpr int kDontWait = 1, kSndMore = 2;
constexpr int kEAgain = EAGAIN, kEIntr = EINTR;

struct Api {
  int (*msg_init)(Msg*);
  int (*msg_init_size)(Msg*, size_t);
  int (*msg_init_data)(Msg*, void*, size_t, void (*)(void*, void*), void*);
  int (*msg_recv)(Msg*, void*, int);
  int (*msg_send)(Msg*, void*, int);
  void* (*msg_data)(Msg*);
  size_t (*msg_size)(const Msg*);
  int (*msg_more)(const Msg*);
  int (*msg_close)(Msg*);
  int (*poll)(PollItem*, int, long);
  int (*errno_)();
  const char* (*strerror)(int);
};

Api g_api;
std::atomic<bool> g_attached{false};

template <typename T>
bool Load(void* lib, const char* name, T* out, std::string* error) {
  *out = reinterpret_cast<T>(dlsym(lib, name));
  if (*out == nullptr) *error = std::string("libzmq lacks ") + name;
  return *out != nullptr;
}

// Frames under this size are copied into libzmq's own message (libzmq copies them anyway).
constexpr size_t kCopyBelow = 64 * 1024;

void ReleaseKeep(void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); }

}  // namespace

bool Attach(const std::string& path, std::string* error) {
  if (g_attached.load()) return true;
  // RTLD_NOLOAD: only the copy pyzmq loaded, never a second one (its sockets would not mix).
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {
    const char* e = dlerror();
    *error = "not loaded by pyzmq: " + path + (e ? std::string(" (") + e + ")" : "");
    return false;
  }
  Api a;
  bool ok = Load(lib, "zmq_msg_init", &a.msg_init, error) &&
            Load(lib, "zmq_msg_init_size", &a.msg_init_size, error) &&
            Load(lib, "zmq_msg_init_data", &a.msg_init_data, error) &&
            Load(lib, "zmq_msg_recv", &a.msg_recv, error) &&
            Load(lib, "zmq_msg_send", &a.msg_send, error) &&
            Load(lib, "zmq_msg_data", &a.msg_data, error) &&
            Load(lib, "zmq_msg_size", &a.msg_size, error) &&
            Load(lib, "zmq_msg_more", &a.msg_more, error) &&
            Load(lib, "zmq_msg_close", &a.msg_close, error) &&
            Load(lib, "zmq_poll", &a.poll, error) && Load(lib, "zmq_errno", &a.errno_, error) &&
            Load(lib, "zmq_strerror", &a.strerror, error);
  if (!ok) return false;
  g_api = a;
  g_attached.store(true);
  return true;
}

bool Attached() { return g_attached.load(); }

std::string LastError() { return g_api.strerror(g_api.errno_()); }

Frames::~Frames() {
  for (Msg* m : msgs_) {
    g_api.msg_close(m);
    delete m;
  }
}

const uint8_t* Frames::data(size_t i) const {
  return static_cast<const uint8_t*>(g_api.msg_data(msgs_[i]));
}

size_t Frames::bytes(size_t i) const { return g_api.msg_size(msgs_[i]); }

int Receive(void* socket, int timeout_ms, Frames* out) {
  PollItem item{socket, 0, kPollIn, 0};
  int rc = g_api.poll(&item, 1, timeout_ms);
  if (rc < 0) return g_api.errno_() == kEIntr ? 0 : -1;
  if (rc == 0 || !(item.revents & kPollIn)) return 0;
  while (true) {  // the parts of one message arrive together: no wait between them
    auto* m = new Msg;
    g_api.msg_init(m);
    if (g_api.msg_recv(m, socket, kDontWait) < 0) {
      const int err = g_api.errno_();
      g_api.msg_close(m);
      delete m;
      if (out->msgs_.empty() && (err == kEAgain || err == kEIntr)) return 0;  // raced away
      return -1;
    }
    out->msgs_.push_back(m);
    if (!g_api.msg_more(m)) return 1;
  }
}

int WaitReadable(void* socket, int fd, int timeout_ms) {
  PollItem items[2] = {{socket, 0, kPollIn, 0}, {nullptr, fd, kPollIn, 0}};
  const int rc = g_api.poll(items, fd >= 0 ? 2 : 1, timeout_ms);
  if (rc < 0) return g_api.errno_() == kEIntr ? 0 : -1;
  return ((items[0].revents & kPollIn) ? 1 : 0) | ((items[1].revents & kPollIn) ? 2 : 0);
}

bool Send(void* socket, const std::vector<OutFrame>& frames, int timeout_ms,
          const std::shared_ptr<const void>& keep) {
  // Wait for room first, so that a message is queued whole or not at all.
  PollItem item{socket, 0, kPollOut, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const long left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    const int rc = g_api.poll(&item, 1, left > 0 ? left : 0);
    if (rc > 0 && (item.revents & kPollOut)) break;
    if ((rc < 0 && g_api.errno_() != kEIntr) || left <= 0) return false;
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    Msg m;
    const OutFrame& f = frames[i];
    if (f.bytes < kCopyBelow || keep == nullptr) {
      g_api.msg_init_size(&m, f.bytes);
      if (f.bytes) std::memcpy(g_api.msg_data(&m), f.data, f.bytes);
    } else {  // one reference per frame, dropped by libzmq's I/O thread
      g_api.msg_init_data(&m, const_cast<void*>(f.data), f.bytes, &ReleaseKeep,
                          new std::shared_ptr<const void>(keep));
    }
    const int flags = i + 1 < frames.size() ? kSndMore : 0;
    // POLLOUT promised room for a message: the parts of one message are queued together.
    if (g_api.msg_send(&m, socket, flags) < 0) {
      g_api.msg_close(&m);
      return false;
    }
  }
  return true;
}

}  // namespace libzmq
}  // namespace memoire
