#include "train_options.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "coshard/runtime/parse_whole.hpp"

namespace coshard::train {

namespace {

// Flags read as words, turned into TrainOptions once the parse succeeded. --init and --resume are
// read as lists: a second one cannot be meant as an override (see only_once).
struct Words {
  std::string model, schedule, strategy = "full_shard", bwd = "pre", precision = "none";
  std::vector<std::string> init, resume;
};

// A flag given twice takes its last value, as argparse-based launchers and torchrun do, so that a
// wrapper (scripts/demo, an sbatch script) sets defaults that its user's flags override. Where the
// model starts is the exception: read as a list of one value per use, refused when given twice.
CLI::Option* once_each(CLI::Option* opt) {
  return opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->expected(1)->allow_extra_args(false);
}

// CLI11's Range, PositiveNumber and NonNegativeNumber compare with < and >, which NaN passes: a
// --lr nan failed only after a step, a --clip nan turned clipping off, a timeout of nan became an
// integer's undefined value.
CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return {};  // the conversion names what is wrong
        return std::isfinite(v) ? std::string() : "must be a finite number, not " + s;
      },
      "FINITE");
}

// CLI11's PositiveNumber and NonNegativeNumber name the largest double in 309 digits, and
// PositiveNumber says "Value 0 not in range 0.000000 to ..." of a 0 it refuses: said in words.
CLI::Validator at_least(double low, bool above) {
  return CLI::Validator(
      [low, above](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v)) return {};  // the conversion names what is wrong
        if (above ? v > low : v >= low) return {};
        return std::string(above ? "must be greater than " : "must be at least ") + CLI::detail::to_string(low) +
               ", not " + s;
      },
      above ? "POSITIVE" : "NONNEGATIVE");
}
CLI::Validator positive() { return at_least(0, true); }
CLI::Validator non_negative() { return at_least(0, false); }

// CLI11 reads "-1" into an unsigned integer as 2^64 - 1.
CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (parse_whole<std::uint64_t>(s)) return {};
        return "must be a whole number from 0 to 18446744073709551615, not " + s;
      },
      "UINT64");
}

// CLI11 2.1 reads whole numbers with strtoll(s, 0): --steps 010 ran 8 steps and --batch 0x10 was
// 16, while the checks (unsigned64) read the text as decimal. Leading zeros are dropped here; any
// other text is refused, so that every integer flag means what it says in decimal.
CLI::Validator decimal() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::size_t digits = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
        if (digits == s.size() || s.find_first_not_of("0123456789", digits) != std::string::npos) {
          return "must be a whole number in decimal, not " + s;
        }
        s.erase(digits, std::min(s.find_first_not_of('0', digits), s.size() - 1) - digits);
        return {};
      },
      "");
}

// Every integer flag, found by the type CLI11 gave it, so that a flag added later is covered too.
void integers_are_decimal(CLI::App& app) {
  for (auto* opt : app.get_options()) {
    const auto type = opt->get_type_name();
    if (type.starts_with("INT") || type.starts_with("UINT")) opt->transform(decimal());
  }
}

