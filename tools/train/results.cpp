#include "results.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "coshard/gpt2/hf_dir.hpp"
#include "agreement.hpp"
#include "model.hpp"
#include "coshard/metrics/trace_merge.hpp"

namespace coshard::train {
namespace {

// Greedy completion of `tokens` by up to max_new tokens (fewer at the context or at `stop`), on
// the whole model in this process. Returns the new tokens.
std::vector<std::int32_t> greedy(FullModel& model, const ModelConfig& c, std::vector<std::int32_t> tokens, int max_new,
                                 std::int32_t stop = -1) {
  std::vector<std::int32_t> out;
  const auto V = static_cast<std::size_t>(c.vocab());
  for (int i = 0; i < max_new && static_cast<std::int64_t>(tokens.size()) < c.context(); ++i) {
    auto logits = model.logits(tokens);
    auto last = logits.subspan((tokens.size() - 1) * V, V);
    auto next = static_cast<std::int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    if (next == stop) break;
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

// The embedded corpus's completion of "a+b=" (bytes) up to a newline.
std::string complete(FullModel& model, const ModelConfig& c, const std::string& prompt, int max_new) {
  const auto out = greedy(model, c, std::vector<std::int32_t>(prompt.begin(), prompt.end()), max_new, '\n');
  return std::string(out.begin(), out.end());
}

// One line of text, newlines and tabs shown escaped.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : std::string(1, c);
  return out;
}

// Up to three greedy completions of prompts taken from the validation data (or the training data
// without it), decoded with --tokenizer or as bytes.
void print_text_samples(const TrainOptions& o, const Inputs& in, FullModel& model) {
  const auto& src = in.val ? *in.val : *in.train;
  const std::size_t prompt = std::min<std::size_t>(16, static_cast<std::size_t>(o.config.context()) / 2);
  const int n = std::min(o.samples, 3), new_tokens = static_cast<int>(std::min<std::int64_t>(32, o.config.context() - prompt));
  if (prompt == 0 || src.size() < prompt) return;  // a context of 1 leaves no room for a prompt
  std::printf("samples: greedy, %d tokens after a %zu-token prompt from the %s data\n", new_tokens, prompt,
              in.val ? "validation" : "training");
  for (int i = 0; i < n; ++i) {
    const std::size_t at = (src.size() - prompt) * static_cast<std::size_t>(i) / static_cast<std::size_t>(n);
    const std::vector<std::int32_t> p(src.begin() + static_cast<std::ptrdiff_t>(at),
                                      src.begin() + static_cast<std::ptrdiff_t>(at + prompt));
    const auto out = greedy(model, o.config, p, new_tokens);
    std::printf("  %s -> %s\n", one_line(in.tokenizer->decode(p)).c_str(), one_line(in.tokenizer->decode(out)).c_str());
  }
}

void load_weights(FullModel& model, const fsdp::StateDict& state) {
  for (std::size_t i = 0; i < model.params().size(); ++i) {
    const auto& name = model.params().infos()[i].name;
    auto dst = model.params().at(i);
    const auto& src = state.at(name);
    std::copy(src.begin(), src.end(), dst.begin());
  }
}

void print_samples(const TrainOptions& o, const Inputs& in, const fsdp::StateDict& state) {
  const auto full = make_full_model(o.config, o.seed);
  load_weights(*full, state);
  if (!in.corpus) {
    print_text_samples(o, in, *full);
    return;
  }
  const AdditionCorpus& corpus = *in.corpus;
  int right = 0;
  std::string shown;
  const auto probes = corpus.probes(static_cast<std::size_t>(o.samples));
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const auto got = complete(*full, o.config, probes[i].prompt(), 4);
    const bool ok = got == probes[i].answer();
    right += ok ? 1 : 0;
    if (i < 6) shown += "  " + probes[i].prompt() + got + (ok ? "   right" : "   wrong (" + probes[i].answer() + ")") + "\n";
  }
  std::printf("samples: %d of %zu completions right\n%s", right, probes.size(), shown.c_str());
}

std::string trace_part(const std::string& trace, int rank) { return trace + ".rank" + std::to_string(rank); }

void merge_timeline(const std::string& trace, int world) {
  std::vector<std::string> parts;
  std::string missing;
  for (int q = 0; q < world; ++q) {
    parts.push_back(trace_part(trace, q));
    std::error_code ec;
    if (!std::filesystem::is_regular_file(parts.back(), ec)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  }
  if (!missing.empty()) {
    // Each rank wrote its part where it sees --trace: a folder local to each host.
    throw Error(Errc::io, "--trace " + trace + ": rank 0 does not find the part(s) of rank(s) " + missing + " (" +
                              trace + ".rankN): give --trace on a file system that every rank sees; the parts "
                              "written are left where their ranks wrote them (coshard-trace-merge joins them)");
  }
  const auto spans = metrics::merge_trace_files(parts, trace);
  for (const auto& p : parts) std::filesystem::remove(p);
  std::printf("timeline: %zu spans of %d rank(s) in %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
              spans, world, trace.c_str());
}

}  // namespace

Task<void> save_and_sample(Job& job, fsdp::Engine& engine, int rank) {
  const TrainOptions& o = job.o;
  const bool want_samples = o.samples > 0 && (job.in.corpus || job.in.tokenizer);
  if (!gathers_model_at_end(o, job.in)) co_return;
  auto state = co_await engine.full_state_dict(true);
  if (rank != 0) co_return;
  if (!o.save.empty()) {
    save_state_dict(o.save, o.config, state);
    std::printf("saved the model to %s\n", o.save.c_str());
  }
  if (!o.save_hf.empty()) {
    save_hf_dir(o.save_hf, o.config, state);
    std::printf("saved the model to %s (Hugging Face: %s.from_pretrained)\n", o.save_hf.c_str(), o.config.hf_class());
  }
  if (want_samples) print_samples(o, job.in, state);
}

void print_summary(const TrainOptions& o, const TrainSummary& s, int world, int shard_group, int first_step) {
  if (first_step >= o.steps) {
    // As resume_step allows: a constant schedule goes on with a larger --steps, a cosine one cannot.
    std::printf("nothing to train: the run resumed after step %d, and --steps is %d; %s\n", first_step, o.steps,
                o.lr_schedule == "constant" ? "give a larger --steps to train on"
                                            : "its cosine schedule ended there, so the run is complete (a run with "
                                              "--lr-schedule constant can be given a larger --steps)");
  } else {
    // A hybrid strategy's shard group is the engine's (by default the ranks of a host), said so
    // that a run across hosts shows how it split the world.
    const bool hybrid = o.strategy == fsdp::Strategy::hybrid_shard || o.strategy == fsdp::Strategy::hybrid_shard_zero2;
    const std::string groups =
        hybrid ? " (shard groups of " + std::to_string(shard_group) + (shard_group == 1 ? " rank)" : " ranks)") : "";
    // After a resume, what this run trained: the steps after the checkpoint's.
    const std::string resumed =
        first_step > 0 ? " (" + std::to_string(first_step + 1) + " to " + std::to_string(o.steps) + ", resumed after step " +
                             std::to_string(first_step) + ")"
                       : "";
    std::printf("trained %d steps%s in %.1f s: loss %.4f -> %.4f, %d rank(s), %s%s\n", o.steps - first_step,
                resumed.c_str(), s.seconds, s.first_loss, s.loss, world, std::string(fsdp::to_string(o.strategy)).c_str(),
                groups.c_str());
  }
  std::fflush(stdout);
}

Task<void> finish_job(Job& job, transport::ProcessGroup& pg) {
  if (job.timeline && job.timeline->dropped() > 0) {
    std::fprintf(stderr, "gpt2-train: rank %d: the timeline is full: it holds the first spans of the last %d step(s) "
                 "and dropped %zu later ones; lower --trace-steps to see whole steps\n", pg.rank(), job.o.trace_steps,
                 job.timeline->dropped());
  }
  if (job.timeline) job.timeline->write(trace_part(job.o.trace, pg.rank()));
  co_await pg.finish();
  if (job.timeline && pg.rank() == 0) merge_timeline(job.o.trace, pg.size());
}

}  // namespace coshard::train
