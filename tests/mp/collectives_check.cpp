// A rank program for the collective tests: every collective of the world communicator, sub-groups
// and a device mesh, checked element by element against a reference computed locally in double.
//   --mode all        every check (default)
//   --mode mismatch   rank 1 passes a different size to an all_gather (--mismatch-elems N, default
//                     1001, against 1000): every rank must fail naming it
//   --mode die        rank --die-rank exits in the middle of a stream of all-reduces; the others
//                     ignore SIGTERM (so the launcher cannot end them) and must report the dead peer
//   --mode straggler  rank --slow-rank enters each of 20 all-reduces --slow-ms late; every rank
//                     prints its coshard_peer_wait_seconds_total series
//   --mode bench      (unused by tests) nothing
//   --timeout-ms T    per-operation deadline
//   --big N           elements of the largest buffers
//   --die-elems N     elements of the all-reduces of --mode die (default 65536)
//   --shared-min B    Runtime::Options::shared_host_min_bytes (host buffers shared from B bytes)
//   --direct-min B    UcxOptions::direct_min_bytes (the direct path from B bytes per rank)
//   --hosts H         each rank names itself host (rank / ceil(ranks / H)) in a UTS namespace of its
//                     own (needs root), so that the world spans H "hosts"; --host-layout round puts
//                     rank r on host r % H instead
//   --real-hosts H    the ranks already run on H real hosts, in blocks (one coshard-run or srun
//                     task set per host): the expectations of --hosts H, with the hosts' own names
//   --rank0-mesh-max B  rank 0 alone proposes UcxOptions::mesh_max_bytes = B (0: no rank may use the mesh)
// Unless COSHARD_UCX_DIRECT=0, a world of several ranks on one host must have run some collectives
// on the direct path, and never one whose buffers are not all shared. Across hosts, the world must
// have run some on the two-level schedule when every host has the same number (> 1) of ranks and
// COSHARD_UCX_HIERARCHY is not 0, and none otherwise. Unless the mesh is off, a world of several
// ranks must have run some (the small ones) on the mesh.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coshard/metrics/prometheus_telemetry.hpp"
#include "coshard/ops/cast.hpp"
#include "coshard/runtime/runtime.hpp"
#include "coshard/transport/process_group.hpp"

using namespace coshard;
using namespace coshard::transport;
using namespace coshard::launch;

namespace {

struct Flags {
  std::string mode = "all";
  int die_rank = 1;
  long timeout_ms = 60000;
  std::int64_t big = 1 << 18;
  std::int64_t die_elems = 1 << 16;
  std::size_t shared_min = std::size_t{1} << 20;
  std::size_t direct_min = 0;  // 0: UcxOptions' default
  int slow_rank = 2;
  int slow_ms = 50;
  int hosts = 0;  // 0: the real host
  std::string host_layout = "block";
  bool real_hosts = false;  // --real-hosts: no UTS namespace
  std::int64_t mismatch_elems = 1001;  // rank 1's all-gather in --mode mismatch (the others: 1000)
  std::int64_t rank0_mesh_max = -1;    // >= 0: rank 0 proposes this UcxOptions::mesh_max_bytes
  int host_of(int rank, int world) const {
    return host_layout == "round" ? rank % hosts : rank / ((world + hosts - 1) / hosts);
  }
};

// How many operations of `c` ran on `algorithm`, from its flight record's counts.
std::uint64_t algorithm_count(const Communicator& c, const std::string& algorithm) {
  const std::string json = c.flight_record_json();
  const auto counts = json.find("\"algorithms\":{");
  if (counts == std::string::npos) return 0;
  const auto end = json.find('}', counts);
  const auto at = json.find("\"" + algorithm + "\":", counts);
  if (at == std::string::npos || at > end) return 0;
  return std::strtoull(json.c_str() + at + algorithm.size() + 3, nullptr, 10);
}

// The largest coshard_peer_segments_mapped_bytes this rank serves (any communicator).
double mapped_peer_bytes(Runtime& rt) {
  std::istringstream text(dynamic_cast<metrics::PrometheusTelemetry&>(rt.telemetry()).serialize());
  double most = 0;
  for (std::string line; std::getline(text, line);) {
    if (line.starts_with("coshard_peer_segments_mapped_bytes{")) {
      most = std::max(most, std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr));
    }
  }
  return most;
}

