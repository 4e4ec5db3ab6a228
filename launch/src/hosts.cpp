#include "coshard/launch/hosts.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>

namespace coshard::launch {
namespace {

constexpr std::size_t kNamed = 8;  // hosts an error lists; a job of 1000 hosts would fill a screen

}  // namespace

std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host[0] != '\0' ? host : "?";
}

Result<int> ranks_per_host(const std::vector<std::string>& host_of_rank) {
  if (host_of_rank.empty()) return Error(Errc::bad_config, "no ranks, so no hosts to group them by");
  std::vector<std::pair<std::string, int>> runs;  // each host's ranks, in order of its first rank
  std::map<std::string, std::size_t> last;        // each host's last rank
  for (std::size_t r = 0; r < host_of_rank.size(); ++r) {
    const std::string& host = host_of_rank[r];
    if (r > 0 && host == host_of_rank[r - 1]) {
      ++runs.back().second;
    } else if (const auto seen = last.find(host); seen != last.end()) {
      return Error(Errc::bad_config, "the ranks of " + host + " are not consecutive (rank " +
                                         std::to_string(seen->second) + ", then rank " + std::to_string(r) +
                                         " after rank " + std::to_string(r - 1) + " on " + host_of_rank[r - 1] + ")");
    } else {
      runs.emplace_back(host, 1);
    }
    last[host] = r;
  }
  const int each = runs.front().second;
  if (std::all_of(runs.begin(), runs.end(), [&](const auto& run) { return run.second == each; })) return each;
  // Of many hosts, those that differ from the count most hold: the first few may all be alike.
  std::map<int, std::size_t> hosts_with;
  for (const auto& run : runs) ++hosts_with[run.second];
  const int usual = std::max_element(hosts_with.begin(), hosts_with.end(), [](const auto& a, const auto& b) {
                      return a.second < b.second;
                    })->first;
  const bool all = runs.size() <= kNamed;
  std::string counts;
  std::size_t named = 0;
  for (const auto& [host, count] : runs) {
    if ((!all && count == usual) || named == kNamed) continue;
    counts += (named++ ? ", " : "") + host + ": " + std::to_string(count);
  }
  if (!all) {
    const std::size_t odd = runs.size() - hosts_with[usual];
    if (odd > named) counts += ", ... (" + std::to_string(odd) + " such hosts)";
    counts += "; the other " + std::to_string(hosts_with[usual]) + " hosts: " + std::to_string(usual) + " each";
  }
  return Error(Errc::bad_config, "the hosts hold different numbers of ranks (" + counts + ")");
}

}  // namespace coshard::launch
