#include "coshard/transport/flight_recorder.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "coshard/runtime/json_escape.hpp"

namespace coshard::transport {

std::string_view to_string(OpState s) noexcept {
  switch (s) {
    case OpState::queued: return "queued";
    case OpState::running: return "running";
    case OpState::done: return "done";
    case OpState::failed: return "failed";
  }
  return "?";
}

std::string_view to_string(CollectiveOp op) noexcept {
  switch (op) {
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::broadcast: return "broadcast";
    case CollectiveOp::barrier: return "barrier";
    case CollectiveOp::send: return "send";
    case CollectiveOp::recv: return "recv";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "?";
}

std::uint64_t FlightRecorder::queued(const OpInfo& info) {
  std::lock_guard lock(m_);
  const std::uint64_t id = next_id_++;
  OpRecord rec;
  rec.info = info;
  rec.queued_at = std::chrono::system_clock::now();
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(rec));
  } else {
    ring_[id % capacity_] = std::move(rec);
  }
  return id;
}

OpRecord* FlightRecorder::find(std::uint64_t id) {
  // Records older than the ring are gone; their updates are dropped.
  if (id + capacity_ < next_id_ || id >= next_id_) return nullptr;
  return &ring_[id % capacity_];
}

void FlightRecorder::started(std::uint64_t id) {
  std::lock_guard lock(m_);
  if (auto* r = find(id)) {
    r->state = OpState::running;
    r->started_at = std::chrono::system_clock::now();
  }
}

void FlightRecorder::finished(std::uint64_t id, const std::string& error) {
  std::lock_guard lock(m_);
  if (auto* r = find(id)) {
    r->state = error.empty() ? OpState::done : OpState::failed;
    r->ended_at = std::chrono::system_clock::now();
    r->error = error;
  }
}

void FlightRecorder::set_algorithm(std::uint64_t id, const std::string& algorithm) {
  std::lock_guard lock(m_);
  ++algorithm_counts_[algorithm];
  if (auto* r = find(id)) r->algorithm = algorithm;
}

std::map<std::string, std::uint64_t> FlightRecorder::algorithm_counts() const {
  std::lock_guard lock(m_);
  return algorithm_counts_;
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(m_);
  std::vector<OpRecord> out;
  const std::uint64_t first = next_id_ > ring_.size() ? next_id_ - ring_.size() : 0;
  for (std::uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

namespace {

std::string micros(std::chrono::system_clock::time_point t) {
  if (t == std::chrono::system_clock::time_point{}) return "null";
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count());
}

}  // namespace

std::string FlightRecorder::json(const Owner& owner) const {
  std::string out = "{\"comm\":\"" + json_escape(owner.comm) + "\",\"rank\":" + std::to_string(owner.rank) +
                    ",\"size\":" + std::to_string(owner.size) + ",\"job_rank\":" + std::to_string(owner.job_rank) +
                    ",\"backend\":\"" + json_escape(owner.backend) + "\",\"algorithms\":{";
  bool first = true;
  for (const auto& [name, n] : algorithm_counts()) {
    if (!first) out += ",";
    first = false;
    out += "\"" + json_escape(name) + "\":" + std::to_string(n);
  }
  out += "},\"ops\":[";
  first = true;
  for (const auto& r : snapshot()) {
    if (!first) out += ",";
    first = false;
    out += "{\"seq\":" + std::to_string(r.info.seq) + ",\"op\":\"" + std::string(to_string(r.info.op)) +
           "\",\"dtype\":\"" + std::string(to_string(r.info.dtype)) + "\",\"count\":" + std::to_string(r.info.count) +
           ",\"bytes\":" + std::to_string(r.info.bytes()) + ",\"peer\":" + std::to_string(r.info.peer) +
           ",\"state\":\"" + std::string(to_string(r.state)) + "\",\"queued_us\":" + micros(r.queued_at) +
           ",\"started_us\":" + micros(r.started_at) + ",\"ended_us\":" + micros(r.ended_at) +
           ",\"algorithm\":\"" + json_escape(r.algorithm) + "\",\"error\":\"" + json_escape(r.error) + "\"}";
  }
  return out + "]}";
}

namespace {

// Writes `text` to `name` in $COSHARD_FLIGHT_DIR (else the temporary directory); the path, or
// empty when it could not be written. Written whole under a name of this thread's, then renamed:
// two threads may write the same record (a failing communicator and a SIGUSR1), and a rank may be
// killed mid-write; the report must never read half a record.
std::string write_record(const std::string& name, const std::string& text) {
  std::error_code ec;
  std::filesystem::path dir;
  if (const char* d = std::getenv("COSHARD_FLIGHT_DIR"); d && *d) {
    dir = d;
  } else {
    dir = std::filesystem::temp_directory_path(ec);
    if (ec) return {};
  }
  std::filesystem::create_directories(dir, ec);
  auto path = dir / name;
  auto tmp = path;
  tmp += ".tmp." + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::ofstream f(tmp, std::ios::trunc);
  f << text << '\n';
  f.close();
  if (!f) return {};
  std::filesystem::rename(tmp, path, ec);
  return ec ? std::string{} : path.string();
}

}  // namespace

std::string FlightRecorder::dump(const Owner& owner) const {
  std::string safe = owner.comm;
  std::replace_if(safe.begin(), safe.end(), [](char c) { return c == '/' || c == ' '; }, '_');
  return write_record("coshard-flight-" + safe + "-rank" + std::to_string(owner.job_rank) + ".json", json(owner));
}

std::string suspended_json(const Scheduler& scheduler, int job_rank) {
  std::string out = "{\"job_rank\":" + std::to_string(job_rank) + ",\"suspended\":[";
  bool first = true;
  for (const auto& w : scheduler.suspended()) {
    if (!first) out += ",";
    first = false;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", std::chrono::duration<double>(w.waited).count());
    out += "{\"what\":\"" + json_escape(w.what) + "\",\"waited_s\":" + secs + "}";
  }
  return out + "]}";
}

std::string dump_suspended(const Scheduler& scheduler, int job_rank) {
  return write_record("coshard-coroutines-rank" + std::to_string(job_rank) + ".json", suspended_json(scheduler, job_rank));
}

}  // namespace coshard::transport
