// The names the docs' snippets assume, as parameters of a coroutine: the block goes into a scope of
// its own inside it, so a snippet may declare these names again.
#include <coshard/fsdp/engine.hpp>
#include <coshard/metrics/rank_metrics.hpp>
#include <coshard/metrics/timeline.hpp>
#include <coshard/runtime/readback.hpp>
#include <coshard/runtime/runtime.hpp>
#include <coshard/launch/launch_env.hpp>
#include <coshard/transport/process_group.hpp>
#include <cstdio>
#include <memory>
#include <vector>

namespace snippet {
using namespace coshard;

// A model as examples/minimal has it: its units and the loss they publish.
struct Model {
  std::vector<fsdp::Unit*> units;
  Readback<float> loss;
  void set_batch(int step);
};

Task<void> body(Runtime& rt, launch::LaunchEnv env, Model& model, std::vector<fsdp::Unit*> units,
                std::unique_ptr<transport::ProcessGroup> pg, std::unique_ptr<fsdp::Engine> engine, Tensor shard,
                Tensor full, int steps) {
  {
    // @snippet
  }
  co_return;
}

}  // namespace snippet
