// Names a thread memoire starts, as `top -H`, `ps -L`, py-spy and /proc/<pid>/task/*/comm show
// it ("memoire-feed", "memoire-copy", ...), so a user can tell memoire's threads from the
// framework's, and a test can count exactly memoire's. The starter names the thread right after
// creating it, so the name is there as soon as the constructor that started it returns.
//
// Linux keeps 15 bytes of a name; a longer one is cut. Elsewhere this does nothing.
#pragma once

#include <thread>

#if defined(__linux__)
#include <pthread.h>
#endif

namespace memoire {

inline void NameThread(std::thread& thread, const char* name) {
#if defined(__linux__)
  char cut[16] = {};
  for (int i = 0; i < 15 && name[i] != '\0'; ++i) cut[i] = name[i];
  pthread_setname_np(thread.native_handle(), cut);
#else
  (void)thread;
  (void)name;
#endif
}

}  // namespace memoire