void add_job_flags(CLI::App& app, TrainOptions& o, Words& w) {
  app.add_option("--model", w.model,
                 "GPT-2: tiny | 10M | 124M (GPT-2 small as released; gpt2-124M too), or a shape: "
                 "layers=2,heads=3,width=48,vocab=97,context=32. Llama: llama-tiny | llama-60M | llama-150M | "
                 "llama3.2-1B | llama3.1-8B, or a shape with kv_heads, ffn and head_dim. A name may be followed by "
                 "overrides: 10M,vocab=512")
      ->capture_default_str();
  app.add_option("--data", o.data, "token file: llm.c .bin (uint16 tokens), or any other file read as bytes "
                                   "(vocab 256); default: an embedded corpus of integer additions")
      ->check(CLI::ExistingFile);
  app.add_option("--val-data", o.val_data, "validation tokens for --eval-every, in either --data format (llm.c and "
                                           "nanoGPT ship train and val files)")
      ->check(CLI::ExistingFile);
  app.add_option("--val-fraction", o.val_fraction, "instead of --val-data: hold out the last fraction F of --data "
                                                   "(default 0: every token of --data is training data)")
      ->check(finite())->check(CLI::Range(0.0, 0.9));
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str()->check(CLI::Range(1, 100000000));
  app.add_option("--batch", o.batch, "sequences per rank per micro-batch")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq", o.seq, "tokens per sequence (at most the model's context)")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  auto* accum = app.add_option("--grad-accum", o.grad_accum, "micro-batches per step (no_sync on all but the last)")
                    ->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--global-batch", o.global_batch,
                 "sequences per step over every rank: --grad-accum becomes G / (ranks x --batch), so that a job that "
                 "goes on with fewer or more ranks (coshard-run --nnodes MIN:MAX) keeps its data and losses; G must "
                 "be a multiple of ranks x --batch at every world size the job may run at")
      ->check(CLI::Range(1, 1 << 30))->excludes(accum);
}

void add_optimizer_flags(CLI::App& app, TrainOptions& o, Words& w) {
  app.add_option("--lr", o.lr, "peak learning rate (AdamW, betas 0.9/0.95, eps 1e-8)")
      ->capture_default_str()->check(finite())->check(positive());
  app.add_option("--lr-schedule", w.schedule, "constant | cosine (to 10% of --lr at the last step)")
      ->capture_default_str()->check(CLI::IsMember({"constant", "cosine"}));
  app.add_option("--warmup-steps", o.warmup_steps, "linear warmup from 0")->capture_default_str()->check(non_negative());
  app.add_option("--weight-decay", o.weight_decay, "AdamW decay, on 2-D weights only (as nanoGPT)")
      ->capture_default_str()->check(finite())->check(non_negative());
  app.add_option("--clip", o.clip, "gradient norm clip (L2); 0 disables")
      ->capture_default_str()->check(finite())->check(non_negative());
  app.add_option("--seed", o.seed, "initialisation and shuffling seed")->capture_default_str()->check(unsigned64());
  app.add_flag("--shuffle", o.shuffle, "visit the sequences in a seeded permutation per epoch (default: llm.c-style "
                                       "sequential batches, wrapping at the end)");
}

void add_sharding_flags(CLI::App& app, TrainOptions& o, Words& w) {
  app.add_option("--strategy", w.strategy, "full_shard | shard_grad_op | no_shard | hybrid_shard | hybrid_shard_zero2")
      ->capture_default_str()
      ->check(CLI::IsMember({"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2"}));
  app.add_option("--shard-group", o.shard_group, "hybrid strategies: ranks per shard group (default: the ranks of a host)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--forward-prefetch", o.forward_prefetch, "units all-gathered ahead in forward")
      ->capture_default_str()->check(CLI::Range(0, 64));
  app.add_option("--backward-prefetch", w.bwd, "pre | post | none")->capture_default_str()->check(CLI::IsMember({"pre", "post", "none"}));
  app.add_option("--mixed-precision", w.precision, "none | bf16 | fp16 (unsharded parameters and reductions)")
      ->capture_default_str()->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_flag("--f32-compute", o.f32_compute,
               "with --mixed-precision bf16: compute on an f32 copy of each unit's bf16 parameters instead of "
               "the bf16 parameters themselves (f32 GEMMs; more memory and slower; the default where the CPU "
               "has no avx512_bf16)");
  app.add_flag("--offload", o.offload, "keep master shards, gradients and optimizer state in host memory");
  app.add_flag("--no-memory-check", o.skip_memory_check,
               "start even where the ranks on this host need more memory than it has left (the check counts "
               "activations, state, unsharded units and data; see docs/gpt2.md)");
  app.add_option("--threads", o.threads,
                 "BLAS threads per rank (default: the CPUs this process may use / ranks on this host, at least 1; "
                 "OPENBLAS_NUM_THREADS, when set, is the default instead)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--collective-timeout", o.collective_timeout,
                 "seconds a collective waits for its peers before every waiting rank fails naming the silent ones")
      ->capture_default_str()->check(finite())->check(CLI::Range(0.1, 86400.0));
  app.add_option("--rendezvous-timeout", o.rendezvous_timeout,
                 "seconds to reach the rendezvous store (MASTER_ADDR:MASTER_PORT) and for every rank to join")
      ->capture_default_str()->check(finite())->check(CLI::Range(0.1, 86400.0));
  app.add_option("--stream-jitter-us", o.stream_jitter_us,
                 "fault injection (scripts/soak): every stream sleeps a random time up to this before each work item; "
                 "the losses must not change")
      ->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--device", o.device,
                 "cpu | cpu-discrete (a CPU device whose memory the host cannot touch, as a GPU's: a host access "
                 "aborts naming it; slower, for proving the GPU path on the CPU) | cuda (GPU LOCAL_RANK, in a build "
                 "with CUDA: docs/gpu.md)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "cpu-discrete", "cuda"}));
}

