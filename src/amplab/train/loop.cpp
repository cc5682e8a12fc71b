// fit(): the epoch loop, an Epoch at a time, calling the Checkpointer, the EpochLog and the guards.
#include "amplab/train/loop.hpp"

#include <torch/torch.h>

#include <cmath>
#include <optional>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/paths.hpp"  // file_name_safe
#include "amplab/measure/trace.hpp"
#include "amplab/report/progress.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/guards.hpp"

namespace amplab {

namespace {

// What every epoch of one fit() shares.
struct Run {
  Trainer& trainer;
  BatchSource& data;
  const FitOptions& options;
  const TrainConfig& config;
  Checkpointer& checkpointer;
  EpochLog& log;
  FitResult& result;
  DivergenceGuard divergence;
  int64_t global_batch;  // samples per micro-batch, all ranks together
  int64_t run_steps;     // optimizer steps of the whole run: the schedule's length
  StepTrace& trace;      // run.trace's window of steps
  int64_t steps_taken = 0;  // optimizer steps taken by this call of fit (the trace counts them)
};

// Sets the data's order for `epoch`; returns its micro-batches.
int64_t start_epoch(BatchSource& data, int64_t epoch) {
  data.set_epoch(epoch);
  return data.batches_per_epoch();
}

// One epoch in progress: where it stands, its sums and the open loss window.
class Epoch {
 public:
  Epoch(Run& run, int64_t epoch, int64_t first_batch, const EpochSums& sums);
  // Trains to the epoch's end (or train.max_steps); a result when the run stops inside it.
  std::optional<FitResult> train();
  // Records, evaluates, reports and saves the finished epoch; a result when the run stops there.
  std::optional<FitResult> finish();
  TrainingPosition position() const;

 private:
  MicroBatches micro_batches(int64_t group);  // the group's batches, made when the step asks
  std::string read_window();  // why training must stop, or ""
  EpochSums sums_now() const;
  FitResult stopped(FitStatus status, int exit_code, std::string message, const TrainingPosition& at);
  FitResult diverged(const std::string& why);
  FitResult out_of_memory_stop(const c10::OutOfMemoryError& error);
  FitResult interrupted(int exit_code);

