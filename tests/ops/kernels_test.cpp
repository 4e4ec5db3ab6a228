// ops::Kernels, the ops on tensors wherever they live: on a CPU stream the ops of a sequence are one
// work item run after what the stream held before submit(), with the results of the same ops run
// at once on the calling thread, also on the cpu-discrete device, whose memory the host cannot
// touch (a host access there aborts the test). An op's error names the sequence's span; a
// sequence left by an exception enqueues nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "coshard/ops/kernels.hpp"
#include "coshard/runtime/copy.hpp"
#include "coshard/runtime/runtime.hpp"

using namespace coshard;

namespace {

constexpr std::size_t kRows = 6, kIn = 8, kOut = 12;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// The inputs and outputs of a small layer and its backward, as tensors of one allocator.
struct Layer {
  Tensor x, ln_w, ln_b, ln, mean, rstd, w, b, y, act, dy, dact, dln, dx, dw, db, dln_w, dln_b;
};

Layer make_layer(Allocator& alloc) {
  auto t = [&](std::size_t n) { return Tensor::empty(alloc, DType::f32, {static_cast<std::int64_t>(n)}); };
  return {t(kRows * kIn), t(kIn), t(kIn), t(kRows * kIn), t(kRows), t(kRows), t(kIn * kOut), t(kOut),
          t(kRows * kOut), t(kRows * kOut), t(kRows * kOut), t(kRows * kOut), t(kRows * kIn), t(kRows * kIn),
          t(kIn * kOut), t(kOut), t(kIn), t(kIn)};
}

// layernorm -> linear -> gelu, and the backward of all three, gradients of the parameters zeroed first.
void run_layer(ops::Kernels& k, const Layer& l) {
  for (const Tensor* g : {&l.dw, &l.db, &l.dln_w, &l.dln_b}) k.zero(*g);
  k.layernorm_forward(l.x, l.ln_w, l.ln_b, l.ln, l.mean, l.rstd, kRows, kIn);
  k.linear_forward(l.ln, l.w, l.b, l.y, kRows, kIn, kOut);
  k.gelu_forward(l.y, l.act);
  k.gelu_backward(l.dy, l.y, l.dact);
  k.linear_backward(l.dact, l.ln, l.w, l.dln, l.dw, l.db, kRows, kIn, kOut);
  k.layernorm_backward(l.dln, l.x, l.ln_w, l.mean, l.rstd, l.dx, l.dln_w, l.dln_b, kRows, kIn);
  k.residual_forward(l.dx, l.x, l.dx);
}

// The inputs, seeded per tensor.
std::vector<std::vector<float>> inputs() {
  return {random_values(kRows * kIn, 1), random_values(kIn, 2), random_values(kIn, 3), random_values(kIn * kOut, 4),
          random_values(kOut, 5), random_values(kRows * kOut, 6)};
}

std::vector<const Tensor*> input_tensors(const Layer& l) { return {&l.x, &l.ln_w, &l.ln_b, &l.w, &l.b, &l.dy}; }
std::vector<const Tensor*> output_tensors(const Layer& l) {
  return {&l.act, &l.dx, &l.dw, &l.db, &l.dln_w, &l.dln_b};
}

// The outputs of the layer with the ops run at once on this thread, in host memory.
std::vector<std::vector<float>> on_this_thread() {
  Allocator alloc(cpu_memory());
  const Layer l = make_layer(alloc);
  const auto in = inputs();
  const auto ins = input_tensors(l);
  for (std::size_t i = 0; i < ins.size(); ++i) std::copy(in[i].begin(), in[i].end(), ins[i]->data_as<float>());
  ops::Launcher here;
  {
    ops::Kernels k = here.begin("layer");
    run_layer(k, l);
  }
  std::vector<std::vector<float>> out;
  for (const Tensor* t : output_tensors(l)) out.emplace_back(t->data_as<float>(), t->data_as<float>() + t->numel());
  return out;
}

std::vector<std::vector<float>> on_a_stream(Runtime::Options options) {
  Runtime rt(std::move(options));
  Stream& s = rt.stream("compute");
  const Layer l = make_layer(rt.allocator());
  const auto in = inputs();
  const auto ins = input_tensors(l);
  for (std::size_t i = 0; i < ins.size(); ++i) upload(s, *ins[i], in[i]);
  ops::Launcher launch(s);
  {
    ops::Kernels k = launch.begin("layer");
    run_layer(k, l);
  }
  std::vector<std::vector<float>> out;
  for (const Tensor* t : output_tensors(l)) out.push_back(rt.scheduler().sync_wait(download<float>(s, *t)));
  return out;
}

TEST(OpsKernels, OnCpuStreamsTheOpsGiveTheBitsOfTheOpsRunAtOnce) {
  const auto want = on_this_thread();
  for (bool discrete : {false, true}) {
    const auto got = on_a_stream({.discrete_memory = discrete});
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i << ", discrete " << discrete;
  }
}

// Llama's ops: RMSNorm, a q/k/v projection, RoPE from a table uploaded as floats, grouped-query
// attention, SwiGLU, and their backward, on `alloc`'s memory through `k`; returns the outputs.
struct LlamaPieces {
  static constexpr std::size_t B = 2, T = 5, C = 8, NH = 4, NKV = 2, hs = 2;
  static constexpr ops::AttentionShape shape{B, T, NH, NKV, hs};
  Tensor x, w, rn, rstd, wqkv, qkv, cos, sin, att, lse, datt, dqkv, dx, dw, gate, up, act, dgate, dup;
  explicit LlamaPieces(Allocator& a) {
    auto t = [&](std::size_t n) { return Tensor::empty(a, DType::f32, {static_cast<std::int64_t>(n)}); };
    const std::size_t rows = B * T, W = shape.qkv_width();
    x = t(rows * C), w = t(C), rn = t(rows * C), rstd = t(rows), wqkv = t(C * W), qkv = t(rows * W);
    cos = t(T * hs / 2), sin = t(T * hs / 2), att = t(rows * NH * hs), lse = t(B * NH * T), datt = t(rows * NH * hs);
    dqkv = t(rows * W), dx = t(rows * C), dw = t(C), gate = t(rows * C), up = t(rows * C), act = t(rows * C);
    dgate = t(rows * C), dup = t(rows * C);
  }
  std::vector<const Tensor*> inputs() const { return {&x, &w, &wqkv, &datt, &gate, &up}; }
  std::vector<const Tensor*> outputs() const { return {&rn, &rstd, &qkv, &att, &lse, &dqkv, &dx, &dw, &act, &dgate, &dup}; }
  void run(ops::Kernels& k) const {
    const std::size_t rows = B * T;
    std::vector<float> c(T * hs / 2), sn(c.size());
    ops::rope_table(c, sn, T, hs, 10000.0);
    k.upload(cos, c);
    k.upload(sin, sn);
    k.zero(dw);
    k.rmsnorm_forward(x, w, rn, rstd, rows, C, 1e-5f);
    k.linear_forward(rn, wqkv, Tensor(), qkv, rows, C, shape.qkv_width());
    k.rope_forward(qkv, cos, sin, shape);
    k.attention_forward(qkv, att, lse, shape);
    k.attention_backward(datt, qkv, att, lse, dqkv, shape);
    k.rope_backward(dqkv, cos, sin, shape);
    k.rmsnorm_backward(x, x, w, rstd, dx, dw, rows, C);
    k.swiglu_forward(gate, up, act);
    k.swiglu_backward(x, gate, up, dgate, dup);
  }
};

std::vector<std::vector<float>> llama_pieces(Runtime* rt) {
  std::unique_ptr<Allocator> host;
  if (!rt) host = std::make_unique<Allocator>(cpu_memory());
  Allocator& alloc = rt ? rt->allocator() : *host;
  const LlamaPieces l(alloc);
  const auto ins = l.inputs();
  std::unique_ptr<ops::Launcher> launch;
  if (rt) {
    for (std::size_t i = 0; i < ins.size(); ++i) upload(rt->stream("compute"), *ins[i], random_values(ins[i]->numel(), 10 + i));
    launch = std::make_unique<ops::Launcher>(rt->stream("compute"));
  } else {
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const auto v = random_values(ins[i]->numel(), 10 + i);
      std::copy(v.begin(), v.end(), ins[i]->data_as<float>());
    }
    launch = std::make_unique<ops::Launcher>();
  }
  {
    ops::Kernels k = launch->begin("llama pieces");
    l.run(k);
  }
  std::vector<std::vector<float>> out;
  for (const Tensor* t : l.outputs()) {
    if (rt) {
      out.push_back(rt->scheduler().sync_wait(download<float>(rt->stream("compute"), *t)));
    } else {
      out.emplace_back(t->data_as<float>(), t->data_as<float>() + t->numel());
    }
  }
  return out;
}