bool direct_expected(int n, const Flags& f) {
  const char* env = std::getenv("COSHARD_UCX_DIRECT");
  return n > 1 && f.hosts < 2 && !(env && std::string(env) == "0");
}

// The small operations take the mesh unless it is off: by COSHARD_UCX_MESH_MAX_BYTES=0 on every
// rank, or by rank 0 alone (the ranks agree on the smallest proposal).
bool mesh_expected(int n, const Flags& f) {
  const char* env = std::getenv("COSHARD_UCX_MESH_MAX_BYTES");
  return n > 1 && !(env && std::string(env) == "0") && f.rank0_mesh_max != 0;
}

bool hierarchy_expected(int n, const Flags& f) {
  const char* env = std::getenv("COSHARD_UCX_HIERARCHY");
  if (f.hosts < 2 || (env && std::string(env) == "0")) return false;
  std::vector<int> per_host(static_cast<std::size_t>(f.hosts), 0);
  for (int r = 0; r < n; ++r) ++per_host[static_cast<std::size_t>(f.host_of(r, n))];
  return std::all_of(per_host.begin(), per_host.end(), [&](int k) { return k == per_host[0] && k > 1; });
}

// The value every rank puts at element i: a multiple of 1/8 below 16 in magnitude, exact in bf16,
// so sums over up to 8 ranks are exact in f32 and the only rounding is the final cast.
double value(int rank, std::int64_t i) { return static_cast<double>((rank * 131 + i * 7) % 251 - 125) / 8.0; }

double round_to(DType t, double v) {
  switch (t) {
    case DType::bf16: return ops::bf16_to_f32(ops::f32_to_bf16(static_cast<float>(v)));
    case DType::f16: return ops::f16_to_f32(ops::f32_to_f16(static_cast<float>(v)));
    case DType::f32: return static_cast<float>(v);
    default: return v;
  }
}

void put(Tensor& t, std::int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data_as<float>()[i] = static_cast<float>(v); break;
    case DType::bf16: static_cast<std::uint16_t*>(t.data())[i] = ops::f32_to_bf16(static_cast<float>(v)); break;
    case DType::f16: static_cast<std::uint16_t*>(t.data())[i] = ops::f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(v * 8); break;
    case DType::i64: t.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(v * 8); break;
  }
}

double get(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data_as<float>()[i];
    case DType::bf16: return ops::bf16_to_f32(static_cast<const std::uint16_t*>(t.data())[i]);
    case DType::f16: return ops::f16_to_f32(static_cast<const std::uint16_t*>(t.data())[i]);
    case DType::i32: return t.data_as<std::int32_t>()[i] / 8.0;
    case DType::i64: return static_cast<double>(t.data_as<std::int64_t>()[i]) / 8.0;
  }
  return 0;
}

double tolerance(DType t) {
  switch (t) {
    case DType::bf16: return 8e-3;
    case DType::f16: return 1e-3;
    case DType::f32: return 1e-6;
    default: return 0;
  }
}

struct Checker {
  int rank;
  int failures = 0;
  int checks = 0;
  // Compares `got` with `want(i)` for every element; reports the first few differences.
  void expect(const std::string& what, const Tensor& got, const std::function<double(std::int64_t)>& want) {
    ++checks;
    int bad = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      double w = want(i), g = get(got, i);
      if (std::fabs(g - w) > tolerance(got.dtype()) * std::max(1.0, std::fabs(w))) {
        if (bad++ < 3) {
          std::fprintf(stderr, "rank %d: %s: element %lld is %.9g, expected %.9g\n", rank, what.c_str(),
                       static_cast<long long>(i), g, w);
        }
      }
    }
    if (bad) {
      ++failures;
      std::fprintf(stderr, "rank %d: FAILED %s (%d of %lld elements wrong)\n", rank, what.c_str(), bad,
                   static_cast<long long>(got.numel()));
    }
  }
};

std::string name(DType t) { return std::string(to_string(t)); }

Task<void> check_all_gather(Runtime& rt, Communicator& c, Checker& ck, std::int64_t big) {
  Stream& s = rt.stream("compute");
  const int n = c.size(), r = c.rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, big + 3}) {
      for (bool in_place : {false, true}) {
        Tensor out = Tensor::empty(rt.allocator(), t, {count * n});
        Tensor in = in_place ? out.view(r * count, {count}) : Tensor::empty(rt.allocator(), t, {count});
        for (std::int64_t i = 0; i < count; ++i) put(in, i, value(r, i));
        co_await c.all_gather(in, out, s);
        ck.expect("all_gather " + name(t) + " x " + std::to_string(count) + (in_place ? " in place" : ""), out,
                  [&](std::int64_t i) { return round_to(t, value(static_cast<int>(i / count), i % count)); });
      }
    }
  }
}

