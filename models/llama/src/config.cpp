#include "coshard/llama/config.hpp"

#include <charconv>
#include <cmath>
#include <tuple>

#include "coshard/models/spec.hpp"
#include "coshard/runtime/error.hpp"

namespace coshard::llama {
namespace {

const std::string kWhat = "Llama config: ";

Error bad(const std::string& msg) { return Error(Errc::bad_config, kWhat + msg); }

void check_range(const char* key, std::int64_t v, std::int64_t hi) {
  if (v < 1 || v > hi) {
    throw bad(std::string(key) + "=" + std::to_string(v) + " is out of range: it must be in [1, " + std::to_string(hi) + "]");
  }
}

// The shortest text that reads back as v (1e-05, 500000).
std::string number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// "llama3:8:1:4:8192" (factor, low_freq_factor, high_freq_factor, original context).
ops::RopeScaling parse_scaling(const std::string& value) {
  ops::RopeScaling s;
  double* fields[] = {&s.factor, &s.low_freq_factor, &s.high_freq_factor, &s.original_context};
  std::string rest = value;
  if (rest.rfind("llama3:", 0) != 0) {
    throw bad("rope_scaling='" + value + "': the one scaling implemented is llama3:FACTOR:LOW:HIGH:CONTEXT "
              "(Llama 3.1's; linear, dynamic, yarn and longrope are not)");
  }
  rest = rest.substr(7);
  for (double* f : fields) {
    const auto colon = rest.find(':');
    *f = models::spec_double(kWhat, "rope_scaling", rest.substr(0, colon));
    rest = colon == std::string::npos ? std::string() : rest.substr(colon + 1);
  }
  return s;
}

}  // namespace

std::int64_t Config::num_params() const noexcept {
  const std::int64_t C = width;
  const std::int64_t block = 2 * C + C * (q_width() + 2 * kv_width()) + q_width() * C + 3 * C * ffn;
  return vocab * C + layers * block + C + (tie_head ? 0 : vocab * C);
}

bool Config::operator==(const Config& o) const noexcept {
  const auto scaling = [](const ops::RopeScaling& s) {
    return std::tuple(s.factor, s.low_freq_factor, s.high_freq_factor, s.original_context);
  };
  return std::tuple(vocab, context, layers, heads, kv_heads, width, ffn, head_dim, rms_eps, rope_theta, rope_llama3,
                    tie_head) == std::tuple(o.vocab, o.context, o.layers, o.heads, o.kv_heads, o.width, o.ffn,
                                            o.head_dim, o.rms_eps, o.rope_theta, o.rope_llama3, o.tie_head) &&
         (!rope_llama3 || scaling(rope_scaling) == scaling(o.rope_scaling));
}

void Config::validate() const {
  check_range("vocab", vocab, std::int64_t{1} << 24);
  check_range("context", context, std::int64_t{1} << 24);
  check_range("layers", layers, 1024);
  check_range("width", width, 65536);
  check_range("ffn", ffn, 1 << 20);
  check_range("heads", heads, 4096);
  check_range("kv_heads", kv_heads, heads);
  check_range("head_dim", head_dim, 4096);
  if (heads % kv_heads != 0) {
    throw bad("kv_heads=" + std::to_string(kv_heads) + " does not divide heads=" + std::to_string(heads) +
              ": each key/value head serves heads / kv_heads query heads; pick a divisor of heads");
  }
  if (head_dim % 2 != 0) {
    throw bad("head_dim=" + std::to_string(head_dim) + " is odd: rotary embeddings rotate pairs of a head's elements");
  }
  if (!(rms_eps > 0.0) || !std::isfinite(rms_eps)) throw bad("rms_eps=" + number(rms_eps) + " must be positive");
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) throw bad("rope_theta=" + number(rope_theta) + " must be above 1");
  const ops::RopeScaling& s = rope_scaling;
  if (rope_llama3 && (!(s.factor >= 1.0) || !(s.low_freq_factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor) ||
                      !(s.original_context > 0.0))) {
    throw bad("rope_scaling llama3 needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
              "original context");
  }
}

