#pragma once
// Rank 0's progress line: step/total, loss, tokens/s, ETA and the share of the step spent waiting
// on communication. On a terminal it updates in place; otherwise it prints plain lines (about 20
// over the run, plus the first and the last step).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

namespace coshard::train {

class Progress {
 public:
  Progress(int total, bool enabled) : total_(total), enabled_(enabled), tty_(::isatty(STDOUT_FILENO) == 1) {}

  void step(int s, double loss, double tokens_per_s, double exposed_share, double val_loss) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double eta = s > 0 ? elapsed / s * (total_ - s) : 0;
    char line[256];
    std::snprintf(line, sizeof line, "step %*d/%d | loss %.4f%s | %.0f tok/s | ETA %s | exposed comm %.0f%%",
                  width(), s, total_, loss, std::isfinite(val_loss) ? (" | val " + fixed(val_loss)).c_str() : "",
                  tokens_per_s, clock(eta).c_str(), 100.0 * std::min(1.0, exposed_share));
    const int every = std::max(1, total_ / 20);
    if (tty_) {
      std::printf("\r\033[K%s", line);
    } else if (s == 1 || s == total_ || s % every == 0 || std::isfinite(val_loss)) {
      std::printf("%s\n", line);
    }
    std::fflush(stdout);
  }
  void done() {
    if (enabled_ && tty_) std::printf("\n");
  }

 private:
  int width() const { return static_cast<int>(std::to_string(total_).size()); }
  static std::string fixed(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", v);
    return b;
  }
  static std::string clock(double s) {
    const long t = std::lround(s);
    char b[32];
    if (t >= 3600) {
      std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, t / 60 % 60);
    } else {
      std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
    }
    return b;
  }
  int total_;
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace coshard::train
