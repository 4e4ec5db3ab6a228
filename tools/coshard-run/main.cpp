// coshard-run: a torchrun-like launcher for coshard programs.
#include <cstdio>
#include <stdexcept>

#include "coshard/runtime/error.hpp"
#include "launcher.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  coshard::run::Options options;
  try {
    options = coshard::run::parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    if (*e.what()) std::fprintf(stderr, "coshard-run: %s\n", e.what());
    std::fputs(coshard::run::usage().c_str(), *e.what() ? stderr : stdout);
    return *e.what() ? 2 : 0;
  }
  try {
    return coshard::run::launch(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coshard-run: %s\n", e.what());
    return 1;
  }
}
