// The GPU through a whole run, sampled on a thread of its own (gpu_timeline.hpp).
#include "amplab/measure/gpu_timeline.hpp"

#include <algorithm>
#include <cstdio>

#include "amplab/infra/append_file.hpp"

namespace amplab {

GpuTimeline::GpuTimeline(torch::Device device, const std::string& csv_path, std::chrono::milliseconds period)
    : gpu_(nvml::Gpu::open(device)), period_(period), start_(std::chrono::steady_clock::now()) {
  if (!gpu_) return;
  if (!csv_path.empty()) {
    csv_ = std::make_unique<AppendFile>(csv_path, /*truncate=*/true);
    csv_->append("time_s,phase,sm_util_pct,memory_util_pct,memory_used_mib,power_w,sm_clock_mhz,temperature_c\n");
  }
  running_ = true;
  thread_ = std::thread([this] { sample_until_stopped(); });
}

GpuTimeline::~GpuTimeline() { stop(); }

void GpuTimeline::phase(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = std::find(phase_names_.begin(), phase_names_.end(), name);
  current_phase_ = static_cast<size_t>(found - phase_names_.begin());
  if (found == phase_names_.end()) phase_names_.push_back(name);
}

void GpuTimeline::stop() {
  if (!thread_.joinable()) return;
  running_ = false;
  thread_.join();
}

GpuTimeline::Sample GpuTimeline::read(double t, size_t phase) const {
  Sample s;
  s.t = t;
  s.phase = phase;
  gpu_->utilization(s.sm_util, s.memory_util);
  gpu_->memory_used_bytes(s.memory_used);
  gpu_->power_milliwatts(s.milliwatts);
  gpu_->sm_clock_mhz(s.sm_mhz);
  gpu_->temperature_c(s.celsius);
  return s;
}

void GpuTimeline::sample_until_stopped() {
  auto next = std::chrono::steady_clock::now();
  while (running_) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    size_t phase;
    std::string phase_name;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      phase = current_phase_;
      phase_name = phase_names_[phase];
    }
    Sample s = read(t, phase);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      samples_.push_back(s);
    }
    if (csv_) {
      char line[256];
      std::snprintf(line, sizeof line, ",%u,%u,%.1f,%.1f,%u,%u\n", s.sm_util, s.memory_util,
                    static_cast<double>(s.memory_used) / (1024.0 * 1024.0), s.milliwatts / 1e3, s.sm_mhz, s.celsius);
      char time[32];
      std::snprintf(time, sizeof time, "%.3f,", s.t);
      // A phase is a lab's label: quoted when it holds a comma or a quote.
      bool quote = phase_name.find_first_of(",\"") != std::string::npos;
      std::string cell = phase_name;
      if (quote) {
        std::string escaped;
        for (char c : phase_name) escaped += c == '"' ? std::string("\"\"") : std::string(1, c);
        cell = "\"" + escaped + "\"";
      }
      csv_->append(std::string(time) + cell + line);
    }
    next += period_;
    std::this_thread::sleep_until(next);
  }
}

std::vector<GpuPhaseStats> GpuTimeline::phases() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<GpuPhaseStats> stats(phase_names_.size());
  std::vector<double> first(phase_names_.size(), -1);
  for (const auto& s : samples_) {
    auto& p = stats[s.phase];
    ++p.samples;
    p.sm_util_mean_pct += s.sm_util;
    p.power_mean_w += s.milliwatts / 1e3;
    p.sm_clock_mean_mhz += s.sm_mhz;
    p.memory_used_max_mib = std::max(p.memory_used_max_mib, static_cast<double>(s.memory_used) / (1024.0 * 1024.0));
    p.temperature_max_c = std::max(p.temperature_max_c, static_cast<double>(s.celsius));
    if (first[s.phase] < 0) first[s.phase] = s.t;
  }
  std::vector<GpuPhaseStats> order;
  std::vector<size_t> index(phase_names_.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = i;
  std::sort(index.begin(), index.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
  for (size_t i : index) {
    auto& p = stats[i];
    if (p.samples == 0) continue;
    const double n = static_cast<double>(p.samples);
    p.phase = phase_names_[i];
    p.sm_util_mean_pct /= n;
    p.power_mean_w /= n;
    p.sm_clock_mean_mhz /= n;
    p.seconds = n * std::chrono::duration<double>(period_).count();
    order.push_back(p);
  }
  return order;
}

std::optional<GpuPhaseStats> GpuTimeline::phase_stats(const std::string& name) const {
  for (const auto& p : phases())
    if (p.phase == name) return p;
  return std::nullopt;
}

nlohmann::json GpuTimeline::summary() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : phases())
    list.push_back({{"phase", p.phase.empty() ? "start" : p.phase},
                    {"seconds", p.seconds},
                    {"samples", p.samples},
                    {"sm_util_mean_pct", p.sm_util_mean_pct},
                    {"memory_used_max_mib", p.memory_used_max_mib},
                    {"power_mean_w", p.power_mean_w},
                    {"sm_clock_mean_mhz", p.sm_clock_mean_mhz},
                    {"temperature_max_c", p.temperature_max_c}});
  return list;
}

}  // namespace amplab