void add_output_flags(CLI::App& app, TrainOptions& o, Words& w) {
  once_each(app.add_option("--init", w.init, "start from this .safetensors (Hugging Face names), or a Hugging Face model "
                                   "directory (GPT2LMHeadModel or LlamaForCausalLM, as save_pretrained writes), which "
                                   "gives the model: no --model needed"))
      ->check(CLI::ExistingPath);
  app.add_option("--save", o.save, "write the trained model to this .safetensors (atomically)");
  app.add_option("--save-hf", o.save_hf, "write the trained model to this directory as transformers' "
                                         "from_pretrained(DIR) loads it (GPT2LMHeadModel or LlamaForCausalLM)");
  app.add_option("--eval-every", o.eval_every, "validation loss every N steps and at the end (0: never; needs --val-data "
                                                  "or --val-fraction)")->check(non_negative());
  app.add_option("--metrics-port", o.metrics_port, "Prometheus /metrics on PORT + local rank; 0 picks free ports")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--metrics-bind", o.metrics_bind, "address the metrics endpoint binds")->capture_default_str();
  app.add_option("--metrics-linger", o.metrics_linger,
                 "keep serving metrics this many seconds after training, so a scraper sees the final values")
      ->check(finite())->check(CLI::Range(0.0, 3600.0));
  app.add_option("--trace", o.trace, "write the overlap timeline of every rank, merged, to this Chrome trace JSON");
  app.add_option("--trace-steps", o.trace_steps, "how many of the last steps the timeline keeps")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--log-json", o.log_json, "one JSON object per step from rank 0, to FILE or - (stdout)");
  app.add_option("--tokenizer", o.tokenizer, "Hugging Face byte-level BPE tokenizer.json that decodes the samples "
                                             "of --data (scripts/prepare-data writes one); vocab 256 data is bytes")
      ->check(CLI::ExistingFile);
  app.add_option("--samples", o.samples, "completions printed at the end: of the embedded corpus's sums, or (at most 3) "
                                         "of prompts from --val-data / --data")
      ->capture_default_str()->check(CLI::Range(0, 10000));
}

void add_checkpoint_flags(CLI::App& app, TrainOptions& o, Words& w) {
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "sharded checkpoints of the whole training state in DIR/step-NNNNNNNN (DIR/latest names the newest); "
                 "SIGUSR2 then stops every rank after a checkpoint, with exit code 75");
  app.add_option("--checkpoint-every", o.checkpoint_every, "a checkpoint every N steps, and one at the end")
      ->check(non_negative());
  app.add_option("--checkpoint-keep", o.checkpoint_keep, "complete checkpoints kept (older ones are removed)")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--checkpoint-async", o.checkpoint_async,
                 "write checkpoints in the background while training goes on (true | false)")
      ->capture_default_str();
  once_each(app.add_option("--resume", w.resume, "auto: continue from the latest checkpoint under --checkpoint-dir "
                                                 "(start fresh if there is none); or a checkpoint directory. Any "
                                                 "world size and strategy"));
}

