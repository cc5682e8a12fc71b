// The gpu_basics lab's config: the keys of configs/gpu_basics.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"

namespace gpu_basics {

using amplab::Range;

struct BenchConfig {
  int warmup = 3, repeats = 10;
  std::vector<int64_t> matmul_sizes = {128, 256, 512, 1024, 2048, 4096, 8192};
  // The CPU side of the matmul comparison, on a GPU run too: not a size for CPU runs only.
  int64_t cpu_max_size = 2048;
  std::vector<std::string> dtypes = {"fp32", "tf32", "fp16", "bf16"};
  int64_t copy_mib = 256;
  template <class V> void fields(V& v) {
    v.field("warmup", warmup, "untimed runs before timing", Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed runs (median reported)", Range<int64_t>::at_least(1));
    v.field("matmul_sizes", matmul_sizes, "n of the n x n x n matmuls", Range<int64_t>::between(1, 32768));
    v.field("cpu_max_size", cpu_max_size, "largest n whose matmul is also timed on the CPU (larger ones take too long)",
            Range<int64_t>::at_least(1));
    v.field("dtypes", dtypes, "matmul types", {"fp32", "tf32", "fp16", "bf16"});
    v.field("copy_mib", copy_mib, "bandwidth test size (MiB)", Range<int64_t>::between(1, 16384));
  }
};

struct GpuBasicsConfig {
  amplab::RunConfig run;
  BenchConfig bench;
  template <class V> void fields(V& v) {
    v.section("run", run);
    v.section("bench", bench);
  }
};

}  // namespace gpu_basics
