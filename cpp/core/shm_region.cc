#include "core/shm_region.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

namespace memoire {

void ShmRegion::RemoveOrphans(int min_age_s) {
  DIR* dir = opendir(kDir);
  if (dir == nullptr) return;
  const size_t prefix = std::strlen(kPrefix);
  const time_t now = time(nullptr);
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + prefix, &end, 10);
    if (end == e->d_name + prefix || *end != '-' || pid <= 0) continue;
    const std::string path = std::string(kDir) + e->d_name;
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        now - st.st_mtime < min_age_s)
      continue;
    // Its creator is gone (never a live process of this pid namespace): nobody maps it now.
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) unlink(path.c_str());
  }
  closedir(dir);
}

Status ShmRegion::Create(size_t bytes, std::unique_ptr<ShmRegion>* out) {
  RemoveOrphans(kOrphanAgeS);
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof(name), "%s%d-%08x%08x", kPrefix, static_cast<int>(getpid()), rd(),
                rd());
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->path_ = std::string(kDir) + name;
  const int fd = open(r->path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Error(Code::kFailedPrecondition, "shared memory: cannot create ", r->path_,
                           ": ", std::strerror(errno));
  r->owner_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    return Error(Code::kResourceExhausted, "shared memory: cannot size ", r->path_, " to ", bytes,
                 " bytes: ", std::strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Error(Code::kResourceExhausted, "shared memory: cannot map ", bytes,
                                    " bytes: ", std::strerror(errno));
  r->data_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  *out = std::move(r);
  return Status::OK();
}

Status ShmRegion::Open(const std::string& path, size_t bytes, std::unique_ptr<ShmRegion>* out) {
  const std::string want = std::string(kDir) + kPrefix;
  if (path.compare(0, want.size(), want) != 0 || path.find('/', want.size()) != std::string::npos ||
      path.find("..") != std::string::npos)
    return Error(Code::kDataLoss, "shared memory: expected a path ", want, "..., got ", path);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error(Code::kFailedPrecondition, "shared memory: cannot open ", path, ": ",
                           std::strerror(errno), " (is the server on another host? use "
                           "shared_memory=False)");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return Error(Code::kDataLoss, "shared memory: ", path, " is not a file of ", bytes, " bytes");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Error(Code::kFailedPrecondition, "shared memory: cannot map ", path,
                                    ": ", std::strerror(errno));
  unlink(path.c_str());  // mapped on both sides now: nothing is left behind by a crash
  std::unique_ptr<ShmRegion> r(new ShmRegion());
  r->path_ = path;
  r->data_ = static_cast<uint8_t*>(p);
  r->bytes_ = bytes;
  *out = std::move(r);
  return Status::OK();
}

ShmRegion::~ShmRegion() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (owner_) unlink(path_.c_str());  // a learner that never mapped it: ENOENT otherwise
}

}  // namespace memoire
