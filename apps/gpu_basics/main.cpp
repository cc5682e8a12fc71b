// Lab 1, GPU basics: what the device is, where tensors live, how to time GPU work, how fast
// memory moves, and where the GPU starts to beat the CPU at matrix products.
//   build/bin/gpu_basics [--config configs/gpu_basics.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <iostream>

#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"
#include "gpu_basics.hpp"

namespace {

struct BenchConfig {
  int warmup = 3;                   // untimed runs before timing
  int repeats = 10;                 // timed runs; the median is reported
  std::vector<int64_t> matmul_sizes = {128, 256, 512, 1024, 2048, 4096, 8192};  // n of n x n x n
  int64_t cpu_max_size = 2048;      // larger CPU matmuls take too long to be worth the wait
  std::vector<std::string> dtypes = {"fp32", "tf32", "fp16", "bf16"};
  int64_t copy_mib = 256;           // size of the bandwidth test tensors

  template <class V>
  void fields(V& v) {
    v.field("warmup", warmup, "untimed runs before timing", amplab::Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed runs (median reported)", amplab::Range<int64_t>::at_least(1));
    v.field("matmul_sizes", matmul_sizes, "n of the n x n x n matmuls", amplab::Range<int64_t>::between(1, 32768));
    v.field("cpu_max_size", cpu_max_size, "largest n timed on the CPU", amplab::Range<int64_t>::at_least(1));
    v.field("dtypes", dtypes, "matmul types", {"fp32", "tf32", "fp16", "bf16"});
    v.field("copy_mib", copy_mib, "bandwidth test size (MiB)", amplab::Range<int64_t>::between(1, 16384));
  }
};

struct GpuBasicsConfig {
  amplab::RunConfig run;
  BenchConfig bench;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("bench", bench);
  }
};

torch::ScalarType dtype_of(const std::string& name) {
  if (name == "fp16") return torch::kHalf;
  if (name == "bf16") return torch::kBFloat16;
  return torch::kFloat32;  // fp32 and tf32 (tf32 is fp32 storage with TF32 tensor-core math)
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&] {
    GpuBasicsConfig config;
    amplab::CommandLine cli;
    GpuBasicsConfig defaults;
    if (auto code = amplab::parse_command_line(argc, argv, "gpu_basics", "Lab 1: GPU basics", amplab::describe_keys(defaults),
                                               cli, /*accepts_resume=*/false))
      return *code;
    amplab::load_lab_config(cli, config);
    amplab::RunDir run = amplab::RunDir::create(config.run, "gpu_basics", amplab::to_yaml(config));
    amplab::apply_run_settings(config.run);
    torch::Device device = amplab::resolve_device(config.run.device);
    const auto& bench = config.bench;
    nlohmann::json summary;

    // 1. The device.
    auto report = gpu_basics::describe_device(device);
    amplab::Table device_table({"device", "name", "SMs", "memory (GiB)", "compute capability", "CUDA", "cuDNN", "CPU threads"});
    device_table.add_row({report.device, report.name, std::to_string(report.multiprocessors), amplab::fixed(report.memory_gib, 1),
                          report.compute_capability, report.cuda_runtime, report.cudnn, std::to_string(report.cpu_threads)});
    std::cout << "\n== Device ==\n" << device_table.to_string();
    device_table.write_csv(run.file("device.csv"));
    summary["device"] = {{"name", report.name}, {"sms", report.multiprocessors}, {"memory_gib", report.memory_gib}};
    if (device.is_cpu())
      std::cout << "(no GPU here" << (amplab::cuda_available() ? "" : ": no CUDA device visible")
                << "; GPU sections below are skipped. Run on a GPU machine for them.)\n";

    // 2. Where tensors live, and what happens when they disagree.
    torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
    gpu_basics::move_to_device(*model, device);
    auto misplaced = gpu_basics::tensors_not_on(*model, device);
    std::cout << "\n== Placement ==\nmodel moved to " << device.str() << "; tensors elsewhere: " << misplaced.size() << "\n";
    torch::Device other = device.is_cuda() ? torch::Device(torch::kCPU) : torch::Device(torch::kMeta);
    std::cout << "adding a " << device.str() << " tensor to a " << other.str() << " tensor: "
              << gpu_basics::explain_device_mismatch(torch::ones({4}, device), torch::ones({4}, other)) << "\n";

    // 3. Timing: the right way against the wrong way.
    {
      int64_t n = device.is_cuda() ? 4096 : 512;
      auto a = torch::randn({n, n}, device);
      auto work = [&] { torch::mm(a, a); };
      auto right = gpu_basics::time_on_device(work, device, bench.warmup, bench.repeats);
      amplab::synchronize(device);
      auto wrong = gpu_basics::time_naively(work, bench.repeats);
      amplab::synchronize(device);
      amplab::Table timing({"method", "median (ms)", "IQR (ms)"});
      timing.add_row({device.is_cuda() ? "CUDA events" : "host clock, one run at a time", amplab::fixed(right.median, 4),
                      amplab::fixed(right.iqr, 4)});
      timing.add_row({"host clock, no synchronize", amplab::fixed(wrong.median, 4), amplab::fixed(wrong.iqr, 4)});
      std::cout << "\n== Timing a " << n << "x" << n << " matmul ==\n" << timing.to_string();
      if (device.is_cuda())
        std::cout << "the host clock only saw the kernel launch: " << amplab::fixed(right.median / std::max(wrong.median, 1e-6), 0)
                  << "x too fast\n";
      timing.write_csv(run.file("timing.csv"));
      summary["timing_ms"] = {{"events", right.median}, {"naive", wrong.median}};
    }

    // 4. Bandwidth.
    amplab::Table bandwidth({"copy", "GB/s"});
    auto bytes = torch::ones({bench.copy_mib << 20}, torch::kUInt8);
    bandwidth.add_row({"host -> host", amplab::fixed(gpu_basics::copy_bandwidth_gbs(bytes, torch::kCPU, bench.warmup, bench.repeats), 1)});
    if (device.is_cuda()) {
      bandwidth.add_row({"host (pageable) -> device", amplab::fixed(gpu_basics::copy_bandwidth_gbs(bytes, device, bench.warmup, bench.repeats), 1)});
      auto pinned = bytes.pin_memory();
      bandwidth.add_row({"host (pinned) -> device", amplab::fixed(gpu_basics::copy_bandwidth_gbs(pinned, device, bench.warmup, bench.repeats), 1)});
      auto on_device = bytes.to(device);
      bandwidth.add_row({"device -> host (pageable)", amplab::fixed(gpu_basics::copy_bandwidth_gbs(on_device, torch::kCPU, bench.warmup, bench.repeats), 1)});
      bandwidth.add_row({"device -> device", amplab::fixed(gpu_basics::copy_bandwidth_gbs(on_device, device, bench.warmup, bench.repeats), 1)});
    }
    std::cout << "\n== Memory bandwidth (" << bench.copy_mib << " MiB) ==\n" << bandwidth.to_string();
    bandwidth.write_csv(run.file("bandwidth.csv"));

    // 5. Matmul throughput against size: where does the GPU start to win?
    amplab::Table matmul({"n", "dtype", "CPU TFLOP/s", device.is_cuda() ? "GPU TFLOP/s" : "GPU", "GPU / CPU"});
    nlohmann::json matmul_json = nlohmann::json::array();
    for (const auto& dtype_name : bench.dtypes) {
      bool cpu_ok = dtype_name == "fp32" || dtype_name == "bf16";  // TF32 is a GPU feature; fp16 matmul is slow on CPUs
      for (int64_t n : bench.matmul_sizes) {
        double cpu = NAN, gpu = NAN;
        if (cpu_ok && n <= bench.cpu_max_size)
          // As many runs as on the GPU: at small sizes one run is a fraction of a millisecond and a
          // single late-waking CPU thread decides it, so a median of 3 read 1 GFLOP/s at n = 128.
          cpu = gpu_basics::matmul_tflops(n, dtype_of(dtype_name), torch::kCPU, false, bench.warmup, bench.repeats);
        if (device.is_cuda())
          gpu = gpu_basics::matmul_tflops(n, dtype_of(dtype_name), device, dtype_name == "tf32", bench.warmup, bench.repeats);
        if (std::isnan(cpu) && std::isnan(gpu)) continue;
        matmul.add_row({std::to_string(n), dtype_name, amplab::fixed(cpu, 3), amplab::fixed(gpu, 1), amplab::fixed(gpu / cpu, 1)});
        matmul_json.push_back({{"n", n}, {"dtype", dtype_name}, {"cpu_tflops", std::isnan(cpu) ? nlohmann::json() : nlohmann::json(cpu)},
                               {"gpu_tflops", std::isnan(gpu) ? nlohmann::json() : nlohmann::json(gpu)}});
      }
    }
    std::cout << "\n== Matmul throughput ==\n" << matmul.to_string();
    matmul.write_csv(run.file("matmul.csv"));
    summary["matmul"] = matmul_json;
    run.write_summary(summary);
    amplab::write_report(run);
    std::cout << "\nresults: " << run.path() << "/ (device.csv, timing.csv, bandwidth.csv, matmul.csv, summary.json)\n";
    return amplab::kExitOk;
  });
}
