#include "core/chunk_ingest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

namespace memoire {

namespace {

std::string Hex8(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%08llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

const char* ChunkIngest::ReasonName(int reason) {
  static const char* kNames[kNumReasons] = {"malformed",      "abandoned_episode",
                                            "out_of_order_chunk", "stream_limit",
                                            "stale_episode",  "episode_too_long",
                                            "bad_episode",    "stream_bytes",
                                            "open_bytes",     "nonfinite",
                                            "peer_lost"};
  return reason >= 0 && reason < kNumReasons ? kNames[reason] : "invalid";
}

Status ChunkIngest::Make(std::shared_ptr<EpisodeStore> store, const Options& options,
                         std::unique_ptr<ChunkIngest>* out) {
  if (!store) return Error(Code::kInvalidArgument, "ChunkIngest: expected a store, got none");
  std::unique_ptr<ChunkIngest> c(new ChunkIngest(std::move(store), Options()));
  MEMOIRE_RETURN_IF_ERROR(c->SetOptions(options));
  *out = std::move(c);
  return Status::OK();
}

Status ChunkIngest::Make(std::shared_ptr<ReplayMemory> memory, const Options& options,
                         std::unique_ptr<ChunkIngest>* out) {
  if (!memory) return Error(Code::kInvalidArgument, "ChunkIngest: expected a memory, got none");
  return Make(std::shared_ptr<EpisodeStore>(EpisodeStoreOf(std::move(memory))), options, out);
}

ChunkIngest::ChunkIngest(std::shared_ptr<EpisodeStore> store, const Options& options)
    : store_(std::move(store)), spec_(store_->row_spec()), opt_(options) {
  auto add = [&](const protocol::Column& c, std::vector<int64_t> shape, bool optional) {
    spec_.push_back({c.name, c.dtype, std::move(shape), optional});
    return static_cast<int>(spec_.size()) - 1;
  };
  spec_uuid_ = add(protocol::kChunkScalars[0], {}, false);
  spec_episode_ = add(protocol::kChunkScalars[1], {}, false);
  spec_index_ = add(protocol::kChunkScalars[2], {}, false);
  spec_multiplier_ = add(protocol::kChunkScalars[3], {}, false);
  spec_info_ = add(protocol::kChunkInfo, {protocol::kChunkInfoSize}, true);
}

std::vector<ChunkIngest::Committed> ChunkIngest::TakeCommitted(int64_t* dropped) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Committed> out(committed_.begin(), committed_.end());
  committed_.clear();
  if (dropped != nullptr) *dropped = committed_dropped_;
  committed_dropped_ = 0;
  return out;
}

ChunkIngest::Options ChunkIngest::options() const {
  std::lock_guard<std::mutex> l(mu_);
  return opt_;
}

Status ChunkIngest::SetOptions(const Options& o) {
  if (o.max_open_episodes < 1)
    return Error(Code::kInvalidArgument, "max_open_episodes: expected >= 1, got ",
                 o.max_open_episodes);
  if (!(o.open_episode_timeout > 0))
    return Error(Code::kInvalidArgument, "open_episode_timeout: expected seconds > 0, got ",
                 o.open_episode_timeout);
  if (o.max_episode_bytes < 1)
    return Error(Code::kInvalidArgument, "max_episode_bytes: expected >= 1, got ",
                 o.max_episode_bytes);
  if (o.max_open_bytes < 1)
    return Error(Code::kInvalidArgument, "max_open_bytes: expected >= 1, got ", o.max_open_bytes);
  if (!(o.peer_timeout > 0) || !std::isfinite(o.peer_timeout))
    return Error(Code::kInvalidArgument, "peer_timeout: expected finite seconds > 0, got ",
                 o.peer_timeout);
  std::lock_guard<std::mutex> l(mu_);
  opt_ = o;
  return Status::OK();
}

std::vector<ChunkIngest::OpenStream> ChunkIngest::OpenStreams() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<OpenStream> out;
  out.reserve(streams_.size());
  for (const auto& [uuid, st] : streams_) out.push_back({uuid, st.episode, st.rows});
  return out;
}

ChunkIngest::Counters ChunkIngest::counters() const {
  std::lock_guard<std::mutex> l(mu_);
  Counters c = counts_;
  c.open_streams = static_cast<int64_t>(streams_.size());
  return c;
}

Status ChunkIngest::Parse(const Frame* frames, size_t n, Chunk* chunk, uint64_t* uuid,
                          int64_t* episode, int64_t* index, Tail* tail, uint8_t* flags) const {
  std::vector<uint64_t> sizes(n - 1);
  for (size_t k = 1; k < n; ++k) sizes[k - 1] = frames[k].size;
  codec::Limits limits;
  limits.max_payload_bytes = opt_.max_message_bytes;
  codec::Message m;
  MEMOIRE_RETURN_IF_ERROR(
      codec::DecodeHeader(frames[0].data, frames[0].size, sizes.data(), n - 1, limits, &m));
  int64_t rows = -1;
  MEMOIRE_RETURN_IF_ERROR(codec::CheckArrays(m, spec_, /*allow_extra=*/false, &rows));
  // CheckArrays proved every entry a top-level array of the spec, each present at most once.
  std::vector<const uint8_t*> data(spec_.size(), nullptr);
  for (const codec::Entry& e : m.entries) {
    size_t s = 0;
    while (spec_[s].name != e.name) ++s;
    data[s] = frames[1 + e.frame].data;
  }
  chunk->rows = rows;
  chunk->bytes = kChunkOverhead + static_cast<int64_t>(frames[0].size);
  for (size_t k = 1; k < n; ++k) chunk->bytes += static_cast<int64_t>(frames[k].size);
  const size_t columns = store_->row_spec().size();
  chunk->columns.assign(data.begin(), data.begin() + columns);
  *uuid = LoadUnaligned<uint64_t>(data[spec_uuid_]);
  *episode = LoadUnaligned<int64_t>(data[spec_episode_]);
  *index = LoadUnaligned<int64_t>(data[spec_index_]);
  tail->multiplier = LoadUnaligned<float>(data[spec_multiplier_]);
  tail->has_info = data[spec_info_] != nullptr;
  if (tail->has_info)
    for (int k = 0; k < protocol::kChunkInfoSize; ++k) {
      tail->info[k] = LoadUnaligned<double>(data[spec_info_] + 8 * k);
      if (!std::isfinite(tail->info[k]))
        return Error(Code::kInvalidArgument, "info: expected finite values, got ", tail->info[k]);
    }
  *flags = m.flags;
  return Status::OK();
}

void ChunkIngest::DropLocked(std::unordered_map<uint64_t, Stream>::iterator it, int reason,
                             std::vector<uint64_t>* released) {
  for (const Chunk& c : it->second.chunks) released->push_back(c.owner);
  counts_.open_bytes -= it->second.bytes;
  streams_.erase(it);
  ++counts_.rejected[reason];
}

bool ChunkIngest::MakeRoomLocked(std::unordered_map<uint64_t, Stream>::iterator it,
                                 int64_t bytes, std::vector<uint64_t>* released) {
  while (counts_.open_bytes + bytes > opt_.max_open_bytes) {
    auto largest = it;
    int64_t most = it->second.bytes + bytes;
    for (auto o = streams_.begin(); o != streams_.end(); ++o)
      if (o != it && o->second.bytes > most) largest = o, most = o->second.bytes;
    if (largest == it) return false;
    DropLocked(largest, kOpenBytes, released);
  }
  return true;
}

void ChunkIngest::Reap(double now, std::vector<uint64_t>* released) {
  std::lock_guard<std::mutex> l(mu_);
  if (last_reap_ < 0 || now - last_reap_ <= std::min(10.0, opt_.open_episode_timeout)) return;
  ReapLocked(now, released);
  last_reap_ = now;
}

void ChunkIngest::ReapLocked(double now, std::vector<uint64_t>* released) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    auto next = std::next(it);
    if (now - it->second.last_seen > opt_.open_episode_timeout) DropLocked(it, kStaleEpisode, released);
    it = next;
  }
}