// "" when FLAG was given at most once, else the trainer's own refusal naming it.
std::string only_once(const char* flag, const std::vector<std::string>& values, std::string& into) {
  if (values.size() > 1) {
    return std::string("gpt2-train: ") + flag + " given " + std::to_string(values.size()) + " times ('" + values[0] +
           "', then '" + values[1] + "'): it says where the model starts, so no later one can override it; give it once";
  }
  into = values.empty() ? std::string() : values[0];
  return {};
}

std::string apply_words(TrainOptions& o, const Words& w) {
  if (auto why = only_once("--init", w.init, o.init); !why.empty()) return why;
  if (auto why = only_once("--resume", w.resume, o.resume); !why.empty()) return why;
  o.lr_schedule = w.schedule;
  static const std::map<std::string, fsdp::Strategy> strategies{
      {"full_shard", fsdp::Strategy::full_shard}, {"shard_grad_op", fsdp::Strategy::shard_grad_op},
      {"no_shard", fsdp::Strategy::no_shard}, {"hybrid_shard", fsdp::Strategy::hybrid_shard},
      {"hybrid_shard_zero2", fsdp::Strategy::hybrid_shard_zero2}};
  o.strategy = strategies.at(w.strategy);
  o.backward_prefetch = w.bwd == "pre" ? fsdp::BackwardPrefetch::pre : w.bwd == "post" ? fsdp::BackwardPrefetch::post
                                                                                       : fsdp::BackwardPrefetch::none;
  o.param_dtype = w.precision == "bf16" ? DType::bf16 : w.precision == "fp16" ? DType::f16 : DType::f32;
  return {};
}

// A Hugging Face directory as --init says what model it is: it gives the model when --model was
// not given, and must agree with one that was.
std::string model_of_init(TrainOptions& o, bool model_given) {
  if (o.init.empty() || !std::filesystem::is_directory(o.init)) return {};
  ModelConfig found;
  try {
    found = ModelConfig::from_hf_dir(o.init);
  } catch (const Error& e) {
    return "gpt2-train: --init " + o.init + ": " + e.message();
  }
  if (model_given && !(found == o.config)) {
    return "gpt2-train: --model " + o.model + " is " + o.config.family() + " " + o.config.to_string() + ", but --init " +
           o.init + " holds " + found.family() + " " + found.to_string() + " (its config.json): drop --model, as the "
           "directory says what it is, or give --model " + found.to_string();
  }
  if (!model_given) {
    o.config = found;
    o.model = found.to_string();
  }
  return {};
}

