#include "amplab/loop.hpp"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <csignal>
#include <cmath>
#include <filesystem>

#include "amplab/cuda_graph.hpp"
#include "amplab/device.hpp"
#include "amplab/error.hpp"
#include "amplab/log.hpp"
#include "amplab/memory.hpp"
#include "amplab/progress.hpp"
#include "amplab/signals.hpp"
#include "amplab/table.hpp"

namespace amplab {

TensorBatches::TensorBatches(torch::Tensor inputs, torch::Tensor targets, EpochSampler sampler, torch::Device device,
                             std::function<torch::Tensor(const torch::Tensor&)> transform)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      sampler_(std::move(sampler)),
      device_(device),
      transform_(std::move(transform)) {
  order_ = sampler_.order().to(inputs_.device());
}

void TensorBatches::set_epoch(int64_t epoch) {
  if (epoch == sampler_.epoch() && order_.defined()) return;
  sampler_.set_epoch(epoch);
  order_ = sampler_.order().to(inputs_.device());
}

torch::Tensor TensorBatches::indices(int64_t index) {
  const int64_t start = index * sampler_.batch_size();
  if (index < 0 || index >= sampler_.batches_per_epoch()) sampler_.batch_indices(index);  // throws the range error
  return order_.narrow(0, start, std::min(sampler_.batch_size(), order_.size(0) - start));
}

Batch TensorBatches::batch(int64_t index) {
  torch::Tensor idx = indices(index);
  torch::Tensor input = inputs_.index_select(0, idx).to(device_, /*non_blocking=*/true);
  torch::Tensor target = targets_.index_select(0, idx.to(targets_.device())).to(device_, /*non_blocking=*/true);
  if (transform_) input = transform_(input);
  return {input, target};
}

void TensorBatches::batch_into(int64_t index, Batch& into) {
  if (transform_ || inputs_.device() != device_ || targets_.device() != device_) return BatchSource::batch_into(index, into);
  // Gather straight into the destination: one kernel per tensor, no temporary.
  torch::Tensor idx = indices(index);
  at::index_select_out(into.input, inputs_, 0, idx);
  at::index_select_out(into.target, targets_, 0, idx);
}

std::string checkpoint_dir_for(const CheckpointConfig& checkpoint, const RunConfig& run, const std::string& lab) {
  if (!checkpoint.dir.empty()) return checkpoint.dir;
  return (std::filesystem::path(run.out_dir) / lab / "checkpoints").string();
}

namespace {

// Remembers consecutive non-finite losses across log windows.
struct DivergenceGuard {
  int patience;
  int consecutive = 0;
  // Returns a message when the run should stop.
  std::string check(const std::vector<double>& losses, bool scaling, double scale, double min_scale) {
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
};

std::string short_number(double v, int decimals = 4) { return fixed(v, decimals); }

}  // namespace

FitResult fit(Trainer& trainer, BatchSource& data, const FitOptions& options) {
  const TrainConfig& config = trainer.config();
  const bool main = options.dist.is_main;
  FitResult result;
  TrainingState state{trainer.model(), trainer.optimizer(), trainer.scaler()};
  std::unique_ptr<CheckpointManager> checkpoints;
  if (!options.checkpoint_dir.empty())
    checkpoints = std::make_unique<CheckpointManager>(options.checkpoint_dir, options.checkpoint.keep_last);

  TrainingPosition position;
  position.data_seed = options.data_seed;
  if (!options.resume.empty()) {
    if (!checkpoints) throw Error("--resume needs a checkpoint directory (checkpoint.dir)");
    std::string path = checkpoints->resolve(options.resume);
    CheckpointInfo info = load_checkpoint(path, state, options.lab);
    if (info.tag != options.tag)
      throw Error("checkpoint '" + path + "' belongs to '" + info.tag + "', not to '" + options.tag + "'");
    position = info.position;
    if (position.data_seed != options.data_seed)
      log::warn("the checkpoint's data seed (" + std::to_string(position.data_seed) + ") differs from run.seed; the "
                "checkpoint's seed is used so that the data order continues exactly");
    trainer.set_global_step(position.global_step);
    if (main)
      log::info("resumed from " + path + " at epoch " + std::to_string(position.epoch + 1) + " batch " +
                std::to_string(position.next_batch) + " (step " + std::to_string(position.global_step) + ")");
  }

  auto save = [&](const TrainingPosition& at) -> std::string {
    if (!checkpoints || !main) return "";
    CheckpointInfo info;
    info.lab = options.lab;
    info.tag = options.tag;
    info.config_yaml = options.config_yaml;
    info.extra_json = options.checkpoint_extra;
    info.position = at;
    std::string path = checkpoints->save(state, info);
    log::debug("checkpoint saved: " + path);
    return path;
  };

  std::unique_ptr<CsvLog> metrics_csv, steps_csv;
  if (options.run_dir && options.run_dir->enabled() && main)
    steps_csv = std::make_unique<CsvLog>(options.run_dir->file("steps.csv"),
                                         std::vector<std::string>{"tag", "epoch", "step", "loss", "samples_per_s",
                                                                  "step_ms", "loss_scale", "skipped_steps"},
                                         /*append=*/true);

  DivergenceGuard divergence{config.divergence_patience};
  std::unique_ptr<GraphedTrainStep> graphed;
  if (config.cuda_graph) graphed = std::make_unique<GraphedTrainStep>(trainer);
  const std::string tag_prefix = options.tag.empty() ? "" : "[" + options.tag + "] ";
  const int64_t accumulation = config.accumulation_steps;

  // Optimizer steps of the whole run (every epoch has the same batches): the schedule's length.
  int64_t run_steps = config.epochs * ((data.batches_per_epoch() + accumulation - 1) / accumulation);
  if (config.max_steps > 0) run_steps = std::min<int64_t>(run_steps, config.max_steps);

  for (int64_t epoch = position.epoch; epoch < config.epochs; ++epoch) {
    data.set_epoch(epoch);
    const int64_t batches = data.batches_per_epoch();
    int64_t next = epoch == position.epoch ? position.next_batch : 0;
    const int64_t total_steps = (batches + accumulation - 1) / accumulation;
    ProgressBar progress(tag_prefix + "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(config.epochs),
                         total_steps, main, main && config.progress);

    EpochRecord record;
    record.tag = options.tag;
    record.epoch = epoch + 1;
    std::vector<torch::Tensor> pending;  // losses since the last log line, still on the device
    torch::Tensor skipped_device;        // steps the GradScaler skipped this epoch, counted on the device
    double loss_sum = 0;
    int64_t loss_count = 0, samples = 0, window_samples = 0, window_steps = 0;
    synchronize(trainer.device());
    Stopwatch epoch_clock, window_clock;

    // Every log_every steps (and at the epoch's end): one host sync to read the losses.
    auto flush_window = [&]() -> std::string {
      if (pending.empty()) return "";
      torch::Tensor losses = options.dist.mean(torch::stack(pending)).to(torch::kCPU, torch::kFloat64);
      std::vector<double> values(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
      for (double v : values)
        if (std::isfinite(v)) loss_sum += v, ++loss_count;
      if (skipped_device.defined()) record.skipped_steps = static_cast<int64_t>(skipped_device.item<double>());
      double seconds = window_clock.seconds();
      double scale = trainer.scaler().get_scale();
      std::string stop = divergence.check(values, trainer.scaler().is_enabled(), scale, config.min_loss_scale);
      double step_ms = 1e3 * seconds / static_cast<double>(std::max<int64_t>(window_steps, 1));
      double rate = static_cast<double>(window_samples) / std::max(seconds, 1e-9);
      std::string status = "loss " + short_number(values.back()) + ", " + fixed(rate, 0) + " samples/s, " +
                           fixed(step_ms, 2) + " ms/step" +
                           (trainer.scaler().is_enabled() ? ", scale " + fixed(scale, 0) : "");
      int64_t step_in_epoch = (next + accumulation - 1) / accumulation;
      progress.note(step_in_epoch, status);
      if (steps_csv)
        steps_csv->row({options.tag, std::to_string(epoch + 1), std::to_string(trainer.global_step()),
                        short_number(values.back(), 6), fixed(rate, 1), fixed(step_ms, 3), fixed(scale, 1),
                        std::to_string(record.skipped_steps)});
      pending.clear();
      window_samples = window_steps = 0;
      window_clock.restart();
      return stop;
    };

    while (next < batches) {
      const int64_t group = std::min(accumulation, batches - next);
      StepResult step;
      if (has_schedule(config.optimizer))  // set before the step: a graph reads it on the device
        set_learning_rate(trainer.optimizer(), scheduled_lr(config.optimizer, trainer.global_step(), run_steps));
      try {
        step = graphed ? graphed->step(data, next)
                       : trainer.step(group, [&](int64_t i) { return data.batch(next + i); });
      } catch (const c10::OutOfMemoryError& e) {
        Phase phase = trainer.current_phase();
        result.status = FitStatus::out_of_memory;
        result.exit_code = 1;
        result.message = explain_oom(e.what_without_backtrace(), trainer.device(), phase);
        trainer.optimizer().zero_grad(true);
        if (phase != Phase::optimizer) {  // parameters are intact: the step had not started updating them
          position.epoch = epoch;
          position.next_batch = next;
          position.global_step = trainer.global_step();
          result.last_checkpoint = save(position);
          if (!result.last_checkpoint.empty()) result.message += "; checkpoint saved to " + result.last_checkpoint;
        }
        result.position = position;
        progress.finish();
        return result;
      }
      next += group;
      samples += step.samples;
      window_samples += step.samples;
      ++window_steps;
      ++record.steps;
      if (step.skipped.defined()) skipped_device = skipped_device.defined() ? skipped_device + step.skipped : step.skipped;
      pending.push_back(step.loss);
      progress.update((next + accumulation - 1) / accumulation);

      const bool reached_max = config.max_steps > 0 && trainer.global_step() >= config.max_steps;
      if (trainer.global_step() % config.log_every == 0 || next >= batches || reached_max) {
        std::string stop = flush_window();
        if (!stop.empty()) {
          progress.finish();
          result.status = FitStatus::diverged;
          result.exit_code = 1;
          result.message = stop;
          result.position = {epoch, next, trainer.global_step(), options.data_seed};
          return result;
        }
      }
      position = {epoch, next, trainer.global_step(), options.data_seed};
      if (next >= batches) position = {epoch + 1, 0, trainer.global_step(), options.data_seed};

      if (options.checkpoint.every_steps > 0 && trainer.global_step() % options.checkpoint.every_steps == 0)
        result.last_checkpoint = save(position);

      // Ctrl-C: stop between optimizer steps, never inside an accumulation group. Several ranks
      // agree at log points (one tiny all-reduce), so that all stop after the same step.
      int signal = interrupt_signal();
      bool agree_now = !options.dist.distributed || trainer.global_step() % config.log_every == 0 || next >= batches;
      if (agree_now && options.dist.any(signal != 0)) {
        progress.finish();
        flush_window();
        if (options.checkpoint.on_interrupt) result.last_checkpoint = save(position);
        result.status = FitStatus::interrupted;
        result.exit_code = interrupt_exit_code(signal != 0 ? signal : SIGINT);
        result.position = position;
        result.message = "interrupted at epoch " + std::to_string(epoch + 1) + " step " +
                         std::to_string(trainer.global_step()) +
                         (result.last_checkpoint.empty()
                              ? "; no checkpoint saved"
                              : "; checkpoint saved to " + result.last_checkpoint + "; resume with --resume " +
                                    result.last_checkpoint);
        return result;
      }
      if (reached_max) break;
    }
    synchronize(trainer.device());
    record.seconds = epoch_clock.seconds();
    progress.finish();
    record.train_loss = loss_count ? loss_sum / static_cast<double>(loss_count) : NAN;
    record.samples_per_second = static_cast<double>(samples) / std::max(record.seconds, 1e-9);
    record.loss_scale = trainer.scaler().get_scale();
    if (options.evaluate) record.eval = options.evaluate(epoch + 1);

    if (main) {
      std::string line = tag_prefix + "epoch " + std::to_string(epoch + 1) + ": train loss " +
                         short_number(record.train_loss) + ", " + fixed(record.seconds, 2) + " s, " +
                         fixed(record.samples_per_second, 0) + " samples/s";
      for (const auto& [key, value] : record.eval.items())
        line += ", " + key + " " + (value.is_number() ? short_number(value.get<double>()) : value.dump());
      if (record.skipped_steps) line += ", " + std::to_string(record.skipped_steps) + " skipped steps";
      log::info(line);
      if (options.run_dir && options.run_dir->enabled()) {
        if (!metrics_csv) {
          std::vector<std::string> columns{"tag",   "epoch",         "train_loss", "seconds", "samples_per_s",
                                           "steps", "skipped_steps", "loss_scale"};
          for (const auto& [key, value] : record.eval.items()) columns.push_back(key);
          metrics_csv = std::make_unique<CsvLog>(options.run_dir->file("metrics.csv"), columns, /*append=*/true);
        }
        std::vector<std::string> row{options.tag,
                                     std::to_string(record.epoch),
                                     short_number(record.train_loss, 6),
                                     fixed(record.seconds, 4),
                                     fixed(record.samples_per_second, 1),
                                     std::to_string(record.steps),
                                     std::to_string(record.skipped_steps),
                                     fixed(record.loss_scale, 1)};
        for (const auto& [key, value] : record.eval.items())
          row.push_back(value.is_number() ? short_number(value.get<double>(), 6) : value.dump());
        metrics_csv->row(row);
      }
    }
    result.epochs.push_back(record);
    if (options.checkpoint.every_epoch) result.last_checkpoint = save(position);
    std::string leak = trainer.memory().leak_report();
    if (!leak.empty() && main) log::warn(leak);
    if (config.max_steps > 0 && trainer.global_step() >= config.max_steps) break;
  }
  result.position = position;

  // Memory: a summary at the end, and the per-phase timeline for scripts/plot.py memory.
  const MemoryTracker& memory = trainer.memory();
  if (main && memory.enabled()) {
    log::info(tag_prefix + "memory per phase (" + (memory_is_rss(trainer.device()) ? "process RSS" : "CUDA allocator") +
              "):\n" + memory.summary_table());
    if (options.run_dir && options.run_dir->enabled() && !memory.timeline().empty()) {
      std::string name = options.tag.empty() ? "memory_timeline.csv" : "memory_timeline-" + options.tag + ".csv";
      for (char& c : name)
        if (c == ' ' || c == '(' || c == ')') c = '_';
      memory.write_timeline_csv(options.run_dir->file(name));
    }
  }
  return result;
}

}  // namespace amplab
