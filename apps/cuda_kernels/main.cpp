// Lab 6, CUDA kernels: each part's kernels against PyTorch on one GPU (and, for element-wise, convolution
// and matmul, against PyTorch's CPU op on the same sizes). Prints a table per part
// (element-wise, reduction, convolution, matrix multiply, fused bias + GELU), writes them as CSV,
// the filtered photographs as PNGs, and the roofline and bandwidth plots, into the run directory.
//   build/bin/cuda_kernels [--config configs/cuda_kernels.yaml] [--set key=value ...]
// Without a GPU it says so in one line and exits 0. A kernel whose TODO is still empty shows the
// TODO in its row; the rest of the lab runs.
#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "amplab/infra/device.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/timing.hpp"
#include "bias_gelu_mlp.hpp"
#include "images.hpp"
#include "amplab/report/table.hpp"
#include "amplab/train/precision.hpp"
#include "config.hpp"
#include "cuda_kernels.hpp"
#include "kernel_bench.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "photo.hpp"

namespace {

namespace ck = cuda_kernels;
using namespace cuda_kernels;  // the lab's kernels and its given bench and photograph
using amplab::decimals;
using nlohmann::json;

using Lab = amplab::Lab<KernelsConfig>;

// ---- the parts: each records its table and prints it ----------------------------------------------

std::string threads_title(const std::string& what, int64_t n, int threads) {
  std::ostringstream title;
  title << what << n / 1e6 << " M floats, " << threads << " threads per block";
  return title.str();
}

void part_elementwise(Lab& lab, const Timer& timer, Plots& plots) {
  const int64_t n = lab.config.sizes.elementwise_n;
  const int threads = lab.config.bench.threads;
  auto options = torch::TensorOptions().device(timer.device);
  auto a = torch::randn({n}, options), b = torch::randn({n}, options), c = torch::empty_like(a);
  const torch::Tensor want = a + b;
  const auto costs = cost([&] { return ck::vector_add_cost(n); });
  auto& table = lab.results.table("elementwise", {{"kernel", "kernel"}, {"ms", "ms", decimals(4)}, {"gbs", "GB/s", decimals(0)},
                                                  {"percent_of_copy", "% of copy", decimals(1)}, {"cpu_ms", "CPU torch add ms", decimals(2)},
                                                  {"speedup_vs_cpu", "GPU speed-up over CPU", amplab::times(1)}, {"check", "check"}});
  torch::Tensor a_cpu = a.cpu(), b_cpu = b.cpu(), c_cpu = torch::empty_like(a_cpu);
  const double add_cpu_ms = cpu_ms(lab.config.bench, n, [&] { torch::add_out(c_cpu, a_cpu, b_cpu); });
  auto row = [&](const std::string& name, const Outcome& o, double moved, bool ours) {
    const double gbs = moved / (o.ms * 1e6), cpu = name == "device copy (torch)" ? NAN : add_cpu_ms;
    table.add({name, o.time(), gbs, 100 * gbs / plots.copy_gbs, cpu, cpu / o.ms, o.checked()});
    plots.gbs("add", name, gbs, ours);
  };
  row("device copy (torch)", {timer.ms([&] { c.copy_(a); }), "", "-"}, 8.0 * n, false);
  row("torch add", {timer.ms([&] { torch::add_out(c, a, b); }), "", "-"}, 12.0 * n, false);
  for (auto version : {ck::AddVersion::grid_stride, ck::AddVersion::float4}) {
    const Outcome o = timer.kernel(
        [&] { return torch::equal(ck::vector_add(a, b, version, threads), want) ? "exact" : "WRONG"; },
        [&] { ck::vector_add(a, b, version, threads); });
    row(ck::name(version), o, costs ? costs->bytes : NAN, true);
    plots.point("elementwise", ck::name(version), costs, o.ms);
  }
  lab.results.print("elementwise", threads_title("1. Element-wise: c = a + b, ", n, threads), costs ? "" : kNoCostModel);
}

void part_reduction(Lab& lab, const Timer& timer, Plots& plots) {
  const int64_t n = lab.config.sizes.reduction_n;
  const int threads = lab.config.bench.threads;
  auto x = torch::rand({n}, torch::TensorOptions().device(timer.device));
  const double exact = x.to(torch::kFloat64).sum().item<double>();
  const auto costs = cost([&] { return ck::reduce_cost(n); });
  auto& table = lab.results.table("reduction", {{"kernel", "kernel"}, {"ms", "ms", decimals(4)}, {"gbs", "GB/s", decimals(0)},
                                                {"percent_of_copy", "% of copy", decimals(1)},
                                                {"vs_torch_sum", "vs torch.sum", amplab::times(2)},
                                                {"relative_error", "relative error"}});
  const double torch_ms = timer.ms([&] { x.sum(); });
  auto error_of = [&](const torch::Tensor& sum) {
    std::ostringstream s;
    s << std::setprecision(2) << std::abs(sum.item<double>() - exact) / exact;
    return s.str();
  };
  auto row = [&](const std::string& name, const Outcome& o, double moved, bool ours) {
    const double gbs = moved / (o.ms * 1e6);
    table.add({name, o.time(), gbs, 100 * gbs / plots.copy_gbs, torch_ms / o.ms, o.checked()});
    plots.gbs("sum", name, gbs, ours);
  };
  row("torch.sum", {torch_ms, "", error_of(x.sum())}, 4.0 * n, false);
  for (auto version : {ck::ReduceVersion::interleaved, ck::ReduceVersion::sequential, ck::ReduceVersion::first_add,
                       ck::ReduceVersion::warp_shuffle}) {
    const Outcome o = timer.kernel([&] { return error_of(ck::reduce_sum(x, version, threads)); },
                                 [&] { ck::reduce_sum(x, version, threads); });
    row(ck::name(version), o, costs ? costs->bytes : NAN, true);
    plots.point("reduction", ck::name(version), costs, o.ms);
  }
  lab.results.print("reduction", threads_title("2. Reduction: sum of ", n, threads), costs ? "" : kNoCostModel);
}

void part_convolution(Lab& lab, const Timer& timer, Plots& plots) {
  const auto [photo, footer] = ck::filter_photo(lab.config.convolution, lab.run, lab.device);
  // Timing on the photograph scaled up to bench_size^2.
  const int64_t s = lab.config.convolution.bench_size;
  namespace F = torch::nn::functional;
  torch::Tensor big = F::interpolate(photo.view({1, 1, photo.size(0), photo.size(1)}),
                                     F::InterpolateFuncOptions().size(std::vector<int64_t>{s, s}).mode(torch::kBilinear).align_corners(false))
                          .view({s, s})
                          .contiguous();
  auto& table = lab.results.table("convolution", {{"filter", "filter"}, {"kernel", "kernel"}, {"ms", "ms", decimals(4)},
                                                  {"gbs", "GB/s", decimals(0)}, {"vs_torch", "vs torch conv2d", amplab::times(1)},
                                                  {"cpu_ms", "CPU conv2d ms", decimals(2)},
                                                  {"speedup_vs_cpu", "GPU speed-up over CPU", amplab::times(1)}, {"check", "check"}});
  const torch::Tensor big_cpu = big.cpu().view({1, 1, s, s});
  std::set<int64_t> on_roofline;  // filter sizes with a point on the roofline (the first filter of each)
  for (const auto& name : lab.config.convolution.filters) {
    torch::Tensor filter = filter_named(name).to(timer.device);
    const int64_t k = filter.size(0);
    auto torch_conv = [&] { return torch::conv2d(big.view({1, 1, s, s}), filter.view({1, 1, k, k}), {}, 1, k / 2); };
    torch::Tensor want;
    {
      amplab::Tf32Guard fp32(false);  // the check's reference in true fp32
      want = torch_conv().view({s, s});
    }
    const auto costs = cost([&] { return ck::conv2d_cost(s, s, k / 2); });
    const double bytes = costs ? costs->bytes : NAN;
    const double torch_ms = timer.ms([&] { torch_conv(); });
    const torch::Tensor filter_cpu = filter.cpu().view({1, 1, k, k});
    const double conv_cpu_ms = cpu_ms(lab.config.bench, s * s, [&] { torch::conv2d(big_cpu, filter_cpu, {}, 1, k / 2); });
    table.add({name, "torch conv2d", torch_ms, bytes / (torch_ms * 1e6), 1.0, conv_cpu_ms, conv_cpu_ms / torch_ms, "-"});
    for (auto version : {ck::ConvVersion::naive, ck::ConvVersion::tiled}) {
      const Outcome o = timer.kernel([&] { return error_check(ck::conv2d(big, filter, version), want, 1e-5); },
                                   [&] { ck::conv2d(big, filter, version); });
      table.add({name, ck::name(version), o.time(), bytes / (o.ms * 1e6), torch_ms / o.ms, conv_cpu_ms, conv_cpu_ms / o.ms,
                 o.checked()});
      if (costs && version == ck::ConvVersion::tiled && std::isfinite(o.ms) && on_roofline.insert(k).second) {
        plots.point("convolution", "tiled " + std::to_string(k) + "x" + std::to_string(k), costs, o.ms);
        plots.gbs("conv " + name, "tiled", bytes / (o.ms * 1e6), true);
      }
    }
  }
  lab.results.print("convolution", "3. Convolution: " + std::to_string(s) + " x " + std::to_string(s) +
                                       " fp32 image (the photograph scaled up), zero padding", footer);
}

void part_matmul(Lab& lab, const Timer& timer, Plots& plots) {
  const auto& mm = lab.config.matmul;
  auto options = torch::TensorOptions().device(timer.device);
  auto& table = lab.results.table("matmul", {{"n", "n", decimals(0)}, {"kernel", "kernel"}, {"ms", "ms", decimals(3)},
                                             {"tflops", "TFLOP/s", decimals(1)}, {"percent_of_cublas", "% of cuBLAS", decimals(1)},
                                             {"cpu_ms", "CPU fp32 mm ms", decimals(1)},
                                             {"speedup_vs_cpu", "GPU speed-up over CPU", amplab::times(1)}, {"check", "check"}});
  const int64_t largest = *std::max_element(mm.sizes.begin(), mm.sizes.end());
  for (int64_t n : mm.sizes) {
    const double flops = 2.0 * n * n * n;
    // A row of the table, and the point on the roofline at the largest size.
    double mm_cpu_ms = NAN;  // torch::mm on the CPU in fp32; the bf16 rows have none
    auto row = [&](const std::string& kernel, const std::string& on_roofline, const Outcome& o, double cublas_ms, int element_bytes) {
      const double cpu = element_bytes == 4 ? mm_cpu_ms : NAN;
      table.add({n, kernel, o.time(), flops / (o.ms * 1e9), 100 * cublas_ms / o.ms, cpu, cpu / o.ms, o.checked()});
      if (n == largest)
        plots.point(element_bytes == 2 ? "matmul bf16" : "matmul", on_roofline, cost([&] { return ck::matmul_cost(n, n, n, element_bytes); }), o.ms);
    };
    torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), want;
    double cublas_ms;
    {
      amplab::Tf32Guard fp32(false);  // cuBLAS in true fp32, as our kernels
      want = torch::mm(a, b);
      cublas_ms = timer.ms([&] { torch::mm(a, b); });
    }
    {
      torch::Tensor a_cpu = a.cpu(), b_cpu = b.cpu();
      mm_cpu_ms = cpu_ms(lab.config.bench, n * n, [&] { torch::mm(a_cpu, b_cpu); });
    }
    plots.fp32_peak = std::max(plots.fp32_peak, flops / (cublas_ms * 1e9));
    row("cuBLAS fp32 (TF32 off)", "cuBLAS fp32", {cublas_ms, "", "-"}, cublas_ms, 4);
    for (auto version : {ck::MatmulVersion::naive, ck::MatmulVersion::tiled, ck::MatmulVersion::register_blocked}) {
      if (version == ck::MatmulVersion::naive && n > mm.naive_max) continue;
      row(ck::name(version), ck::name(version),
          timer.kernel([&] { return error_check(ck::matmul(a, b, version), want, 1e-4); }, [&] { ck::matmul(a, b, version); }),
          cublas_ms, 4);
    }
    if (!mm.wmma) continue;
    torch::Tensor a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    torch::Tensor want16 = torch::mm(a16.to(torch::kFloat32), b16.to(torch::kFloat32));
    const double cublas16_ms = timer.ms([&] { torch::mm(a16, b16); });
    plots.bf16_peak = std::max(plots.bf16_peak, flops / (cublas16_ms * 1e9));
    row("cuBLAS bf16", "cuBLAS bf16", {cublas16_ms, "", "-"}, cublas16_ms, 2);
    row("wmma bf16", "wmma bf16",
        timer.kernel([&] { return error_check(ck::matmul(a16, b16, ck::MatmulVersion::wmma_bf16), want16, 1e-2); },
                   [&] { ck::matmul(a16, b16, ck::MatmulVersion::wmma_bf16); }),
        cublas16_ms, 2);
  }
  lab.results.print("matmul", "4. Matrix multiply: n x n x n (% of cuBLAS in the same dtype)");
}

