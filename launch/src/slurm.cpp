#include "coshard/launch/slurm.hpp"

#include <limits>

#include "coshard/runtime/parse_whole.hpp"

namespace coshard::launch {
namespace {

constexpr std::size_t kMaxHosts = 65536;

Error bad_list(std::string_view list, const std::string& why) {
  return Error(Errc::bad_config, "Slurm host list '" + std::string(list) + "' " + why);
}

std::optional<long> to_long(std::string_view s) {
  const std::optional<long> v = parse_whole<long>(s);
  if (!v || *v < 0) return std::nullopt;
  return v;
}

// "1-3,07" -> {"1","2","3","07"}: a range keeps the width of its first bound ("01-10").
Result<std::vector<std::string>> expand_ranges(std::string_view list, std::string_view ranges) {
  std::vector<std::string> out;
  while (!ranges.empty()) {
    auto comma = ranges.find(',');
    auto part = ranges.substr(0, comma);
    ranges = comma == std::string_view::npos ? std::string_view() : ranges.substr(comma + 1);
    auto dash = part.find('-');
    auto lo_s = part.substr(0, dash);
    auto lo = to_long(lo_s), hi = dash == std::string_view::npos ? lo : to_long(part.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) return bad_list(list, "has a bad range '" + std::string(part) + "'");
    if (out.size() + static_cast<std::size_t>(*hi - *lo) >= kMaxHosts) return bad_list(list, "names over 65536 hosts");
    for (long v = *lo;; ++v) {  // ends at hi, not past it: hi may be LONG_MAX
      auto s = std::to_string(v);
      if (s.size() < lo_s.size()) s.insert(0, lo_s.size() - s.size(), '0');
      out.push_back(std::move(s));
      if (v == *hi) break;
    }
  }
  return out;
}

// One comma-free entry, possibly with several bracket groups: "rack[1-2]-n[1-2]".
Result<std::vector<std::string>> expand_entry(std::string_view list, std::string_view entry) {
  auto open = entry.find('[');
  if (open == std::string_view::npos) {
    if (entry.find(']') != std::string_view::npos) return bad_list(list, "has a ']' without '['");
    return std::vector<std::string>{std::string(entry)};
  }
  auto close = entry.find(']', open);
  if (close == std::string_view::npos) return bad_list(list, "has a '[' without ']'");
  auto values = expand_ranges(list, entry.substr(open + 1, close - open - 1));
  if (!values) return values.error();
  auto rest = expand_entry(list, entry.substr(close + 1));
  if (!rest) return rest.error();
  std::vector<std::string> out;
  if (values.value().size() * rest.value().size() > kMaxHosts) return bad_list(list, "names over 65536 hosts");
  const std::string prefix(entry.substr(0, open));
  for (const auto& v : values.value()) {
    for (const auto& r : rest.value()) out.push_back(prefix + v + r);
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0 || depth > 1) return bad_list(list, "has unbalanced brackets");
    if (i < list.size() && !(list[i] == ',' && depth == 0)) continue;
    auto entry = list.substr(start, i - start);
    start = i + 1;
    if (entry.empty()) return bad_list(list, "has an empty entry");
    auto hosts = expand_entry(list, entry);
    if (!hosts) return hosts.error();
    if (out.size() + hosts.value().size() > kMaxHosts) return bad_list(list, "names over 65536 hosts");
    out.insert(out.end(), hosts.value().begin(), hosts.value().end());
  }
  if (depth != 0) return bad_list(list, "has unbalanced brackets");
  return out;
}

Result<std::vector<int>> expand_tasks_per_node(std::string_view counts) {
  std::vector<int> out;
  auto bad = [&] {
    return Error(Errc::bad_config, "Slurm tasks per node '" + std::string(counts) + "' is not like \"2(x3),1\"");
  };
  while (!counts.empty()) {
    auto comma = counts.find(',');
    auto part = counts.substr(0, comma);
    counts = comma == std::string_view::npos ? std::string_view() : counts.substr(comma + 1);
    long repeat = 1;
    if (auto paren = part.find("(x"); paren != std::string_view::npos) {
      if (part.back() != ')') return bad();
      auto r = to_long(part.substr(paren + 2, part.size() - paren - 3));
      if (!r || *r < 1 || *r > static_cast<long>(kMaxHosts)) return bad();
      repeat = *r;
      part = part.substr(0, paren);
    }
    auto n = to_long(part);
    if (!n || *n < 1 || *n > std::numeric_limits<int>::max() || out.size() + static_cast<std::size_t>(repeat) > kMaxHosts) {
      return bad();
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
  }
  if (out.empty()) return bad();
  return out;
}

bool in_slurm_step(const EnvLookup& env) { return env("SLURM_STEP_ID").has_value() && env("SLURM_PROCID").has_value(); }

Result<SlurmStep> read_slurm_step(const EnvLookup& env) {
  SlurmStep s;
  std::vector<std::string> problems;
  auto need = [&](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names) {
      if (auto v = env(n)) return *v;
    }
    problems.push_back(std::string(*names.begin()) + " is not set");
    return {};
  };
  s.job_id = need({"SLURM_JOB_ID", "SLURM_JOBID"});
  s.step_id = need({"SLURM_STEP_ID", "SLURM_STEPID"});
  if (auto list = need({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}); !list.empty()) {
    if (auto h = expand_hostlist(list)) s.hosts = std::move(h).value(); else problems.push_back(h.error().message());
  }
  if (auto tasks = need({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}); !tasks.empty()) {
    if (auto t = expand_tasks_per_node(tasks)) s.tasks_per_host = std::move(t).value(); else problems.push_back(t.error().message());
  }
  auto node = need({"SLURM_NODEID"});
  if (auto n = to_long(node); n && *n <= std::numeric_limits<int>::max()) {
    s.node_id = static_cast<int>(*n);
  } else if (!node.empty()) {
    problems.push_back("SLURM_NODEID='" + node + "' is not a node index");
  }
  if (!s.hosts.empty() && !s.tasks_per_host.empty() && s.hosts.size() != s.tasks_per_host.size()) {
    problems.push_back("the step lists " + std::to_string(s.hosts.size()) + " hosts but tasks for " +
                       std::to_string(s.tasks_per_host.size()));
  }
  if (!s.hosts.empty() && static_cast<std::size_t>(s.node_id) >= s.hosts.size()) {
    problems.push_back("SLURM_NODEID=" + std::to_string(s.node_id) + " is outside the step's " +
                       std::to_string(s.hosts.size()) + " hosts");
  }
  // A port every task computes alike: Slurm's reserved ports when MpiParams=ports= gives some,
  // otherwise one below Linux's ephemeral range picked by the ids (MASTER_PORT overrides it).
  const auto resv = env("SLURM_STEP_RESV_PORTS");
  const auto first = resv ? to_long(std::string_view(*resv).substr(0, resv->find('-'))) : std::nullopt;
  if (first && *first >= 1 && *first <= 65535) {
    s.port = static_cast<std::uint16_t>(*first);
  } else {
    // Unsigned: ids are at most LONG_MAX, and 131 x that overflowed a long.
    const auto job = static_cast<std::uint64_t>(to_long(s.job_id).value_or(0));
    const auto step = static_cast<std::uint64_t>(to_long(s.step_id).value_or(0));
    s.port = static_cast<std::uint16_t>(20000 + (job % 12000 * 131 + step % 12000 * 7) % 12000);
  }
  s.token = "slurm-" + s.job_id + "." + s.step_id;
  if (!problems.empty()) {
    std::string msg = "Slurm step environment is incomplete: ";
    for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    return Error(Errc::bad_config, msg + ". Start the ranks with srun inside an allocation");
  }
  return s;
}

}  // namespace coshard::launch
