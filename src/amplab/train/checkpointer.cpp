// The Checkpointer: --resume resolved, loaded and checked; the save policy and the last good checkpoint.
#include "amplab/train/checkpointer.hpp"

#include <torch/torch.h>

#include <filesystem>

#include <unistd.h>

#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"

namespace amplab {

namespace fs = std::filesystem;

std::string checkpoint_dir_for(const CheckpointConfig& checkpoint, const RunConfig& run, const std::string& lab) {
  if (!checkpoint.dir.empty()) return checkpoint.dir;
  return (fs::path(run.out_dir) / lab / "checkpoints").string();
}

CheckpointConfig resolved_checkpoint_config(const CheckpointConfig& checkpoint, const RunConfig& run,
                                            const std::string& lab) {
  CheckpointConfig resolved = checkpoint;
  resolved.dir = checkpoint_dir_for(checkpoint, run, lab);
  return resolved;
}

std::string latest_pointer_dir(const RunDir* run_dir) {
  if (!run_dir || !run_dir->enabled()) return "";
  return fs::path(run_dir->path()).lexically_normal().parent_path().string();
}

std::string resolve_resume(const std::string& flag, const CheckpointManager& checkpoints) {
  if (flag.empty()) return "";
  if (flag == "auto") return checkpoints.has_latest() ? checkpoints.resolve("latest") : "";
  return checkpoints.resolve(flag);
}

ResumePoint find_resume_point(const std::string& flag, const std::string& checkpoint_dir, const RunDir* run_dir,
                              const std::string& lab) {
  CheckpointManager checkpoints(checkpoint_dir, 1, "", latest_pointer_dir(run_dir));
  ResumePoint point;
  point.path = resolve_resume(flag, checkpoints);
  if (flag == "auto")
    log::info(point.path.empty() ? "--resume auto: no checkpoint in " + checkpoint_dir + ", starting fresh"
                                 : "--resume auto: resuming from the latest checkpoint, " + point.path);
  if (point.path.empty()) return point;
  point.info = read_checkpoint_info(point.path);
  check_checkpoint_lab(point.info, point.path, lab);
  return point;
}

void to_json(nlohmann::json& j, const PositionSettings& settings) {
  j = nlohmann::json::object();
  for (const auto& s : settings.list) j[s.name] = s.value;
}

void from_json(const nlohmann::json& j, PositionSettings& settings) {
  settings.list.clear();
  for (const auto& [name, value] : j.items()) settings.list.push_back({name, "", value});
}

PositionSettings position_settings(const TrainConfig& c, const FitOptions& options, int64_t dataset_size) {
  PositionSettings settings{{
      {"batch_size", "train.batch_size", c.batch_size},
      {"world_size", "the number of processes (WORLD_SIZE)", options.dist.world_size},
      {"accumulation_steps", "train.accumulation_steps", c.accumulation_steps},
      {"drop_last", "train.drop_last", c.drop_last},
      {"dataset_size", "the training set's size (data.train_limit, data.dataset)", dataset_size},
      {"precision", "train.precision", to_string(c.precision)},
      {"loss_scaling", "train.loss_scaling", c.loss_scaling},
      {"schedule", "train.optimizer.schedule", c.optimizer.schedule},
      {"warmup", "train.optimizer.warmup", c.optimizer.warmup}}};
  // Under a schedule the rate of every step depends on the run's length.
  if (has_schedule(c.optimizer)) {
    settings.list.push_back({"epochs", options.epochs_key, c.epochs});
    settings.list.push_back({"max_steps", "train.max_steps", c.max_steps});
  }
  return settings;
}

void to_json(nlohmann::json& j, const LoopState& state) {
  j = {{"settings", state.settings}, {"epochs", state.epochs}, {"sums", state.sums}};
}

void from_json(const nlohmann::json& j, LoopState& state) {
  state.settings = j.value("settings", nlohmann::json::object()).get<PositionSettings>();
  state.epochs = j.value("epochs", nlohmann::json::array()).get<std::vector<EpochRecord>>();
  state.sums = j.contains("sums") ? j.at("sums").get<EpochSums>() : EpochSums{};
}

namespace {

std::string value_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Refuses (or, forced, reports) settings that differ from the checkpoint's.
void check_resume_settings(const PositionSettings& now, const PositionSettings& then, const std::string& path,
                           bool force, const std::string& where) {
  for (const auto& s : now.list) {
    auto old = std::find_if(then.list.begin(), then.list.end(), [&](const Setting& t) { return t.name == s.name; });
    if (old == then.list.end() || old->value == s.value) continue;
    std::string change = s.key + " is " + value_text(s.value) + " now but was " + value_text(old->value) +
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

Checkpointer::Checkpointer(const FitOptions& options, Trainer& trainer, PositionSettings settings)
    : options_(options), trainer_(trainer), settings_(std::move(settings)) {
  if (!options.checkpoint) return;  // a run that saves none
  if (options.checkpoint->dir.empty())
    throw Error("checkpoint.dir: this lab handed fit() its checkpoint: section without the directory resolved, so it "
                "would save nothing; build the options with Lab::fit_options() (or resolved_checkpoint_config)");
  // The run directory's name is the wall clock's second, which two runs can share (two
  // run.out_dir with one checkpoint.dir, a clock set back): a random part keeps their files apart.
  std::string owner = options.run_dir && options.run_dir->enabled()
                          ? fs::path(options.run_dir->path()).filename().string()
                          : "run" + std::to_string(::getpid());
  owner += "-" + unique_run_token();
  if (!options.tag.empty()) owner += "-" + options.tag;
  checkpoints_ = std::make_unique<CheckpointManager>(options.checkpoint->dir, options.checkpoint->keep_last, owner,
                                                     latest_pointer_dir(options.run_dir));
  const CheckpointConfig& c = *options.checkpoint;
  if (options.dist.is_main && (c.every_epoch || c.every_steps > 0 || c.on_interrupt)) checkpoints_->open_for_writing();
}

Checkpointer::~Checkpointer() = default;

// Only the main rank reads the pointer (it is beside its run directory); the others take its answer.
std::string Checkpointer::resolved_resume() const {
  if (options_.resume.empty()) return "";
  if (!checkpoints_) throw Error("--resume needs a checkpoint directory (checkpoint.dir)");
  return options_.dist.from_main(options_.dist.is_main ? resolve_resume(options_.resume, *checkpoints_) : "");
}

std::optional<Resumed> Checkpointer::resume(int64_t global_batch) {
  const std::string path = resolved_resume();
  if (path.empty()) return std::nullopt;
  TrainingState state{trainer_.model(), trainer_.optimizer(), trainer_.scaler()};
  CheckpointInfo info = load_checkpoint(path, state, options_.lab);
  if (info.tag != options_.tag)
    throw Error("checkpoint '" + path + "' belongs to '" + info.tag + "', not to '" + options_.tag + "'");
  Resumed resumed;
  resumed.position = info.position;
  if (!info.loop_json.empty()) resumed.loop = nlohmann::json::parse(info.loop_json).get<LoopState>();
  apply(resumed, path, global_batch);
  trainer_.set_global_step(resumed.position.global_step);
  last_good_ = path;
  last_good_step_ = resumed.position.global_step;
  const TrainConfig& config = trainer_.config();
  resumed.finished = resumed.position.epoch >= config.epochs ||
                     (config.max_steps > 0 && resumed.position.global_step >= config.max_steps);
  announce(resumed, path);
  return resumed;
}

// The checkpoint's position in this run's terms, after the settings check.
void Checkpointer::apply(Resumed& resumed, const std::string& path, int64_t global_batch) const {
  TrainingPosition& position = resumed.position;
  if (position.samples == 0 && position.next_batch > 0)  // written before positions were counted in samples
    position.samples = position.next_batch * global_batch;
  const std::string where = "sample " + std::to_string(position.samples) + " of epoch " + std::to_string(position.epoch + 1);
  check_resume_settings(settings_, resumed.loop.settings, path, options_.force_resume, where);
  if (position.data_seed != options_.data_seed)
    log::warn("the checkpoint's data seed (" + std::to_string(position.data_seed) + ") differs from run.seed; the "
              "checkpoint's seed is used so that the data order continues exactly");
  // The same samples with the current batch: exact unless a forced change makes them not divide.
  position.next_batch = position.samples / global_batch;
  if (position.next_batch * global_batch != position.samples)
    log::warn("--force: sample " + std::to_string(position.samples) + " is not on a batch boundary with " +
              std::to_string(global_batch) + " samples per batch; going on from sample " +
              std::to_string(position.next_batch * global_batch) + " (some samples are seen twice)");
  position.world_size = options_.dist.world_size;
}

void Checkpointer::announce(const Resumed& resumed, const std::string& path) const {
  if (!options_.dist.is_main) return;
  const TrainingPosition& p = resumed.position;
  if (resumed.finished)
    log::info("checkpoint '" + path + "' is at the end of its run (" + std::to_string(p.epoch) + " epoch(s), step " +
              std::to_string(p.global_step) + "): nothing left to train; to train further, raise " + options_.epochs_key +
              (has_schedule(trainer_.config().optimizer) ? " and add --force (the learning-rate schedule "
                                                           "then stretches over the longer run)" : ""));
  else
    log::info("resumed from " + path + " at epoch " + std::to_string(p.epoch + 1) + " batch " +
              std::to_string(p.next_batch) + " (step " + std::to_string(p.global_step) + ")");
}

bool Checkpointer::saves_at_step(int64_t global_step) const {
  return options_.checkpoint && options_.checkpoint->every_steps > 0 && global_step % options_.checkpoint->every_steps == 0;
}

bool Checkpointer::saves_at_epoch_end(bool interrupted) const {
  return options_.checkpoint && (options_.checkpoint->every_epoch || (interrupted && options_.checkpoint->on_interrupt));
}

bool Checkpointer::saves_on_interrupt() const { return options_.checkpoint && options_.checkpoint->on_interrupt; }

std::string Checkpointer::save(const TrainingPosition& at, const std::vector<EpochRecord>& epochs, const EpochSums& sums,
                               bool losses_finite) {
  if (!checkpoints_ || !options_.dist.is_main) return "";
  if (!parameters_finite(trainer_.model()) || (!losses_finite && !trainer_.scaler().is_enabled())) {
    log::warn("not saving a checkpoint at step " + std::to_string(at.global_step) + ": the " +
              (losses_finite ? "parameters are" : "loss is") + " not finite; the last good checkpoint is " +
              (last_good_.empty() ? "none" : "'" + last_good_ + "'"));
    return "";
  }
  CheckpointInfo info;
  info.lab = options_.lab;
  info.tag = options_.tag;
  info.config_yaml = options_.config_yaml;
  info.extra_json = options_.checkpoint_extra;
  info.loop_json = nlohmann::json(LoopState{settings_, epochs, sums}).dump();
  info.position = at;
  TrainingState state{trainer_.model(), trainer_.optimizer(), trainer_.scaler()};
  std::string path = checkpoints_->save(state, info);
  log::debug("checkpoint saved: " + path);
  last_good_ = path;
  last_good_step_ = at.global_step;
  return path;
}

std::string Checkpointer::last_good_note() const {
  return last_good_.empty() ? std::string("; no good checkpoint was saved")
                            : "; the last good checkpoint is '" + last_good_ + "' (step " + std::to_string(last_good_step_) + ")";
}

std::string Checkpointer::interrupted_message(int64_t epoch, int64_t global_step, const std::string& saved,
                                              bool finished) const {
  std::string message = "interrupted at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(global_step) +
                        (finished ? ", after its last step: training had finished" : "");
  if (!saved.empty()) return message + "; checkpoint saved to " + saved + (finished ? "" : "; resume with --resume " + saved);
  message += std::string("; no checkpoint saved") + (options_.checkpoint && options_.checkpoint->on_interrupt ? "" : " (checkpoint.on_interrupt=false)");
  if (last_good_.empty()) return message + ", none to resume from";
  return message + ": the last is '" + last_good_ + "' at step " + std::to_string(last_good_step_) +
         (last_good_step_ < global_step ? ", so the steps after it are lost" : "") + "; resume with --resume " + last_good_;
}

}  // namespace amplab
