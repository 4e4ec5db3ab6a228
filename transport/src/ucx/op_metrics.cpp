#include "op_metrics.hpp"

namespace coshard::transport::detail {
namespace {

constexpr std::array<double, 14> kDurationBuckets = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
                                                     3e-2, 0.1,  0.3,  1.0,  3.0,  10.0, 30.0};

// Bus bandwidth factor, as nccl-tests computes it from the algorithm bandwidth.
double bus_factor(CollectiveOp op, int n) {
  switch (op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: return static_cast<double>(n - 1) / n;
    case CollectiveOp::all_reduce: return 2.0 * (n - 1) / n;
    default: return 1.0;
  }
}

}  // namespace

OpMetrics::OpMetrics(Telemetry& t) : telemetry_(t) {
  for (std::size_t i = 0; i < kOps; ++i) {
    Labels l{{"op", std::string(to_string(static_cast<CollectiveOp>(i)))}, {"transport", "ucx"}};
    ops_[i].duration = &t.histogram("coshard_collective_duration_seconds",
                                    "Time from start to completion of a collective on its stream", l,
                                    kDurationBuckets);
    ops_[i].bytes = &t.counter("coshard_collective_bytes_total", "Bytes per rank moved by collectives", l);
    ops_[i].busbw = &t.gauge("coshard_collective_busbw_bytes_per_second",
                             "Bus bandwidth of the last collective (nccl-tests' formula)", l);
  }
  for (const char* kind : {"timeout", "peer_lost", "mismatch", "other"}) {
    errors_.push_back(&t.counter("coshard_comm_errors_total", "Failed collectives by kind",
                                 {{"kind", kind}, {"transport", "ucx"}}));
  }
}

void OpMetrics::finished(const OpInfo& info, int size, double seconds, const std::string& algorithm) {
  auto& ins = ops_[static_cast<std::size_t>(info.op)];
  ins.duration->observe(seconds);
  ins.bytes->add(static_cast<double>(info.bytes()));
  if (seconds > 0 && info.bytes() > 0) {
    double total = static_cast<double>(info.bytes());
    if (info.op == CollectiveOp::all_gather || info.op == CollectiveOp::reduce_scatter) total *= size;
    ins.busbw->set(total / seconds * bus_factor(info.op, size));
  }
  Counter*& runs = algorithms_[{info.op, algorithm}];
  if (!runs) {
    runs = &telemetry_.counter("coshard_collective_algorithm_total",
                               "Operations by how they ran: ring, mesh (small, one round per level), direct (shared "
                               "memory), hierarchical (across hosts), p2p",
                               {{"op", std::string(to_string(info.op))}, {"algorithm", algorithm}, {"transport", "ucx"}});
  }
  runs->add();
}

void OpMetrics::failed(const Error& e) {
  const std::size_t kind = e.code() == Errc::timeout ? 0 : e.code() == Errc::peer_lost ? 1
                           : e.code() == Errc::invalid_argument ? 2 : 3;
  errors_[kind]->add();
}

void OpMetrics::count_peer_waits(const Wire& wire) {
  const auto& waits = wire.peer_waits();
  for (std::size_t p = 0; p < waits.size(); ++p) {
    if (waits[p] <= 0) continue;
    const int job_rank = wire.peer(static_cast<int>(p)).job_rank;
    Counter*& series = peer_wait_[job_rank];
    if (!series) {
      series = &telemetry_.counter(
          "coshard_peer_wait_seconds_total",
          "Time collectives waited for a peer's first message after this rank entered them: how late it was",
          {{"peer", std::to_string(job_rank)}, {"transport", "ucx"}});
    }
    series->add(waits[p]);
  }
}

}  // namespace coshard::transport::detail
