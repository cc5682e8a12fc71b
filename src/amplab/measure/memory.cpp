// Memory per phase (memory.hpp): the CUDA allocator's counters on a GPU, the process's RSS on a CPU.
#include "amplab/measure/memory.hpp"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#ifdef AMPLAB_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>  // cudaMemGetInfo: the total a memory cap is a fraction of
#include <nvtx3/nvToolsExt.h>
#endif

#include "amplab/infra/error.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/measure/trace.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/report/table.hpp"

namespace amplab {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// VmRSS and VmHWM from /proc/self/status, in bytes.
std::pair<int64_t, int64_t> rss_and_peak() {
  std::ifstream in("/proc/self/status");
  std::string line;
  int64_t rss = 0, hwm = 0;
  while (std::getline(in, line)) {
    auto value = [&] { return std::stoll(line.substr(line.find(':') + 1)) * 1024; };  // kB
    if (line.rfind("VmRSS:", 0) == 0) rss = value();
    if (line.rfind("VmHWM:", 0) == 0) hwm = value();
  }
  return {rss, hwm};
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::other: return "other";
  }
  return "?";
}

bool memory_is_rss(torch::Device device) { return !device.is_cuda(); }

MemoryReading read_memory(torch::Device device) {
  MemoryReading r;
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);  // the allocator has no stats before CUDA starts
    using c10::CachingDeviceAllocator::StatType;
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    const auto all = static_cast<size_t>(StatType::AGGREGATE);
    r.allocated = stats.allocated_bytes[all].current;
    r.peak_allocated = stats.allocated_bytes[all].peak;
    r.reserved = stats.reserved_bytes[all].current;
    r.peak_reserved = stats.reserved_bytes[all].peak;
    r.alloc_retries = stats.num_alloc_retries;
    r.ooms = stats.num_ooms;
    return r;
  }
#endif
  auto [rss, hwm] = rss_and_peak();
  r.allocated = r.reserved = rss;
  r.peak_allocated = r.peak_reserved = hwm;
  return r;
}

void reset_peak_memory(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
    return;
  }
#endif
  // Writing 5 to clear_refs resets the high-water mark (Linux >= 4.0); best effort.
  std::ofstream("/proc/self/clear_refs") << "5";
}

struct MemoryTracker::PhaseRange {
  at::RecordFunction range{at::RecordScope::USER_SCOPE};
};

MemoryTracker::MemoryTracker(torch::Device device, const MemoryConfig& config)
    : device_(device), config_(config), start_seconds_(now_seconds()) {}

void MemoryTracker::begin(Phase phase) {
  if (!config_.track) return;
  close_phase();
  reset_peak_memory(device_);
  current_ = phase;
  phase_open_ = true;
#ifdef AMPLAB_WITH_CUDA
  nvtxRangePushA(to_string(phase));
#endif
  if (at::hasCallbacks()) {  // a profiler is recording (run.trace): the phase is a range of its trace
    range_ = std::make_shared<PhaseRange>();
    range_->range.before(to_string(phase));
  }
}

void MemoryTracker::close_phase() {
  if (!phase_open_) return;
#ifdef AMPLAB_WITH_CUDA
  nvtxRangePop();
#endif
  range_.reset();
  phase_open_ = false;
  MemoryReading reading = read_memory(device_);
  auto& peak = phase_peak_[static_cast<int>(current_)];
  peak = std::max(peak, reading.peak_allocated);
  phase_end_allocated_[static_cast<int>(current_)] = reading.allocated;
  if (config_.timeline) timeline_.push_back({step_, current_, now_seconds() - start_seconds_, reading});
}

void MemoryTracker::sample() {
  if (!config_.track || !config_.timeline || !phase_open_) return;
  PhaseSample s{step_, current_, now_seconds() - start_seconds_, read_memory(device_)};
  s.phase_end = false;
  timeline_.push_back(s);
}

void MemoryTracker::end_step(int64_t step) {
  trace_safe_point();  // between steps: run.trace may end a long phase's trace here
  if (!config_.track) return;
  close_phase();
  step_end_allocated_.push_back(read_memory(device_).allocated);
  step_end_by_phase_.push_back(phase_end_allocated_);
  step_ = step + 1;
}

std::string MemoryTracker::leak_report() const {
  const auto window = static_cast<size_t>(config_.leak_window);
  if (step_end_allocated_.size() < window) return "";
  const size_t first = step_end_allocated_.size() - window;
  // Steady growth: allocated never falls and rises in most steps of the window.
  int rises = 0;
  for (size_t i = first + 1; i < step_end_allocated_.size(); ++i) {
    if (step_end_allocated_[i] < step_end_allocated_[i - 1]) return "";
    if (step_end_allocated_[i] > step_end_allocated_[i - 1]) ++rises;
  }
  int64_t growth = step_end_allocated_.back() - step_end_allocated_[first];
  if (rises < static_cast<int>(window) / 2 || mib(growth) < config_.leak_min_mib) return "";
  // The phase whose end-of-phase allocation grew the most over the window.
  Phase worst = Phase::other;
  int64_t worst_growth = -1;
  for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer}) {
    int64_t g = step_end_by_phase_.back()[static_cast<int>(p)] - step_end_by_phase_[first][static_cast<int>(p)];
    if (g > worst_growth) worst_growth = g, worst = p;
  }
  std::ostringstream out;
  out.precision(3);
  out << (memory_is_rss(device_) ? "RSS" : "allocated GPU memory") << " grew by " << mib(growth) << " MiB over the last "
      << window << " steps (" << mib(growth) / static_cast<double>(window - 1) << " MiB/step), most in the "
      << to_string(worst) << " phase: something keeps tensors alive from one step to the next; "
         "run.memory_snapshot=true shows what (on a GPU, at pytorch.org/memory_viz)";
  return out.str();
}