// The op alone, fp32 and bf16: forward, and forward + backward (autograd), composed against fused.
void part_fused_op(Lab& lab, const Timer& timer) {
  const auto& f = lab.config.fused;
  auto& table = lab.results.table("fused_op", {{"dtype", "dtype"}, {"pass", "pass"}, {"composed_ms", "composed ms", decimals(3)},
                                               {"fused_ms", "fused ms", decimals(3)}, {"speedup", "speed-up", amplab::times(2)},
                                               {"fused_gbs", "fused GB/s", decimals(0)}});
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto options = torch::TensorOptions().device(timer.device).dtype(dtype);
    auto x = torch::randn({f.rows, f.cols}, options).requires_grad_(true);
    auto bias = torch::randn({f.cols}, options).requires_grad_(true);
    auto grad_y = torch::randn({f.rows, f.cols}, options);
    const double element = dtype == torch::kBFloat16 ? 2 : 4;
    const double rc = static_cast<double>(f.rows) * f.cols;
    // Least bytes: forward reads x and bias, writes y; backward reads grad_y, x and bias, writes grad_x and grad_bias.
    const double forward_bytes = element * (2 * rc + f.cols), backward_bytes = element * (3 * rc + 2.0 * f.cols);
    for (bool backward : {false, true}) {
      auto pass = [&](auto fn) {
        if (backward) return void(torch::autograd::grad({fn(x, bias)}, {x, bias}, {grad_y}));
        torch::NoGradGuard no_grad;
        fn(x, bias);
      };
      const double composed_ms = timer.ms([&] { pass(ck::bias_gelu_composed); });
      const Outcome o = timer.kernel(
          [&] {
            torch::NoGradGuard no_grad;
            return error_check(ck::bias_gelu(x, bias), ck::bias_gelu_composed(x, bias), dtype == torch::kBFloat16 ? 1e-2 : 1e-5);
          },
          [&] { pass(ck::bias_gelu); });
      const double bytes = backward ? forward_bytes + backward_bytes : forward_bytes;
      table.add({dtype == torch::kBFloat16 ? "bf16" : "fp32", backward ? "forward + backward" : "forward", composed_ms, o.time(),
                 composed_ms / o.ms, bytes / (o.ms * 1e6)});
    }
  }
  lab.results.print("fused_op", "5. Fused bias + GELU (tanh), x " + std::to_string(f.rows) + " x " + std::to_string(f.cols));
}

