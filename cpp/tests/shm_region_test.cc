// ShmRegion: a new file is private to its user and shared by both mappings; the learner's
// Open removes the name, and so does the creator's end when no learner came; Open refuses
// any path but a stream file's, and a file smaller than asked; RemoveOrphans removes only the
// old files of creators that are gone.
#include "core/shm_region.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "tests/testing.h"

using namespace memoire;

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A file at kDir/kPrefix<pid>-<tag>, last modified `age_s` seconds ago.
std::string MakeStreamFile(long pid, const char* tag, int age_s) {
  const std::string path = std::string(ShmRegion::kDir) + ShmRegion::kPrefix +
                           std::to_string(pid) + "-" + tag;
  std::FILE* f = std::fopen(path.c_str(), "w");
  CHECK(f != nullptr);
  if (f != nullptr) std::fclose(f);
  struct timeval times[2];
  gettimeofday(&times[0], nullptr);
  times[0].tv_sec -= age_s;
  times[1] = times[0];
  CHECK(utimes(path.c_str(), times) == 0);
  return path;
}

// The pid of a process that has exited (and was reaped).
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

TEST(CreateThenOpenSharesTheBytesAndRemovesTheName) {
  std::unique_ptr<ShmRegion> server, learner;
  CHECK(ShmRegion::Create(8192, &server).ok());
  if (!server) return;
  const std::string path = server->path();
  const std::string prefix = std::string(ShmRegion::kDir) + ShmRegion::kPrefix +
                             std::to_string(getpid()) + "-";
  CHECK(path.compare(0, prefix.size(), prefix) == 0);
  struct stat st;
  CHECK(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600 && st.st_size == 8192 && st.st_uid == geteuid());
  CHECK(server->bytes() == 8192);
  std::memcpy(server->data() + 4096, "server", 6);

  CHECK(ShmRegion::Open(path, 8192, &learner).ok());
  if (!learner) return;
  CHECK(!Exists(path));  // mapped on both sides: nothing left behind by a crash
  CHECK(std::memcmp(learner->data() + 4096, "server", 6) == 0);
  std::memcpy(learner->data() + 100, "learner", 7);
  CHECK(std::memcmp(server->data() + 100, "learner", 7) == 0);
  learner.reset();
  server.reset();  // its name is gone already: nothing to remove
}

TEST(TheCreatorRemovesANameNoLearnerOpened) {
  std::unique_ptr<ShmRegion> server;
  CHECK(ShmRegion::Create(4096, &server).ok());
  if (!server) return;
  const std::string path = server->path();
  CHECK(Exists(path));
  server.reset();
  CHECK(!Exists(path));
}

TEST(OpenRefusesOtherPathsAndShortFiles) {
  std::unique_ptr<ShmRegion> r;
  const std::string dir = ShmRegion::kDir;
  const std::string prefix = dir + ShmRegion::kPrefix;
  CHECK(ShmRegion::Open("/tmp/memoire-stream-1-x", 4096, &r).code() == Code::kDataLoss);
  CHECK(ShmRegion::Open(dir + "other-file", 4096, &r).code() == Code::kDataLoss);
  CHECK(ShmRegion::Open(prefix + "1-x/y", 4096, &r).code() == Code::kDataLoss);
  CHECK(ShmRegion::Open(prefix + "../memoire-stream-1-x", 4096, &r).code() == Code::kDataLoss);
  CHECK(ShmRegion::Open(prefix + "0-no-such-file", 4096, &r).code() ==
        Code::kFailedPrecondition);
  std::unique_ptr<ShmRegion> server;
  CHECK(ShmRegion::Create(4096, &server).ok());
  if (!server) return;
  CHECK(ShmRegion::Open(server->path(), 8192, &r).code() == Code::kDataLoss);  // too short
  CHECK(r == nullptr && Exists(server->path()));  // a refused open removes nothing
}

TEST(RemoveOrphansTakesOnlyOldFilesOfCreatorsThatAreGone) {
  const pid_t dead = DeadPid();
  const std::string orphan = MakeStreamFile(dead, "orphan-test", 120);
  const std::string young = MakeStreamFile(dead, "young-test", 0);
  const std::string live = MakeStreamFile(getpid(), "live-test", 120);
  ShmRegion::RemoveOrphans(60);
  CHECK(!Exists(orphan));
  CHECK(Exists(young));  // its learner may still be coming
  CHECK(Exists(live));   // its creator runs
  // Create removes orphans as old as kOrphanAgeS.
  const std::string old = MakeStreamFile(dead, "old-test", ShmRegion::kOrphanAgeS + 5);
  std::unique_ptr<ShmRegion> server;
  CHECK(ShmRegion::Create(4096, &server).ok());
  CHECK(!Exists(old) && Exists(young));
  unlink(young.c_str());
  unlink(live.c_str());
}

}  // namespace

TEST_MAIN()