double reduce_ref(ReduceOp op, int n, double factor, const std::function<double(int)>& v) {
  double acc = op == ReduceOp::max ? -1e300 : 0.0;
  for (int q = 0; q < n; ++q) {
    double x = v(q) * (op == ReduceOp::premul_sum ? factor : 1.0);
    acc = op == ReduceOp::max ? std::max(acc, x) : acc + x;
  }
  return op == ReduceOp::avg ? acc / n : acc;
}

const Reduction kReductions[] = {Reduction::sum(), Reduction::avg(), Reduction::max(), Reduction::premul_sum(0.5)};

Task<void> check_reduce_scatter(Runtime& rt, Communicator& c, Checker& ck, std::int64_t big) {
  Stream& s = rt.stream("compute");
  const int n = c.size(), r = c.rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t count : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, std::int64_t{1000}, big / 2 + 1}) {
      for (Reduction red : kReductions) {
        Tensor in = Tensor::empty(rt.allocator(), t, {count * n});
        Tensor out = Tensor::empty(rt.allocator(), t, {count});
        for (std::int64_t i = 0; i < count * n; ++i) put(in, i, value(r, i));
        co_await c.reduce_scatter(in, out, red, s);
        ck.expect("reduce_scatter " + name(t) + " " + std::string(to_string(red.op)) + " x " + std::to_string(count),
                  out, [&](std::int64_t i) {
                    return round_to(t, reduce_ref(red.op, n, red.factor,
                                                  [&](int q) { return round_to(t, value(q, r * count + i)); }));
                  });
      }
    }
  }
}

Task<void> check_all_reduce(Runtime& rt, Communicator& c, Checker& ck, std::int64_t big, std::string tag) {
  Stream& s = rt.stream("compute");
  const int n = c.size(), r = c.rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{3}, std::int64_t{1001}, big + 5}) {
      for (Reduction red : kReductions) {
        Tensor buf = Tensor::empty(rt.allocator(), t, {count});
        for (std::int64_t i = 0; i < count; ++i) put(buf, i, value(r, i));
        co_await c.all_reduce(buf, red, s);
        ck.expect(tag + "all_reduce " + name(t) + " " + std::string(to_string(red.op)) + " x " + std::to_string(count),
                  buf, [&](std::int64_t i) {
                    return round_to(t, reduce_ref(red.op, n, red.factor, [&](int q) { return round_to(t, value(q, i)); }));
                  });
      }
    }
  }
}

Task<void> check_broadcast_and_p2p(Runtime& rt, Communicator& c, Checker& ck, std::int64_t big) {
  Stream& s = rt.stream("compute");
  const int n = c.size(), r = c.rank();
  for (int root = 0; root < n; ++root) {
    for (std::int64_t count : {std::int64_t{1}, big + 1}) {
      Tensor buf = Tensor::empty(rt.allocator(), DType::i32, {count});
      for (std::int64_t i = 0; i < count; ++i) put(buf, i, r == root ? value(root, i) : -99);
      co_await c.broadcast(buf, root, s);
      ck.expect("broadcast root " + std::to_string(root) + " x " + std::to_string(count), buf,
                [&](std::int64_t i) { return value(root, i); });
    }
  }
  co_await c.barrier(s);
  ++ck.checks;
  if (n > 1) {
    // A ring of sends: even ranks send first, odd ranks receive first, so large (rendezvous)
    // messages cannot wait on each other in a cycle.
    const std::int64_t count = big + 11;
    Tensor out = Tensor::empty(rt.allocator(), DType::f32, {count});
    Tensor in = Tensor::empty(rt.allocator(), DType::f32, {count});
    for (std::int64_t i = 0; i < count; ++i) put(out, i, value(r, i));
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    if (r % 2 == 0) {
      co_await c.send(out, right, s);
      co_await c.recv(in, left, s);
    } else {
      co_await c.recv(in, left, s);
      co_await c.send(out, right, s);
    }
    ck.expect("recv from rank " + std::to_string(left), in, [&](std::int64_t i) { return round_to(DType::f32, value(left, i)); });
  }
}