// The op in an MLP training step: bf16 autocast, mlp_layers x (Linear without bias + bias + GELU), SGD;
// the bias and GELU three ways.
void part_fused_mlp(Lab& lab, const Timer& timer) {
  const auto& f = lab.config.fused;
  const cuda_kernels::BiasGeluMlp mlp(f.mlp_width, f.mlp_layers, timer.device);
  auto options = torch::TensorOptions().device(timer.device);
  auto input = torch::randn({f.mlp_batch, f.mlp_width}, options), target = torch::randn({f.mlp_batch, f.mlp_width}, options);
  torch::optim::SGD sgd(mlp.parameters(), torch::optim::SGDOptions(1e-4));
  auto& table = lab.results.table("fused_mlp", {{"epilogue", "epilogue"}, {"ms_per_step", "ms per step", decimals(3)},
                                                {"speedup_vs_composed", "speed-up vs composed", amplab::times(3)}});
  const std::vector<std::pair<std::string, cuda_kernels::BiasGeluMlp::Epilogue>> epilogues = {
      {"Linear + (x + bias) + gelu, composed", ck::bias_gelu_composed},
      {"Linear(bias) + gelu (bias in cuBLAS's epilogue)", nullptr},
      {"Linear + fused bias_gelu (yours)", ck::bias_gelu}};
  double composed_ms = NAN;
  for (const auto& [name, epilogue] : epilogues) {
    auto step = [&] {
      sgd.zero_grad();
      torch::Tensor loss;
      {
        amplab::AutocastGuard autocast(timer.device, amplab::Precision::bf16_mixed);
        loss = torch::mse_loss(mlp.forward(input, epilogue).to(torch::kFloat32), target);
      }
      loss.backward();
      sgd.step();
    };
    const Outcome o = timer.kernel([] { return std::string("-"); }, step);
    if (name == epilogues.front().first) composed_ms = o.ms;
    table.add({name, o.time(), composed_ms / o.ms});
  }
  std::ostringstream title;
  title << "5b. MLP training step: " << f.mlp_layers << " x Linear(" << f.mlp_width << ", " << f.mlp_width
        << ") + bias + GELU, batch " << f.mlp_batch << ", bf16 autocast, SGD";
  lab.results.print("fused_mlp", title.str());
}