int64_t ChunkIngest::Listen(double now, std::vector<uint64_t>* released) {
  std::lock_guard<std::mutex> l(mu_);
  return ListenLocked(now, released);
}

int64_t ChunkIngest::ListenLocked(double now, std::vector<uint64_t>* released) {
  const double cap = std::min(kMaxListenGap, kListenGapFraction * opt_.peer_timeout);
  if (last_listen_ >= 0 && now > last_listen_) listen_clock_ += std::min(now - last_listen_, cap);
  if (now > last_listen_) last_listen_ = now;
  // A scan costs one pass over the open streams: at most every cap of listening time.
  if (listen_clock_ - last_liveness_ < cap) return 0;
  last_liveness_ = listen_clock_;
  int64_t dropped = 0;
  for (auto it = streams_.begin(); it != streams_.end();) {
    auto next = std::next(it);
    if (listen_clock_ - it->second.heard > opt_.peer_timeout) {
      if (lost_.size() == kCommittedLog) lost_.pop_front();
      lost_.emplace_back(it->first, it->second.episode);
      auto away = away_.find(it->first);
      if (away == away_.end() && away_.size() < kCommittedLog)
        away = away_.emplace(it->first, Away()).first;
      if (away != away_.end()) {
        Away& a = away->second;
        if (a.back) a = Away();  // gone again since it came back: a new absence
        a.last_word = it->second.last_word;
        a.episode = it->second.episode;
        a.episodes += 1;
        a.rows += it->second.rows;
      }
      DropLocked(it, kPeerLost, released);
      ++dropped;
    }
    it = next;
  }
  return dropped;
}

