// A shared-memory stream's two ends without Python or a socket: the server's ServerShm holds
// the ring and slots of a memory's layout, the learner maps them (StreamSource::MapSlots,
// refusing slots of another size), and the hub's sampler fills them: notices reach the
// learner's ring in order, credits come back, a dishonest credit is refused and reported
// (Refusals), and Remove / Clear stop the samplers.
#include "core/stream_hub.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/stream_source.h"
#include "tests/small_memory.h"
#include "tests/testing.h"

using namespace memoire;
using memoire_test::MakeSmallMemory;

namespace {

// One episode of `len` steps in `m`.
void AddEpisode(ReplayMemory& m, int64_t len) {
  std::vector<int64_t> s(len);
  std::vector<float> a(len, 1.0f), r(len, 0.5f), w(len, 1.0f);
  std::vector<int32_t> info(len, 7);
  for (int64_t k = 0; k < len; ++k) s[k] = k;
  const void* fields[ReplayMemory::kNumFields] = {s.data(), a.data(), r.data(), a.data(),
                                                  r.data(), nullptr, info.data()};
  CHECK(m.NewEpisode().ok());
  CHECK(m.AddEntries(len, fields, w.data()).ok());
  CHECK(m.CloseEpisode(1.0f, false, false, true).ok());
}

// The learner's end of `shm`, mapped as StreamSource would map it.
StreamSource::Options Learner(const ServerShm& shm, Status* status) {
  StreamSource::Options o;
  o.layout = shm.layout;
  *status = StreamSource::MapSlots(shm.region->path(), shm.slots, shm.slot_layout.slot_bytes, &o);
  return o;
}

// Notices taken from `ring` until `want` came or 2 s passed.
std::vector<StreamRing::Notice> TakeNotices(StreamRing* ring, size_t want) {
  std::vector<StreamRing::Notice> got;
  StreamRing::Notice n;
  for (int wait = 0; wait < 2000 && got.size() < want; ++wait) {
    while (got.size() < want && ring->PollNotice(&n)) got.push_back(n);
    if (got.size() < want) ring->WaitNotices(1);
  }
  return got;
}

TEST(TheLearnerMapsTheServersSlotsOfItsLayoutOnly) {
  std::shared_ptr<ReplayMemory> m = MakeSmallMemory(64, 1);
  std::shared_ptr<ServerShm> shm;
  CHECK(ServerShm::Create(MemoryStreamLayout(*m, 2), 3, &shm).ok());
  if (!shm) return;
  CHECK(shm->slots == 3 && shm->layout.batch_size == 2);
  CHECK(shm->region->bytes() == StreamRing::Bytes(3) + 3 * shm->slot_layout.slot_bytes);

  StreamSource::Options wrong;
  wrong.layout = shm->layout;
  CHECK(StreamSource::MapSlots(shm->region->path(), 3, shm->slot_layout.slot_bytes + 4096,
                               &wrong).code() == Code::kDataLoss);
  CHECK(StreamSource::MapSlots(shm->region->path(), 0, shm->slot_layout.slot_bytes, &wrong)
            .code() == Code::kDataLoss);
  CHECK(wrong.shm == nullptr);

  Status s;
  StreamSource::Options o = Learner(*shm, &s);
  CHECK(s.ok());
  if (!o.shm) return;
  CHECK(o.slots == 3 && o.slots_at == StreamRing::Bytes(3));
  CHECK(o.slot_layout.slot_bytes == shm->slot_layout.slot_bytes);
  // One mapping: what the server writes into a slot, the learner's source reads there.
  std::memcpy(shm->slot_base() + 2 * shm->slot_layout.slot_bytes, "batch", 5);
  StreamSource source(o);
  CHECK(source.shared_memory() && source.slots() == 3);
  CHECK(std::memcmp(source.slot_data(2), "batch", 5) == 0);
  source.Release(1);  // not handed out: ignored
  CHECK(source.credit_returned() == 0);
}

TEST(TheHubsSamplerFillsTheLearnersSlotsInOrder) {
  std::shared_ptr<ReplayMemory> m = MakeSmallMemory(64, 2);
  AddEpisode(*m, 12);
  std::shared_ptr<StreamHub> hub;
  CHECK(StreamHub::Make(nullptr, &hub).ok());  // no socket: Poll is never called
  std::shared_ptr<ServerShm> shm;
  CHECK(ServerShm::Create(MemoryStreamLayout(*m, 2), 3, &shm).ok());
  if (!hub || !shm) return;
  Status s;
  StreamSource::Options learner = Learner(*shm, &s);
  CHECK(s.ok());
  CHECK(hub->Add("peer", m, shm, 2, 0, nullptr, 50, 2).ok());
  CHECK(hub->Find("peer") != nullptr && hub->FindRows("peer") == nullptr);
  CHECK(hub->Find("other") == nullptr);

  int64_t next_seq = 0;
  for (int round = 0; round < 4; ++round) {
    const std::vector<StreamRing::Notice> got = TakeNotices(&learner.ring, 3);
    CHECK(got.size() == 3);
    for (const StreamRing::Notice& n : got) {
      CHECK(n.error_bytes == 0 && n.seq == next_seq++);
      CHECK(n.slot >= 0 && n.slot < 3);
    }
    for (const StreamRing::Notice& n : got) learner.ring.PublishCredit(n.slot);
  }
  CHECK(hub->counts().batches.load() >= 12);
  CHECK(hub->Refusals().empty());

  // A credit for a slot the learner does not hold: the sampler refuses it and stops.
  CHECK(TakeNotices(&learner.ring, 3).size() == 3);
  learner.ring.PublishCredit(3);  // no such slot
  std::vector<std::pair<std::string, std::string>> refused;
  for (int wait = 0; wait < 2000 && refused.empty(); ++wait) {
    refused = hub->Refusals();
    if (refused.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(refused.size() == 1 && refused[0].first == "peer" && !refused[0].second.empty());

  CHECK(hub->Remove("peer"));
  CHECK(!hub->Remove("peer") && hub->Find("peer") == nullptr);
  std::shared_ptr<ServerShm> fresh;
  CHECK(ServerShm::Create(MemoryStreamLayout(*m, 2), 3, &fresh).ok());
  CHECK(hub->Add("peer", m, fresh, 1, 0, nullptr, 50, 2).ok());
  hub->Clear();
  CHECK(hub->Find("peer") == nullptr);
}

}  // namespace

TEST_MAIN()
