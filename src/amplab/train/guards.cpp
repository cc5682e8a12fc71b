// The checks that stop a run: batch size, divergence, out of memory, agreed interrupts.
#include "amplab/train/guards.hpp"

#include <csignal>
#include <cmath>

#include "amplab/infra/error.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/measure/memory.hpp"

namespace amplab {

void check_batches_fit(const TrainConfig& config, BatchSource& data, int64_t world) {
  const std::string processes = world > 1 ? " for " + std::to_string(world) + " processes" : "";
  if (data.batches_per_epoch() == 0)
    throw Error("train.batch_size=" + std::to_string(config.batch_size) + " leaves no batch: the training set has " +
                std::to_string(data.dataset_size()) + " samples" + processes +
                (config.drop_last ? " and train.drop_last drops the only, partial batch" : "") +
                "; lower train.batch_size (or raise data.train_limit)");
  if (data.dataset_size() > 0 && config.batch_size * world > data.dataset_size())
    throw Error("train.batch_size=" + std::to_string(config.batch_size) + (world > 1 ? " x " + std::to_string(world) + " processes" : "") +
                " is larger than the training set (" + std::to_string(data.dataset_size()) +
                " samples): every step would see the same single batch; lower train.batch_size");
}

std::string DivergenceGuard::check(const std::vector<double>& losses, bool scaling, double scale, double min_scale) {
  if (scaling) {
    if (scale < min_scale)
      return "the fp16 loss scale fell to " + std::to_string(scale) + " (below train.min_loss_scale=" +
             std::to_string(min_scale) + "): gradients overflow at every step; lower the learning rate or use bf16-mixed";
    return "";
  }
  for (double loss : losses) {
    consecutive = std::isfinite(loss) ? 0 : consecutive + 1;
    if (consecutive >= patience)
      return "the loss was not finite for " + std::to_string(consecutive) +
             " consecutive steps (train.divergence_patience): training diverged; lower train.optimizer.lr or "
             "enable train.grad_clip_norm";
  }
  return "";
}

std::string no_finite_loss_message(int64_t steps, int64_t epoch, int patience) {
  return "the loss was not finite at any of the " + std::to_string(steps) + " steps of epoch " + std::to_string(epoch) +
         " (fewer than train.divergence_patience=" + std::to_string(patience) +
         "): training diverged; lower train.optimizer.lr or enable train.grad_clip_norm";
}

OutOfMemory out_of_memory(const c10::OutOfMemoryError& error, Trainer& trainer) {
  Phase phase = trainer.current_phase();
  OutOfMemory oom{explain_oom(error.what_without_backtrace(), trainer.device(), phase), phase != Phase::optimizer};
  trainer.optimizer().zero_grad(true);
  return oom;
}

Interrupt agreed_interrupt(const DistributedHooks& dist) {
  int signal = interrupt_signal();
  if (!dist.any(signal != 0)) return {};
  return {true, interrupt_exit_code(signal != 0 ? signal : SIGINT)};
}

}  // namespace amplab