std::vector<std::pair<uint64_t, int64_t>> ChunkIngest::TakeLost() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::pair<uint64_t, int64_t>> out(lost_.begin(), lost_.end());
  lost_.clear();
  return out;
}

std::vector<ChunkIngest::Returned> ChunkIngest::TakeReturned() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Returned> out(returned_.begin(), returned_.end());
  returned_.clear();
  return out;
}

void ChunkIngest::HeardLocked(uint64_t uuid, double now) {
  auto it = away_.find(uuid);
  if (it == away_.end() || it->second.back) return;
  Away& a = it->second;
  a.back = true;
  Returned r;
  r.uuid = uuid;
  r.silent = std::max(0.0, now - a.last_word);
  r.episode = a.episode;
  r.episodes = a.episodes;
  r.rows = a.rows;
  r.count = ++returns_;
  if (returned_.size() == kCommittedLog) returned_.pop_front();
  returned_.push_back(r);
}

void ChunkIngest::KeepaliveLocked(const Frame* frames, size_t n, double now, Result* out) {
  std::vector<uint64_t> sizes(n - 1);
  for (size_t k = 1; k < n; ++k) sizes[k - 1] = frames[k].size;
  codec::Limits limits;
  limits.max_payload_bytes = opt_.max_message_bytes;
  codec::Message m;
  int64_t batch = -1;
  Status st = codec::DecodeHeader(frames[0].data, frames[0].size, sizes.data(), n - 1, limits, &m);
  static const std::vector<codec::ArraySpec> kSpec = {
      {protocol::kKeepaliveScalars[0].name, protocol::kKeepaliveScalars[0].dtype, {}, false}};
  if (st.ok()) st = codec::CheckArrays(m, kSpec, /*allow_extra=*/false, &batch);
  if (!st.ok()) return Reject(kMalformed, "keepalive: " + st.message(), out);
  // CheckArrays proved one top-level uint64 0-d entry with its frame.
  const uint64_t uuid = LoadUnaligned<uint64_t>(frames[1 + m.entries[0].frame].data);
  ++counts_.keepalives;
  ListenLocked(now, &out->released);
  HeardLocked(uuid, now);
  auto it = streams_.find(uuid);
  if (it != streams_.end()) {
    it->second.heard = listen_clock_;
    it->second.last_word = now;
  }
  out->outcome = Outcome::kKeepalive;
}

void ChunkIngest::Reject(int reason, std::string detail, Result* out) {
  out->outcome = Outcome::kRejected;
  out->reason = reason;
  out->reason_count = ++counts_.rejected[reason];
  out->detail = std::move(detail);
}