TEST(OpsKernels, LlamasOpsOnCpuStreamsGiveTheBitsOfTheOpsRunAtOnce) {
  const auto want = llama_pieces(nullptr);
  for (bool discrete : {false, true}) {
    Runtime rt({.discrete_memory = discrete});
    const auto got = llama_pieces(&rt);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "output " << i << ", discrete " << discrete;
  }
}

TEST(OpsKernels, ASequenceRunsAfterWhatTheStreamHeldWhenItIsSubmitted) {
  Runtime rt({.discrete_memory = true});
  Stream& s = rt.stream("compute");
  Tensor src = Tensor::empty(rt.allocator(), DType::f32, {4});
  Tensor dst = Tensor::empty(rt.allocator(), DType::f32, {4});
  upload(s, src, std::vector<float>{1, 2, 3, 4});
  upload(s, dst, std::vector<float>{0, 0, 0, 0});
  ops::Launcher launch(s);
  ops::Kernels k = launch.begin("copy");
  k.copy(dst, src);
  float seen = -1;
  s.enqueue([dst, &seen] { seen = dst.data_as<float>()[3]; });  // queued before the sequence is
  k.submit();
  EXPECT_EQ(rt.scheduler().sync_wait(download<float>(s, dst)), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(seen, 0.0f) << "the copy ran before submit()";
}

Task<void> reached(Event e) { co_await e; }

TEST(OpsKernels, AnOpsErrorOnAStreamNamesTheSequence) {
  Runtime rt({});
  Stream& s = rt.stream("compute");
  Tensor x = Tensor::empty(rt.allocator(), DType::f32, {6});
  Tensor w = Tensor::empty(rt.allocator(), DType::f32, {6});
  Tensor y = Tensor::empty(rt.allocator(), DType::f32, {5});  // 2 x 3 rows by 3 out: 6 elements needed
  ops::Launcher launch(s);
  {
    ops::Kernels k = launch.begin("forward h.7");
    k.linear_forward(x, w, {}, y, 2, 3, 2);
  }
  Event done(s.device());
  done.record(s);
  try {
    rt.scheduler().sync_wait(reached(done));
    FAIL() << "the wrong size went through";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("forward h.7"), std::string::npos) << what;
    EXPECT_NE(what.find("linear_forward"), std::string::npos) << what;
  }
}