// Refuses a thread count the reductions' trees cannot halve; without a GPU, says so and stops.
std::optional<int> check_before_run(const KernelsConfig& config, const amplab::ConfigSource& source) {
  const int threads = config.bench.threads;
  if ((threads & (threads - 1)) != 0)
    throw amplab::Error(source.where("bench.threads") + ": bench.threads: " + std::to_string(threads) +
                        " is not a power of two (the reductions' trees halve the block); allowed: 32, 64, ..., 1024");
  if (amplab::cuda_available() && !amplab::resolve_device(config.run.device).is_cpu()) return std::nullopt;
  std::cout << "cuda_kernels: this lab runs CUDA kernels and needs a GPU; "
            << (amplab::cuda_available() ? "run.device is cpu" : "no CUDA device is visible here")
            << ": run it on a GPU machine (labs/cuda_kernels/README.md)" << std::endl;
  return amplab::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  const amplab::LabInfo info{amplab::this_lab::kName, amplab::this_lab::kTitle, /*accepts_resume=*/false,
                             "sizes.elementwise_n, sizes.reduction_n, convolution.bench_size, matmul.sizes, fused.rows, "
                             "fused.cols, fused.mlp_width, fused.mlp_batch"};
  return amplab::lab_main<KernelsConfig>(argc, argv, info, check_before_run, [](Lab& lab) {
    const Timer timer{lab.config.bench, lab.device};
    Plots plots{lab.results};
    lab.phase("memory roof");
    {  // The memory roof: a device-to-device copy of 400 MB (read + write).
      auto source = torch::randn({100'000'000}, torch::TensorOptions().device(lab.device));
      auto target = torch::empty_like(source);
      plots.copy_gbs = 8e8 / (timer.ms([&] { target.copy_(source); }) * 1e6);
    }
    std::cout << "device copy " << amplab::fixed(plots.copy_gbs, 0) << " GB/s (the memory roof)\n";
    for (const auto& part : lab.config.bench.parts) {
      lab.phase(part == "fused" ? "fused_op" : part);  // a phase per table
      if (part == "elementwise") part_elementwise(lab, timer, plots);
      if (part == "reduction") part_reduction(lab, timer, plots);
      if (part == "convolution") part_convolution(lab, timer, plots);
      if (part == "matmul") part_matmul(lab, timer, plots);
      if (part == "fused") part_fused_op(lab, timer);
      if (part != "fused" || lab.config.fused.mlp_layers == 0) continue;
      lab.phase("fused_mlp");
      part_fused_mlp(lab, timer);
    }
    lab.phase("");
    lab.results.set("roofs", plots.roofs());
    lab.draw_plots = lab.config.bench.plots;
    return amplab::kExitOk;
  });
}
