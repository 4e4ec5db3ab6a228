#pragma once
// How every benchmark here reports repeated measurements: the median, and the spread
// (max - min) / median that scripts/bench compares ratios against.
#include <algorithm>
#include <vector>

namespace coshard::bench {

struct Summary {
  double median = 0;
  double spread = 0;
};

/// `samples` must not be empty.
inline Summary summarise(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const double median = samples[samples.size() / 2];
  return {median, (samples.back() - samples.front()) / median};
}

}  // namespace coshard::bench
