#include "direct_probe.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "coshard/runtime/shared_memory.hpp"
#include "env.hpp"

namespace coshard::transport::detail {
namespace {

// A memfd segment of this process for the probe, freed on every path out.
class ProbeSegment {
 public:
  ProbeSegment() : memory_(shared_cpu_memory(Device::cpu(), 0)) {}
  ~ProbeSegment() {
    if (p_) memory_->deallocate(p_, kBytes);
  }
  ProbeSegment(const ProbeSegment&) = delete;
  ProbeSegment& operator=(const ProbeSegment&) = delete;
  // Writes `nonce` into a new segment and returns where peers find it; false when there is none.
  bool create(std::uint64_t nonce, SegmentRef* ref) {
    p_ = memory_->allocate(kBytes);
    std::memcpy(p_, &nonce, sizeof nonce);
    return shared_segment_of(p_, sizeof nonce, ref);
  }

 private:
  static constexpr std::size_t kBytes = 4096;
  std::unique_ptr<MemoryResource> memory_;
  void* p_ = nullptr;
};

}  // namespace

Task<DirectSetup> probe_direct(launch::StoreClient* store, std::string prefix, int rank, int size, UcxOptions ucx) {
  bool want = ucx.direct;
  if (auto v = env_switch("COSHARD_UCX_DIRECT")) want = *v;
  std::size_t min_bytes = ucx.direct_min_bytes;
  if (auto v = env_bytes("COSHARD_UCX_DIRECT_MIN_BYTES")) min_bytes = *v;
  ProbeSegment probe;
  SegmentRef mine{};
  const std::uint64_t nonce =
      (static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) << 16) ^
      (static_cast<std::uint64_t>(::getpid()) << 1) ^ static_cast<std::uint64_t>(rank);
  if (want) {
    try {
      want = probe.create(nonce, &mine);
    } catch (const Error&) {
      want = false;
    }
  }
  std::ostringstream entry;
  entry << (want ? 1 : 0) << ' ' << min_bytes << ' ' << mine.pid << ' ' << mine.fd << ' ' << mine.id << ' '
        << mine.size << ' ' << mine.inode << ' ' << mine.offset << ' ' << nonce;
  co_await store->set(prefix + "direct/" + std::to_string(rank), entry.str());
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back(prefix + "direct/" + std::to_string(q));
  auto values = co_await store->wait(keys, ucx.connect_timeout);
  bool ok = want;
  DirectSetup setup;
  for (int q = 0; q < size; ++q) {
    std::istringstream in(values[static_cast<std::size_t>(q)]);
    int w = 0;
    std::size_t m = 0;
    SegmentRef ref{};
    std::uint64_t n = 0;
    if (!(in >> w >> m >> ref.pid >> ref.fd >> ref.id >> ref.size >> ref.inode >> ref.offset >> n)) w = 0;
    setup.min_bytes = std::max(setup.min_bytes, m);
    if (!w) ok = false;
    if (!ok || q == rank) continue;
    try {
      auto mapped = PeerMapping::map(ref);
      std::uint64_t seen = 0;
      std::memcpy(&seen, mapped.data(), sizeof seen);
      ok = seen == n;
    } catch (const Error&) {
      ok = false;
    }
  }
  co_await store->set(prefix + "direct-ok/" + std::to_string(rank), ok ? "1" : "0");
  std::vector<std::string> done;
  for (int q = 0; q < size; ++q) done.push_back(prefix + "direct-ok/" + std::to_string(q));
  auto verdicts = co_await store->wait(done, ucx.connect_timeout);
  setup.on = std::all_of(verdicts.begin(), verdicts.end(), [](const std::string& v) { return v == "1"; });
  co_return setup;
}

}  // namespace coshard::transport::detail
