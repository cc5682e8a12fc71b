#include "amplab/train/loop.hpp"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <csignal>
#include <cmath>
#include <filesystem>

#include <unistd.h>

#include "amplab/fast/cuda_graph.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/report/progress.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/report/table.hpp"

namespace amplab {

std::string checkpoint_dir_for(const CheckpointConfig& checkpoint, const RunConfig& run, const std::string& lab) {
  if (!checkpoint.dir.empty()) return checkpoint.dir;
  return (std::filesystem::path(run.out_dir) / lab / "checkpoints").string();
}

std::string resolve_resume(const std::string& spec, const std::string& dir) {
  if (spec != "auto") return spec;
  return CheckpointManager(dir, 1).has_latest() ? "latest" : "";
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

// The running sums of the epoch in progress: what its EpochRecord is made of. Kept in
// checkpoints, so that an interrupted epoch reports the same mean loss as an uninterrupted one.
struct EpochSums {
  double loss_sum = 0;     // of the finite losses read so far
  int64_t loss_count = 0;
  int64_t samples = 0;     // this rank's samples
  int64_t steps = 0;
  int64_t skipped = 0;     // steps the GradScaler skipped
  double seconds = 0;      // training time before the last resume
};

nlohmann::json to_json(const EpochRecord& r) {
  return {{"tag", r.tag}, {"epoch", r.epoch}, {"train_loss", r.train_loss}, {"seconds", r.seconds},
          {"samples_per_second", r.samples_per_second}, {"steps", r.steps}, {"skipped_steps", r.skipped_steps},
          {"loss_scale", r.loss_scale}, {"eval", r.eval}};
}

EpochRecord epoch_record_from(const nlohmann::json& j) {
  EpochRecord r;
  r.tag = j.at("tag");
  r.epoch = j.at("epoch");
  r.train_loss = j.at("train_loss").is_number() ? j.at("train_loss").get<double>() : NAN;
  r.seconds = j.at("seconds");
  r.samples_per_second = j.at("samples_per_second");
  r.steps = j.at("steps");
  r.skipped_steps = j.at("skipped_steps");
  r.loss_scale = j.at("loss_scale");
  r.eval = j.at("eval");
  return r;
}

// What the position in the data and the learning rate depend on, with the key that sets each.
struct Setting {
  std::string name;  // in the checkpoint
  std::string key;   // in messages
  nlohmann::json value;
};

std::vector<Setting> position_settings(const TrainConfig& c, const FitOptions& options, int64_t dataset_size) {
  std::vector<Setting> settings{
      {"batch_size", "train.batch_size", c.batch_size},
      {"world_size", "the number of processes (WORLD_SIZE)", options.dist.world_size},
      {"accumulation_steps", "train.accumulation_steps", c.accumulation_steps},
      {"drop_last", "train.drop_last", c.drop_last},
      {"dataset_size", "the training set's size (data.train_limit, data.dataset)", dataset_size},
      {"precision", "train.precision", to_string(c.precision)},
      {"loss_scaling", "train.loss_scaling", c.loss_scaling},
      {"schedule", "train.optimizer.schedule", c.optimizer.schedule},
      {"warmup", "train.optimizer.warmup", c.optimizer.warmup}};
  // Under a schedule the rate of every step depends on the run's length.
  if (has_schedule(c.optimizer)) {
    settings.push_back({"epochs", options.epochs_key, c.epochs});
    settings.push_back({"max_steps", "train.max_steps", c.max_steps});
  }
  return settings;
}

nlohmann::json settings_json(const std::vector<Setting>& settings) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& s : settings) j[s.name] = s.value;
  return j;
}

std::string value_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Refuses (or, forced, reports) settings that differ from the checkpoint's.
void check_resume_settings(const std::vector<Setting>& now, const nlohmann::json& then, const std::string& path,
                           bool force, const std::string& where) {
  for (const auto& s : now) {
    if (!then.contains(s.name) || then.at(s.name) == s.value) continue;
    std::string change = s.key + " is " + value_text(s.value) + " now but was " + value_text(then.at(s.name)) +
                         " when checkpoint '" + path + "' was written";
    if (force) {
      log::warn("--force: " + change + "; going on from " + where + " with the new value");
      continue;
    }
    throw Error("--resume: " + change + "; the position in the data and the learning-rate schedule depend on it: "
                "resume with the old value, or add --force to go on from " + where + " with the new one");
  }
}

