// The machine and the build (env.hpp): versions, GPU, CPU and git commit for summary.json.
#include "amplab/infra/env.hpp"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/cuda.h>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace amplab {

namespace {

std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return output;
  std::array<char, 256> buffer{};
  while (fgets(buffer.data(), buffer.size(), pipe)) output += buffer.data();
  if (pclose(pipe) != 0) return "";
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  return output;
}

// CUDA encodes 13.0 as 13000; cuDNN encodes 9.19.0 as 91900.
std::string cuda_version_string(long v) {
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
std::string cudnn_version_string(long v) {
  if (v <= 0) return "";
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

}  // namespace

std::string source_dir() { return AMPLAB_SOURCE_DIR; }

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string git_commit() {
  std::string commit = run_command("git -C '" + source_dir() + "' rev-parse --short=12 HEAD 2>/dev/null");
  if (commit.empty()) return "";
  std::string dirty = run_command("git -C '" + source_dir() + "' status --porcelain --untracked-files=no 2>/dev/null");
  return dirty.empty() ? commit : commit + "-dirty";
}

Environment collect_environment(int gpu_index) {
  Environment env;
  env.torch_version = TORCH_VERSION;
  env.cpu_model = cpu_model_name();
  env.cpu_threads = at::get_num_threads();
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) env.hostname = host;
  env.git_commit = git_commit();
#ifdef AMPLAB_WITH_CUDA
  const auto& hooks = at::detail::getCUDAHooks();
  env.cuda_runtime = cuda_version_string(hooks.versionCUDART());
  if (torch::cuda::is_available()) {
    env.gpu_count = static_cast<int>(torch::cuda::device_count());
    env.cudnn_version = cudnn_version_string(hooks.versionCuDNN());
    const auto* props = at::cuda::getDeviceProperties(gpu_index);
    env.gpu_name = props->name;
    env.gpu_memory_gib = static_cast<double>(props->totalGlobalMem) / (1 << 30);
    int driver = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess) env.driver_version = cuda_version_string(driver);
  }
#endif
  return env;
}

nlohmann::json to_json(const Environment& env) {
  return {{"torch", env.torch_version},        {"cuda_runtime", env.cuda_runtime},
          {"cudnn", env.cudnn_version},        {"gpu", env.gpu_name},
          {"gpu_memory_gib", env.gpu_memory_gib}, {"gpu_count", env.gpu_count},
          {"cuda_driver", env.driver_version}, {"cpu", env.cpu_model},
          {"cpu_threads", env.cpu_threads},    {"hostname", env.hostname},
          {"git_commit", env.git_commit}};
}

}  // namespace amplab
