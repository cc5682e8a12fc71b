// Lab 6, CUDA kernels: each part's kernels against PyTorch on one GPU. Prints a table per part
// (element-wise, reduction, convolution, matrix multiply, fused bias + GELU), writes them as CSV,
// the filtered photographs as PNGs, and the roofline and bandwidth plots, into the run directory.
//   build/bin/cuda_kernels [--config configs/cuda_kernels.yaml] [--set key=value ...]
// Without a GPU it says so in one line and exits 0. A kernel whose TODO is still empty shows the
// TODO in its row; the rest of the lab runs.
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/report/report.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"
#include "amplab/measure/timing.hpp"
#include "cuda_kernels.hpp"

namespace {

namespace ck = cuda_kernels;

const std::vector<std::string> kParts = {"elementwise", "reduction", "convolution", "matmul", "fused"};
const std::vector<std::string> kFilters = {"blur3", "sharpen3", "edge3", "blur5", "edge5"};

struct BenchConfig {
  std::vector<std::string> parts = kParts;  // which parts run, in this order
  int warmup = 3;                           // untimed calls before timing
  int repeats = 10;                         // timed windows; the median is reported
  int window = 5;                           // calls back to back in a window (time / window per call)
  int threads = 256;                        // threads per block of the element-wise and reduction kernels
  bool plots = true;                        // roofline.png, bandwidth.png (scripts/plot.py kernels)

  template <class V>
  void fields(V& v) {
    v.field("parts", parts, "parts to run", kParts);
    v.field("warmup", warmup, "untimed calls before timing", amplab::Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed windows (median reported)", amplab::Range<int64_t>::at_least(1));
    v.field("window", window, "calls back to back per timed window", amplab::Range<int64_t>::at_least(1));
    v.field("threads", threads, "threads per block, element-wise and reduction (a power of two)",
            amplab::Range<int64_t>::between(32, 1024));
    v.field("plots", plots, "draw roofline.png and bandwidth.png");
  }
};

struct SizesConfig {
  int64_t elementwise_n = 100'000'000;  // floats added (parts 1 and 2: 400 MB per vector)
  int64_t reduction_n = 100'000'000;    // floats summed

