// LD_PRELOAD tracer for benchmarks/device_crash.sh: on SIGSEGV or SIGBUS it prints the faulting
// thread (id, name, fault address, rip, rsp), its native backtrace and the mappings, then dies as
// before. Python's faulthandler, when on, runs first and chains to it.
#define _GNU_SOURCE
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static void out(const char* s, int n) { (void)!write(2, s, n); }

static void handler(int sig, siginfo_t* si, void* ctx) {
  char buf[512];
  ucontext_t* uc = (ucontext_t*)ctx;
  int n = snprintf(buf, sizeof buf, "\n=== native fault: signal %d tid %ld addr %p rip %llx rsp %llx\n",
                   sig, (long)syscall(SYS_gettid), si->si_addr,
                   (unsigned long long)uc->uc_mcontext.gregs[REG_RIP],
                   (unsigned long long)uc->uc_mcontext.gregs[REG_RSP]);
  out(buf, n);
  char name[64] = {0};
  int fd = open("/proc/thread-self/comm", O_RDONLY);
  if (fd >= 0) { int r = read(fd, name, sizeof name - 1); close(fd); if (r > 0) out(name, r); }
  void* frames[64];
  int k = backtrace(frames, 64);
  backtrace_symbols_fd(frames, k, 2);
  out("=== maps\n", 9);
  fd = open("/proc/self/maps", O_RDONLY);
  if (fd >= 0) { char m[4096]; ssize_t r; while ((r = read(fd, m, sizeof m)) > 0) out(m, r); close(fd); }
  out("=== end\n", 8);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void init(void) {
  static char stack[1 << 16];
  stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack};
  sigaltstack(&ss, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