Task<void> check_groups(Runtime& rt, Communicator& world, Checker& ck) {
  const int n = world.size(), r = world.rank();
  auto parity = co_await world.split(r % 2, r, "parity");
  if (parity->size() != (n + 1 - r % 2) / 2) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: parity group has %d ranks\n", r, parity->size());
  }
  co_await check_all_reduce(rt, *parity, ck, 1000, "parity ");
  auto none = co_await world.split(r == 0 ? -1 : 0, -r);  // rank 0 stays out; the others reversed
  if ((r == 0) != (none == nullptr)) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: split with a negative color is wrong\n", r);
  } else if (none && none->rank() != n - 1 - r) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: split ordered by key gave rank %d, expected %d\n", r, none->rank(), n - 1 - r);
  }
  if (n == 4) {
    auto mesh = co_await DeviceMesh::create(world, 2, 2);
    co_await check_all_reduce(rt, *mesh.shard_group, ck, 1000, "shard group ");
    co_await check_all_reduce(rt, *mesh.replicate_group, ck, 1000, "replicate group ");
    Stream& s = rt.stream("compute");
    Tensor v = Tensor::empty(rt.allocator(), DType::f32, {1});
    put(v, 0, r);
    co_await mesh.shard_group->all_reduce(v, Reduction::sum(), s);
    ck.expect("shard group members", v, [&](std::int64_t) { return r < 2 ? 0 + 1 : 2 + 3; });
    put(v, 0, r);
    co_await mesh.replicate_group->all_reduce(v, Reduction::sum(), s);
    ck.expect("replicate group members", v, [&](std::int64_t) { return r % 2 == 0 ? 0 + 2 : 1 + 3; });
  }
}

// One rank's buffer is private (not a shared segment): every rank must take the ring for that
// operation, and the direct path again for the next one, whose buffers are all shared.
Task<void> check_mixed(Runtime& rt, Communicator& c, Checker& ck, std::int64_t big, std::size_t shared_min,
                       std::size_t direct_min, bool direct_possible) {
  Stream& s = rt.stream("compute");
  const int n = c.size(), r = c.rank();
  Allocator private_memory(cpu_memory());
  // Large enough for a shared segment and for the direct path.
  const auto count = static_cast<std::int64_t>(std::max<std::size_t>(
      {static_cast<std::size_t>(big), shared_min / sizeof(float) + 1, direct_min / sizeof(float) + 1}));
  for (bool mixed : {true, false}) {
    Tensor in = Tensor::empty(mixed && r == 0 ? private_memory : rt.allocator(), DType::f32, {count});
    Tensor out = Tensor::empty(rt.allocator(), DType::f32, {count * n});
    for (std::int64_t i = 0; i < count; ++i) put(in, i, value(r, i));
    const auto before = algorithm_count(c, "direct");
    co_await c.all_gather(in, out, s);
    const auto took = algorithm_count(c, "direct") - before;
    ck.expect(std::string("all_gather with ") + (mixed ? "rank 0's input private" : "every input shared"), out,
              [&](std::int64_t i) { return round_to(DType::f32, value(static_cast<int>(i / count), i % count)); });
    const std::uint64_t want = !mixed && direct_possible ? 1 : 0;
    if (took != want) {
      ++ck.failures;
      std::fprintf(stderr, "rank %d: the all_gather with %s ran %llu times on the direct path, expected %llu\n", r,
                   mixed ? "rank 0's input private" : "every input shared", static_cast<unsigned long long>(took),
                   static_cast<unsigned long long>(want));
    }
  }
}

