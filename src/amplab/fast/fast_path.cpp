// train.fast_path composed: the trainer's fused optimizers, the MNIST network, the graphed step (fast_path.hpp).
#include "amplab/fast/fast_path.hpp"

#include "amplab/fast/cuda_graph.hpp"
#include "amplab/fast/fused_adamw.hpp"
#include "amplab/fast/fused_mnist_net.hpp"
#include "amplab/fast/fused_sgd.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"

namespace amplab {

std::unique_ptr<torch::optim::Optimizer> make_fast_path_optimizer(const std::vector<torch::Tensor>& parameters,
                                                                  const TrainConfig& config) {
  const OptimizerConfig& c = config.optimizer;
  if (!config.fast_path) return make_optimizer(parameters, c);
  check_fast_path(config.fast_path, c);
  if (c.name == "sgd") return std::make_unique<FusedSGD>(parameters, sgd_options(c));
  return std::make_unique<FusedAdamW>(parameters, adamw_options(c));
}

void check_fast_path(bool fast_path, const OptimizerConfig& optimizer) {
  if (fast_path && optimizer.name != "sgd" && optimizer.name != "adamw")
    throw Error("train.fast_path: there is no fused kernel for train.optimizer.name '" + optimizer.name +
                "' here (only sgd and adamw); choose one of those, or set train.fast_path=false");
}

MnistNet make_mnist_net(const TrainConfig& config) { return config.fast_path ? make_fused_mnist_net() : MnistNet(); }

std::string describe_fast_path(bool fast_path, const OptimizerConfig& optimizer) {
  if (!fast_path) return "fast path off: torch::optim " + optimizer.name;
  return "fast path on (train.fast_path): fused " + optimizer.name;
}

namespace {

// Why the steps of `trainer` run eagerly although the fast path is on ("" when they need not).
std::string eager_because(Trainer& trainer, int64_t processes) {
  if (!trainer.device().is_cuda()) return "CUDA graphs need a GPU";
  if (processes > 1) return "CUDA graphs in one process only: the gradient sync starts each all-reduce from the host";
  if (trainer.scaler().is_enabled() && cuda_graph_blocker(trainer) == kScalerOnTheHost) {
    log::warn("train.fast_path: " + std::string(kScalerOnTheHost) + "; running the step eagerly");
    return "the GradScaler decides on the host";
  }
  return "";
}

std::string network_of(Trainer& trainer) {
  const bool fused = dynamic_cast<FusedMnistNetImpl*>(&trainer.model()) != nullptr;
  if (fused)
    return trainer.device().is_cuda() ? "FusedMnistNet (our kernels), " : "FusedMnistNet (torch's ops off a GPU), ";
  return dynamic_cast<MnistNetImpl*>(&trainer.model()) ? "MnistNet (the textbook layers), " : "";
}

}  // namespace

FastPathSteps fast_path_steps(Trainer& trainer, int64_t processes) {
  const TrainConfig& config = trainer.config();
  FastPathSteps steps;
  const std::string optimizer = (config.fast_path ? "fused " : "torch::optim ") + config.optimizer.name;
  if (!config.fast_path) {
    steps.description = "fast path off: " + network_of(trainer) + optimizer + ", eager steps";
    return steps;
  }
  steps.description = "fast path on (train.fast_path): " + network_of(trainer) + optimizer + ", ";
  const std::string why = eager_because(trainer, processes);
  if (!why.empty()) {
    steps.description += "eager steps (" + why + ")";
    return steps;
  }
  auto graphed = std::make_shared<GraphedTrainStep>(trainer);  // throws when the step cannot be captured
  steps.run_step = [graphed](BatchSource& data, int64_t first_batch, int64_t /*batches: 1*/) {
    return graphed->step(data, first_batch);
  };
  steps.description += "one CUDA graph per step";
  return steps;
}

}  // namespace amplab
