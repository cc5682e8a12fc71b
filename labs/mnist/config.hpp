// The mnist lab's config: the keys of configs/mnist.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/data/mnist.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/state/checkpoint.hpp"
#include "amplab/train/trainer.hpp"

namespace mnist {

struct MnistLabConfig {
  std::vector<std::string> modes = {"cpu", "gpu", "gpu-amp"};
  std::vector<std::string> amp_precisions = {"fp16-mixed", "bf16-mixed"};
  std::string loader = "resident";
  bool channels_last = true;
  int64_t eval_batch_size = 1000;
  bool plots = true;
  int profile_steps = 30;
  std::string init_weights;

  template <class V>
  void fields(V& v) {
    v.field("modes", modes, "modes to run, in order (the cpu mode trains with the config's cpu: values)",
            {"cpu", "gpu", "gpu-amp"});
    v.field("amp_precisions", amp_precisions, "precisions of the gpu-amp mode, one run each", {"fp16-mixed", "bf16-mixed"});
    v.field("loader", loader,
            "training batches: resident (the whole set on the device); from host memory: pageable (copied on the "
            "compute stream, the host waits), pinned (pinned, non-blocking, same stream) or prefetch (your prefetcher)",
            [](const std::string& value) -> std::string {
              return value == "resident" || value == "pageable" || value == "pinned" || value == "prefetch"
                         ? ""
                         : "expected resident, pageable, pinned or prefetch";
            });
    v.field("channels_last", channels_last, "GPU modes: NHWC images and activations (faster convolutions)");
    v.field("eval_batch_size", eval_batch_size, "test-set batch size", amplab::Range<int64_t>::at_least(1));
    v.field("plots", plots, "write PNG plots into the run directory (needs matplotlib)");
    v.field("profile_steps", profile_steps, "steps of the per-phase profile after each mode's training (0: none)",
            amplab::Range<int64_t>::between(0, 10000));
    v.field("init_weights", init_weights,
            "safetensors file to start every mode from, e.g. a model-*.safetensors or one Python wrote (empty: the seed's weights)",
            amplab::check_path_value);
  }
};

struct MnistConfig {
  amplab::RunConfig run;
  amplab::DataConfig data;
  amplab::TrainConfig train;
  amplab::CheckpointConfig checkpoint;
  amplab::MemoryConfig memory;
  MnistLabConfig mnist;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("data", data);
    v.section("train", train);
    v.section("checkpoint", checkpoint);
    v.section("memory", memory);
    v.section("mnist", mnist);
  }
};

}  // namespace mnist
