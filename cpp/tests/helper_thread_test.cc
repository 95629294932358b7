// HelperThread: runs each job once and Wait returns after it; the thread is reused; a forked
// child starts its own thread instead of waiting on its parent's (which it does not have); a
// job runs with its caller's scheduling (batch or not).
#include "core/helper_thread.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/batch_scheduling.h"
#include "tests/testing.h"

using namespace memoire;

namespace {

TEST(JobsRunOnceOnOneReusedThread) {
  HelperThread h;
  h.Wait();  // nothing started: returns at once
  std::atomic<int> runs{0};
  std::thread::id first;
  for (int k = 0; k < 1000; ++k) {
    std::thread::id id;
    CHECK(h.Start([&] {
      runs.fetch_add(1);
      id = std::this_thread::get_id();
    }));
    h.Wait();
    CHECK(runs.load() == k + 1);  // done when Wait returns
    if (k == 0) first = id;
    CHECK(id == first && id != std::this_thread::get_id());
  }
}

TEST(AForkedChildUsesItsOwnThread) {
  HelperThread h;
  int value = 0;
  CHECK(h.Start([&] { value = 1; }));
  h.Wait();
  const pid_t child = fork();
  if (child == 0) {
    // The parent's thread is not here: waiting on it would hang forever.
    int in_child = 0;
    const bool ok = h.Start([&] { in_child = 7; });
    h.Wait();
    _exit(ok && in_child == 7 ? 0 : 1);
  }
  CHECK(child > 0);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(h.Start([&] { value = 2; }));  // the parent's thread still serves
  h.Wait();
  CHECK(value == 2);
}

TEST(AJobRunsWithItsCallersScheduling) {
  HelperThread h;
  auto policy_of_job = [&] {
    int policy = -1;
    CHECK(h.Start([&] { policy = sched_getscheduler(0); }));
    h.Wait();
    return policy;
  };
  // Started by a batch thread (which it inherits from), then used by a plain one, and back.
  std::thread batch_caller([&] {
    SetBatchScheduling(true);
    CHECK(sched_getscheduler(0) == SCHED_BATCH);
    CHECK(policy_of_job() == SCHED_BATCH);
  });
  batch_caller.join();
  CHECK(!BatchScheduling() && sched_getscheduler(0) == SCHED_OTHER);
  CHECK(policy_of_job() == SCHED_OTHER);
  std::thread again([&] {
    SetBatchScheduling(true);
    CHECK(policy_of_job() == SCHED_BATCH);
    SetBatchScheduling(false);
    CHECK(sched_getscheduler(0) == SCHED_OTHER);
    CHECK(policy_of_job() == SCHED_OTHER);
  });
  again.join();
}

}  // namespace

TEST_MAIN()