  Run& run_;
  const int64_t epoch_, batches_, accumulation_;
  int64_t next_;
  EpochSums sums_;
  ProgressBar progress_;
  LossWindow window_;
  bool window_finite_ = true;  // the losses read last were finite
  Stopwatch clock_;
};

Epoch::Epoch(Run& run, int64_t epoch, int64_t first_batch, const EpochSums& sums)
    : run_(run),
      epoch_(epoch),
      batches_(start_epoch(run.data, epoch)),
      accumulation_(run.config.accumulation_steps),
      next_(std::min(first_batch, batches_)),
      sums_(sums),
      progress_(run.log.tag_prefix() + "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(run.config.epochs),
                (batches_ + accumulation_ - 1) / accumulation_, run.options.dist.is_main,
                run.options.dist.is_main && run.config.progress) {
  synchronize(run_.trainer.device());
  clock_.restart();
  window_.restart_clock();
}

TrainingPosition Epoch::position() const {
  const uint64_t seed = run_.options.data_seed;
  const int64_t world = run_.options.dist.world_size, step = run_.trainer.global_step();
  if (next_ >= batches_) return {epoch_ + 1, 0, step, seed, 0, world};
  return {epoch_, next_, step, seed, std::min(next_ * run_.global_batch, batches_ * run_.global_batch), world};
}

EpochSums Epoch::sums_now() const {
  EpochSums now = sums_;
  now.seconds += clock_.seconds();
  return now;
}

MicroBatches Epoch::micro_batches(int64_t group) {
  return MicroBatches{group, [this](int64_t i) { return run_.data.batch_rows(next_ + i); },
                      [this](int64_t i) { return run_.data.batch(next_ + i); }};
}

std::optional<FitResult> Epoch::train() {
  const TrainConfig& config = run_.config;
  Trainer& trainer = run_.trainer;
  while (next_ < batches_) {
    const int64_t group = std::min(accumulation_, batches_ - next_);
    if (has_schedule(config.optimizer))  // set before the step: a graph reads it on the device
      set_learning_rate(trainer.optimizer(), scheduled_lr(config.optimizer, trainer.global_step(), run_.run_steps));
    // The step: Trainer::step (trainer.cpp), which runs lab 2's train_step (or lab 3's accumulation
    // over a group, then lab 2's optimizer_step); with the fast path, options.run_step replays it as
    // a CUDA graph.
    StepResult result;
    run_.trace.before_step(run_.steps_taken);
    try {
      if (run_.options.run_step) result = run_.options.run_step(run_.data, next_, group);
      else if (group == 1) result = trainer.step(run_.data.batch(next_));
      else result = trainer.step(micro_batches(group));
    } catch (const c10::OutOfMemoryError& error) {
      return out_of_memory_stop(error);
    }
    run_.trace.after_step(run_.steps_taken++);
    next_ += group;
    sums_.samples += result.samples;
    ++sums_.steps;
    window_.add(result);
    progress_.update((next_ + accumulation_ - 1) / accumulation_);

    const int64_t global_step = trainer.global_step();
    const bool reached_max = config.max_steps > 0 && global_step >= config.max_steps;
    const bool checkpoint_now = run_.checkpointer.saves_at_step(global_step);
    if (global_step % config.log_every == 0 || next_ >= batches_ || reached_max || checkpoint_now)
      if (std::string stop = read_window(); !stop.empty()) return diverged(stop);
    if (checkpoint_now) run_.checkpointer.save(position(), run_.result.epochs, sums_now(), window_finite_);

    // Ctrl-C: stop between optimizer steps, never inside an accumulation group. Several ranks
    // agree at log points (one tiny all-reduce), so that all stop after the same step. At the
    // epoch's end the epoch is finished first (its record, evaluation and checkpoint).
    const bool agree_now = !run_.options.dist.distributed || global_step % config.log_every == 0;
    if (next_ < batches_ && agree_now)
      if (Interrupt interrupt = agreed_interrupt(run_.options.dist); interrupt.stop) return interrupted(interrupt.exit_code);
    if (reached_max) break;
  }
  return std::nullopt;
}

// Every log_every steps, at the epoch's end and before a checkpoint: one host sync to read the
// losses into the sums.
std::string Epoch::read_window() {
  if (window_.empty()) return "";
  LossWindow::Reading reading = window_.read(run_.options.dist.mean);
  window_finite_ = true;
  for (double v : reading.losses) {
    if (std::isfinite(v)) sums_.loss_sum += v, ++sums_.loss_count;
    else window_finite_ = false;
  }
  sums_.skipped += reading.skipped;
  LossScaler& scaler = run_.trainer.scaler();
  const double scale = scaler.get_scale();
  std::string stop = run_.divergence.check(reading.losses, scaler.is_enabled(), scale, run_.config.min_loss_scale);
  progress_.note((next_ + accumulation_ - 1) / accumulation_, run_.log.window_note(reading, scale, scaler.is_enabled()));
  run_.log.step_row(epoch_ + 1, run_.trainer.global_step(), reading, scale, sums_.skipped);
  return stop;
}

FitResult Epoch::stopped(FitStatus status, int exit_code, std::string message, const TrainingPosition& at) {
  FitResult& result = run_.result;
  result.status = status;
  result.exit_code = exit_code;
  result.message = std::move(message);
  result.position = at;
  result.last_checkpoint = run_.checkpointer.last_good();
  return result;
}

FitResult Epoch::diverged(const std::string& why) {
  progress_.finish();
  return stopped(FitStatus::diverged, 1, why + run_.checkpointer.last_good_note(), position());
}

FitResult Epoch::out_of_memory_stop(const c10::OutOfMemoryError& error) {
  OutOfMemory oom = out_of_memory(error, run_.trainer);
  const TrainingPosition at = position();
  if (oom.parameters_intact) {
    std::string path = run_.checkpointer.save(at, run_.result.epochs, sums_now(), true);
    if (!path.empty()) oom.message += "; checkpoint saved to " + path;
  }
  progress_.finish();
  return stopped(FitStatus::out_of_memory, 1, oom.message, at);
}

FitResult Epoch::interrupted(int exit_code) {
  progress_.finish();
  if (std::string stop = read_window(); !stop.empty()) return diverged(stop);
  const TrainingPosition at = position();
  Checkpointer& checkpointer = run_.checkpointer;
  std::string saved;
  if (checkpointer.saves_on_interrupt()) saved = checkpointer.save(at, run_.result.epochs, sums_now(), window_finite_);
  return stopped(FitStatus::interrupted, exit_code,
                 checkpointer.interrupted_message(epoch_, run_.trainer.global_step(), saved, false), at);
}

std::optional<FitResult> Epoch::finish() {
  Trainer& trainer = run_.trainer;
  synchronize(trainer.device());
  EpochRecord record;
  record.tag = run_.options.tag;
  record.epoch = epoch_ + 1;
  record.seconds = sums_now().seconds;
  progress_.finish();
  record.train_loss = sums_.loss_count ? sums_.loss_sum / static_cast<double>(sums_.loss_count) : NAN;
  // An epoch shorter than train.divergence_patience whose every loss was NaN or inf must not
  // pass for a finished one.
  if (sums_.loss_count == 0 && sums_.steps > 0)
    return diverged(no_finite_loss_message(sums_.steps, epoch_ + 1, run_.config.divergence_patience));
  record.samples_per_second = static_cast<double>(sums_.samples) / std::max(record.seconds, 1e-9);
  record.steps = sums_.steps;
  record.skipped_steps = sums_.skipped;
  record.loss_scale = trainer.scaler().get_scale();
  if (run_.options.evaluate) record.eval = run_.options.evaluate(epoch_ + 1);
  run_.log.epoch_done(record);
  run_.result.epochs.push_back(record);

  // A signal during the epoch's last step, its evaluation or before: stop here, at the boundary.
  const TrainingPosition at = position();
  const Interrupt interrupt = agreed_interrupt(run_.options.dist);
  Checkpointer& checkpointer = run_.checkpointer;
  if (checkpointer.saves_at_epoch_end(interrupt.stop)) checkpointer.save(at, run_.result.epochs, EpochSums{}, window_finite_);
  run_.log.leak_warning(trainer.memory());
  if (!interrupt.stop) return std::nullopt;
  const int64_t step = trainer.global_step();
  const bool last_epoch = epoch_ + 1 >= run_.config.epochs || (run_.config.max_steps > 0 && step >= run_.config.max_steps);
  const std::string saved = checkpointer.last_good_step() == step ? checkpointer.last_good() : "";
  return stopped(FitStatus::interrupted, interrupt.exit_code, checkpointer.interrupted_message(epoch_, step, saved, last_epoch), at);
}

// Where train.trace_steps writes ("" for no trace): the rank that writes files, into its run directory.
std::string trace_path(const TrainConfig& config, const FitOptions& options) {
  if (!config.trace_steps || !options.dist.is_main || !options.run_dir || !options.run_dir->enabled()) return "";
  return options.run_dir->file("trace-" + file_name_safe(options.tag.empty() ? "train" : options.tag) + ".json");
}

// Optimizer steps of the whole run (every epoch has the same batches): the schedule's length.
int64_t run_length(const TrainConfig& config, BatchSource& data) {
  const int64_t per_epoch = (data.batches_per_epoch() + config.accumulation_steps - 1) / config.accumulation_steps;
  const int64_t steps = config.epochs * per_epoch;
  return config.max_steps > 0 ? std::min<int64_t>(steps, config.max_steps) : steps;
}

}  // namespace

FitResult fit(Trainer& trainer, BatchSource& data, const FitOptions& options) {
  const TrainConfig& config = trainer.config();
  check_batches_fit(config, data, options.dist.world_size);
  const int64_t global_batch = config.batch_size * options.dist.world_size;
  Checkpointer checkpointer(options, trainer, position_settings(config, options, data.dataset_size()));

  FitResult result;
  TrainingPosition position;
  position.data_seed = options.data_seed;
  position.world_size = options.dist.world_size;
  EpochSums resumed_sums;  // the interrupted epoch's sums, from the checkpoint
  if (std::optional<Resumed> resumed = checkpointer.resume(global_batch)) {
    position = resumed->position;
    result.epochs = std::move(resumed->loop.epochs);
    resumed_sums = resumed->loop.sums;
    result.last_checkpoint = checkpointer.last_good();
    if (resumed->finished) {
      result.already_finished = true;
      result.position = position;
      return result;
    }
  }

  EpochLog log(options.tag, options.run_dir, options.dist.is_main);
  const int64_t steps = run_length(config, data);
  StepTrace trace(trace_path(config, options), std::min<int64_t>(10, steps / 2), 5, trainer.device());
  Run run{trainer, data, options, config, checkpointer, log, result, DivergenceGuard{config.divergence_patience},
          global_batch, steps, trace};
  // A rank that died ends the run on the others with the last good checkpoint named.
  try {
    for (int64_t index = position.epoch; index < config.epochs; ++index) {
      const bool resuming_here = index == position.epoch && position.next_batch > 0;
      Epoch epoch(run, index, index == position.epoch ? position.next_batch : 0,
                  resuming_here ? resumed_sums : EpochSums{});
      if (std::optional<FitResult> stopped = epoch.train()) return *stopped;
      if (std::optional<FitResult> stopped = epoch.finish()) return *stopped;
      position = epoch.position();
      if (config.max_steps > 0 && trainer.global_step() >= config.max_steps) break;
    }
  } catch (const PeerLost& e) {
    throw PeerLost(std::string(e.what()) + checkpointer.last_good_note());
  }
  result.position = position;
  result.last_checkpoint = checkpointer.last_good();
  log.memory_report(trainer.memory(), trainer.device());
  return result;
}

}  // namespace amplab
