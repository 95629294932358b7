// ChunkIngest::Ingest into every store kind (fixtures.h), with the clock moving: the input is
// a store kind, then operations, each a byte and its operands:
//   op % 4 == 0  a message (fuzz_input.h) taken by Ingest at `now`, its frames kept alive until
//                the ingest releases them (as a server keeps ZeroMQ's messages)
//   op % 4 == 1  Listen(now): the owner reads (liveness)
//   op % 4 == 2  Reap(now)
//   op % 4 == 3  the clock moves by the next byte x 0.25 s (peer_timeout 2 s, open_episode_timeout
//                8 s, so a few operations reach both)
// Small budgets (3 streams, 24 KiB a stream, 48 KiB in all: each chunk is charged 4 KiB of
// overhead besides its frames) so that every rule is reachable.
// After each operation: the counters agree with the open streams, and every owner is released
// at most once; at the end every owner still held belongs to an open stream.
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "core/chunk_ingest.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  memoire_fuzz::Input in(data, size);
  const int kind = in.U8() % memoire_fuzz::kNumStoreKinds;
  ChunkIngest::Options o;
  o.max_open_episodes = 3;
  o.open_episode_timeout = 8.0;
  o.peer_timeout = 2.0;
  o.max_episode_bytes = 24 << 10;
  o.max_open_bytes = 48 << 10;
  o.max_message_bytes = 1 << 16;
  std::unique_ptr<ChunkIngest> ingest;
  FUZZ_ASSERT(ChunkIngest::Make(memoire_fuzz::MakeEpisodeStore(kind), o, &ingest).ok());
  std::map<uint64_t, memoire_fuzz::Message> held;  // owner -> its message
  std::set<uint64_t> released;
  uint64_t next_owner = 1;
  double now = 0;
  auto release = [&](const std::vector<uint64_t>& owners) {
    for (uint64_t owner : owners) {
      FUZZ_ASSERT(released.insert(owner).second);  // once
      FUZZ_ASSERT(held.erase(owner) == 1);
    }
  };
  for (int ops = 0; !in.empty() && ops < 256; ++ops) {
    const uint8_t op = in.U8();
    switch (op % 4) {
      case 0: {
        const uint64_t owner = next_owner++;
        memoire_fuzz::Message& m = held[owner] = memoire_fuzz::ReadMessage(in);
        const std::vector<codec::Frame> frames = m.view();
        ChunkIngest::Result r;
        ingest->Ingest(owner, frames.data(), frames.size(), now, &r);
        if (r.outcome == ChunkIngest::Outcome::kRejected)
          FUZZ_ASSERT(r.reason >= 0 && r.reason < ChunkIngest::kNumReasons);
        release(r.released);
        break;
      }
      case 1: {
        std::vector<uint64_t> gone;
        ingest->Listen(now, &gone);
        release(gone);
        break;
      }
      case 2: {
        std::vector<uint64_t> gone;
        ingest->Reap(now, &gone);
        release(gone);
        break;
      }
      default:
        now += 0.25 * in.U8();
    }
    const ChunkIngest::Counters c = ingest->counters();
    FUZZ_ASSERT(c.open_streams >= 0 && c.open_streams <= o.max_open_episodes);
    FUZZ_ASSERT(c.open_bytes >= 0 && c.open_bytes <= o.max_open_bytes);
    FUZZ_ASSERT(static_cast<int64_t>(ingest->OpenStreams().size()) == c.open_streams);
  }
  int64_t dropped = 0;
  ingest->TakeCommitted(&dropped);
  ingest->TakeLost();
  ingest->TakeReturned();
  // Owners not released are exactly those of open streams' chunks: none once none is open.
  if (ingest->counters().open_streams == 0) FUZZ_ASSERT(held.empty());
  return 0;
}
