// The test-support Prometheus server (tests/support, header-only) inside a test body.
#include <chrono>
#include <string>
#include <vector>

#include "support/prometheus_server.hpp"

namespace snippet {
using namespace std::chrono_literals;

void body() {
  // @snippet
}

}  // namespace snippet
