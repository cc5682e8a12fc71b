// EpochRecord and EpochSums as JSON, the loss window, steps.csv, metrics.csv, the epoch line and the memory report.
#include "amplab/train/epoch_log.hpp"

#include <cmath>

#include "amplab/infra/log.hpp"
#include "amplab/report/table.hpp"

namespace amplab {

void to_json(nlohmann::json& j, const EpochRecord& r) {
  j = {{"tag", r.tag}, {"epoch", r.epoch}, {"train_loss", r.train_loss}, {"seconds", r.seconds},
       {"samples_per_second", r.samples_per_second}, {"steps", r.steps}, {"skipped_steps", r.skipped_steps},
       {"loss_scale", r.loss_scale}, {"eval", r.eval}};
}

void from_json(const nlohmann::json& j, EpochRecord& r) {
  r.tag = j.at("tag");
  r.epoch = j.at("epoch");
  r.train_loss = j.at("train_loss").is_number() ? j.at("train_loss").get<double>() : NAN;
  r.seconds = j.at("seconds");
  r.samples_per_second = j.at("samples_per_second");
  r.steps = j.at("steps");
  r.skipped_steps = j.at("skipped_steps");
  r.loss_scale = j.at("loss_scale");
  r.eval = j.at("eval");
}

void to_json(nlohmann::json& j, const EpochSums& s) {
  j = {{"loss_sum", s.loss_sum}, {"loss_count", s.loss_count}, {"samples", s.samples},
       {"steps", s.steps},       {"skipped", s.skipped},       {"seconds", s.seconds}};
}

void from_json(const nlohmann::json& j, EpochSums& s) {
  s.loss_sum = j.at("loss_sum");
  s.loss_count = j.at("loss_count");
  s.samples = j.at("samples");
  s.steps = j.at("steps");
  s.skipped = j.at("skipped");
  s.seconds = j.at("seconds");
}

void LossWindow::add(const StepResult& step) {
  samples_ += step.samples;
  ++steps_;
  if (step.skipped.defined()) skipped_ = skipped_.defined() ? skipped_ + step.skipped : step.skipped;
  pending_.push_back(step.loss);
}

LossWindow::Reading LossWindow::read(const std::function<torch::Tensor(const torch::Tensor&)>& mean) {
  Reading reading;
  torch::Tensor losses = mean(torch::stack(pending_)).to(torch::kCPU, torch::kFloat64);
  reading.losses.assign(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
  if (skipped_.defined()) reading.skipped = static_cast<int64_t>(skipped_.item<double>());
  reading.seconds = clock_.seconds();
  reading.samples = samples_;
  reading.steps = steps_;
  pending_.clear();
  skipped_ = torch::Tensor();
  samples_ = steps_ = 0;
  clock_.restart();
  return reading;
}

namespace {

std::string short_number(double v, int decimals = 4) { return fixed(v, decimals); }

double step_ms(const LossWindow::Reading& w) { return 1e3 * w.seconds / static_cast<double>(std::max<int64_t>(w.steps, 1)); }
double samples_per_second(const LossWindow::Reading& w) { return static_cast<double>(w.samples) / std::max(w.seconds, 1e-9); }

// Evaluation results as table cells, in the record's order.
std::string eval_cell(const nlohmann::json& value, int decimals) {
  return value.is_number() ? short_number(value.get<double>(), decimals) : value.dump();
}

}  // namespace

EpochLog::EpochLog(std::string tag, const RunDir* run_dir, bool main)
    : tag_(std::move(tag)), tag_prefix_(tag_.empty() ? "" : "[" + tag_ + "] "), run_dir_(run_dir), main_(main) {
  if (run_dir_ && run_dir_->enabled() && main_)
    steps_csv_ = std::make_unique<CsvLog>(run_dir_->file("steps.csv"),
                                          std::vector<std::string>{"tag", "epoch", "step", "loss", "samples_per_s",
                                                                   "step_ms", "loss_scale", "skipped_steps"},
                                          /*append=*/true);
}

std::string EpochLog::window_note(const LossWindow::Reading& w, double scale, bool scaling) const {
  return "loss " + short_number(w.losses.back()) + ", " + fixed(samples_per_second(w), 0) + " samples/s, " +
         fixed(step_ms(w), 2) + " ms/step" + (scaling ? ", scale " + fixed(scale, 0) : "");
}

void EpochLog::step_row(int64_t epoch, int64_t global_step, const LossWindow::Reading& w, double scale, int64_t skipped) {
  if (!steps_csv_) return;
  steps_csv_->row({tag_, std::to_string(epoch), std::to_string(global_step), short_number(w.losses.back(), 6),
                   fixed(samples_per_second(w), 1), fixed(step_ms(w), 3), fixed(scale, 1), std::to_string(skipped)});
}

void EpochLog::epoch_done(const EpochRecord& record) {
  if (!main_) return;
  std::string line = tag_prefix_ + "epoch " + std::to_string(record.epoch) + ": train loss " +
                     short_number(record.train_loss) + ", " + fixed(record.seconds, 2) + " s, " +
                     fixed(record.samples_per_second, 0) + " samples/s";
  for (const auto& [key, value] : record.eval.items()) line += ", " + key + " " + eval_cell(value, 4);
  if (record.skipped_steps) line += ", " + std::to_string(record.skipped_steps) + " skipped steps";
  log::info(line);
  if (!run_dir_ || !run_dir_->enabled()) return;
  if (!metrics_csv_) {
    std::vector<std::string> columns{"tag",   "epoch",         "train_loss", "seconds", "samples_per_s",
                                     "steps", "skipped_steps", "loss_scale"};
    for (const auto& [key, value] : record.eval.items()) columns.push_back(key);
    metrics_csv_ = std::make_unique<CsvLog>(run_dir_->file("metrics.csv"), columns, /*append=*/true);
  }
  std::vector<std::string> row{tag_,
                               std::to_string(record.epoch),
                               short_number(record.train_loss, 6),
                               fixed(record.seconds, 4),
                               fixed(record.samples_per_second, 1),
                               std::to_string(record.steps),
                               std::to_string(record.skipped_steps),
                               fixed(record.loss_scale, 1)};
  for (const auto& [key, value] : record.eval.items()) row.push_back(eval_cell(value, 6));
  metrics_csv_->row(row);
}

void EpochLog::leak_warning(const MemoryTracker& memory) const {
  std::string leak = memory.leak_report();
  if (!leak.empty() && main_) log::warn(leak);
}

// A summary per phase, and the timeline for scripts/plot.py memory.
void EpochLog::memory_report(const MemoryTracker& memory, torch::Device device) const {
  if (!main_ || !memory.enabled()) return;
  log::info(tag_prefix_ + "memory per phase (" + (memory_is_rss(device) ? "process RSS" : "CUDA allocator") + "):\n" +
            memory.summary_table());
  if (!run_dir_ || !run_dir_->enabled() || memory.timeline().empty()) return;
  std::string name = tag_.empty() ? "memory_timeline.csv" : "memory_timeline-" + tag_ + ".csv";
  for (char& c : name)
    if (c == ' ' || c == '(' || c == ')') c = '_';
  memory.write_timeline_csv(run_dir_->file(name));
}

}  // namespace amplab
