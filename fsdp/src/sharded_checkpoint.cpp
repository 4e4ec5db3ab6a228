#include "sharded_checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "coshard/runtime/copy.hpp"
#include "coshard/transport/gather_integers.hpp"
#include "coshard/runtime/file_io.hpp"

namespace coshard::fsdp::detail {
namespace {

// A piece and where its values live in this rank's shard tensors.
struct Planned {
  CheckpointPiece piece;
  std::size_t unit = 0;
  int tensor = 0;         // index into state_kinds: 0 master, 1 exp_avg, 2 exp_avg_sq
  std::int64_t at = 0;    // first element in the shard tensor
};

const Tensor& tensor_of(const UnitState& u, int i) {
  return i == 0 ? u.shard.master : i == 1 ? u.shard.exp_avg : u.shard.exp_avg_sq;
}

// The elements of the flat parameter a shard holds: [begin, begin + count).
std::pair<std::int64_t, std::int64_t> owned(const UnitState& u, const Context& ctx, int shard_rank) {
  return ctx.sharded() ? std::pair{shard_rank * u.layout.chunk, u.layout.chunk} : std::pair{std::int64_t{0}, u.layout.padded};
}

std::vector<Planned> plan(const std::vector<UnitState>& units, const Context& ctx, int shard_rank, const std::string& file) {
  const auto kinds = state_kinds(ctx.opt.optimizer);
  std::vector<Planned> out;
  std::uint64_t bytes = 0;
  for (std::size_t ui = 0; ui < units.size(); ++ui) {
    const auto& u = units[ui];
    const auto [begin, count] = owned(u, ctx, shard_rank);
    for (int k = 0; k < static_cast<int>(kinds.size()); ++k) {
      for (const auto& p : u.layout.params) {
        const std::int64_t lo = std::max(begin, p.offset), hi = std::min(begin + count, p.offset + p.numel);
        if (lo >= hi) continue;
        Planned pl{{p.spec.name, kinds[static_cast<std::size_t>(k)], p.spec.shape, lo - p.offset, hi - lo, file, bytes, 0},
                   ui, k, lo - begin};
        bytes += static_cast<std::uint64_t>(hi - lo) * sizeof(float);
        out.push_back(std::move(pl));
      }
    }
  }
  return out;
}

std::string file_of(int shard_rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.bin", shard_rank);
  return name;
}

// Runs `fn` on `stream`, so that blocking file I/O stays off the scheduler thread, and rethrows
// what it threw. Callers pass a named std::function, never a lambda that owns values: GCC 12
// destroys the temporaries of a co_await expression twice.
Task<void> run_on(Stream& stream, std::function<void()> fn, std::string span) {
  auto error = std::make_shared<std::exception_ptr>();
  stream.enqueue([fn = std::move(fn), error] {
    try {
      fn();
    } catch (...) {
      *error = std::current_exception();
    }
  }, std::move(span));
  Event done;
  done.record(stream);
  co_await done;
  if (*error) std::rethrow_exception(*error);
}

// Rank 0 is about to name every rank's file in the manifest: each must be there as its rank wrote
// it. One that is not means ranks write different directories under one name (a directory
// local to each host), and a manifest would promise files that no reader finds.
void check_visible(const std::filesystem::path& dir, const Manifest& m) {
  namespace fs = std::filesystem;
  for (const auto& f : m.files) {
    const auto path = dir / f.name;
    std::error_code ec;
    auto seen = [&] { return fs::is_regular_file(path, ec) && fs::file_size(path, ec) == f.bytes; };
    // A shared file system may show another host's new file a moment late.
    for (int i = 0; i < 20 && !seen(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (seen()) continue;
    const bool there = fs::is_regular_file(path, ec);
    throw Error(Errc::io, "rank " + std::to_string(f.rank) + " wrote its file " + f.name + " (" + std::to_string(f.bytes) +
                              " bytes), but in " + dir.string() + " rank 0 " +
                              (there ? "finds " + std::to_string(fs::file_size(path, ec)) + " bytes" : "does not find it") +
                              ": the checkpoint directory must be one that every rank sees (on several hosts, a "
                              "directory of a file system they share)");
  }
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

// The cause, on the rank that met it, at once: when the ranks then fail together the launcher may
// stop this one before its error reaches the log.
void ShardedCheckpoint::report(const std::filesystem::path& dir, const std::exception_ptr& e) const {
  ctx_.rt.log(LogLevel::error, "rank " + std::to_string(ctx_.rank) + ": checkpoint '" + dir.string() + "': " + message_of(e));
}

std::vector<CheckpointPiece> pieces_of(const std::vector<UnitState>& units, const Context& ctx, int shard_rank,
                                       const std::string& file) {
  std::vector<CheckpointPiece> out;
  for (auto& p : plan(units, ctx, shard_rank, file)) out.push_back(std::move(p.piece));
  return out;
}

struct ShardedCheckpoint::Pending {
  std::filesystem::path dir;
  CheckpointMetadata metadata;
  std::vector<CheckpointUnit> units;  // optimizer step counts when staged
  bool writer = false;                // the first replica writes; the others hold the same shards
  std::vector<Planned> planned;
  std::shared_ptr<std::vector<float>> staged = std::make_shared<std::vector<float>>();
  struct Result {
    std::exception_ptr error;
    std::uint64_t bytes = 0;
    std::uint32_t crc = 0;
    std::vector<std::uint32_t> piece_crcs;
  };
  std::shared_ptr<Result> result = std::make_shared<Result>();
  Event written;
};

ShardedCheckpoint::ShardedCheckpoint(Context& ctx, std::vector<UnitState>& units, CommGroups& comms)
    : ctx_(ctx), units_(units), comms_(comms), stream_(ctx.rt.stream("checkpoint")) {}

ShardedCheckpoint::~ShardedCheckpoint() {
  if (pending_) {
    ctx_.rt.log(LogLevel::error, "rank " + std::to_string(ctx_.rank) + ": the asynchronous checkpoint '" +
                                     pending_->dir.string() +
                                     "' was never finished (call wait_for_checkpoint() before the engine goes): it has "
                                     "no manifest and is not a checkpoint");
  }
  try {
    stream_.synchronize(ctx_.opt.timeout);
  } catch (const std::exception& e) {
    ctx_.rt.log(LogLevel::error, "rank " + std::to_string(ctx_.rank) + ": checkpoint shutdown: " + e.what());
  }
}

Task<void> ShardedCheckpoint::save(std::filesystem::path dir, CheckpointMetadata metadata, bool async) {
  co_await finish();  // a second save waits for the first
  // Overwriting a checkpoint in place could leave its manifest over new files: refuse. So is a
  // target whose manifest cannot be looked at, by every rank (none may enter the save alone).
  bool exists = false;
  std::string unseen;
  try {
    exists = is_checkpoint(dir);
  } catch (const Error& e) {
    unseen = e.message();
  }
  if (const std::string there = co_await failures(!exists && unseen.empty()); !there.empty()) {
    throw Error(Errc::bad_config,
                !unseen.empty() ? "cannot save to '" + dir.string() + "': " + unseen
                                : "'" + dir.string() + "' already holds a checkpoint" +
                                      (exists ? "" : " (or cannot be looked at) on rank(s) " + there) +
                                      ": save to a new directory, or remove it first",
                ErrorContext{.rank = ctx_.rank, .op = "save_sharded", .unit = {}});
  }
  auto p = std::make_unique<Pending>();
  p->dir = std::move(dir);
  p->metadata = std::move(metadata);
  p->writer = ctx_.rank < ctx_.shard_size;
  if (p->writer) p->planned = plan(units_, ctx_, ctx_.shard_rank, file_of(ctx_.shard_rank));
  for (const auto& u : units_) p->units.push_back({u.name, u.shard.opt_step, u.shard.sgd_started});
  try {
    co_await stage(*p);
  } catch (...) {  // reported to every rank by publish(), which every rank reaches
    p->result->error = std::current_exception();
  }
  write(*p);
  pending_ = std::move(p);
  if (!async) co_await finish();
}

Task<void> ShardedCheckpoint::finish() {
  if (!pending_) co_return;
  auto p = std::move(pending_);
  co_await publish(*p);
}

// Copies the owned tensors to host memory after every optimizer update issued so far.
Task<void> ShardedCheckpoint::stage(Pending& p) {
  std::int64_t total = 0;
  for (const auto& pl : p.planned) total += pl.piece.length;
  p.staged->resize(static_cast<std::size_t>(total));
  Stream& s = *ctx_.streams.optimizer;
  float* out = p.staged->data();
  for (const auto& pl : p.planned) {
    const Tensor piece = tensor_of(units_[pl.unit], pl.tensor).view(pl.at, {pl.piece.length});
    copy_to_host(s, piece, out, piece.nbytes(), p.staged, "checkpoint stage");
    out += pl.piece.length;
  }
  Event staged;
  staged.record(s);
  co_await staged;
}

// Writes this rank's file on the checkpoint stream; the result is read by publish().
void ShardedCheckpoint::write(Pending& p) {
  if (p.writer && !p.result->error) {
    std::vector<std::pair<std::uint64_t, std::int64_t>> ranges;  // byte offset, elements
    for (const auto& pl : p.planned) ranges.emplace_back(pl.piece.byte_offset, pl.piece.length);
    stream_.enqueue([path = p.dir / file_of(ctx_.shard_rank), dir = p.dir, staged = p.staged, result = p.result,
                     ranges = std::move(ranges)] {
      try {
        std::filesystem::create_directories(dir);
        sync_directory(dir.parent_path());  // the new directory's entry is durable too
        const auto bytes = std::as_bytes(std::span<const float>(*staged));
        for (const auto& [at, n] : ranges) {
          result->piece_crcs.push_back(crc32c(bytes.subspan(at, static_cast<std::size_t>(n) * sizeof(float))));
        }
        write_atomic(path, std::span<const std::span<const std::byte>>(&bytes, 1));
        result->bytes = bytes.size();
        result->crc = crc32c(bytes);
      } catch (...) {
        result->error = std::current_exception();
      }
    }, "checkpoint write");
  }
  p.written = Event();
  p.written.record(stream_);
}

// Every rank's report to rank 0; the manifest when all succeeded; the outcome to everyone.
Task<void> ShardedCheckpoint::publish(Pending& p) {
  co_await p.written;
  // The pieces of every writer (ranks 0 .. shard_size - 1): their checksums come back in the reports.
  std::vector<std::vector<CheckpointPiece>> pieces;
  std::size_t width = 0;
  for (int r = 0; r < ctx_.shard_size; ++r) {
    pieces.push_back(pieces_of(units_, ctx_, r, file_of(r)));
    width = std::max(width, pieces.back().size());
  }
  width += 3;
  std::vector<std::int64_t> m(width, 0);
  m[0] = p.result->error ? 0 : 1;
  m[1] = static_cast<std::int64_t>(p.result->bytes);
  m[2] = p.result->crc;
  for (std::size_t i = 0; i < p.result->piece_crcs.size(); ++i) m[3 + i] = p.result->piece_crcs[i];
  const std::vector<std::int64_t> reports =
      co_await transport::gather_integers(*comms_.checkpoint, stream_, ctx_.rt.allocator(), std::move(m));
  std::string failed;
  for (int r = 0; r < ctx_.world; ++r) {
    if (!reports[static_cast<std::size_t>(r) * width]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  std::exception_ptr local = p.result->error;
  if (local) report(p.dir, local);
  if (failed.empty() && ctx_.rank == 0) {
    try {
      std::function<void()> work = [dir = p.dir, m = manifest(p, reports, std::move(pieces))] {
        check_visible(dir, m);
        write_manifest(dir, m);
      };
      co_await run_on(stream_, std::move(work), "checkpoint manifest");
    } catch (...) {
      local = std::current_exception();
    }
  }
  if (local && !p.result->error) report(p.dir, local);
  const std::string failed_manifest = co_await failures(!local);
  if (failed.empty() && failed_manifest.empty()) co_return;
  const std::string why = local ? message_of(local)
                                : "rank(s) " + (failed.empty() ? failed_manifest : failed) +
                                      " could not write their part (their errors say why)";
  throw Error(Errc::io, "the checkpoint '" + p.dir.string() + "' was not written: " + why +
                            ". No manifest was written, so the previous checkpoint is still the latest",
              ErrorContext{.rank = ctx_.rank, .op = "save_sharded", .unit = {}});
}

Manifest ShardedCheckpoint::manifest(const Pending& p, const std::vector<std::int64_t>& reports,
                                     std::vector<std::vector<CheckpointPiece>> pieces) const {
  const std::size_t width = reports.size() / static_cast<std::size_t>(ctx_.world);
  Manifest m;
  m.world_size = ctx_.world;
  m.strategy = std::string(to_string(ctx_.opt.strategy));
  m.shard_group_size = ctx_.shard_size;
  m.optimizer = optimizer_name(ctx_.opt.optimizer);
  m.param_dtype = std::string(to_string(ctx_.param_dtype));
  m.units = p.units;
  m.metadata = p.metadata;
  for (int r = 0; r < ctx_.shard_size; ++r) {
    const std::int64_t* rep = reports.data() + static_cast<std::size_t>(r) * width;
    auto& mine = pieces[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i].crc32c = static_cast<std::uint32_t>(rep[3 + i]);
    m.files.push_back({file_of(r), r, static_cast<std::uint64_t>(rep[1]), static_cast<std::uint32_t>(rep[2])});
    m.pieces.insert(m.pieces.end(), mine.begin(), mine.end());
  }
  return m;
}

// The ranks whose `ok` is false, as "1, 3" (empty when every rank succeeded).
Task<std::string> ShardedCheckpoint::failures(bool ok) {
  std::vector<std::int64_t> mine{ok ? 1 : 0};
  const std::vector<std::int64_t> oks =
      co_await transport::gather_integers(*comms_.checkpoint, stream_, ctx_.rt.allocator(), std::move(mine));
  std::string failed;
  for (int r = 0; r < ctx_.world; ++r) {
    if (!oks[static_cast<std::size_t>(r)]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  co_return failed;
}

Task<CheckpointMetadata> ShardedCheckpoint::load(std::filesystem::path dir) {
  co_await finish();
  // Stream work holds what it uses (never this frame, which a cancelled wait would unwind).
  auto m = std::make_shared<Manifest>();
  std::exception_ptr local;
  try {
    std::function<void()> read = [m, dir] { *m = read_manifest(dir); };
    co_await run_on(stream_, std::move(read), "checkpoint manifest");
    check_compatible(*m, dir);
    co_await quiesce(ctx_);  // nothing may use the shards
    auto values = std::make_shared<std::vector<std::vector<float>>>();
    std::function<void()> read_values = [this, m, dir, values] { *values = read_shards(*m, dir); };
    co_await run_on(stream_, std::move(read_values), "checkpoint read");
    co_await install(*m, std::move(*values));
  } catch (...) {
    local = std::current_exception();
    report(dir, local);
  }
  const std::string failed = co_await failures(!local);
  if (local) std::rethrow_exception(local);
  if (!failed.empty()) {
    throw Error(Errc::io, "could not load the checkpoint '" + dir.string() + "': rank(s) " + failed +
                              " failed (their errors say why)",
                ErrorContext{.rank = ctx_.rank, .op = "load_sharded", .unit = {}});
  }
  co_return m->metadata;
}

// The checkpoint must be of this model (names and shapes) and hold this optimizer's state.
void ShardedCheckpoint::check_compatible(const Manifest& m, const std::filesystem::path& dir) const {
  const std::string where = "the checkpoint '" + dir.string() + "'";
  std::map<std::string, const CheckpointPiece*> stored;
  for (const auto& p : m.pieces) stored.emplace(p.param, &p);
  std::size_t params = 0;
  for (const auto& u : units_) {
    for (const auto& p : u.layout.params) {
      ++params;
      auto it = stored.find(p.spec.name);
      if (it == stored.end()) {
        throw Error(Errc::bad_config, where + " is of another model: it has no parameter '" + p.spec.name + "' (unit '" +
                                          u.name + "'). Load a checkpoint of this model");
      }
      if (it->second->shape != p.spec.shape) {
        throw Error(Errc::bad_config, where + " is of another model shape: '" + p.spec.name + "' is " +
                                          coshard::to_string(it->second->shape) + " there and " +
                                          coshard::to_string(p.spec.shape) + " here");
      }
    }
  }
  if (stored.size() != params) {
    throw Error(Errc::bad_config, where + " is of another model: it stores " + std::to_string(stored.size()) +
                                      " parameters where this model has " + std::to_string(params));
  }
  for (const auto& u : units_) {
    const bool listed = std::any_of(m.units.begin(), m.units.end(), [&](const auto& cu) { return cu.name == u.name; });
    if (!listed && !m.units.empty()) {
      throw Error(Errc::bad_config, where + " has no optimizer state of unit '" + u.name + "': it was saved with "
                                        "other units. Wrap the model in the same units to resume it");
    }
  }
  const std::string optimizer = optimizer_name(ctx_.opt.optimizer);
  if (m.optimizer != optimizer) {
    throw Error(Errc::bad_config, where + " holds " + m.optimizer + " state but this run uses " + optimizer +
                                      ": the optimizer cannot change across a resume");
  }
}

// Each rank reads the pieces that intersect its shards: the values of every (unit, state kind),
// unit-major, on the host.
std::vector<std::vector<float>> ShardedCheckpoint::read_shards(const Manifest& m, const std::filesystem::path& dir) const {
  std::map<std::pair<std::string, std::string>, std::vector<const CheckpointPiece*>> index;
  for (const auto& p : m.pieces) index[{p.param, p.kind}].push_back(&p);
  const auto kinds = state_kinds(ctx_.opt.optimizer);
  std::vector<std::vector<float>> out;
  for (const auto& u : units_) {
    const auto [begin, count] = owned(u, ctx_, ctx_.shard_rank);
    for (std::size_t k = 0; k < kinds.size(); ++k) {
      std::vector<float>& dst = out.emplace_back(static_cast<std::size_t>(count), 0.0f);
      for (const auto& p : u.layout.params) {
        const std::int64_t lo = std::max(begin, p.offset) - p.offset;
        const std::int64_t hi = std::min(begin + count, p.offset + p.numel) - p.offset;
        if (lo >= hi) continue;
        std::int64_t filled = 0;
        for (const auto* piece : index[{p.spec.name, kinds[k]}]) {
          const std::int64_t a = std::max(lo, piece->offset), b = std::min(hi, piece->offset + piece->length);
          if (a >= b) continue;
          const auto values = read_piece(dir, *piece);
          std::copy_n(values.begin() + (a - piece->offset), b - a, dst.begin() + (p.offset + a - begin));
          filled += b - a;
        }
        if (filled != hi - lo) {
          throw Error(Errc::corrupt_file, "the checkpoint '" + dir.string() + "' lacks " + kinds[k] + " values of '" +
                                              p.spec.name + "' (elements " + std::to_string(lo) + ".." + std::to_string(hi) +
                                              "). It is damaged: resume from an earlier one");
        }
      }
    }
  }
  return out;
}

// Copies what read_shards() read into the shards (on the checkpoint stream, as device work);
// gradients start at zero.
Task<void> ShardedCheckpoint::install(Manifest m, std::vector<std::vector<float>> values) {
  const auto kinds = state_kinds(ctx_.opt.optimizer);
  std::size_t next = 0;
  for (auto& u : units_) {
    for (std::size_t k = 0; k < kinds.size(); ++k) upload(stream_, tensor_of(u, static_cast<int>(k)), std::move(values[next++]));
    fill_zero(stream_, u.shard.grad);
    u.shard.opt_step = 0;  // a checkpoint without step counts starts a fresh optimizer
    u.shard.sgd_started = false;
    for (const auto& cu : m.units) {
      if (cu.name == u.name) {
        u.shard.opt_step = cu.optimizer_step;
        u.shard.sgd_started = cu.sgd_started;
      }
    }
  }
  Event installed(stream_.device());
  installed.record(stream_);
  co_await installed;
}

}  // namespace coshard::fsdp::detail
