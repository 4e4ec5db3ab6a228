// coshard-ckpt: looks into sharded checkpoints (coshard/fsdp/checkpoint.hpp) and converts them.
//   coshard-ckpt inspect DIR                  what is in it
//   coshard-ckpt verify DIR                   every checksum, every piece covered exactly once
//   coshard-ckpt export DIR --to FILE         the full model as GPT-2 safetensors (what --save writes)
//   coshard-ckpt import FILE DIR --model M    a GPT-2 safetensors file or Hugging Face directory as a
//                                             checkpoint (fresh optimizer)
// Exit codes: 0 ok, 1 the checkpoint or file is bad (the message says what and where), 2 usage.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "coshard/fsdp/checkpoint.hpp"
#include "coshard/gpt2/config.hpp"
#include "coshard/gpt2/hf_dir.hpp"
#include "coshard/gpt2/params.hpp"
#include "coshard/gpt2/safetensors.hpp"
#include "coshard/runtime/error.hpp"

using namespace coshard;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: coshard-ckpt inspect DIR\n"
    "       coshard-ckpt verify DIR\n"
    "       coshard-ckpt export DIR --to FILE.safetensors\n"
    "       coshard-ckpt import FILE.safetensors|HF_DIR DIR --model MODEL\n"
    "  DIR is a sharded checkpoint (gpt2-train --checkpoint-dir writes them as DIR/step-NNNNNNNN).\n"
    "  export writes the full model under its Hugging Face GPT-2 names, as gpt2-train --save does;\n"
    "  import makes a checkpoint of a model (MODEL as gpt2-train --model) with a fresh optimizer.\n";

int inspect(const fs::path& dir) {
  const auto m = fsdp::read_manifest(dir);
  std::printf("checkpoint %s (format version %d)\n", dir.c_str(), m.version);
  std::printf("  saved by %d rank(s), %s, shard group %d, %s, parameters in %s\n", m.world_size, m.strategy.c_str(),
              m.shard_group_size, m.optimizer.c_str(), m.param_dtype.c_str());
  std::map<std::string, std::uint64_t> kinds;  // kind -> elements
  std::map<std::string, Shape> params;
  for (const auto& p : m.pieces) {
    // Each piece fits the bytes its file claims, but the claims are the manifest's own: saturate.
    auto& n = kinds[p.kind];
    if (__builtin_add_overflow(n, static_cast<std::uint64_t>(p.length), &n)) n = UINT64_MAX;
    params[p.param] = p.shape;
  }
  for (const auto& [kind, n] : kinds) std::printf("  %-16s %llu elements\n", kind.c_str(), static_cast<unsigned long long>(n));
  std::printf("  %zu parameters, %zu pieces in %zu file(s):\n", params.size(), m.pieces.size(), m.files.size());
  for (const auto& f : m.files) std::printf("    %s  rank %d  %llu bytes\n", f.name.c_str(), f.rank, static_cast<unsigned long long>(f.bytes));
  if (!m.metadata.empty()) std::printf("  training state:\n");
  for (const auto& [k, v] : m.metadata) std::printf("    %s = %s\n", k.c_str(), v.c_str());
  return 0;
}

int verify(const fs::path& dir) {
  fsdp::verify_checkpoint(dir);
  const auto m = fsdp::read_manifest(dir);
  std::uint64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::printf("%s: ok (%zu files, %zu pieces, %llu bytes checked)\n", dir.c_str(), m.files.size(), m.pieces.size(),
              static_cast<unsigned long long>(bytes));
  return 0;
}

gpt2::Config model_of(const fsdp::Manifest& m, const fs::path& dir) {
  auto it = m.metadata.find("model");
  if (it == m.metadata.end()) {
    throw Error(Errc::bad_config, "checkpoint " + dir.string() + " does not say which GPT-2 model it holds (no 'model' "
                                  "in its training state): it was not written by gpt2-train");
  }
  return gpt2::parse_config(it->second);
}

// Whether `path` is `dir` or lies under it, symbolic links resolved.
bool inside(const fs::path& path, const fs::path& dir) {
  const auto rel = fs::weakly_canonical(path).lexically_relative(fs::weakly_canonical(dir));
  return !rel.empty() && *rel.begin() != "..";
}

int export_model(const fs::path& dir, const fs::path& to) {
  const auto m = fsdp::read_manifest(dir);
  if (inside(to, dir)) {
    throw Error(Errc::bad_config, "export --to " + to.string() + " lies inside the checkpoint " + dir.string() +
                                      " and would replace its files: give a path outside it");
  }
  const auto config = model_of(m, dir);
  gpt2::StateDict state;
  for (const auto& p : m.pieces) {
    if (p.kind == "param" && !state.count(p.param)) state[p.param] = fsdp::read_full(dir, m, p.param, "param");
  }
  gpt2::save_state_dict(to, config, state);
  std::printf("exported %zu parameters of %s to %s\n", state.size(), dir.c_str(), to.c_str());
  return 0;
}

int import_model(const fs::path& file, const fs::path& dir, const std::string& model) {
  const auto config = gpt2::parse_config(model);
  const auto state = gpt2::read_init(file, config);  // a safetensors file or a Hugging Face directory, as --init
  std::vector<fsdp::FullTensor> params;
  for (const auto& p : gpt2::all_params(config)) {
    if (auto it = state.find(p.name); it != state.end()) params.push_back({p.name, p.shape, it->second});
  }
  fsdp::write_checkpoint(dir, params, {{"model", model}, {"step", "0"}, {"imported_from", fs::absolute(file).string()}});
  std::printf("imported %zu parameters of %s into %s\n", params.size(), file.c_str(), dir.c_str());
  return 0;
}

int run(const std::vector<std::string>& a) {
  if (a.size() == 2 && a[0] == "inspect") return inspect(a[1]);
  if (a.size() == 2 && a[0] == "verify") return verify(a[1]);
  if (a.size() == 4 && a[0] == "export" && a[2] == "--to") return export_model(a[1], a[3]);
  if (a.size() == 5 && a[0] == "import" && a[3] == "--model") return import_model(a[1], a[2], a[4]);
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s", kUsage);
    return 0;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coshard-ckpt: %s\n", e.what());
    return 1;
  }
}