// Two communicators with many operations in flight at once, each on its own stream.
Task<void> check_concurrent(Runtime& rt, ProcessGroup& pg, Checker& ck) {
  CommOptions a, b;
  a.name = "all_gather";
  b.name = "reduce_scatter";
  auto ag = co_await pg.new_communicator(a);
  auto rs = co_await pg.new_communicator(b);
  const int n = pg.size(), r = pg.rank();
  const std::int64_t count = 4099;
  std::vector<Tensor> ins, outs, rin, rout;
  std::vector<Event> events;
  Stream& s = rt.stream("compute");
  for (int k = 0; k < 16; ++k) {
    ins.push_back(Tensor::empty(rt.allocator(), DType::f32, {count}));
    outs.push_back(Tensor::empty(rt.allocator(), DType::f32, {count * n}));
    rin.push_back(Tensor::empty(rt.allocator(), DType::f32, {count * n}));
    rout.push_back(Tensor::empty(rt.allocator(), DType::f32, {count}));
    for (std::int64_t i = 0; i < count; ++i) put(ins.back(), i, value(r + k, i));
    for (std::int64_t i = 0; i < count * n; ++i) put(rin.back(), i, value(r + k, i));
    events.push_back(ag->all_gather(ins.back(), outs.back(), s));
    events.push_back(rs->reduce_scatter(rin.back(), rout.back(), Reduction::sum(), s));
  }
  for (auto& e : events) co_await e;
  for (int k = 0; k < 16; ++k) {
    ck.expect("concurrent all_gather " + std::to_string(k), outs[static_cast<std::size_t>(k)],
              [&](std::int64_t i) { return value(static_cast<int>(i / count) + k, i % count); });
    ck.expect("concurrent reduce_scatter " + std::to_string(k), rout[static_cast<std::size_t>(k)], [&](std::int64_t i) {
      return reduce_ref(ReduceOp::sum, n, 1, [&](int q) { return value(q + k, r * count + i); });
    });
  }
}

