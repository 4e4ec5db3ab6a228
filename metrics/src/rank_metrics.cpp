#include "coshard/metrics/rank_metrics.hpp"

#include "coshard/metrics/exporter.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::metrics {

RankMetrics::RankMetrics(Options options)
    : options_(std::move(options)),
      build_(metrics::build_info()),
      telemetry_(std::make_unique<PrometheusTelemetry>(
          Labels{{"rank", std::to_string(options_.rank)}, {"local_rank", std::to_string(options_.local_rank)}},
          options_.timeline)) {
  if (options_.rank < 0 || options_.local_rank < 0) {
    throw Error(Errc::bad_config, "metrics: rank " + std::to_string(options_.rank) + " and local rank " +
                                      std::to_string(options_.local_rank) + " must not be negative");
  }
  telemetry_
      ->gauge("coshard_build_info", "Always 1; the labels say which coshard, wire protocol, CUDA, NCCL and UCX this rank runs",
              {{"version", build_.version},
               {"wire_protocol", build_.wire_protocol},
               {"cuda", build_.cuda},
               {"nccl", build_.nccl},
               {"ucx", build_.ucx}})
      .set(1);
}

RankMetrics::~RankMetrics() { stop(); }

void RankMetrics::start() {
  std::lock_guard lock(m_);
  if (exporter_) return;
  std::uint16_t port = 0;
  if (options_.port != 0) {
    const long p = static_cast<long>(options_.port) + options_.local_rank;
    if (p > 65535) {
      throw Error(Errc::bad_config, "metrics port " + std::to_string(options_.port) + " + local rank " +
                                        std::to_string(options_.local_rank) + " = " + std::to_string(p) +
                                        " is above 65535: choose a lower --metrics-port (0 picks free ports)");
    }
    port = static_cast<std::uint16_t>(p);
  }
  try {
    exporter_ = std::make_unique<Exporter>(telemetry_->registry(), options_.bind_address, port, [this] {
      std::lock_guard watch(watch_m_);
      if (watched_) update(*watched_);
    });
  } catch (const Error& e) {
    ErrorContext ctx;
    ctx.rank = options_.rank;
    ctx.op = "metrics exporter";
    std::string how = options_.port == 0
                          ? std::string("")
                          : " (each rank serves on --metrics-port + local rank: " + std::to_string(options_.port) +
                                " + " + std::to_string(options_.local_rank) + ")";
    throw Error(e.code(), e.message() + how, ctx);
  }
}

void RankMetrics::stop() noexcept {
  std::unique_ptr<Exporter> ex;
  {
    std::lock_guard lock(m_);
    ex = std::move(exporter_);
  }
  ex.reset();  // joins civetweb's threads outside the lock
}

RankMetrics::State RankMetrics::state() const noexcept {
  std::lock_guard lock(m_);
  return exporter_ ? State::serving : State::stopped;
}

std::uint16_t RankMetrics::port() const noexcept {
  std::lock_guard lock(m_);
  return exporter_ ? exporter_->port() : 0;
}

std::string RankMetrics::url() const {
  std::lock_guard lock(m_);
  return exporter_ ? exporter_->url() : std::string();
}

void RankMetrics::update(const AllocatorStats& stats, std::string_view device) {
  const Labels l{{"device", std::string(device)}};
  auto& t = *telemetry_;
  t.gauge("coshard_allocator_allocated_bytes", "Bytes handed out by the caching allocator and not yet freed", l)
      .set(static_cast<double>(stats.allocated_bytes));
  t.gauge("coshard_allocator_reserved_bytes",
          "Bytes the caching allocator holds from the device (allocated plus cached)", l)
      .set(static_cast<double>(stats.reserved_bytes));
  t.gauge("coshard_allocator_peak_bytes", "Highest allocated bytes since start or the last peak reset", l)
      .set(static_cast<double>(stats.peak_allocated_bytes));
}

void RankMetrics::update(const Allocator& allocator) { update(allocator.stats(), allocator.device().to_string()); }

RankMetrics::Watching RankMetrics::watch(const Allocator& allocator) {
  std::lock_guard lock(watch_m_);
  if (watched_) throw Error(Errc::invalid_argument, "metrics: an allocator is already watched; end that first");
  watched_ = &allocator;
  update(allocator);
  return Watching(*this);
}

RankMetrics::Watching::~Watching() {
  std::lock_guard lock(m_.watch_m_);
  if (m_.watched_) m_.update(*m_.watched_);
  m_.watched_ = nullptr;
}

}  // namespace coshard::metrics