std::string Config::to_string() const {
  std::string s = "layers=" + std::to_string(layers) + ",heads=" + std::to_string(heads) + ",kv_heads=" +
                  std::to_string(kv_heads) + ",width=" + std::to_string(width) + ",ffn=" + std::to_string(ffn) +
                  ",head_dim=" + std::to_string(head_dim) + ",vocab=" + std::to_string(vocab) + ",context=" +
                  std::to_string(context) + ",rms_eps=" + number(rms_eps) + ",rope_theta=" + number(rope_theta);
  if (rope_llama3) {
    s += ",rope_scaling=llama3:" + number(rope_scaling.factor) + ":" + number(rope_scaling.low_freq_factor) + ":" +
         number(rope_scaling.high_freq_factor) + ":" + number(rope_scaling.original_context);
  }
  if (tie_head) s += ",tie_head=true";
  return s;
}

std::vector<std::string> config_names() { return {"llama-tiny", "llama-60M", "llama-150M", "llama3.2-1B", "llama3.1-8B"}; }

Config named_config(std::string_view name) {
  Config c;
  const ops::RopeScaling llama31{8.0, 1.0, 4.0, 8192.0};
  if (name == "llama-tiny") {
    c = Config{};
  } else if (name == "llama-60M") {
    c = {.vocab = 32000, .context = 1024, .layers = 8, .heads = 8, .kv_heads = 4, .width = 512, .ffn = 1408,
         .head_dim = 64};
  } else if (name == "llama-150M") {
    c = {.vocab = 32000, .context = 1024, .layers = 12, .heads = 12, .kv_heads = 4, .width = 768, .ffn = 2816,
         .head_dim = 64};
  } else if (name == "llama3.2-1B") {
    c = {.vocab = 128256, .context = 131072, .layers = 16, .heads = 32, .kv_heads = 8, .width = 2048, .ffn = 8192,
         .head_dim = 64, .rope_theta = 500000.0, .rope_llama3 = true, .rope_scaling = {32.0, 1.0, 4.0, 8192.0},
         .tie_head = true};
  } else if (name == "llama3.1-8B") {
    c = {.vocab = 128256, .context = 131072, .layers = 32, .heads = 32, .kv_heads = 8, .width = 4096, .ffn = 14336,
         .head_dim = 128, .rope_theta = 500000.0, .rope_llama3 = true, .rope_scaling = llama31};
  } else {
    throw bad("unknown config name '" + std::string(name) + "': use llama-tiny, llama-60M, llama-150M, llama3.2-1B, "
              "llama3.1-8B or key=value pairs");
  }
  return c;
}

Config parse_config(std::string_view spec) {
  const models::Spec parsed = models::parse_spec(spec, kWhat, "llama-tiny, llama-60M, llama-150M or key=value pairs");
  Config c;
  if (!parsed.name.empty()) c = named_config(parsed.name);
  for (const auto& [key, value] : parsed.values) {
    if (key == "tie_head") {
      c.tie_head = models::spec_bool(kWhat, key, value);
    } else if (key == "rms_eps") {
      c.rms_eps = models::spec_double(kWhat, key, value);
    } else if (key == "rope_theta") {
      c.rope_theta = models::spec_double(kWhat, key, value);
    } else if (key == "rope_scaling") {
      c.rope_llama3 = value != "none";
      if (c.rope_llama3) c.rope_scaling = parse_scaling(value);
    } else {
      std::int64_t* field = key == "vocab" ? &c.vocab : key == "context" ? &c.context : key == "layers" ? &c.layers
                          : key == "heads" ? &c.heads : key == "kv_heads" ? &c.kv_heads : key == "width" ? &c.width
                          : key == "ffn" ? &c.ffn : key == "head_dim" ? &c.head_dim : nullptr;
      if (!field) {
        throw bad("unknown key '" + key + "' in '" + std::string(spec) + "': keys are layers, heads, kv_heads, width, "
                  "ffn, head_dim, vocab, context, rms_eps, rope_theta, rope_scaling, tie_head");
      }
      *field = models::spec_int(kWhat, key, value);
    }
  }
  if (parsed.name.empty()) {
    for (const char* k : {"layers", "heads", "kv_heads", "width", "ffn", "head_dim", "vocab", "context"}) {
      if (!parsed.has(k)) {
        throw bad("'" + std::string(spec) + "' lacks " + k + ": give all of layers, heads, kv_heads, width, ffn, "
                  "head_dim, vocab, context, or start from a named config (e.g. llama-tiny,width=128)");
      }
    }
  }
  c.validate();
  return c;
}

}  // namespace coshard::llama
