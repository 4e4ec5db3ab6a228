#include "coshard/gpt2/config.hpp"

#include "coshard/models/spec.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::gpt2 {
namespace {

Error bad(std::string msg) { return Error(Errc::bad_config, "GPT-2 config: " + std::move(msg)); }

void check_range(const char* key, std::int64_t v, std::int64_t hi) {
  if (v < 1 || v > hi) {
    throw bad(std::string(key) + "=" + std::to_string(v) + " is out of range: it must be in [1, " + std::to_string(hi) + "]");
  }
}

}  // namespace

std::int64_t Config::num_params() const noexcept {
  const std::int64_t C = width;
  const std::int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return vocab * C + context * C + layers * block + 2 * C + (tie_head ? 0 : vocab * C);
}

void Config::validate() const {
  check_range("vocab", vocab, std::int64_t{1} << 24);
  check_range("context", context, std::int64_t{1} << 20);
  check_range("layers", layers, 1024);
  check_range("width", width, 65536);
  check_range("heads", heads, width);
  if (width % heads != 0) {
    throw bad("width=" + std::to_string(width) + " is not divisible by heads=" + std::to_string(heads) +
              ": each head gets width/heads channels; pick a width that is a multiple of heads");
  }
}

std::string Config::to_string() const {
  std::string s = "layers=" + std::to_string(layers) + ",heads=" + std::to_string(heads) + ",width=" + std::to_string(width) +
                  ",vocab=" + std::to_string(vocab) + ",context=" + std::to_string(context);
  if (!tie_head) s += ",tie_head=false";
  return s;
}

std::vector<std::string> config_names() { return {"tiny", "10M", "124M"}; }

Config named_config(std::string_view name) {
  Config c;
  if (name == "tiny") {
    c = {.vocab = 256, .context = 64, .layers = 2, .heads = 4, .width = 96};
  } else if (name == "10M") {
    c = {.vocab = 256, .context = 256, .layers = 6, .heads = 6, .width = 384};
  } else if (name == "small") {
    // This name meant the 10.8M config once; GPT-2 small as released is 124M. Say so, not guess.
    throw bad("there is no config 'small': GPT-2 small as released is '124M'; the 6-layer byte-level config is '10M'");
  } else if (name == "124M") {
    c = {.vocab = 50257, .context = 1024, .layers = 12, .heads = 12, .width = 768};
  } else {
    throw bad("unknown config name '" + std::string(name) + "': use tiny, 10M, 124M or key=value pairs "
              "(layers=2,heads=3,width=48,vocab=97,context=32)");
  }
  return c;
}

Config parse_config(std::string_view spec) {
  const std::string what = "GPT-2 config: ";
  const models::Spec parsed = models::parse_spec(spec, what, "tiny, 10M, 124M or key=value pairs");
  Config c;
  if (!parsed.name.empty()) c = named_config(parsed.name);
  for (const auto& [key, value] : parsed.values) {
    if (key == "tie_head") {
      c.tie_head = models::spec_bool(what, key, value);
      continue;
    }
    std::int64_t* field = key == "vocab" ? &c.vocab : key == "context" ? &c.context : key == "layers" ? &c.layers
                        : key == "heads" ? &c.heads : key == "width" ? &c.width : nullptr;
    if (!field) {
      throw bad("unknown key '" + key + "' in '" + std::string(spec) + "': keys are layers, heads, width, vocab, context, tie_head");
    }
    *field = models::spec_int(what, key, value);
  }
  if (parsed.name.empty()) {
    for (const char* k : {"layers", "heads", "width", "vocab", "context"}) {
      if (!parsed.has(k)) {
        throw bad("'" + std::string(spec) + "' lacks " + k + ": give all of layers, heads, width, vocab, context, or start "
                  "from a named config (e.g. tiny,width=128)");
      }
    }
  }
  c.validate();
  return c;
}

}  // namespace coshard::gpt2
