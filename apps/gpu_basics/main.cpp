// Lab 1, GPU basics: what the device is, where tensors live, how to time GPU work, how fast
// memory moves, and where the GPU starts to beat the CPU at matrix products.
//   build/bin/gpu_basics [--config configs/gpu_basics.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "amplab/infra/device.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/report/table.hpp"
#include "config.hpp"
#include "gpu_basics.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml

namespace {

using amplab::decimals;
using gpu_basics::GpuBasicsConfig;

using GpuLab = amplab::Lab<GpuBasicsConfig>;

void describe_device(GpuLab& lab) {
  auto r = gpu_basics::describe_device(lab.device);
  lab.results
      .table("device", {{"device", "device"}, {"name", "name"}, {"sms", "SMs", decimals(0)},
                        {"memory_gib", "memory (GiB)", decimals(1)}, {"compute_capability", "compute capability"},
                        {"cuda", "CUDA"}, {"cudnn", "cuDNN"}, {"cpu_threads", "CPU threads", decimals(0)}})
      .add({r.device, r.name, r.multiprocessors, r.memory_gib, r.compute_capability, r.cuda_runtime, r.cudnn, r.cpu_threads});
  lab.results.print("device", "Device",
                    lab.on_cpu() ? std::string("(no GPU here") + (amplab::cuda_available() ? "" : ": no CUDA device visible") +
                                       "; GPU sections below are skipped. Run on a GPU machine for them.)\n"
                                 : "");
}

// Where tensors live, and what happens when they disagree.
void show_placement(const GpuLab& lab) {
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  gpu_basics::move_to_device(*model, lab.device);
  auto misplaced = gpu_basics::tensors_not_on(*model, lab.device);
  std::cout << "\n== Placement ==\nmodel moved to " << lab.device.str() << "; tensors elsewhere: " << misplaced.size() << "\n";
  torch::Device other = lab.on_cpu() ? torch::Device(torch::kMeta) : torch::Device(torch::kCPU);
  std::cout << "adding a " << lab.device.str() << " tensor to a " << other.str() << " tensor: "
            << gpu_basics::explain_device_mismatch(torch::ones({4}, lab.device), torch::ones({4}, other)) << "\n";
}

// Timing: the right way against the wrong way.
void time_matmul(GpuLab& lab) {
  const auto& bench = lab.config.bench;
  const int64_t n = lab.on_cpu() ? 512 : 4096;
  lab.phase("timing");
  auto a = torch::randn({n, n}, lab.device);
  auto work = [&] { torch::mm(a, a); };
  auto right = gpu_basics::time_on_device(work, lab.device, bench.warmup, bench.repeats);
  amplab::synchronize(lab.device);
  auto wrong = gpu_basics::time_naively(work, bench.repeats);
  amplab::synchronize(lab.device);
  lab.results.table("timing", {{"method", "method"}, {"median_ms", "median (ms)", decimals(4)}, {"iqr_ms", "IQR (ms)", decimals(4)}})
      .add({lab.on_cpu() ? "host clock, one run at a time" : "CUDA events", right.median, right.iqr})
      .add({"host clock, no synchronize", wrong.median, wrong.iqr});
  lab.results.set("timing_ms", {{"events", right.median}, {"naive", wrong.median}});
  lab.results.print("timing", "Timing a " + std::to_string(n) + "x" + std::to_string(n) + " matmul",
                    lab.on_cpu() ? "" : "the host clock only saw the kernel launch: " +
                                            amplab::fixed(right.median / std::max(wrong.median, 1e-6), 0) + "x too fast\n");
}

void measure_bandwidth(GpuLab& lab) {
  const auto& bench = lab.config.bench;
  lab.phase("bandwidth");
  auto& table = lab.results.table("bandwidth", {{"copy", "copy"}, {"gb_s", "GB/s", decimals(1)}});
  auto copy = [&](const char* what, const torch::Tensor& from, torch::Device to) {
    table.add({what, gpu_basics::copy_bandwidth_gbs(from, to, bench.warmup, bench.repeats)});
  };
  auto bytes = torch::ones({bench.copy_mib << 20}, torch::kUInt8);
  copy("host -> host", bytes, torch::kCPU);
  if (!lab.on_cpu()) {
    copy("host (pageable) -> device", bytes, lab.device);
    copy("host (pinned) -> device", bytes.pin_memory(), lab.device);
    auto on_device = bytes.to(lab.device);
    copy("device -> host (pageable)", on_device, torch::kCPU);
    copy("device -> device", on_device, lab.device);
  }
  lab.results.print("bandwidth", "Memory bandwidth (" + std::to_string(bench.copy_mib) + " MiB)");
}

// Matmul throughput against size: where does the GPU start to win?
void sweep_matmul(GpuLab& lab) {
  const auto& bench = lab.config.bench;
  lab.phase("matmul");
  auto& table = lab.results.table("matmul", {{"n", "n", decimals(0)}, {"dtype", "dtype"},
                                             {"cpu_tflops", "CPU TFLOP/s", decimals(3)},
                                             {"gpu_tflops", lab.on_cpu() ? "GPU" : "GPU TFLOP/s", decimals(1)},
                                             {"gpu_over_cpu", "GPU / CPU", decimals(1)}});
  amplab::run_then_record([&] {
    for (const auto& dtype_name : bench.dtypes) {
      const auto dtype = dtype_name == "fp16" ? torch::kHalf : dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat32;
      const bool cpu_ok = dtype_name == "fp32" || dtype_name == "bf16";  // TF32 is a GPU feature; fp16 matmul is slow on CPUs
      for (int64_t n : bench.matmul_sizes) {
        amplab::stop_if_interrupted();  // a size at a time: the largest CPU ones take seconds
        double cpu = NAN, gpu = NAN;
        if (cpu_ok && n <= bench.cpu_max_size)
          // As many runs as on the GPU: at small sizes one run is a fraction of a millisecond and a
          // single late-waking CPU thread decides it, so a median of 3 read 1 GFLOP/s at n = 128.
          cpu = gpu_basics::matmul_tflops(n, dtype, torch::kCPU, false, bench.warmup, bench.repeats);
        if (!lab.on_cpu()) gpu = gpu_basics::matmul_tflops(n, dtype, lab.device, dtype_name == "tf32", bench.warmup, bench.repeats);
        if (!std::isnan(cpu) || !std::isnan(gpu)) table.add({n, dtype_name, cpu, gpu, gpu / cpu});  // NaN: not timed
      }
    }
  }, [&] { lab.results.print("matmul", "Matmul throughput"); });
}

}  // namespace

int main(int argc, char** argv) {
  const amplab::LabInfo info{amplab::this_lab::kName, amplab::this_lab::kTitle, /*accepts_resume=*/false, "bench.copy_mib or bench.matmul_sizes"};
  return amplab::lab_main<GpuBasicsConfig>(argc, argv, info, [](GpuLab& lab) {
    describe_device(lab);
    show_placement(lab);
    time_matmul(lab);
    measure_bandwidth(lab);
    sweep_matmul(lab);
    lab.draw_plots = true;  // matmul.png
    return amplab::kExitOk;
  });
}
