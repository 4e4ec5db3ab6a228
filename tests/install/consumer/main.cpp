#include <coshard/ops/cast.hpp>
#include <coshard/runtime/scheduler.hpp>
#include <coshard/runtime/stream.hpp>
#include <coshard/transport/launch_env.hpp>
#include <cstdio>

coshard::Task<int> work(coshard::Event e) {
  co_await e;
  co_return 42;
}

int main() {
  coshard::Scheduler sched;
  sched.start();
  auto stream = coshard::Stream::cpu(coshard::Device::cpu(), "compute");
  int value = 0;
  stream.enqueue([&] { value = static_cast<int>(coshard::ops::bf16_to_f32(coshard::ops::f32_to_bf16(1.0f))); });
  coshard::Event e;
  e.record(stream);
  int r = sched.sync_wait(work(e));
  auto env = coshard::transport::resolve_launch_env(coshard::transport::process_env());
  std::printf("consumer ok: %d %d world=%d\n", r, value, env ? env.value().world_size : -1);
  return r == 42 && value == 1 ? 0 : 1;
}
