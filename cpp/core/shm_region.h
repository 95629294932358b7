// ShmRegion: the shared memory of a sampling stream whose server and learner share a host
// (core/stream_source.h is the learner's end, core/stream_hub.h the server's).
//
// Thread safety: thread-safe (immutable once made). The bytes it maps are shared with the other
// process: the stream's ring (core/stream_ring.h) says who may touch which.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace memoire {

// A file in /dev/shm mapped read-write by a server (its creator) and one learner: a
// shared-memory stream's ring (core/stream_ring.h) and slots (core/stream_batch.h).
class ShmRegion {
 public:
  static constexpr const char* kDir = "/dev/shm/";
  static constexpr const char* kPrefix = "memoire-stream-";
  // A file whose creator died before its learner mapped it (a server killed by SIGKILL: its
  // destructor never ran) is removed by the next Create on this host, once it is this old.
  static constexpr int kOrphanAgeS = 60;
  // Creates a new file of `bytes` (mode 0600, a fresh unique name: the creator's pid, then
  // random bits) and maps it read-write; first removes orphans (RemoveOrphans).
  static Status Create(size_t bytes, std::unique_ptr<ShmRegion>* out);
  // Removes this user's files kDir/kPrefix<pid>-... at least min_age_s seconds old (last
  // modified) whose creator pid is no process of this pid namespace. The age spares a live
  // creator in another pid namespace sharing /dev/shm: a learner maps a file within its open
  // handshake, so an older unmapped file has no learner coming (one that came would fall back
  // to the socket).
  static void RemoveOrphans(int min_age_s);
  // Maps an existing file (a path under kDir named kPrefix...) of at least `bytes` read-write
  // (a learner may write into its batches, as into get_batch's; the server never reads them),
  // then removes its name (the creator's mapping and this one stay).
  static Status Open(const std::string& path, size_t bytes, std::unique_ptr<ShmRegion>* out);
  ~ShmRegion();  // unmaps; the creator also removes the name if it is still there
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  ShmRegion() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;
};

}  // namespace memoire
