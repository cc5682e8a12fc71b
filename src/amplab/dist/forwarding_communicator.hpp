// A Communicator that passes every call to another one: the base of a wrapper that watches the
// calls it overrides (the lab tests' recorders of the order of collectives; lab 8's byte count).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "amplab/dist/communicator.hpp"

namespace amplab::dist {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  torch::Device device() const override { return inner_->device(); }
  std::shared_ptr<Work> all_reduce_sum(std::vector<torch::Tensor> tensors) override {
    return inner_->all_reduce_sum(std::move(tensors));
  }
  std::shared_ptr<Work> all_reduce_mean(std::vector<torch::Tensor> tensors) override {
    return inner_->all_reduce_mean(std::move(tensors));
  }
  std::shared_ptr<Work> then_copy(std::shared_ptr<Work> work, std::vector<torch::Tensor> from,
                                        std::vector<torch::Tensor> to) override {
    return inner_->then_copy(std::move(work), std::move(from), std::move(to));
  }
  std::shared_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input, Reduction op) override {
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    return inner_->all_gather(std::move(output), std::move(input));
  }
  void broadcast(std::vector<torch::Tensor> tensors, int root) override { inner_->broadcast(std::move(tensors), root); }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return inner_->all_gather_bytes(mine); }
  void barrier() override { inner_->barrier(); }
  void shutdown() override { inner_->shutdown(); }

 protected:
  std::shared_ptr<Communicator> inner_;
};

}  // namespace amplab::dist