bool parameters_finite(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flags;
  for (const auto& p : model.parameters()) flags.push_back(p.isfinite().all());
  return flags.empty() || torch::stack(flags).all().item<bool>();
}

}  // namespace

FitResult fit(Trainer& trainer, BatchSource& data, const FitOptions& options) {
  const TrainConfig& config = trainer.config();
  const bool main = options.dist.is_main;
  const int64_t world = options.dist.world_size;
  FitResult result;
  TrainingState state{trainer.model(), trainer.optimizer(), trainer.scaler()};

  if (data.batches_per_epoch() == 0)
    throw Error("train.batch_size=" + std::to_string(config.batch_size) + " leaves no batch: the training set has " +
                std::to_string(data.dataset_size()) + " samples" + (world > 1 ? " for " + std::to_string(world) + " processes" : "") +
                (config.drop_last ? " and train.drop_last drops the only, partial batch" : "") +
                "; lower train.batch_size (or raise data.train_limit)");
  if (data.dataset_size() > 0 && config.batch_size * world > data.dataset_size())
    throw Error("train.batch_size=" + std::to_string(config.batch_size) + (world > 1 ? " x " + std::to_string(world) + " processes" : "") +
                " is larger than the training set (" + std::to_string(data.dataset_size()) +
                " samples): every step would see the same single batch; lower train.batch_size");

  std::unique_ptr<CheckpointManager> checkpoints;
  const bool saves = options.checkpoint.every_epoch || options.checkpoint.every_steps > 0 || options.checkpoint.on_interrupt;
  if (!options.checkpoint_dir.empty()) {
    // The run directory's name is the wall clock's second, which two runs can share (two
    // run.out_dir with one checkpoint.dir, a clock set back): a random part keeps their files apart.
    std::string owner = options.run_dir && options.run_dir->enabled()
                            ? std::filesystem::path(options.run_dir->path()).filename().string()
                            : "run" + std::to_string(::getpid());
    owner += "-" + unique_run_token();
    if (!options.tag.empty()) owner += "-" + options.tag;
    checkpoints = std::make_unique<CheckpointManager>(options.checkpoint_dir, options.checkpoint.keep_last, owner);
    // Now rather than at the first save: a directory that cannot be written is found before training.
    if (main && saves) checkpoints->open_for_writing();
  }
  const auto settings = position_settings(config, options, data.dataset_size());
  const int64_t global_batch = config.batch_size * world;  // samples per micro-batch, all ranks together

  TrainingPosition position;
  position.data_seed = options.data_seed;
  position.world_size = world;
  EpochSums resumed_sums;  // the interrupted epoch's sums, from the checkpoint
  std::string resume = options.resume;
  if (resume == "auto" && checkpoints) resume = options.dist.from_main(resolve_resume("auto", checkpoints->dir()));
  if (!resume.empty()) {
    if (!checkpoints) throw Error("--resume needs a checkpoint directory (checkpoint.dir)");
    std::string path = options.dist.from_main(checkpoints->resolve(resume));
    CheckpointInfo info = load_checkpoint(path, state, options.lab);
    if (info.tag != options.tag)
      throw Error("checkpoint '" + path + "' belongs to '" + info.tag + "', not to '" + options.tag + "'");
    position = info.position;
    nlohmann::json loop = info.loop_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(info.loop_json);
    if (position.samples == 0 && position.next_batch > 0)  // written before positions were counted in samples
      position.samples = position.next_batch * global_batch;
    const std::string where = "sample " + std::to_string(position.samples) + " of epoch " + std::to_string(position.epoch + 1);
    check_resume_settings(settings, loop.value("settings", nlohmann::json::object()), path, options.force_resume, where);
    if (position.data_seed != options.data_seed)
      log::warn("the checkpoint's data seed (" + std::to_string(position.data_seed) + ") differs from run.seed; the "
                "checkpoint's seed is used so that the data order continues exactly");
    // The same samples with the current batch: exact unless a forced change makes them not divide.
    position.next_batch = position.samples / global_batch;
    if (position.next_batch * global_batch != position.samples)
      log::warn("--force: sample " + std::to_string(position.samples) + " is not on a batch boundary with " +
                std::to_string(global_batch) + " samples per batch; going on from sample " +
                std::to_string(position.next_batch * global_batch) + " (some samples are seen twice)");
    position.world_size = world;
    for (const auto& e : loop.value("epochs", nlohmann::json::array())) result.epochs.push_back(epoch_record_from(e));
    if (loop.contains("sums")) {
      const auto& j = loop.at("sums");
      resumed_sums = {j.at("loss_sum").get<double>(), j.at("loss_count").get<int64_t>(), j.at("samples").get<int64_t>(),
                      j.at("steps").get<int64_t>(),   j.at("skipped").get<int64_t>(),    j.at("seconds").get<double>()};
    }
    trainer.set_global_step(position.global_step);
    result.last_checkpoint = path;
    const bool finished = position.epoch >= config.epochs || (config.max_steps > 0 && position.global_step >= config.max_steps);
    if (finished) {
      result.already_finished = true;
      result.position = position;
      if (main)
        log::info("checkpoint '" + path + "' is at the end of its run (" + std::to_string(position.epoch) + " epoch(s), step " +
                  std::to_string(position.global_step) + "): nothing left to train; to train further, raise " +
                  options.epochs_key + (has_schedule(config.optimizer) ? " and add --force (the learning-rate schedule "
                                                                         "then stretches over the longer run)" : ""));
      return result;
    }
    if (main)
      log::info("resumed from " + path + " at epoch " + std::to_string(position.epoch + 1) + " batch " +
                std::to_string(position.next_batch) + " (step " + std::to_string(position.global_step) + ")");
  }

  std::string last_good = result.last_checkpoint;  // the newest checkpoint with finite parameters
  int64_t last_good_step = position.global_step;
  // Writes a checkpoint at `at` unless the parameters (or, without loss scaling, the last losses)
  // are not finite: a diverged run must never replace its good checkpoints with bad ones.
  auto save = [&](const TrainingPosition& at, const EpochSums& sums, bool losses_finite) -> std::string {
    if (!checkpoints || !main) return "";
    if (!parameters_finite(trainer.model()) || (!losses_finite && !trainer.scaler().is_enabled())) {
      log::warn("not saving a checkpoint at step " + std::to_string(at.global_step) + ": the " +
                (losses_finite ? "parameters are" : "loss is") + " not finite; the last good checkpoint is " +
                (last_good.empty() ? "none" : "'" + last_good + "'"));
      return "";
    }
    nlohmann::json loop{{"settings", settings_json(settings)}, {"epochs", nlohmann::json::array()},
                        {"sums", {{"loss_sum", sums.loss_sum}, {"loss_count", sums.loss_count}, {"samples", sums.samples},
                                  {"steps", sums.steps}, {"skipped", sums.skipped}, {"seconds", sums.seconds}}}};
    for (const auto& e : result.epochs) loop["epochs"].push_back(to_json(e));
    CheckpointInfo info;
    info.lab = options.lab;
    info.tag = options.tag;
    info.config_yaml = options.config_yaml;
    info.extra_json = options.checkpoint_extra;
    info.loop_json = loop.dump();
    info.position = at;
    std::string path = checkpoints->save(state, info);
    log::debug("checkpoint saved: " + path);
    last_good = path;
    last_good_step = at.global_step;
    return path;
  };
  auto last_good_note = [&]() {
    return last_good.empty() ? std::string("; no good checkpoint was saved")
                             : "; the last good checkpoint is '" + last_good + "' (step " + std::to_string(last_good_step) + ")";
  };
  // What an interrupted run says: where it stopped, what was saved, how to go on.
  auto interrupted_message = [&](int64_t epoch, const std::string& saved, bool finished) {
    std::string message = "interrupted at epoch " + std::to_string(epoch + 1) + " step " +
                          std::to_string(trainer.global_step()) +
                          (finished ? ", after its last step: training had finished" : "");
    if (!saved.empty()) return message + "; checkpoint saved to " + saved + (finished ? "" : "; resume with --resume " + saved);
    message += std::string("; no checkpoint saved") + (options.checkpoint.on_interrupt ? "" : " (checkpoint.on_interrupt=false)");
    if (last_good.empty()) return message + ", none to resume from";
    return message + ": the last is '" + last_good + "' at step " + std::to_string(last_good_step) +
           (last_good_step < trainer.global_step() ? ", so the steps after it are lost" : "") + "; resume with --resume " +
           last_good;
  };

  std::unique_ptr<CsvLog> metrics_csv, steps_csv;
  if (options.run_dir && options.run_dir->enabled() && main)
    steps_csv = std::make_unique<CsvLog>(options.run_dir->file("steps.csv"),
                                         std::vector<std::string>{"tag", "epoch", "step", "loss", "samples_per_s",
                                                                  "step_ms", "loss_scale", "skipped_steps"},
                                         /*append=*/true);

  DivergenceGuard divergence{config.divergence_patience};
  std::unique_ptr<GraphedTrainStep> graphed;
  if (config.cuda_graph) {
    if (cuda_graph_blocker(trainer) == kScalerOnTheHost)
      log::warn("train.cuda_graph: " + std::string(kScalerOnTheHost) + "; running the step eagerly");
    else
      graphed = std::make_unique<GraphedTrainStep>(trainer);
  }
  const std::string tag_prefix = options.tag.empty() ? "" : "[" + options.tag + "] ";
  const int64_t accumulation = config.accumulation_steps;

  // Optimizer steps of the whole run (every epoch has the same batches): the schedule's length.
  int64_t run_steps = config.epochs * ((data.batches_per_epoch() + accumulation - 1) / accumulation);
  if (config.max_steps > 0) run_steps = std::min<int64_t>(run_steps, config.max_steps);

  // A rank that died ends the run on the others with the last good checkpoint named.
  try {
    for (int64_t epoch = position.epoch; epoch < config.epochs; ++epoch) {
      data.set_epoch(epoch);
      const int64_t batches = data.batches_per_epoch();
      const bool resuming_here = epoch == position.epoch && position.next_batch > 0;
      int64_t next = epoch == position.epoch ? std::min(position.next_batch, batches) : 0;
      const int64_t total_steps = (batches + accumulation - 1) / accumulation;
      ProgressBar progress(tag_prefix + "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(config.epochs),
                           total_steps, main, main && config.progress);

      EpochRecord record;
      record.tag = options.tag;
      record.epoch = epoch + 1;
      EpochSums sums = resuming_here ? resumed_sums : EpochSums{};
      std::vector<torch::Tensor> pending;  // losses since the last log line, still on the device
      torch::Tensor skipped_device;        // steps the GradScaler skipped since the last log line, on the device
      bool window_finite = true;           // the losses read last were finite
      int64_t window_samples = 0, window_steps = 0;
      synchronize(trainer.device());
      Stopwatch epoch_clock, window_clock;
      auto position_now = [&]() {
        TrainingPosition at{epoch, next, trainer.global_step(), options.data_seed,
                            std::min(next * global_batch, batches * global_batch), world};
        if (next >= batches) at = {epoch + 1, 0, trainer.global_step(), options.data_seed, 0, world};
        return at;
      };
      auto sums_now = [&]() {
        EpochSums now = sums;
        now.seconds += epoch_clock.seconds();
        return now;
      };

      // Every log_every steps, at the epoch's end and before a checkpoint: one host sync to read
      // the losses into the sums. Returns why training must stop ("" to go on).
      auto flush_window = [&]() -> std::string {
        if (pending.empty()) return "";
        torch::Tensor losses = options.dist.mean(torch::stack(pending)).to(torch::kCPU, torch::kFloat64);
        std::vector<double> values(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
        window_finite = true;
        for (double v : values) {
          if (std::isfinite(v)) sums.loss_sum += v, ++sums.loss_count;
          else window_finite = false;
        }
        if (skipped_device.defined()) sums.skipped += static_cast<int64_t>(skipped_device.item<double>());
        skipped_device = torch::Tensor();
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
                          std::to_string(sums.skipped)});
        pending.clear();
        window_samples = window_steps = 0;
        window_clock.restart();
        return stop;
      };
      auto diverged = [&](const std::string& why) {
        progress.finish();
        result.status = FitStatus::diverged;
        result.exit_code = 1;
        result.message = why + last_good_note();
        result.position = position_now();
        result.last_checkpoint = last_good;
        return result;
      };

      while (next < batches) {
        const int64_t group = std::min(accumulation, batches - next);
        StepResult step;
        if (has_schedule(config.optimizer))  // set before the step: a graph reads it on the device
          set_learning_rate(trainer.optimizer(), scheduled_lr(config.optimizer, trainer.global_step(), run_steps));
        try {
          step = graphed ? graphed->step(data, next)
                         : trainer.step(MicroBatches{group, [&](int64_t i) { return data.batch_rows(next + i); },
                                                     [&](int64_t i) { return data.batch(next + i); }});
        } catch (const c10::OutOfMemoryError& e) {
          Phase phase = trainer.current_phase();
          result.status = FitStatus::out_of_memory;
          result.exit_code = 1;
          result.message = explain_oom(e.what_without_backtrace(), trainer.device(), phase);
          trainer.optimizer().zero_grad(true);
          result.position = position_now();
          if (phase != Phase::optimizer) {  // parameters are intact: the step had not started updating them
            std::string path = save(result.position, sums_now(), true);
            if (!path.empty()) result.message += "; checkpoint saved to " + path;
          }
          result.last_checkpoint = last_good;
          progress.finish();
          return result;
        }
        next += group;
        sums.samples += step.samples;
        window_samples += step.samples;
        ++window_steps;
        ++sums.steps;
        if (step.skipped.defined()) skipped_device = skipped_device.defined() ? skipped_device + step.skipped : step.skipped;
        pending.push_back(step.loss);
        progress.update((next + accumulation - 1) / accumulation);

        const bool reached_max = config.max_steps > 0 && trainer.global_step() >= config.max_steps;
        const bool checkpoint_now = options.checkpoint.every_steps > 0 && trainer.global_step() % options.checkpoint.every_steps == 0;
        if (trainer.global_step() % config.log_every == 0 || next >= batches || reached_max || checkpoint_now) {
          std::string stop = flush_window();
          if (!stop.empty()) return diverged(stop);
        }
        position = position_now();
        if (checkpoint_now) save(position, sums_now(), window_finite);

        // Ctrl-C: stop between optimizer steps, never inside an accumulation group. Several ranks
        // agree at log points (one tiny all-reduce), so that all stop after the same step. At the
        // epoch's end the epoch is finished first (its record, evaluation and checkpoint).
        int signal = interrupt_signal();
        bool agree_now = !options.dist.distributed || trainer.global_step() % config.log_every == 0;
        if (next < batches && agree_now && options.dist.any(signal != 0)) {
          progress.finish();
          std::string stop = flush_window();
          if (!stop.empty()) return diverged(stop);
          result.status = FitStatus::interrupted;
          result.exit_code = interrupt_exit_code(signal != 0 ? signal : SIGINT);
          result.position = position;
          std::string saved;
          if (options.checkpoint.on_interrupt) saved = save(position, sums_now(), window_finite);
          result.message = interrupted_message(epoch, saved, false);
          result.last_checkpoint = last_good;
          return result;
        }
        if (reached_max) break;
      }
      synchronize(trainer.device());
      const EpochSums final_sums = sums_now();
      record.seconds = final_sums.seconds;
      progress.finish();
      record.train_loss = sums.loss_count ? sums.loss_sum / static_cast<double>(sums.loss_count) : NAN;
      // An epoch shorter than train.divergence_patience whose every loss was NaN or inf must not
      // pass for a finished one.
      if (sums.loss_count == 0 && sums.steps > 0)
        return diverged("the loss was not finite at any of the " + std::to_string(sums.steps) + " steps of epoch " +
                        std::to_string(epoch + 1) + " (fewer than train.divergence_patience=" +
                        std::to_string(config.divergence_patience) +
                        "): training diverged; lower train.optimizer.lr or enable train.grad_clip_norm");
      record.samples_per_second = static_cast<double>(sums.samples) / std::max(record.seconds, 1e-9);
      record.steps = sums.steps;
      record.skipped_steps = sums.skipped;
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
      position = position_now();
      // A signal during the epoch's last step, its evaluation or before: stop here, at the boundary.
      int signal = interrupt_signal();
      const bool stop = options.dist.any(signal != 0);
      if (options.checkpoint.every_epoch || (stop && options.checkpoint.on_interrupt))
        save(position, EpochSums{}, window_finite);
      std::string leak = trainer.memory().leak_report();
      if (!leak.empty() && main) log::warn(leak);
      const bool last_epoch = epoch + 1 >= config.epochs || (config.max_steps > 0 && trainer.global_step() >= config.max_steps);
      if (stop) {
        result.status = FitStatus::interrupted;
        result.exit_code = interrupt_exit_code(signal != 0 ? signal : SIGINT);
        result.position = position;
        result.last_checkpoint = last_good;
        result.message =
            interrupted_message(epoch, last_good_step == trainer.global_step() ? last_good : "", last_epoch);
        return result;
      }
      if (last_epoch) break;
    }
  } catch (const PeerLost& e) {
    throw PeerLost(std::string(e.what()) + last_good_note());
  }
  result.position = position;
  result.last_checkpoint = last_good;

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