// The checks that span several flags; empty when the options go together.
std::string conflicts(const TrainOptions& o) {
  if (o.warmup_steps > o.steps) {
    return "gpt2-train: --warmup-steps " + std::to_string(o.warmup_steps) + " is more than --steps " +
           std::to_string(o.steps) + ": the learning rate would never reach --lr; lower --warmup-steps";
  }
  if (o.seq > o.config.context()) {
    return "gpt2-train: --seq " + std::to_string(o.seq) + " is longer than the model's context (" +
           std::to_string(o.config.context()) + "); lower --seq or pick a larger --model context";
  }
  if (o.f32_compute && o.param_dtype != DType::bf16) {
    return "gpt2-train: --f32-compute goes with --mixed-precision bf16 (every other precision computes in f32)";
  }
  if (o.device == "cuda" && o.stream_jitter_us > 0) {
    return "gpt2-train: --stream-jitter-us injects delays into CPU streams only; drop it with --device cuda";
  }
  if (o.offload && o.strategy == fsdp::Strategy::no_shard) {
    return "gpt2-train: --offload needs a sharded --strategy (no_shard keeps everything on every rank)";
  }
  if (o.shard_group > 0 && o.strategy != fsdp::Strategy::hybrid_shard && o.strategy != fsdp::Strategy::hybrid_shard_zero2) {
    return "gpt2-train: --shard-group goes with --strategy hybrid_shard or hybrid_shard_zero2";
  }
  if (!o.resume.empty() && !o.init.empty()) {
    return "gpt2-train: --resume and --init both say where the model starts; give one";
  }
  if (o.resume == "auto" && o.checkpoint_dir.empty()) {
    return "gpt2-train: --resume auto looks under --checkpoint-dir; give --checkpoint-dir DIR";
  }
  if (!o.val_data.empty() && o.val_fraction > 0) {
    return "gpt2-train: --val-data and --val-fraction both say where validation data comes from; give one";
  }
  if (o.eval_every > 0 && o.val_data.empty() && o.val_fraction == 0) {
    return "gpt2-train: --eval-every needs validation data: --val-data FILE, or --val-fraction F to hold out the "
           "last F of --data";
  }
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) {
    return "gpt2-train: --checkpoint-every needs --checkpoint-dir DIR";
  }
  if (!o.tokenizer.empty() && o.data.empty()) {
    return "gpt2-train: --tokenizer decodes the samples of --data, but without --data the run trains on the embedded "
           "corpus (byte text, no tokenizer needed): give --data, or drop --tokenizer";
  }
  return {};
}

}  // namespace

ParseResult parse_train_options(int argc, char** argv) {
  TrainOptions o;
  CLI::App app{"gpt2-train: trains GPT-2 with coshard's FSDP engine. Run under coshard-run for several ranks "
               "(coshard-run --nproc-per-node 2 -- gpt2-train); alone it is one rank.",
               "gpt2-train"};
  app.get_formatter()->column_width(34);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // before any option is added
  Words w;
  w.model = o.model;
  w.schedule = o.lr_schedule;
  add_job_flags(app, o, w);
  add_optimizer_flags(app, o, w);
  add_sharding_flags(app, o, w);
  add_output_flags(app, o, w);
  add_checkpoint_flags(app, o, w);
  integers_are_decimal(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, app.help()};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, 2, std::string("gpt2-train: ") + e.what() + "\nRun gpt2-train --help for the flags."};
  }
  try {
    o.model = w.model;
    o.config = ModelConfig::parse(w.model);
  } catch (const Error& e) {
    return {std::nullopt, 2, "gpt2-train: --model: " + e.message()};
  }
  if (auto why = apply_words(o, w); !why.empty()) return {std::nullopt, 2, why};
  if (auto why = model_of_init(o, app.count("--model") > 0); !why.empty()) return {std::nullopt, 2, why};
  if (auto why = conflicts(o); !why.empty()) return {std::nullopt, 2, why};
  return {o, 0, {}};
}

std::string fit_global_batch(TrainOptions& o, int world) {
  if (o.global_batch == 0) return {};
  const long long per_micro_batch = static_cast<long long>(world) * o.batch;
  const std::string what = "gpt2-train: --global-batch " + std::to_string(o.global_batch);
  const std::string per = "the ranks (" + std::to_string(world) + ") x --batch (" + std::to_string(o.batch) +
                          ") = " + std::to_string(per_micro_batch);
  if (o.global_batch % per_micro_batch != 0) {
    return what + " is not a multiple of " + per + ": give a --global-batch that is, at every world size the job "
                  "may run at, or another --batch";
  }
  if (o.global_batch / per_micro_batch > 4096) {
    return what + " needs more than 4096 micro-batches of " + per + ": raise --batch";
  }
  o.grad_accum = static_cast<int>(o.global_batch / per_micro_batch);
  return {};
}

double learning_rate(const TrainOptions& o, int step) {
  if (step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  if (o.lr_schedule == "constant") return o.lr;
  const double span = std::max(1, o.steps - o.warmup_steps);
  const double progress = std::min(1.0, (step - o.warmup_steps) / span);
  const double min_lr = 0.1 * o.lr;
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace coshard::train
