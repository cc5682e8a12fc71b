// The cuda_kernels lab's config: the keys of configs/cuda_kernels.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"

namespace cuda_kernels {

inline const std::vector<std::string> kParts = {"elementwise", "reduction", "convolution", "matmul", "fused"};
inline const std::vector<std::string> kFilters = {"blur3", "sharpen3", "edge3", "blur5", "edge5"};

struct BenchConfig {
  std::vector<std::string> parts = kParts;
  int warmup = 3, repeats = 10, window = 5, threads = 256;
  int64_t cpu_max_elements = 100'000'000;
  bool plots = true;
  template <class V>
  void fields(V& v) {
    v.field("parts", parts, "parts to run", kParts);
    v.field("warmup", warmup, "untimed calls before timing", amplab::Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed windows (median reported)", amplab::Range<int64_t>::at_least(1));
    v.field("window", window, "calls back to back per timed window", amplab::Range<int64_t>::at_least(1));
    v.field("threads", threads, "threads per block, element-wise and reduction (a power of two)",
            amplab::Range<int64_t>::between(32, 1024));
    v.field("cpu_max_elements", cpu_max_elements,
            "largest tensor (elements) PyTorch's CPU op is timed on for the CPU columns of element-wise, convolution "
            "and matmul (same sizes as the GPU; a larger size shows '-'; 0: no CPU timing)",
            amplab::Range<int64_t>::at_least(0));
    v.field("plots", plots, "draw roofline.png and bandwidth.png");
  }
};

struct SizesConfig {
  int64_t elementwise_n = 100'000'000, reduction_n = 100'000'000;
  template <class V>
  void fields(V& v) {
    v.field("elementwise_n", elementwise_n, "floats per vector of c = a + b", amplab::Range<int64_t>::between(1, 1'000'000'000));
    v.field("reduction_n", reduction_n, "floats summed", amplab::Range<int64_t>::between(1, 1'000'000'000));
  }
};

struct ConvolutionConfig {
  std::string image;
  std::vector<std::string> filters = kFilters;
  int64_t bench_size = 4096;
  template <class V>
  void fields(V& v) {
    v.field("image", image, "image file to filter (\"\": matplotlib's sample grace_hopper.jpg)");
    v.field("filters", filters, "filters applied and timed", kFilters);
    v.field("bench_size", bench_size, "side of the square image the kernels are timed on", amplab::Range<int64_t>::between(8, 16384));
  }
};

struct MatmulConfig {
  std::vector<int64_t> sizes = {1024, 2048, 4096};
  int64_t naive_max = 4096;
  bool wmma = true;
  template <class V>
  void fields(V& v) {
    v.field("sizes", sizes, "n of the n x n x n products", amplab::Range<int64_t>::between(1, 16384));
    v.field("naive_max", naive_max, "largest n the naive kernel is timed at", amplab::Range<int64_t>::at_least(0));
    v.field("wmma", wmma, "also time the bf16 tensor-core kernel against cuBLAS bf16");
  }
};

struct FusedConfig {
  int64_t rows = 8192, cols = 8192, mlp_width = 8192, mlp_batch = 8192, mlp_layers = 4;
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

}  // namespace cuda_kernels
