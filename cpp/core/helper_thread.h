// HelperThread: one parked thread that runs one job at a time for its owner, started on first
// use and joined when the owner goes. For work split in two on a hot path (ReplayMemory::
// Sample's copy of a large batch): waking a parked thread costs microseconds where starting a
// thread costs tens of them, and on 2 cores that start-up had eaten much of the split's gain.
//
// Fork: a child process never waits on its parent's thread (it does not exist there): a helper
// used in another process than the one that started it abandons that thread's state and
// starts its own.
//
// Thread safety: one owner thread at a time calls Start / Wait (ReplayMemory: the Sample holding
// its helper_mu_).
#pragma once

#include <functional>
#include <memory>

namespace memoire {

class HelperThread {
 public:
  HelperThread();
  ~HelperThread();  // joins the thread (which is idle: every Start was waited for)
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Runs `job` on the helper; false when no thread could be started (run it yourself).
  bool Start(std::function<void()> job);
  // Blocks until the job given to the last successful Start has returned.
  void Wait();

 private:
  struct State;
  static void Loop(State* s);
  std::unique_ptr<State> state_;
};

}  // namespace memoire
