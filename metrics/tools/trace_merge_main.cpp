// coshard-trace-merge: joins the per-rank Chrome traces written by --trace into one file that
// Perfetto or chrome://tracing opens with one process per rank and one track per stream.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "coshard/metrics/trace_merge.hpp"
#include "coshard/runtime/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: coshard-trace-merge TRACE.json [TRACE.json ...] -o MERGED.json\n"
    "  Merges per-rank timelines (Chrome trace JSON) into one trace: process \"rank R\" per rank,\n"
    "  one track per stream in the order compute, all_gather, reduce_scatter, all_reduce, unshard,\n"
    "  reduce, h2d, d2h, optimizer, scheduler, then any other stream by name.\n"
    "  -o, --output FILE   where to write the merged trace (written atomically)\n"
    "  -h, --help          this text\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string output;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "-o" || a == "--output") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "coshard-trace-merge: %s needs a file name\n%s", argv[i], kUsage);
        return 2;
      }
      output = argv[++i];
    } else if (a.starts_with("--output=")) {
      output = std::string(a.substr(9));
    } else if (a.starts_with("-") && a != "-") {
      std::fprintf(stderr, "coshard-trace-merge: unknown option '%s'\n%s", argv[i], kUsage);
      return 2;
    } else {
      inputs.emplace_back(a);
    }
  }
  if (inputs.empty() || output.empty()) {
    std::fprintf(stderr, "coshard-trace-merge: %s\n%s", inputs.empty() ? "no input traces" : "no -o OUTPUT", kUsage);
    return 2;
  }
  try {
    const auto spans = coshard::metrics::merge_trace_files(inputs, output);
    std::printf("coshard-trace-merge: %zu spans from %zu traces written to %s\n", spans, inputs.size(), output.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coshard-trace-merge: %s\n", e.what());
    return 1;
  }
}
