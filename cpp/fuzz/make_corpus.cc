// Writes the fuzz targets' seed corpora, each input made by the project's own encoders (codec,
// EncodeStreamBatch, EncodeErrorMessage, lz4::Compress, ReplayMemory::SaveTo, the stores'
// exports) in the layout its target reads (cpp/fuzz/*_fuzz.cc, fuzz_input.h):
//   make_corpus OUT      writes OUT/<target>/<seed name> for every target
// scripts/fuzz.sh corpus regenerates cpp/fuzz/corpus/ with it. Deterministic: the same build
// writes the same bytes.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cache_ring.h"
#include "core/codec.h"
#include "core/frame_codec.h"
#include "core/protocol.h"
#include "core/stream_batch.h"
#include "core/stream_ring.h"
#include "fuzz/fixtures.h"
#include "fuzz/fuzz_input.h"

using namespace memoire;
using memoire_fuzz::Message;
using memoire_fuzz::PutF64;
using memoire_fuzz::PutLe;
using memoire_fuzz::PutMessage;

namespace {

std::string out_dir;
int written = 0;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = out_dir + "/" + target;
  ::mkdir(out_dir.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::fprintf(stderr, "make_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
  ++written;
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "make_corpus: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

// ---- messages built with the codec

codec::Entry Array(const std::string& name, DType dtype, std::vector<int64_t> shape,
                   codec::Kind kind = codec::Kind::kArray) {
  codec::Entry e;
  e.name = name;
  e.kind = shape.empty() && kind == codec::Kind::kArray ? codec::Kind::kScalar : kind;
  e.dtype = dtype;
  e.shape = std::move(shape);
  return e;
}

// A message of `type` from entries with their data (one string per data-bearing entry).
Message Build(codec::MsgType type, uint8_t flags, std::vector<codec::Entry> entries,
              const std::vector<std::string>& data) {
  codec::Message m;
  m.type = type;
  m.flags = flags;
  m.entries = std::move(entries);
  Check(codec::Finalize(&m), "finalize");
  Message out;
  out.frames.emplace_back();
  Check(codec::EncodeHeader(m, &out.frames[0]), "encode header");
  for (const std::string& d : data) out.frames.push_back(d);
  return out;
}

// `rows` rows of an array spec [-1, *shape] (values finite and small: they pass the stores'
// checks, so the seeds reach the commit).
std::string Rows(const codec::ArraySpec& spec, int64_t rows, int64_t start) {
  int64_t per_row = 1;
  for (size_t d = 1; d < spec.shape.size(); ++d) per_row *= spec.shape[d];
  std::string out;
  for (int64_t k = 0; k < rows * per_row; ++k) {
    const int64_t v = (start + k) % 5;
    switch (spec.dtype) {
      case DType::kFloat32: {
        const float x = 0.5f * static_cast<float>(v);
        out.append(reinterpret_cast<const char*>(&x), 4);
        break;
      }
      case DType::kFloat64: {
        const double x = 0.5 * static_cast<double>(v);
        out.append(reinterpret_cast<const char*>(&x), 8);
        break;
      }
      case DType::kBool:
        out.push_back(static_cast<char>(v == 4));
        break;
      default:
        PutLe(&out, static_cast<uint64_t>(v), static_cast<int>(ItemSize(spec.dtype)));
    }
  }
  return out;
}

template <typename T>
std::string Raw(T x) {
  return std::string(reinterpret_cast<const char*>(&x), sizeof x);
}

Message Chunk(const std::vector<codec::ArraySpec>& row_spec, int64_t rows, uint64_t uuid,
              int64_t episode, int64_t index, uint8_t flags, bool info) {
  std::vector<codec::Entry> entries;
  std::vector<std::string> data;
  for (const codec::ArraySpec& c : row_spec) {
    std::vector<int64_t> shape = c.shape;
    shape[0] = rows;
    entries.push_back(Array(c.name, c.dtype, shape));
    data.push_back(Rows(c, rows, index * 7));
  }
  entries.push_back(Array("uuid", DType::kUInt64, {}));
  data.push_back(Raw(uuid));
  entries.push_back(Array("episode", DType::kInt64, {}));
  data.push_back(Raw(episode));
  entries.push_back(Array("index", DType::kInt64, {}));
  data.push_back(Raw(index));
  entries.push_back(Array("multiplier", DType::kFloat32, {}));
  data.push_back(Raw(1.0f));
  if (info) {
    entries.push_back(Array("info", DType::kFloat64, {3}));
    data.push_back(Raw(1.5) + Raw(double(rows)) + Raw(1.0));
  }
  return Build(codec::MsgType::kChunk, flags, std::move(entries), data);
}

Message Keepalive(uint64_t uuid) {
  return Build(codec::MsgType::kKeepalive, 0, {Array("uuid", DType::kUInt64, {})}, {Raw(uuid)});
}

// ---- per target

void CodecSeeds() {
  auto store = memoire_fuzz::MakeEpisodeStore(0);
  const Message chunk = Chunk(store->row_spec(), 3, 11, 0, 0, protocol::kChunkLast, true);
  std::vector<codec::Entry> nested = {
      Array("settings", DType::kUInt8, {3}, codec::Kind::kDict),
      Array("name", DType::kUInt8, {4}, codec::Kind::kStr),
      Array("shape", DType::kUInt8, {2}, codec::Kind::kList),
      Array("", DType::kInt64, {}),
      Array("", DType::kInt64, {}),
      Array("none", DType::kUInt8, {}, codec::Kind::kNone),
      Array("blob", DType::kUInt8, {5}, codec::Kind::kBytes),
  };
  const Message hello = Build(codec::MsgType::kHelloReply, 0, nested,
                              {"atar", Raw(int64_t{84}), Raw(int64_t{84}), "\x01\x02\x03\x04\x05"});
  std::string header;
  std::vector<codec::Frame> frames;
  const std::string kind = "SampleError", reason = "no episode stored";  // the frames' bytes
  Check(EncodeErrorMessage(kind, reason, &header, &frames), "error");
  int k = 0;
  for (const Message* m : {&chunk, &hello}) {
    std::string in(1, '\0');
    PutMessage(&in, *m);
    Write("codec", "seed-" + std::to_string(k++), in);
  }
  std::string in(1, '\0');
  PutMessage(&in, memoire_fuzz::Owned(header, frames));
  Write("codec", "seed-error", in);
}

void Lz4Seeds() {
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<uint8_t> screen(7056);  // an Atari frame: long runs, a few edges
  for (size_t i = 0; i < screen.size(); ++i) screen[i] = (i / 84) % 7 == 0 ? 144 : (i % 13 < 2);
  inputs.push_back(screen);
  std::vector<uint8_t> noise(300);
  uint32_t x = 12345;
  for (uint8_t& b : noise) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  inputs.push_back(noise);
  const char* text = "memoire memoire memoire: a replay memory, a replay memory, a replay.";
  inputs.emplace_back(text, text + std::strlen(text));
  inputs.emplace_back();
  int k = 0;
  for (const auto& raw : inputs) {
    std::vector<uint8_t> block(lz4::CompressBound(raw.size()));
    block.resize(lz4::Compress(raw.data(), raw.size(), block.data()));
    std::string in;
    PutLe(&in, raw.size(), 2);
    in.append(block.begin(), block.end());
    Write("lz4", "seed-" + std::to_string(k++), in);
  }
}

void ChunkIngestSeeds() {
  for (int kind = 0; kind < memoire_fuzz::kNumStoreKinds; ++kind) {
    const auto store = memoire_fuzz::MakeEpisodeStore(kind);
    const auto& spec = store->row_spec();
    const uint8_t close = protocol::kChunkLast | protocol::kChunkTerminal |
                          protocol::kChunkUpdateValue | protocol::kChunkUpdateWeight;
    std::string in;
    PutLe(&in, kind, 1);
    // Actor 1: an episode in two chunks, a keepalive between them, the clock moving.
    PutLe(&in, 0, 1);
    PutMessage(&in, Chunk(spec, 4, 1, 0, 0, 0, false));
    PutLe(&in, 3, 1);
    PutLe(&in, 2, 1);  // +0.5 s
    PutLe(&in, 0, 1);
    PutMessage(&in, Keepalive(1));
    // Actor 2 opens an episode, then goes silent.
    PutLe(&in, 0, 1);
    PutMessage(&in, Chunk(spec, 3, 2, 5, 0, 0, false));
    PutLe(&in, 0, 1);
    PutMessage(&in, Chunk(spec, 5, 1, 0, 1, close, true));
    // Time passes while the owner reads (a read counts at most 0.5 s of listening): actor 2
    // is lost, then comes back late.
    for (int i = 0; i < 8; ++i) {
      PutLe(&in, 3, 1);
      PutLe(&in, 4, 1);  // +1 s
      PutLe(&in, 1, 1);  // Listen
    }
    PutLe(&in, 0, 1);
    PutMessage(&in, Chunk(spec, 2, 2, 5, 1, close, false));
    PutLe(&in, 3, 1);
    PutLe(&in, 60, 1);
    PutLe(&in, 2, 1);  // Reap
    Write("chunk_ingest", std::string("seed-") + memoire_fuzz::StoreKindName(kind), in);
  }
}

void StreamBatchSeeds() {
  struct Case {
    int batch, stack, multi;
    uint16_t flags;
    bool compressed;
  };
  const Case cases[] = {{4, 2, 1, 0x3fff, false}, {3, 3, 2, 0x3fff, true},
                        {2, 1, 1, 0x0081, true},  {4, 4, 4, 0x2041, false},
                        {1, 2, 3, 0x0001, true}};
  int k = 0;
  for (const Case& c : cases) {
    const uint8_t sizes = static_cast<uint8_t>((c.batch - 1) | (c.stack - 1) << 2 |
                                               (c.multi - 1) << 4);
    const StreamLayout layout = memoire_fuzz::StreamLayoutOf(sizes, c.flags, c.compressed);
    auto m = memoire_fuzz::MakeMemory(c.compressed, c.stack, c.multi);
    memoire_fuzz::AddEpisode(*m, 0, 9);
    memoire_fuzz::AddEpisode(*m, 9, 6);
    StreamBatch b;
    b.send = StreamSends(layout);
    b.compressed_state = c.compressed && layout.sends(protocol::kStateField);
    Check(m->SampleDistinct(layout.batch_size, &b), "sample distinct");
    b.seq = k;
    std::string header;
    std::vector<codec::Frame> frames;
    Check(EncodeStreamBatch(b, layout.schema, &header, &frames), "encode stream batch");
    std::string in;
    PutLe(&in, sizes, 1);
    PutLe(&in, c.flags, 2);
    PutLe(&in, c.compressed, 1);
    PutMessage(&in, memoire_fuzz::Owned(header, frames));
    Write("stream_batch", "seed-" + std::to_string(k++), in);
  }
}

void ErrorMessageSeeds() {
  std::string header;
  std::vector<codec::Frame> frames;
  const std::string kind = kDrawError, reason = "sample: no episode is stored yet";
  Check(EncodeErrorMessage(kind, reason, &header, &frames), "error");
  std::string in;
  PutMessage(&in, memoire_fuzz::Owned(header, frames));
  Write("error_message", "seed-draw", in);
  const Message with_slot = Build(
      codec::MsgType::kError, 0,
      {Array("error", DType::kUInt8, {6}, codec::Kind::kStr),
       Array("reason", DType::kUInt8, {4}, codec::Kind::kStr), Array("slot", DType::kInt64, {})},
      {"Refuse", "busy", Raw(int64_t{3})});
  in.clear();
  PutMessage(&in, with_slot);
  Write("error_message", "seed-slot", in);
}

std::string SavedBytes(const ReplayMemory& m) {
  const int fd = memfd_create("make_corpus", 0);
  Check(m.SaveTo(fd), "save");
  const off_t n = ::lseek(fd, 0, SEEK_END);
  std::string out(static_cast<size_t>(n), '\0');
  if (::pread(fd, out.data(), out.size(), 0) != n) std::exit(1);
  ::close(fd);
  return out;
}

void MemoryCheckpointSeeds() {
  for (bool compressed : {false, true}) {
    for (int episodes : {0, 2, 5}) {
      auto m = memoire_fuzz::MakeMemory(compressed, 2, 1);
      for (int e = 0; e < episodes; ++e) memoire_fuzz::AddEpisode(*m, e * 10, 3 + 2 * e);
      std::string in(1, static_cast<char>(compressed));
      in += SavedBytes(*m);
      Write("memory_checkpoint",
            std::string("seed-") + (compressed ? "compressed-" : "raw-") +
                std::to_string(episodes),
            in);
    }
  }
}

void CircularRestoreSeeds() {
  for (bool prioritized : {false, true}) {
    for (int adds : {3, 13}) {
      auto b = memoire_fuzz::MakeCircular(prioritized);
      for (int k = 0; k < adds; ++k) {
        const uint8_t obs[2] = {uint8_t(k), uint8_t(k * 3)};
        const int32_t act = k % 3;
        const float rew = 0.5f * k;
        const uint8_t term = k % 5 == 4;
        const void* row[4] = {obs, &act, &rew, &term};
        Check(b->Add(row, term != 0, 0.25 * (k % 4)), "add");
      }
      std::string in(1, static_cast<char>(prioritized));
      PutLe(&in, static_cast<uint64_t>(b->add_count()), 8);
      PutF64(&in, prioritized ? b->max_recorded_priority() : 1.0);
      const std::vector<int64_t> ends = b->EpisodeEnds();
      PutLe(&in, ends.size(), 1);
      for (int64_t e : ends) PutLe(&in, static_cast<uint64_t>(e), 8);
      if (prioritized) {
        std::vector<int64_t> idx(b->capacity());
        for (int64_t i = 0; i < b->capacity(); ++i) idx[i] = i;
        std::vector<double> leaves(b->capacity());
        Check(b->GetPriorities(idx.data(), b->capacity(), leaves.data()), "priorities");
        for (double l : leaves) PutF64(&in, l);
      }
      for (int f = 0; f < 4; ++f)
        in.append(reinterpret_cast<const char*>(b->column(f)),
                  b->capacity() * b->schema().field(f).bytes());
      Write("circular_restore",
            std::string("seed-") + (prioritized ? "prioritized-" : "uniform-") +
                std::to_string(adds),
            in);
    }
  }
}

void TransitionImportSeeds() {
  using memoire_fuzz::kActionBytes;
  using memoire_fuzz::kObsBytes;
  for (bool prioritized : {false, true}) {
    for (int steps : {4, 17}) {
      auto t = memoire_fuzz::MakeTransitionStore(prioritized);
      for (int k = 0; k < steps; ++k) {
        const uint8_t frame[kObsBytes] = {uint8_t(k + 1), uint8_t(k), 7};
        const uint8_t action[kActionBytes] = {uint8_t(k % 3), 0, 0, 0};
        int64_t emitted;
        Check(t->Add(frame, action, 0.5 * k, k % 6 == 5, false, 0.5 + k % 3, &emitted), "add");
      }
      const int s = t->options().stack_size;
      const int64_t m = t->size(), add_count = t->add_count(), w = t->window_size();
      std::vector<int64_t> keys(m);
      std::vector<double> nodes(t->num_nodes());
      t->ExportSampler(keys.data(), nodes.data());
      std::vector<int64_t> in_order(m);
      for (int64_t k = 0; k < m; ++k) in_order[k] = add_count - m + k;
      std::vector<uint8_t> states(m * kObsBytes * s), next(m * kObsBytes * s),
          actions(m * kActionBytes), terms(m), ends(m);
      std::vector<double> rewards(m);
      Check(t->Gather(in_order.data(), m, states.data(), actions.data(), rewards.data(),
                      next.data(), terms.data(), ends.data()),
            "gather");
      std::vector<uint8_t> wf(w * kObsBytes), wa(w * kActionBytes), wt(w), we(w);
      std::vector<double> wr(w);
      t->ExportWindow(wf.data(), wa.data(), wr.data(), wt.data(), we.data());
      std::string in(1, static_cast<char>(prioritized));
      PutLe(&in, static_cast<uint64_t>(add_count), 8);
      PutLe(&in, m, 1);
      PutLe(&in, w, 1);
      for (int64_t k : keys) PutLe(&in, static_cast<uint64_t>(k), 8);
      if (prioritized)
        for (double x : nodes) PutF64(&in, x);
      for (const auto* v : {&states, &next, &actions, &terms, &ends})
        in.append(v->begin(), v->end());
      for (double r : rewards) PutF64(&in, r);
      for (const auto* v : {&wf, &wa, &wt, &we}) in.append(v->begin(), v->end());
      for (double r : wr) PutF64(&in, r);
      Write("transition_import",
            std::string("seed-") + (prioritized ? "prioritized-" : "uniform-") +
                std::to_string(steps),
            in);
    }
  }
}

void StreamRingSeeds() {
  // An honest exchange: notices out, polled, credits back, taken; then a scribble over the
  // credit head and the notices.
  std::string in(1, '\3');  // 4 slots
  for (int i = 0; i < 6; ++i) {
    PutLe(&in, 0, 1);
    PutLe(&in, i, 1);
    PutLe(&in, i % 4, 1);
    PutLe(&in, i == 5 ? 40 : 0, 2);
    PutLe(&in, 1, 1);
    PutLe(&in, 2, 1);
    PutLe(&in, i % 4, 1);
    PutLe(&in, 3, 1);
    PutLe(&in, 5, 1);
  }
  Write("stream_ring", "seed-honest", in);
  const StreamRing::Offsets o = StreamRing::OffsetsOf(4);
  PutLe(&in, 4, 1);
  PutLe(&in, o.credit_head, 2);
  PutLe(&in, 4, 1);
  PutLe(&in, 0x7fffffff, 4);
  PutLe(&in, 3, 1);
  PutLe(&in, 4, 1);
  PutLe(&in, o.notices, 2);
  PutLe(&in, 16, 1);
  PutLe(&in, 0xffffffffffffffffull, 8);
  PutLe(&in, 0x8000000000000000ull, 8);
  PutLe(&in, 0, 1);
  PutLe(&in, 9, 1);
  PutLe(&in, 9, 1);
  PutLe(&in, 0, 2);
  PutLe(&in, 1, 1);
  PutLe(&in, 5, 1);
  Write("stream_ring", "seed-scribbled", in);
}

void CacheRingSeeds() {
  const std::vector<Field> columns = memoire_fuzz::CacheColumns();
  const std::vector<codec::ArraySpec> spec =
      CacheMessageSpec(columns, memoire_fuzz::kCacheSize);
  std::string in;
  for (uint64_t uuid : {1, 2, 3, 4}) {
    std::vector<codec::Entry> entries;
    std::vector<std::string> data;
    for (const codec::ArraySpec& c : spec) {
      entries.push_back(Array(c.name, c.dtype, c.shape));
      codec::ArraySpec rows = c;
      rows.shape.insert(rows.shape.begin(), 1);
      data.push_back(Rows(rows, 1, static_cast<int64_t>(uuid)));
    }
    PutLe(&in, 0, 1);
    PutMessage(&in, Build(codec::MsgType::kCache, 0, std::move(entries), data));
    PutLe(&in, 1 + 2 * 2, 1);   // take 3
    PutLe(&in, 0x81 + 2 * 5, 1);  // take 6 with reuse
  }
  Write("cache_ring", "seed-caches", in);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  CodecSeeds();
  Lz4Seeds();
  ChunkIngestSeeds();
  StreamBatchSeeds();
  ErrorMessageSeeds();
  MemoryCheckpointSeeds();
  CircularRestoreSeeds();
  TransitionImportSeeds();
  StreamRingSeeds();
  CacheRingSeeds();
  std::printf("make_corpus: %d seeds in %s\n", written, out_dir.c_str());
  return 0;
}
