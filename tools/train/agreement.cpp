#include "agreement.hpp"

#include <cstdio>
#include <filesystem>

#include "checkpoints.hpp"
#include "coshard/runtime/error.hpp"
#include "coshard/transport/gather_integers.hpp"

namespace coshard::train {
namespace {

namespace fs = std::filesystem;

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 14695981039346656037ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string hex(std::uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string given(const std::string& path) { return path.empty() ? "none" : "given"; }

std::string file_size(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? "unreadable" : std::to_string(n) + " bytes";
}

}  // namespace

std::string token_identity(const gpt2::Tokens& tokens) {
  constexpr std::size_t kEnds = 4096, kStrided = std::size_t{1} << 20;
  const std::size_t n = tokens.size();
  std::uint64_t h = fnv1a(&n, sizeof n);
  if (n <= 2 * kEnds + kStrided) {
    h = fnv1a(tokens.data(), n * sizeof(gpt2::Token), h);
  } else {
    h = fnv1a(tokens.data(), kEnds * sizeof(gpt2::Token), h);
    h = fnv1a(tokens.data() + n - kEnds, kEnds * sizeof(gpt2::Token), h);
    const std::size_t stride = n / kStrided;
    for (std::size_t i = kEnds; i < n - kEnds; i += stride) h = fnv1a(&tokens[i], sizeof(gpt2::Token), h);
  }
  return std::to_string(n) + " tokens, hash " + hex(h);
}

bool gathers_model_at_end(const TrainOptions& o, const Inputs& in) {
  return !o.save.empty() || !o.save_hf.empty() || (o.samples > 0 && (in.corpus || in.tokenizer));
}

std::vector<Setting> shared_settings(const TrainOptions& o, const Inputs& in) {
  const auto num = [](auto v) { return std::to_string(v); };
  return {
      {"--model", o.config.to_string()},
      {"--seed", num(o.seed)},  // before --data: the embedded corpus follows it
      {"--data", in.data_id.data},
      {"--val-data", o.val_data.empty() ? "none" : in.data_id.val_data},
      {"--val-fraction", exact_number(o.val_fraction)},
      {"--steps", num(o.steps)},
      {"--batch", num(o.batch)},
      {"--seq", num(o.seq)},
      {"--grad-accum (or --global-batch)", num(o.grad_accum)},
      {"--lr", exact_number(o.lr)},
      {"--lr-schedule", o.lr_schedule},
      {"--warmup-steps", num(o.warmup_steps)},
      {"--weight-decay", exact_number(o.weight_decay)},
      {"--clip", exact_number(o.clip)},
      {"--shuffle", o.shuffle ? "true" : "false"},
      {"--strategy", std::string(fsdp::to_string(o.strategy))},
      {"--shard-group", num(o.shard_group)},
      {"--forward-prefetch", num(o.forward_prefetch)},
      {"--backward-prefetch", num(static_cast<int>(o.backward_prefetch))},
      {"--mixed-precision", std::string(to_string(o.param_dtype))},
      {"--f32-compute", o.f32_compute ? "true" : "false"},
      {"--offload", o.offload ? "true" : "false"},
      {"--device", o.device},
      {"--init", o.init.empty() ? "none" : file_size(o.init)},
      {"--eval-every", num(o.eval_every)},
      // Only rank 0 writes and samples, but every rank takes part in the gather before.
      {"--save, --save-hf or --samples with a tokenizer (the model gathered at the end)",
       gathers_model_at_end(o, in) ? "yes" : "no"},
      {"--trace", given(o.trace)},
      {"--checkpoint-dir", given(o.checkpoint_dir)},
      {"--checkpoint-every", num(o.checkpoint_every)},
      {"--checkpoint-async", o.checkpoint_async ? "true" : "false"},
      {"--resume", o.resume.empty() || o.resume == "auto" ? o.resume : "a checkpoint"},
  };
}

std::vector<std::int64_t> setting_hashes(const std::vector<Setting>& settings) {
  std::vector<std::int64_t> out;
  for (const auto& s : settings) out.push_back(static_cast<std::int64_t>(fnv1a(s.value.data(), s.value.size())));
  return out;
}

std::optional<std::string> first_difference(const std::vector<Setting>& settings, const std::vector<std::int64_t>& all,
                                            int world, int rank) {
  const std::size_t n = settings.size();
  for (std::size_t i = 0; i < n; ++i) {
    std::string ranks;
    for (int r = 1; r < world; ++r) {
      if (all[static_cast<std::size_t>(r) * n + i] != all[i]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (ranks.empty()) continue;
    return "the ranks were started with different " + settings[i].flag + ": rank " + ranks + " differs from rank 0 (" +
           settings[i].flag + " is " + settings[i].value + " here, on rank " + std::to_string(rank) +
           "). Start every rank with the same flags and the same data";
  }
  return std::nullopt;
}

Task<void> check_same_settings(Runtime& rt, transport::ProcessGroup& pg, std::vector<Setting> settings) {
  std::vector<std::int64_t> mine = setting_hashes(settings);
  const std::vector<std::int64_t> all =
      co_await transport::gather_integers(pg.world(), rt.stream("compute"), rt.allocator(), std::move(mine));
  if (auto why = first_difference(settings, all, pg.size(), pg.rank())) throw Error(Errc::bad_config, *why);
}

}  // namespace coshard::train