Task<int> run(Runtime& rt, LaunchEnv env, Flags f) {
  ProcessGroupOptions o;
  o.world.timeout = std::chrono::milliseconds(f.timeout_ms);
  if (f.direct_min) o.ucx.direct_min_bytes = f.direct_min;
  if (f.rank0_mesh_max >= 0 && env.rank == 0) o.ucx.mesh_max_bytes = static_cast<std::size_t>(f.rank0_mesh_max);
  if (f.mode == "straggler" && env.rank == f.slow_rank) {
    o.world.before_op = [ms = f.slow_ms](const OpInfo&) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  }
  auto pg = co_await ProcessGroup::create(rt, env, o);
  Communicator& w = pg->world();
  Checker ck{w.rank()};
  Stream& s = rt.stream("compute");
  if (f.mode == "mismatch") {
    const std::int64_t count = w.rank() == 1 ? f.mismatch_elems : 1000;
    Tensor in = Tensor::empty(rt.allocator(), DType::f32, {count});
    Tensor out = Tensor::empty(rt.allocator(), DType::f32, {count * w.size()});
    try {
      co_await w.all_gather(in, out, s);
      std::printf("rank %d: mismatch NOT detected\n", w.rank());
      co_return 1;
    } catch (const Error& e) {
      std::printf("rank %d: expected error: %s\n", w.rank(), e.what());
      co_return 4;
    }
  }
  if (f.mode == "straggler") {
    Tensor buf = Tensor::empty(rt.allocator(), DType::f32, {1024});
    for (int k = 0; k < 20; ++k) co_await w.all_reduce(buf, Reduction::sum(), s);
    co_await pg->finish();
    std::istringstream text(dynamic_cast<metrics::PrometheusTelemetry&>(rt.telemetry()).serialize());
    for (std::string line; std::getline(text, line);) {
      if (line.starts_with("coshard_peer_wait_seconds_total{")) std::printf("%s\n", line.c_str());
    }
    co_return 0;
  }
  if (f.mode == "die") {
    Tensor buf = Tensor::empty(rt.allocator(), DType::f32, {f.die_elems});
    try {
      for (int k = 0;; ++k) {
        if (k == 20 && w.rank() == f.die_rank) {
          std::fprintf(stderr, "rank %d exiting on purpose\n", w.rank());
          std::fflush(stderr);
          std::_Exit(3);
        }
        co_await w.all_reduce(buf, Reduction::sum(), s);
      }
    } catch (const Error& e) {
      std::printf("rank %d: expected error: %s\n", w.rank(), e.what());
      std::fflush(stdout);
      co_return 4;
    }
  }
  co_await check_all_gather(rt, w, ck, f.big);
  co_await check_reduce_scatter(rt, w, ck, f.big);
  co_await check_all_reduce(rt, w, ck, f.big, "");
  co_await check_broadcast_and_p2p(rt, w, ck, f.big);
  co_await check_groups(rt, w, ck);
  const std::size_t direct_min = f.direct_min ? f.direct_min : UcxOptions{}.direct_min_bytes;
  co_await check_mixed(rt, w, ck, f.big, f.shared_min, direct_min, direct_expected(w.size(), f));
  co_await check_concurrent(rt, *pg, ck);
  const auto direct = algorithm_count(w, "direct"), hierarchical = algorithm_count(w, "hierarchical");
  const auto mesh = algorithm_count(w, "mesh");
  if ((mesh > 0) != mesh_expected(w.size(), f)) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: %llu collectives ran on the mesh; expected %s\n", ck.rank,
                 static_cast<unsigned long long>(mesh), mesh_expected(w.size(), f) ? "some" : "none");
  }
  if ((direct > 0) != direct_expected(w.size(), f)) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: %llu collectives ran on the direct path; expected %s\n", ck.rank,
                 static_cast<unsigned long long>(direct), direct_expected(w.size(), f) ? "some" : "none");
  }
  if (direct > 0 && mapped_peer_bytes(rt) <= 0) {  // the direct path maps its peers' segments
    ++ck.failures;
    std::fprintf(stderr, "rank %d: the direct path ran but coshard_peer_segments_mapped_bytes counts nothing\n", ck.rank);
  }
  if ((hierarchical > 0) != hierarchy_expected(w.size(), f)) {
    ++ck.failures;
    std::fprintf(stderr, "rank %d: %llu collectives ran on the two-level schedule; expected %s\n", ck.rank,
                 static_cast<unsigned long long>(hierarchical), hierarchy_expected(w.size(), f) ? "some" : "none");
  }
  co_await pg->finish();
  if (ck.failures) {
    std::printf("rank %d: %d of %d checks FAILED\n", ck.rank, ck.failures, ck.checks);
    co_return 1;
  }
  std::printf("rank %d: collectives ok (%d checks, %d ranks, %llu hierarchical, %llu direct, %llu mesh)\n", ck.rank,
              ck.checks, w.size(), static_cast<unsigned long long>(hierarchical), static_cast<unsigned long long>(direct),
              static_cast<unsigned long long>(mesh));
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") f.mode = v;
    else if (k == "--die-rank") f.die_rank = std::atoi(v.c_str());
    else if (k == "--timeout-ms") f.timeout_ms = std::atol(v.c_str());
    else if (k == "--big") f.big = std::atoll(v.c_str());
    else if (k == "--die-elems") f.die_elems = std::atoll(v.c_str());
    else if (k == "--shared-min") f.shared_min = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--direct-min") f.direct_min = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--slow-rank") f.slow_rank = std::atoi(v.c_str());
    else if (k == "--slow-ms") f.slow_ms = std::atoi(v.c_str());
    else if (k == "--hosts") f.hosts = std::atoi(v.c_str());
    else if (k == "--host-layout") f.host_layout = v;
    else if (k == "--mismatch-elems") f.mismatch_elems = std::atoll(v.c_str());
    else if (k == "--rank0-mesh-max") f.rank0_mesh_max = std::atoll(v.c_str());
    else if (k == "--real-hosts") {
      f.hosts = std::atoi(v.c_str());
      f.real_hosts = true;
    }
    else {
      std::fprintf(stderr, "collectives_check: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  // In the failure modes only the communicator's own detection may end a rank, not the launcher.
  if (f.mode != "all") ::signal(SIGTERM, SIG_IGN);
  auto env = resolve_launch_env(process_env());
  if (!env) {
    std::fprintf(stderr, "%s\n", env.error().what());
    return 2;
  }
  if (f.hosts > 0 && !f.real_hosts) {
    // A hostname of its own is all that tells UCX's peers apart by host (the wires' identities).
    const std::string host = "coshard-fake-host" + std::to_string(f.host_of(env.value().rank, env.value().world_size));
    if (::unshare(CLONE_NEWUTS) != 0 || ::sethostname(host.c_str(), host.size()) != 0) {
      std::fprintf(stderr, "collectives_check: --hosts needs root (a UTS namespace): %s\n", std::strerror(errno));
      return 2;
    }
  }
  try {
    Runtime::Options ro;
    ro.name = "check";
    ro.rank = env.value().rank;
    ro.shared_host_min_bytes = f.shared_min;
    metrics::PrometheusTelemetry telemetry;  // --mode straggler reads its series
    ro.telemetry = &telemetry;
    Runtime rt(ro);
    int rc = rt.scheduler().sync_wait(run(rt, env.value(), f));
    std::fflush(stdout);
    if (f.mode != "all") std::_Exit(rc);  // peers are gone: skip the orderly shutdown
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", env.value().rank, e.what());
    return 1;
  }
}