TEST(OpsKernels, ASequenceLeftByAnExceptionEnqueuesNothing) {
  Runtime rt({});
  Stream& s = rt.stream("compute");
  Tensor src = Tensor::empty(rt.allocator(), DType::f32, {2});
  Tensor dst = Tensor::empty(rt.allocator(), DType::f32, {2});
  upload(s, src, std::vector<float>{5, 6});
  upload(s, dst, std::vector<float>{0, 0});
  ops::Launcher launch(s);
  try {
    ops::Kernels k = launch.begin("dropped");
    k.copy(dst, src);
    throw std::runtime_error("a unit failed half-way");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(rt.scheduler().sync_wait(download<float>(s, dst)), (std::vector<float>{0, 0}));
}

TEST(OpsKernels, WeightsOtherThanF32OrBf16AreRefusedWhenTheOpIsCalled) {
  Allocator alloc(cpu_memory());
  Tensor x = Tensor::empty(alloc, DType::f32, {4}), y = Tensor::empty(alloc, DType::f32, {4});
  Tensor w = Tensor::empty(alloc, DType::f16, {4});
  ops::Launcher here;
  ops::Kernels k = here.begin("");
  try {
    k.linear_forward(x, w, {}, y, 2, 2, 2);
    FAIL() << "an f16 weight went through";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights are f32 or bf16, got f16"), std::string::npos) << e.what();
  }
}

}  // namespace