void MemoryTracker::write_timeline_csv(const std::string& path) const {
  std::ostringstream out;
  out << "step,phase,seconds,allocated_mib,reserved_mib,peak_allocated_mib,peak_reserved_mib,alloc_retries,ooms,source,"
         "event\n";
  const char* source = memory_is_rss(device_) ? "cpu_rss" : "cuda_allocator";
  for (const auto& s : timeline_) {
    out << s.step << "," << to_string(s.phase) << "," << s.seconds << "," << mib(s.reading.allocated) << ","
        << mib(s.reading.reserved) << "," << mib(s.reading.peak_allocated) << "," << mib(s.reading.peak_reserved) << ","
        << s.reading.alloc_retries << "," << s.reading.ooms << "," << source << ","
        << (s.phase_end ? "phase_end" : "sample") << "\n";
  }
  write_file_atomic(path, out.str());  // whole or not at all; an IoError names the file
}

std::string MemoryTracker::summary_table() const {
  MemoryReading now = read_memory(device_);
  bool rss = memory_is_rss(device_);
  Table table({"phase", rss ? "peak RSS (MiB)" : "peak allocated (MiB)"});
  for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer})
    table.add_row({to_string(p), fixed(mib(phase_peak(p)), 1)});
  std::ostringstream out;
  table.print(out);
  out << (rss ? "CPU process RSS (includes the allocator's free memory and the whole process): now "
              : "now: allocated ")
      << fixed(mib(now.allocated), 1) << " MiB";
  if (!rss)
    out << ", reserved " << fixed(mib(now.reserved), 1) << " MiB, allocation retries " << now.alloc_retries << ", OOMs "
        << now.ooms;
  out << "\n";
  return out.str();
}

std::string explain_oom(const std::string& torch_message, torch::Device device, Phase phase) {
  MemoryReading r = read_memory(device);
  std::string asked = torch_message.substr(0, torch_message.find('.'));
  std::ostringstream out;
  out.precision(4);
  out << "out of memory on " << device.str() << " during the " << to_string(phase) << " phase (" << asked << "); in use: "
      << mib(r.allocated) << " MiB allocated by tensors, " << mib(r.reserved)
      << " MiB reserved by the caching allocator; try: a smaller train.batch_size with train.accumulation_steps "
         "to keep the effective batch, train.precision=bf16-mixed or fp16-mixed, or activation checkpointing";
  return out.str();
}

bool is_out_of_memory(const std::exception& error) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error)) return true;
  // cuBLAS and cuDNN report a failed workspace allocation through their own status codes.
  std::string what = error.what();
  return what.find("CUDA out of memory") != std::string::npos || what.find("ALLOC_FAILED") != std::string::npos;
}

std::string oom_summary(const std::exception& error) {
  std::string what = error.what();
  auto end = what.find_first_of("\n");
  std::string line = what.substr(0, end);
  // The allocator's message: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."
  auto tried = line.find(". GPU");
  return tried == std::string::npos ? line : line.substr(0, tried);
}

void free_cached_memory(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
}

int64_t device_total_memory(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device.has_index() ? device.index() : 0);
    size_t free = 0, total = 0;
    cudaError_t status = cudaMemGetInfo(&free, &total);
    cudaSetDevice(previous);
    if (status != cudaSuccess) throw Error(std::string("cudaMemGetInfo failed: ") + cudaGetErrorString(status));
    return static_cast<int64_t>(total);
  }
#endif
  return 0;
}

void limit_device_memory(torch::Device device, int64_t bytes) {
  if (!device.is_cuda())
    throw Error("a device memory cap needs a GPU (" + device.str() +
                " has none to cap); on the CPU the lab simulates a limit instead");
#ifdef AMPLAB_WITH_CUDA
  const int64_t total = device_total_memory(device);
  if (bytes > total)
    throw Error("memory cap of " + fixed(mib(bytes), 0) + " MiB exceeds " + device.str() + "'s " + fixed(mib(total), 0) +
                " MiB; choose a smaller cap (or 0 for none)");
  double fraction = bytes <= 0 ? 1.0 : static_cast<double>(bytes) / static_cast<double>(total);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.has_index() ? device.index() : 0);
#endif
}

int64_t available_cpu_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

void require_cpu_memory(int64_t bytes, const std::string& what, const std::string& keys) {
  const int64_t available = available_cpu_bytes();
  if (available < 0 || bytes <= available) return;
  auto gib = [](int64_t b) { return fixed(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0), 1) + " GiB"; };
  throw Error(what + " needs at least " + std::to_string(bytes) + " bytes (" + gib(bytes) + ") of CPU memory, " +
              gib(available) + " are available; lower " + keys);
}

}  // namespace amplab
