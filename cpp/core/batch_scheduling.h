// Batch scheduling for the threads that fill batches in the background (a server's stream
// samplers, a feed's samplers, and the helper a Sample wakes from them): on Linux they run as
// SCHED_BATCH, with the same share of the CPU as any thread (nice is unchanged), but their
// wake-ups never preempt the thread running on the CPU they land on.
//
// Why: a learner that takes a batch wakes the sampler that draws the next one. On 2 cores the
// scheduler put that sampler on the learner's CPU and ran it at once, so the learner's take
// waited out the draw: 0.09 ms per take instead of 0.015 ms with a 0.25 ms learner step, about
// a fifth of the step (benchmarks/bench_remote_sampling.py --step-ms 0.25). As SCHED_BATCH the
// sampler runs when the learner sleeps or on the other core, which is what a prefetcher is for.
//
// Elsewhere than Linux both calls do nothing but remember the choice.
#pragma once

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace memoire {

namespace internal {
inline thread_local bool batch_scheduling = false;
}  // namespace internal

// Sets the calling thread's policy: SCHED_BATCH when `on`, else SCHED_OTHER (the default).
// Best effort: a refusal (a seccomp profile, a real-time caller) leaves the thread as it was.
inline void SetBatchScheduling(bool on) {
  internal::batch_scheduling = on;
#if defined(__linux__)
  sched_param none{};
  pthread_setschedparam(pthread_self(), on ? SCHED_BATCH : SCHED_OTHER, &none);
#endif
}

// Whether the calling thread asked for batch scheduling (a helper it wakes follows it).
inline bool BatchScheduling() { return internal::batch_scheduling; }

}  // namespace memoire
