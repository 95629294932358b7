#include "core/helper_thread.h"

#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "core/batch_scheduling.h"
#include "core/thread_name.h"

namespace memoire {

struct HelperThread::State {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void()> job;  // guarded by mu
  bool batch = false;         // the job's caller runs with batch scheduling; guarded by mu
  bool pending = false;       // a job waits for the thread; guarded by mu
  bool done = true;           // the last job returned; guarded by mu
  bool stop = false;          // guarded by mu
  pid_t pid = 0;              // the process whose thread this is
  std::thread thread;
};

HelperThread::HelperThread() = default;

void HelperThread::Loop(State* s) {
  // A thread inherits its starter's policy: whoever started the helper, it begins as a plain
  // thread, and BatchScheduling() then says what it runs as.
  SetBatchScheduling(false);
  std::unique_lock<std::mutex> l(s->mu);
  while (true) {
    s->cv.wait(l, [s] { return s->pending || s->stop; });
    if (!s->pending) return;
    s->pending = false;
    std::function<void()> job = std::move(s->job);
    const bool caller_batch = s->batch;
    l.unlock();
    // The helper does its caller's work, so it is scheduled as its caller is: in the
    // background for a server's sampler, not for a learner's own get_batch.
    if (caller_batch != BatchScheduling()) SetBatchScheduling(caller_batch);
    job();
    l.lock();
    s->done = true;
    s->cv.notify_all();
  }
}

bool HelperThread::Start(std::function<void()> job) {
  if (state_ && state_->pid != getpid()) state_.release();  // a forked child: not its thread
  if (!state_) {
    auto s = std::make_unique<State>();
    s->pid = getpid();
    try {
      s->thread = std::thread(Loop, s.get());
      NameThread(s->thread, "memoire-helper");
    } catch (const std::system_error&) {
      return false;
    }
    state_ = std::move(s);
  }
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->job = std::move(job);
    state_->batch = BatchScheduling();
    state_->pending = true;
    state_->done = false;
  }
  state_->cv.notify_all();
  return true;
}

void HelperThread::Wait() {
  if (!state_) return;
  std::unique_lock<std::mutex> l(state_->mu);
  state_->cv.wait(l, [this] { return state_->done; });
}

HelperThread::~HelperThread() {
  if (!state_) return;
  if (state_->pid != getpid()) {  // a forked child: the thread is its parent's
    state_.release();
    return;
  }
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
}

}  // namespace memoire
