// Lab 8's measure of communication: the bytes each rank sends per step, counted at the
// collectives it issues, beside what the formula says each stage must send.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "amplab/dist/forwarding_communicator.hpp"

namespace zero_lab {

// Counts the bytes this rank sends in the collectives issued through it, as the ring algorithms
// send them (NCCL's for large messages): a reduce-scatter of an n-byte input or an all-gather
// into an n-byte output sends (W-1)/W x n; an all-reduce sends twice that, being a reduce-scatter
// followed by an all-gather. Broadcasts (set-up) are not counted. Thread-safe: ZeRO-2's hooks issue
// reduce-scatters from autograd's thread.
class TrafficCounter final : public amplab::dist::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;

  std::shared_ptr<amplab::dist::Work> all_reduce_sum(std::vector<torch::Tensor> tensors) override {
    for (const auto& t : tensors) add(2 * t.nbytes());
    return inner_->all_reduce_sum(std::move(tensors));
  }
  std::shared_ptr<amplab::dist::Work> all_reduce_mean(std::vector<torch::Tensor> tensors) override {
    for (const auto& t : tensors) add(2 * t.nbytes());
    return inner_->all_reduce_mean(std::move(tensors));
  }
  std::shared_ptr<amplab::dist::Work> reduce_scatter(torch::Tensor output, torch::Tensor input,
                                                     amplab::dist::Reduction op) override {
    add(input.nbytes());
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<amplab::dist::Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    add(output.nbytes());
    return inner_->all_gather(std::move(output), std::move(input));
  }

  void reset() { buffer_bytes_ = 0; }
  // Bytes sent since reset().
  double sent() const { return static_cast<double>(buffer_bytes_.load()) * (size() - 1) / size(); }

 private:
  std::atomic<int64_t> buffer_bytes_{0};  // the collectives' buffers; a ring sends (W-1)/W of them
  void add(size_t bytes) { buffer_bytes_ += static_cast<int64_t>(bytes); }
};

// What the formula says a rank sends per step for `num_params` parameters on `world` ranks:
// DDP all-reduces the fp32 gradients; ZeRO-1 and ZeRO-2 reduce-scatter them and all-gather the
// fp32 parameters (the same bytes); ZeRO-3 all-gathers the parameters twice (forward and
// backward) in `param_bytes` per element, but `gathered_once` of them once (a unit kept whole from
// forward to backward), and reduce-scatters the gradients in `reduce_bytes`.
inline double expected_traffic(int stage, int world, int64_t num_params, int param_bytes = 4, int reduce_bytes = 4,
                               int64_t gathered_once = 0) {
  const double share = static_cast<double>(world - 1) / world, n = static_cast<double>(num_params);
  if (stage < 3) return share * 2 * 4 * n;
  return share * (param_bytes * (2 * n - static_cast<double>(gathered_once)) + reduce_bytes * n);
}

}  // namespace zero_lab
