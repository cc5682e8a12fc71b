// Facts about the machine and the build, recorded in each run's summary.json.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace amplab {

struct Environment {
  std::string torch_version;   // "2.11.0"
  std::string cuda_runtime;    // "13.0" or "" without CUDA
  std::string cudnn_version;   // "9.19.0" or ""
  std::string gpu_name;        // of the device in use, "" on CPU
  double gpu_memory_gib = 0;   // total memory of that GPU
  int gpu_count = 0;
  std::string driver_version;  // CUDA driver API version, e.g. "13.0"
  std::string cpu_model;
  int cpu_threads = 0;         // intra-op threads torch uses
  std::string hostname;
  std::string git_commit;      // of the source tree, "" when not a git checkout
};

Environment collect_environment(int gpu_index = 0);
nlohmann::json to_json(const Environment& env);

std::string cpu_model_name();
std::string git_commit();       // of AMPLAB_SOURCE_DIR (compiled in), with "-dirty" when modified
std::string source_dir();       // the project's root, compiled in (tests and scripts find files here)

}  // namespace amplab