  template <class V>
  void fields(V& v) {
    v.field("elementwise_n", elementwise_n, "floats per vector of c = a + b", amplab::Range<int64_t>::between(1, 1'000'000'000));
    v.field("reduction_n", reduction_n, "floats summed", amplab::Range<int64_t>::between(1, 1'000'000'000));
  }
};

struct ConvolutionConfig {
  std::string image;               // a photograph; "" = matplotlib's grace_hopper.jpg
  std::vector<std::string> filters = kFilters;
  int64_t bench_size = 4096;       // the photograph scaled to bench_size x bench_size for timing

  template <class V>
  void fields(V& v) {
    v.field("image", image, "image file to filter (\"\": matplotlib's sample grace_hopper.jpg)");
    v.field("filters", filters, "filters applied and timed", kFilters);
    v.field("bench_size", bench_size, "side of the square image the kernels are timed on", amplab::Range<int64_t>::between(8, 16384));
  }
};

struct MatmulConfig {
  std::vector<int64_t> sizes = {1024, 2048, 4096};  // n of n x n x n
  int64_t naive_max = 4096;                         // larger n skip the naive kernel (slow)
  bool wmma = true;                                 // also bf16: WMMA against cuBLAS

  template <class V>
  void fields(V& v) {
    v.field("sizes", sizes, "n of the n x n x n products", amplab::Range<int64_t>::between(1, 16384));
    v.field("naive_max", naive_max, "largest n the naive kernel is timed at", amplab::Range<int64_t>::at_least(0));
    v.field("wmma", wmma, "also time the bf16 tensor-core kernel against cuBLAS bf16");
  }
};

struct FusedConfig {
  int64_t rows = 8192, cols = 8192;  // the op's x: (rows, cols)
  int64_t mlp_width = 8192;          // the MLP step: mlp_layers x (Linear(width, width) + bias + GELU)
  int64_t mlp_batch = 8192;
  int64_t mlp_layers = 4;

  template <class V>
  void fields(V& v) {
    v.field("rows", rows, "rows of x for the op's timing", amplab::Range<int64_t>::between(1, 1 << 20));
    v.field("cols", cols, "columns of x (the bias's size)", amplab::Range<int64_t>::between(1, 1 << 20));
    v.field("mlp_width", mlp_width, "MLP width", amplab::Range<int64_t>::between(1, 65536));
    v.field("mlp_batch", mlp_batch, "MLP batch", amplab::Range<int64_t>::between(1, 1 << 20));
    v.field("mlp_layers", mlp_layers, "MLP layers (0: no MLP step)", amplab::Range<int64_t>::between(0, 64));
  }
};

struct KernelsConfig {
  amplab::RunConfig run;
  BenchConfig bench;
  SizesConfig sizes;
  ConvolutionConfig convolution;
  MatmulConfig matmul;
  FusedConfig fused;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("bench", bench);
    v.section("sizes", sizes);
    v.section("convolution", convolution);
    v.section("matmul", matmul);
    v.section("fused", fused);
  }
};

// ---- timing and bookkeeping -------------------------------------------------------------------------

// Median milliseconds per call: `warmup` calls, then `repeats` windows of `window` calls back to back.
struct Timer {
  const BenchConfig& bench;
  torch::Device device;
  double ms(const std::function<void()>& work, int window = 0) const {
    for (int i = 0; i < bench.warmup; ++i) work();
    return amplab::quantile(amplab::time_back_to_back(work, device, window > 0 ? window : bench.window, bench.repeats), 0.5);
  }
};

// What a table row shows for a kernel: its time, or the TODO still in the way.
struct Outcome {
  double ms = NAN;
  std::string todo;   // "cuda_kernels-4" while that hole is empty
  std::string check;  // "ok", "exact", or what is wrong
};

// Runs `check` (returns the check column) then times `work`; an empty hole becomes the outcome.
Outcome run_kernel(const Timer& timer, const std::function<std::string()>& check, const std::function<void()>& work) {
  Outcome out;
  try {
    out.check = check();
    out.ms = timer.ms(work);
  } catch (const amplab::NotImplemented& e) {
    out.todo = e.todo_id();
  }
  return out;
}

std::string todo_cell(const Outcome& o) { return "TODO(" + o.todo + ")"; }

// The cost model is TODO 1: until it is filled, no GB/s, TFLOP/s or roofline from it.
std::optional<ck::Cost> cost(const std::function<ck::Cost()>& of) {
  try {
    return of();
  } catch (const amplab::NotImplemented&) {
    return std::nullopt;
  }
}

std::string error_check(const torch::Tensor& got, const torch::Tensor& want, double tolerance) {
  const double scale = want.abs().max().item<double>() + 1e-30;
  const double err = (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>() / scale;
  std::ostringstream s;
  s << std::setprecision(2) << err;
  return (err <= tolerance ? "ok (" : "WRONG (") + s.str() + " of max)";
}

// The run's records for the plots and summary.json.
struct Records {
  nlohmann::json summary;
  amplab::Table roofline{{"part", "kernel", "intensity", "tflops"}};
  amplab::Table bandwidth{{"part", "kernel", "gbs", "ours"}};
  double copy_gbs = 0;
  double fp32_peak = 0, bf16_peak = 0;  // TFLOP/s of cuBLAS, the best size

  void point(const std::string& part, const std::string& kernel, const ck::Cost& c, double ms) {
    if (std::isfinite(ms) && c.bytes > 0)
      roofline.add_row({part, kernel, amplab::fixed(c.intensity(), 4), amplab::fixed(c.flops / (ms * 1e9), 4)});
  }
  void gbs(const std::string& part, const std::string& kernel, double value, bool ours) {
    if (std::isfinite(value)) bandwidth.add_row({part, kernel, amplab::fixed(value, 1), ours ? "yes" : "no"});
  }
};

// Python for the helper scripts: the project's .venv, else python3 (the GPU machine's).
std::string python() {
  const std::string venv = amplab::source_dir() + "/.venv/bin/python";
  return std::filesystem::exists(venv) ? venv : "python3";
}

// Runs `python scripts/images.py args...`; true when it exits 0.
bool images_py(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {python(), amplab::source_dir() + "/scripts/images.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = fork();
  if (pid == 0) {
    execvp(c_argv[0], c_argv.data());
    _exit(127);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// images.py's raw format: int64 height, int64 width, then float32 row by row.
torch::Tensor read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int64_t shape[2] = {0, 0};
  in.read(reinterpret_cast<char*>(shape), sizeof(shape));
  if (!in || shape[0] < 1 || shape[1] < 1) throw amplab::Error(path + ": not an image written by scripts/images.py");
  torch::Tensor image = torch::empty({shape[0], shape[1]});
  in.read(reinterpret_cast<char*>(image.data_ptr<float>()), image.nbytes());
  if (!in) throw amplab::Error(path + ": shorter than its " + std::to_string(shape[0]) + " x " + std::to_string(shape[1]) + " pixels");
  return image;
}

void write_f32(const std::string& path, const torch::Tensor& image) {
  torch::Tensor host = image.to(torch::kCPU, torch::kFloat32).contiguous();
  std::ofstream out(path, std::ios::binary);
  const int64_t shape[2] = {host.size(0), host.size(1)};
  out.write(reinterpret_cast<const char*>(shape), sizeof(shape));
  out.write(reinterpret_cast<const char*>(host.data_ptr<float>()), host.nbytes());
}

torch::Tensor filter_named(const std::string& name) {
  if (name == "blur3") return torch::tensor({1.f, 2.f, 1.f, 2.f, 4.f, 2.f, 1.f, 2.f, 1.f}).view({3, 3}) / 16;  // Gaussian
  if (name == "sharpen3") return torch::tensor({0.f, -1.f, 0.f, -1.f, 5.f, -1.f, 0.f, -1.f, 0.f}).view({3, 3});
  if (name == "edge3") return torch::tensor({-1.f, -1.f, -1.f, -1.f, 8.f, -1.f, -1.f, -1.f, -1.f}).view({3, 3});  // Laplacian
  auto binomial = torch::tensor({1.f, 4.f, 6.f, 4.f, 1.f});
  if (name == "blur5") return torch::outer(binomial, binomial) / 256;  // Gaussian, 5x5
  // edge5: Laplacian of Gaussian
  return torch::tensor({0.f, 0.f, -1.f, 0.f, 0.f, 0.f, -1.f, -2.f, -1.f, 0.f, -1.f, -2.f, 16.f, -2.f, -1.f,
                        0.f, -1.f, -2.f, -1.f, 0.f, 0.f, 0.f, -1.f, 0.f, 0.f})
      .view({5, 5});
}

// ---- the parts ---------------------------------------------------------------------------------------

void part_elementwise(const KernelsConfig& config, const Timer& timer, Records& records, const amplab::RunDir& run) {
  const int64_t n = config.sizes.elementwise_n;
  auto options = torch::TensorOptions().device(timer.device);
  auto a = torch::randn({n}, options), b = torch::randn({n}, options), c = torch::empty_like(a);
  const torch::Tensor want = a + b;
  const auto costs = cost([&] { return ck::vector_add_cost(n); });
  const double bytes = costs ? costs->bytes : NAN;
  amplab::Table table({"kernel", "ms", "GB/s", "% of copy", "check"});
  auto row = [&](const std::string& name, double ms, double moved, bool ours, const std::string& check) {
    const double gbs = moved / (ms * 1e6);
    table.add_row({name, amplab::fixed(ms, 4), amplab::fixed(gbs, 0), amplab::fixed(100 * gbs / records.copy_gbs, 1), check});
    records.gbs("add", name, gbs, ours);
  };
  row("device copy (torch)", timer.ms([&] { c.copy_(a); }), 8.0 * n, false, "-");
  row("torch add", timer.ms([&] { torch::add_out(c, a, b); }), 12.0 * n, false, "-");
  nlohmann::json json = nlohmann::json::object();
  for (auto version : {ck::AddVersion::grid_stride, ck::AddVersion::float4}) {
    auto outcome = run_kernel(
        timer, [&] { return torch::equal(ck::vector_add(a, b, version, config.bench.threads), want) ? "exact" : "WRONG"; },
        [&] { ck::vector_add(a, b, version, config.bench.threads); });
    if (!outcome.todo.empty()) {
      table.add_row({ck::name(version), todo_cell(outcome), "", "", ""});
      continue;
    }
    row(ck::name(version), outcome.ms, bytes, true, outcome.check);
    if (costs) records.point("elementwise", ck::name(version), *costs, outcome.ms);
    json[ck::name(version)] = {{"ms", outcome.ms}, {"gbs", bytes / (outcome.ms * 1e6)}};
  }
  std::cout << "\n== 1. Element-wise: c = a + b, " << n / 1e6 << " M floats, " << config.bench.threads
            << " threads per block ==\n"
            << table.to_string();
  if (!costs) std::cout << "(GB/s of your kernels need your cost model: TODO(cuda_kernels-1))\n";
  table.write_csv(run.file("elementwise.csv"));
  records.summary["elementwise"] = json;
}

void part_reduction(const KernelsConfig& config, const Timer& timer, Records& records, const amplab::RunDir& run) {
  const int64_t n = config.sizes.reduction_n;
  auto x = torch::rand({n}, torch::TensorOptions().device(timer.device));
  const double exact = x.to(torch::kFloat64).sum().item<double>();
  const auto costs = cost([&] { return ck::reduce_cost(n); });
  const double bytes = costs ? costs->bytes : NAN;
  amplab::Table table({"kernel", "ms", "GB/s", "% of copy", "vs torch.sum", "relative error"});
  const double torch_ms = timer.ms([&] { x.sum(); });
  auto error_of = [&](const torch::Tensor& sum) {
    std::ostringstream s;
    s << std::setprecision(2) << std::abs(sum.item<double>() - exact) / exact;
    return s.str();
  };
  const double torch_gbs = 4.0 * n / (torch_ms * 1e6);
  table.add_row({"torch.sum", amplab::fixed(torch_ms, 4), amplab::fixed(torch_gbs, 0),
                 amplab::fixed(100 * torch_gbs / records.copy_gbs, 1), "1.00x", error_of(x.sum())});
  records.gbs("sum", "torch.sum", torch_gbs, false);
  nlohmann::json json = nlohmann::json::object();
  for (auto version : {ck::ReduceVersion::interleaved, ck::ReduceVersion::sequential, ck::ReduceVersion::first_add,
                       ck::ReduceVersion::warp_shuffle}) {
    auto outcome = run_kernel(timer, [&] { return error_of(ck::reduce_sum(x, version, config.bench.threads)); },
                              [&] { ck::reduce_sum(x, version, config.bench.threads); });
    if (!outcome.todo.empty()) {
      table.add_row({ck::name(version), todo_cell(outcome), "", "", "", ""});
      continue;
    }
    const double gbs = bytes / (outcome.ms * 1e6);
    table.add_row({ck::name(version), amplab::fixed(outcome.ms, 4), amplab::fixed(gbs, 0),
                   amplab::fixed(100 * gbs / records.copy_gbs, 1), amplab::fixed(torch_ms / outcome.ms, 2) + "x",
                   outcome.check});
    records.gbs("sum", ck::name(version), gbs, true);
    if (costs) records.point("reduction", ck::name(version), *costs, outcome.ms);
    json[ck::name(version)] = {{"ms", outcome.ms}, {"gbs", gbs}, {"vs_torch_sum", torch_ms / outcome.ms}};
  }
  std::cout << "\n== 2. Reduction: sum of " << n / 1e6 << " M floats, " << config.bench.threads
            << " threads per block ==\n"
            << table.to_string();
  if (!costs) std::cout << "(GB/s of your kernels need your cost model: TODO(cuda_kernels-1))\n";
  table.write_csv(run.file("reduction.csv"));
  json["torch_sum_gbs"] = torch_gbs;
  records.summary["reduction"] = json;
}

// The photograph as a (h, w) float tensor in [0, 1] on the CPU, or a test pattern if it cannot be read.
torch::Tensor load_photo(const ConvolutionConfig& conv, const amplab::RunDir& run) {
  const std::string raw = run.file("photo.f32");
  std::vector<std::string> args = {"load"};
  if (!conv.image.empty()) args.push_back(conv.image);
  args.push_back(raw);
  if (images_py(args)) {
    torch::Tensor photo = read_f32(raw);
    std::filesystem::remove(raw);
    return photo;
  }
  std::cout << "(could not read " << (conv.image.empty() ? "matplotlib's grace_hopper.jpg" : conv.image)
            << " with scripts/images.py: filtering a test pattern instead)\n";
  auto y = torch::linspace(0, 1, 600).view({-1, 1}), x = torch::linspace(0, 1, 512).view({1, -1});
  return (torch::sin(40 * x * y) * 0.5 + 0.5).contiguous();
}

void part_convolution(const KernelsConfig& config, const Timer& timer, Records& records, const amplab::RunDir& run) {
  const auto& conv = config.convolution;
  torch::Tensor photo = load_photo(conv, run).to(timer.device);

  // The photograph through each filter (the tiled kernel; the given naive one while TODO 8 is empty).
  std::vector<std::string> images = {run.file("photo.f32")};
  write_f32(images[0], photo);
  bool naive_used = false;
  for (const auto& name : conv.filters) {
    torch::Tensor filter = filter_named(name).to(timer.device), out;
    try {
      out = ck::conv2d(photo, filter, ck::ConvVersion::tiled);
    } catch (const amplab::NotImplemented&) {
      out = ck::conv2d(photo, filter, ck::ConvVersion::naive);
      naive_used = true;
    }
    images.push_back(run.file("conv_" + name + ".f32"));
    write_f32(images.back(), out);
  }
  std::vector<std::string> args = {"png", "--montage", run.file("conv_filters.png")};
  args.insert(args.end(), images.begin(), images.end());
  if (!images_py(args)) std::cout << "(PNG images skipped: scripts/images.py failed; is matplotlib installed?)\n";

  // Timing on the photograph scaled up to bench_size^2.
  const int64_t s = conv.bench_size;
  torch::Tensor big = torch::nn::functional::interpolate(
                          photo.view({1, 1, photo.size(0), photo.size(1)}),
                          torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{s, s}).mode(torch::kBilinear).align_corners(false))
                          .view({s, s})
                          .contiguous();
  amplab::Table table({"filter", "kernel", "ms", "GB/s", "vs torch conv2d", "check"});
  nlohmann::json json = nlohmann::json::object();
  std::set<int64_t> on_roofline;  // filter sizes with a point on the roofline (the first filter of each)
  for (const auto& name : conv.filters) {
    torch::Tensor filter = filter_named(name).to(timer.device);
    const int64_t k = filter.size(0);
    torch::Tensor want;
    {
      amplab::Tf32Guard fp32(false);  // the check's reference in true fp32
      want = torch::conv2d(big.view({1, 1, s, s}), filter.view({1, 1, k, k}), {}, 1, k / 2).view({s, s});
    }
    const auto costs = cost([&] { return ck::conv2d_cost(s, s, k / 2); });
    const double torch_ms = timer.ms([&] { torch::conv2d(big.view({1, 1, s, s}), filter.view({1, 1, k, k}), {}, 1, k / 2); });
    auto gbs_of = [&](double ms) { return costs ? amplab::fixed(costs->bytes / (ms * 1e6), 0) : std::string("-"); };
    table.add_row({name, "torch conv2d", amplab::fixed(torch_ms, 4), gbs_of(torch_ms), "1.0x", "-"});
    for (auto version : {ck::ConvVersion::naive, ck::ConvVersion::tiled}) {
      auto outcome = run_kernel(timer, [&] { return error_check(ck::conv2d(big, filter, version), want, 1e-5); },
                                [&] { ck::conv2d(big, filter, version); });
      if (!outcome.todo.empty()) {
        table.add_row({name, ck::name(version), todo_cell(outcome), "", "", ""});
        continue;
      }
      table.add_row({name, ck::name(version), amplab::fixed(outcome.ms, 4), gbs_of(outcome.ms),
                     amplab::fixed(torch_ms / outcome.ms, 1) + "x", outcome.check});
      json[name][ck::name(version)] = {{"ms", outcome.ms}, {"vs_torch", torch_ms / outcome.ms}};
      if (costs && version == ck::ConvVersion::tiled && on_roofline.insert(k).second) {
        records.point("convolution", "tiled " + std::to_string(k) + "x" + std::to_string(k), *costs, outcome.ms);
        records.gbs("conv " + name, "tiled", costs->bytes / (outcome.ms * 1e6), true);
      }
    }
    json[name]["torch_ms"] = torch_ms;
  }
  std::cout << "\n== 3. Convolution: " << s << " x " << s << " fp32 image (the photograph scaled up), zero padding ==\n"
            << table.to_string();
  if (naive_used) std::cout << "(the images used the given naive kernel: TODO(cuda_kernels-8) is still empty)\n";
  std::cout << "images: " << run.file("conv_filters.png") << " and conv_<filter>.png\n";
  table.write_csv(run.file("convolution.csv"));
  records.summary["convolution"] = json;
}

void part_matmul(const KernelsConfig& config, const Timer& timer, Records& records, const amplab::RunDir& run) {
  const auto& mm = config.matmul;
  auto options = torch::TensorOptions().device(timer.device);
  amplab::Table table({"n", "kernel", "ms", "TFLOP/s", "% of cuBLAS", "check"});
  nlohmann::json json = nlohmann::json::array();
  const int64_t largest = *std::max_element(mm.sizes.begin(), mm.sizes.end());
  for (int64_t n : mm.sizes) {
    const double flops = 2.0 * n * n * n;
    auto tflops = [&](double ms) { return flops / (ms * 1e9); };
    const auto cost32 = cost([&] { return ck::matmul_cost(n, n, n, 4); });
    const auto cost16 = cost([&] { return ck::matmul_cost(n, n, n, 2); });
    torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), want;
    double cublas_ms;
    {
      amplab::Tf32Guard fp32(false);  // cuBLAS in true fp32, as our kernels
      want = torch::mm(a, b);
      cublas_ms = timer.ms([&] { torch::mm(a, b); });
    }
    records.fp32_peak = std::max(records.fp32_peak, tflops(cublas_ms));
    table.add_row({std::to_string(n), "cuBLAS fp32 (TF32 off)", amplab::fixed(cublas_ms, 3), amplab::fixed(tflops(cublas_ms), 1), "100.0", "-"});
    if (n == largest && cost32) records.point("matmul", "cuBLAS fp32", *cost32, cublas_ms);
    json.push_back({{"n", n}, {"kernel", "cuBLAS fp32"}, {"ms", cublas_ms}});
    for (auto version : {ck::MatmulVersion::naive, ck::MatmulVersion::tiled, ck::MatmulVersion::register_blocked}) {
      if (version == ck::MatmulVersion::naive && n > mm.naive_max) continue;
      auto outcome = run_kernel(timer, [&] { return error_check(ck::matmul(a, b, version), want, 1e-4); },
                                [&] { ck::matmul(a, b, version); });
      if (!outcome.todo.empty()) {
        table.add_row({std::to_string(n), ck::name(version), todo_cell(outcome), "", "", ""});
        continue;
      }
      table.add_row({std::to_string(n), ck::name(version), amplab::fixed(outcome.ms, 3), amplab::fixed(tflops(outcome.ms), 1),
                     amplab::fixed(100 * cublas_ms / outcome.ms, 1), outcome.check});
      if (n == largest && cost32) records.point("matmul", ck::name(version), *cost32, outcome.ms);
      json.push_back({{"n", n}, {"kernel", ck::name(version)}, {"ms", outcome.ms}});
    }
    if (!mm.wmma) continue;
    torch::Tensor a16 = a.to(torch::kBFloat16), b16 = b.to(torch::kBFloat16);
    torch::Tensor want16 = torch::mm(a16.to(torch::kFloat32), b16.to(torch::kFloat32));
    const double cublas16_ms = timer.ms([&] { torch::mm(a16, b16); });
    records.bf16_peak = std::max(records.bf16_peak, tflops(cublas16_ms));
    table.add_row({std::to_string(n), "cuBLAS bf16", amplab::fixed(cublas16_ms, 3), amplab::fixed(tflops(cublas16_ms), 1), "100.0", "-"});
    if (n == largest && cost16) records.point("matmul bf16", "cuBLAS bf16", *cost16, cublas16_ms);
    auto outcome = run_kernel(timer, [&] { return error_check(ck::matmul(a16, b16, ck::MatmulVersion::wmma_bf16), want16, 1e-2); },
                              [&] { ck::matmul(a16, b16, ck::MatmulVersion::wmma_bf16); });
    if (!outcome.todo.empty()) {
      table.add_row({std::to_string(n), "wmma bf16", todo_cell(outcome), "", "", ""});
      continue;
    }
    table.add_row({std::to_string(n), "wmma bf16", amplab::fixed(outcome.ms, 3), amplab::fixed(tflops(outcome.ms), 1),
                   amplab::fixed(100 * cublas16_ms / outcome.ms, 1), outcome.check});
    if (n == largest && cost16) records.point("matmul bf16", "wmma bf16", *cost16, outcome.ms);
    json.push_back({{"n", n}, {"kernel", "wmma bf16"}, {"ms", outcome.ms}});
  }
  std::cout << "\n== 4. Matrix multiply: n x n x n (% of cuBLAS in the same dtype) ==\n" << table.to_string();
  table.write_csv(run.file("matmul.csv"));
  records.summary["matmul"] = json;
}

// One bias + GELU of an MLP layer, three ways.
enum class Epilogue { linear_bias_gelu, composed, fused };
const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::linear_bias_gelu: return "Linear(bias) + gelu (bias in cuBLAS's epilogue)";
    case Epilogue::composed: return "Linear + (x + bias) + gelu, composed";
    case Epilogue::fused: return "Linear + fused bias_gelu (yours)";
  }
  return "?";
}

void part_fused(const KernelsConfig& config, const Timer& timer, Records& records, const amplab::RunDir& run) {
  const auto& f = config.fused;
  nlohmann::json json = nlohmann::json::object();
  // The op alone: forward, and forward + backward (autograd).
  amplab::Table op({"dtype", "pass", "composed ms", "fused ms", "speed-up", "fused GB/s"});
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto options = torch::TensorOptions().device(timer.device).dtype(dtype);
    auto x = torch::randn({f.rows, f.cols}, options).requires_grad_(true);
    auto bias = torch::randn({f.cols}, options).requires_grad_(true);
    auto grad_y = torch::randn({f.rows, f.cols}, options);
    const double element = dtype == torch::kBFloat16 ? 2 : 4;
    const double rc = static_cast<double>(f.rows) * f.cols;
    // Least bytes: forward reads x and bias, writes y; backward reads grad_y, x and bias, writes grad_x and grad_bias.
    const double forward_bytes = element * (2 * rc + f.cols), backward_bytes = element * (3 * rc + 2.0 * f.cols);
    const std::string type = dtype == torch::kBFloat16 ? "bf16" : "fp32";
    for (bool backward : {false, true}) {
      auto pass = [&](auto fn) {
        if (!backward) {
          torch::NoGradGuard no_grad;
          fn(x, bias);
        } else {
          torch::autograd::grad({fn(x, bias)}, {x, bias}, {grad_y});
        }
      };
      const double composed_ms = timer.ms([&] { pass(ck::bias_gelu_composed); });
      auto outcome = run_kernel(
          timer,
          [&] {
            torch::NoGradGuard no_grad;
            return error_check(ck::bias_gelu(x, bias), ck::bias_gelu_composed(x, bias), dtype == torch::kBFloat16 ? 1e-2 : 1e-5);
          },
          [&] { pass(ck::bias_gelu); });
      const std::string name = backward ? "forward + backward" : "forward";
      if (!outcome.todo.empty()) {
        op.add_row({type, name, amplab::fixed(composed_ms, 3), todo_cell(outcome), "", ""});
        continue;
      }
      const double bytes = backward ? forward_bytes + backward_bytes : forward_bytes;
      op.add_row({type, name, amplab::fixed(composed_ms, 3), amplab::fixed(outcome.ms, 3),
                  amplab::fixed(composed_ms / outcome.ms, 2) + "x", amplab::fixed(bytes / (outcome.ms * 1e6), 0)});
      json["op"][type][backward ? "forward_backward" : "forward"] = {{"composed_ms", composed_ms}, {"fused_ms", outcome.ms}};
    }
  }
  std::cout << "\n== 5. Fused bias + GELU (tanh), x " << f.rows << " x " << f.cols << " ==\n" << op.to_string();
  op.write_csv(run.file("fused_op.csv"));

  // The op in an MLP training step: bf16 autocast, mlp_layers x (Linear without bias + bias + GELU).
  if (f.mlp_layers > 0) {
    auto options = torch::TensorOptions().device(timer.device);
    std::vector<torch::Tensor> weights, biases;
    for (int64_t l = 0; l < f.mlp_layers; ++l) {
      weights.push_back((torch::randn({f.mlp_width, f.mlp_width}, options) / std::sqrt(double(f.mlp_width))).requires_grad_(true));
      biases.push_back((0.1 * torch::randn({f.mlp_width}, options)).requires_grad_(true));
    }
    auto input = torch::randn({f.mlp_batch, f.mlp_width}, options), target = torch::randn({f.mlp_batch, f.mlp_width}, options);
    std::vector<torch::Tensor> params = weights;
    params.insert(params.end(), biases.begin(), biases.end());
    torch::optim::SGD sgd(params, torch::optim::SGDOptions(1e-4));
    amplab::Table mlp({"epilogue", "ms per step", "speed-up vs composed"});
    double composed_ms = NAN;
    for (auto epilogue : {Epilogue::composed, Epilogue::linear_bias_gelu, Epilogue::fused}) {
      auto step = [&] {
        sgd.zero_grad();
        torch::Tensor loss;
        {
          amplab::AutocastGuard autocast(timer.device, amplab::Precision::bf16_mixed);
          torch::Tensor h = input;
          for (int64_t l = 0; l < f.mlp_layers; ++l) {
            if (epilogue == Epilogue::linear_bias_gelu) {
              h = torch::gelu(torch::linear(h, weights[l], biases[l]), "tanh");
            } else {
              torch::Tensor z = torch::linear(h, weights[l]);
              h = epilogue == Epilogue::fused ? ck::bias_gelu(z, biases[l]) : ck::bias_gelu_composed(z, biases[l]);
            }
          }
          loss = torch::mse_loss(h.to(torch::kFloat32), target);
        }
        loss.backward();
        sgd.step();
      };
      auto outcome = run_kernel(timer, [] { return std::string("-"); }, step);
      if (!outcome.todo.empty()) {
        mlp.add_row({epilogue_name(epilogue), todo_cell(outcome), ""});
        continue;
      }
      if (epilogue == Epilogue::composed) composed_ms = outcome.ms;
      mlp.add_row({epilogue_name(epilogue), amplab::fixed(outcome.ms, 3), amplab::fixed(composed_ms / outcome.ms, 3) + "x"});
      json["mlp"][epilogue_name(epilogue)] = outcome.ms;
    }
    std::cout << "\n== 5b. MLP training step: " << f.mlp_layers << " x Linear(" << f.mlp_width << ", " << f.mlp_width
              << ") + bias + GELU, batch " << f.mlp_batch << ", bf16 autocast, SGD ==\n"
              << mlp.to_string();
    mlp.write_csv(run.file("fused_mlp.csv"));
  }
  records.summary["fused"] = json;
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&] {
    KernelsConfig config;
    amplab::CommandLine cli;
    KernelsConfig defaults;
    if (auto code = amplab::parse_command_line(argc, argv, "cuda_kernels", "Lab 6: CUDA kernels",
                                               amplab::describe_keys(defaults), cli, /*accepts_resume=*/false))
      return *code;
    auto source = amplab::load_lab_config(cli, config);
    const int threads = config.bench.threads;
    if ((threads & (threads - 1)) != 0)
      throw amplab::Error(source.where("bench.threads") + ": bench.threads: " + std::to_string(threads) +
                          " is not a power of two (the reductions' trees halve the block); allowed: 32, 64, ..., 1024");
    if (!amplab::cuda_available() || amplab::resolve_device(config.run.device).is_cpu()) {
      std::cout << "cuda_kernels: this lab runs CUDA kernels and needs a GPU; "
                << (amplab::cuda_available() ? "run.device is cpu" : "no CUDA device is visible here")
                << ": run it on a GPU machine (labs/cuda_kernels/README.md)" << std::endl;
      return amplab::kExitOk;
    }
    amplab::RunDir run = amplab::RunDir::create(config.run, "cuda_kernels", amplab::to_yaml(config));
    amplab::apply_run_settings(config.run);
    const torch::Device device = amplab::resolve_device(config.run.device);
    const Timer timer{config.bench, device};
    Records records;

    // The memory roof: a device-to-device copy of 400 MB (read + write).
    {
      auto source_tensor = torch::randn({100'000'000}, torch::TensorOptions().device(device));
      auto target = torch::empty_like(source_tensor);
      records.copy_gbs = 8e8 / (timer.ms([&] { target.copy_(source_tensor); }) * 1e6);
    }
    std::cout << "device: " << amplab::describe(device) << "; device copy " << amplab::fixed(records.copy_gbs, 0)
              << " GB/s (the memory roof)\n";

    for (const auto& part : config.bench.parts) {
      if (part == "elementwise") part_elementwise(config, timer, records, run);
      if (part == "reduction") part_reduction(config, timer, records, run);
      if (part == "convolution") part_convolution(config, timer, records, run);
      if (part == "matmul") part_matmul(config, timer, records, run);
      if (part == "fused") part_fused(config, timer, records, run);
    }

    records.summary["roofs"] = {{"memory_gbs", records.copy_gbs}};
    if (records.fp32_peak > 0) records.summary["roofs"]["fp32_tflops"] = records.fp32_peak;
    if (records.bf16_peak > 0) records.summary["roofs"]["bf16_tflops"] = records.bf16_peak;
    records.roofline.write_csv(run.file("roofline.csv"));
    records.bandwidth.write_csv(run.file("bandwidth.csv"));
    run.write_summary(records.summary);
    if (config.bench.plots) amplab::make_plots("kernels", run);
    amplab::write_report(run);
    std::cout << "\nresults: " << run.path() << "/ (*.csv, summary.json, roofline.png, bandwidth.png, conv_*.png)\n";
    return amplab::kExitOk;
  });
}