void ChunkIngest::Ingest(uint64_t owner, const Frame* frames, size_t n, double now, Result* out) {
  out->outcome = Outcome::kNotChunk;
  out->rows = 0;
  out->reason = kMalformed;
  out->reason_count = 0;
  out->detail.clear();
  out->quiet = false;
  out->released.clear();
  uint16_t version = 0;
  uint8_t type = 0;
  if (n == 0 || !codec::PeekVersion(frames[0].data, frames[0].size, &version, &type) ||
      version != codec::kWireVersion ||
      (type != static_cast<uint8_t>(codec::MsgType::kChunk) &&
       type != static_cast<uint8_t>(codec::MsgType::kKeepalive))) {
    out->released.push_back(owner);
    return;
  }
  if (type == static_cast<uint8_t>(codec::MsgType::kKeepalive)) {
    out->released.push_back(owner);  // nothing of it is kept
    std::lock_guard<std::mutex> l(mu_);
    return KeepaliveLocked(frames, n, now, out);
  }
  Chunk chunk;
  chunk.owner = owner;
  uint64_t uuid = 0;
  int64_t episode = 0, index = 0;
  Tail tail;
  uint8_t flags = 0;
  Stream done;
  {
    std::lock_guard<std::mutex> l(mu_);
    Status st = Parse(frames, n, &chunk, &uuid, &episode, &index, &tail, &flags);
    if (!st.ok()) {
      out->released.push_back(owner);
      return Reject(kMalformed, st.message(), out);
    }
    ++counts_.chunks;
    ListenLocked(now, &out->released);
    if (last_reap_ < 0) last_reap_ = now;
    if (now - last_reap_ > std::min(10.0, opt_.open_episode_timeout)) {
      ReapLocked(now, &out->released);
      last_reap_ = now;
    }
    HeardLocked(uuid, now);
    auto it = streams_.find(uuid);
    auto away = away_.find(uuid);
    if (away != away_.end() && it == streams_.end()) {
      if (episode == away->second.episode && index != 0) {
        // The rest of the episode it lost while away, still on its way then: dropped as its
        // start was, and not logged again (its return was reported once).
        out->released.push_back(owner);
        Reject(kOutOfOrderChunk,
               "dropped chunk " + std::to_string(index) + " of episode " +
                   std::to_string(episode) + " from " + Hex8(uuid) + ": lost to peer_timeout",
               out);
        out->quiet = true;
        return;
      }
      away_.erase(away);  // another episode: it is back for good
    }
    if (it != streams_.end() && it->second.episode != episode) {
      DropLocked(it, kAbandonedEpisode, &out->released);  // the actor started another episode
      it = streams_.end();
    }
    if (it == streams_.end()) {
      if (index != 0) {
        out->released.push_back(owner);
        return Reject(kOutOfOrderChunk,
                      "dropped chunk " + std::to_string(index) + " of episode " +
                          std::to_string(episode) + " from " + Hex8(uuid) + ": its start was lost",
                      out);
      }
      if (static_cast<int64_t>(streams_.size()) >= opt_.max_open_episodes) {
        auto oldest = std::min_element(streams_.begin(), streams_.end(), [](auto& a, auto& b) {
          return a.second.last_seen < b.second.last_seen;
        });
        DropLocked(oldest, kStreamLimit, &out->released);
      }
      it = streams_.emplace(uuid, Stream()).first;
      it->second.episode = episode;
    }
    Stream& s = it->second;
    int reason = -1;
    if (index != s.next_index) {
      reason = kOutOfOrderChunk;
    } else if (s.rows + chunk.rows > store_->max_episode_rows()) {
      reason = kEpisodeTooLong;
    } else if (s.bytes + chunk.bytes > opt_.max_episode_bytes) {
      reason = kStreamBytes;
    } else if (!MakeRoomLocked(it, chunk.bytes, &out->released)) {
      reason = kOpenBytes;
    }
    if (reason >= 0) {
      for (const Chunk& c : s.chunks) out->released.push_back(c.owner);
      counts_.open_bytes -= s.bytes;
      streams_.erase(it);
      out->released.push_back(owner);
      return Reject(reason, "dropped episode " + std::to_string(episode) + " from " + Hex8(uuid) +
                                ": " + ReasonName(reason), out);
    }
    const int64_t rows = chunk.rows;
    s.bytes += chunk.bytes;
    counts_.open_bytes += chunk.bytes;
    s.chunks.push_back(std::move(chunk));
    s.rows += rows;
    s.next_index += 1;
    s.last_seen = now;
    s.heard = listen_clock_;
    s.last_word = now;
    if (!(flags & kLast)) {
      out->outcome = Outcome::kStaged;
      out->rows = rows;
      return;
    }
    done = std::move(s);
    counts_.open_bytes -= done.bytes;
    streams_.erase(it);
  }
  // The last chunk: commit outside mu_, so other actors' chunks are taken meanwhile.
  int reason = kBadEpisode;
  Status st = Commit(done, tail, flags, &reason);
  for (const Chunk& c : done.chunks) out->released.push_back(c.owner);
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok())
    return Reject(reason, "dropped episode " + std::to_string(episode) + " from " +
                              Hex8(uuid) + ": " + st.message(), out);
  out->outcome = Outcome::kCommitted;
  out->rows = done.rows;
  if (done.rows == 0) return;
  Committed c;
  c.uuid = uuid;
  c.episode = episode;
  c.rows = done.rows;
  c.has_info = tail.has_info;
  std::copy(tail.info, tail.info + protocol::kChunkInfoSize, c.info);
  if (committed_.size() == kCommittedLog) {
    committed_.pop_front();
    ++committed_dropped_;
  }
  committed_.push_back(c);
}

Status ChunkIngest::Commit(const Stream& st, const Tail& tail, uint8_t flags, int* reason) {
  if (st.rows == 0) return Status::OK();  // nothing to store
  std::vector<EpisodeStore::Part> parts(st.chunks.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    parts[k].rows = st.chunks[k].rows;
    parts[k].columns = st.chunks[k].columns;
  }
  EpisodeStore::End end;
  end.multiplier = tail.multiplier;
  end.terminal = flags & kTerminal;
  end.update_value = flags & kUpdateValue;
  end.update_weight = flags & kUpdateWeight;
  // Checked before the store is touched, so a bad episode evicts nothing.
  bool nonfinite = false;
  Status s = store_->Check(parts, end, &nonfinite);
  if (!s.ok()) {
    *reason = nonfinite ? kNonFinite : kBadEpisode;
    return s;
  }
  *reason = kBadEpisode;
  std::lock_guard<std::mutex> l(commit_mu_);
  return store_->Commit(parts, end);
}

}  // namespace memoire
