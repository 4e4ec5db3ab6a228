#include "plan.hpp"

#include <numeric>

namespace coshard::fsdp::detail {

Plan::Plan(std::vector<std::string> names, std::vector<int> phases, Options options)
    : names_(std::move(names)), phases_(std::move(phases)), options_(std::move(options)) {
  for (int p : phases_) steps_ += static_cast<std::size_t>(p);
}

std::vector<std::size_t> Plan::forward_order() const {
  if (ready_) return order_;
  std::vector<std::size_t> o(names_.size());
  std::iota(o.begin(), o.end(), std::size_t{0});
  for (std::size_t u = names_.size(); u-- > 0;) {
    for (int p = 1; p < phases_[u]; ++p) o.push_back(u);
  }
  return o;
}

void Plan::forward_done(std::size_t position) noexcept {
  if (position + 1 == steps_ && !ready_) ready_ = true;
}

bool Plan::deviates(std::size_t position, std::size_t unit) const noexcept {
  return ready_ && (position >= order_.size() || order_[position] != unit);
}

std::vector<std::size_t> Plan::named(const std::map<std::string, std::vector<std::string>>& lists,
                                     std::size_t unit) const {
  std::vector<std::size_t> out;
  auto it = lists.find(names_[unit]);
  if (it == lists.end()) return out;
  for (const auto& name : it->second) {
    for (std::size_t j = 0; j < names_.size(); ++j) {
      if (names_[j] == name) out.push_back(j);
    }
  }
  return out;
}

std::vector<std::size_t> Plan::forward_prefetch(std::size_t unit, std::size_t position) const {
  if (options_.prefetch.forward_explicit.count(names_[unit])) return named(options_.prefetch.forward_explicit, unit);
  std::vector<std::size_t> out;
  if (!ready_) return out;
  for (int k = 1; k <= options_.prefetch.forward && position + static_cast<std::size_t>(k) < order_.size(); ++k) {
    out.push_back(order_[position + static_cast<std::size_t>(k)]);
  }
  return out;
}

std::vector<std::size_t> Plan::backward_prefetch(std::size_t unit, std::size_t position) const {
  if (has_explicit_backward(unit)) return named(options_.prefetch.backward_explicit, unit);
  if (position + 1 >= order_.size()) return {};
  return {order_[order_.size() - 2 - position]};
}

bool Plan::has_explicit_backward(std::size_t unit) const {
  return options_.prefetch.backward_explicit.count(names_[unit]) > 0;
}

bool Plan::prefetch_before_backward(std::size_t unit) const {
  return has_explicit_backward(unit) || options_.prefetch.backward == BackwardPrefetch::pre;
}

bool Plan::prefetch_after_backward(std::size_t unit) const {
  return !has_explicit_backward(unit) && options_.prefetch.backward == BackwardPrefetch::post;
}

bool Plan::reshard_after_forward(std::size_t unit) const {
  if (options_.strategy == Strategy::no_shard) return false;
  if (options_.reshard_after_forward) {
    if (auto* b = std::get_if<bool>(&*options_.reshard_after_forward)) return *b;
    return true;  // to a group size
  }
  if (options_.strategy == Strategy::shard_grad_op || options_.strategy == Strategy::hybrid_shard_zero2) return false;
  return !(ready_ && !order_.empty() && order_.back() == unit);
}

}  // namespace coshard::fsdp::detail
