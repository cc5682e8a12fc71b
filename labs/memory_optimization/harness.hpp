// The model every experiment of the lab starts from, given (no TODOs): the deep residual MLP with
// its initial weights kept on the host, a fresh Trainer per run, the synthetic data's teacher,
// your estimate and the memory limit (simulated on the CPU, a cap on a GPU).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "amplab/report/results.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "config.hpp"
#include "memory_optimization.hpp"

namespace memory_optimization {

inline double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Harness {
  const LabConfig& config;
  const MemLabConfig& mem;
  torch::Device device;
  bool cpu;
  std::string memory_source;
  DeepMlpOptions shape;
  DeepMlp model{nullptr};
  std::vector<torch::Tensor> initial;  // host copies of the initial parameters: every run starts there
  torch::Tensor teacher;               // (width, classes): labels of the synthetic data
  int64_t parameters = 0;
  int64_t cap_bytes = 0;               // GPU memory cap in force (0: none)

  Harness(const LabConfig& config, torch::Device device);
  // Untracked by default: the tracker resets peaks per phase, it would spoil the step's peak.
  amplab::Trainer trainer(amplab::Precision precision, bool track = false) const;
  void reset(int64_t checkpoint_every);  // the initial parameters, no gradients, checkpointing every k blocks
  void release();                        // gradients freed and the allocator's cache emptied
  MemoryEstimate estimate(amplab::Precision precision, int64_t every) const;
  double estimate_mib(amplab::Precision p, int64_t every, int64_t batch) const { return mib(estimate(p, every).at(batch)); }
  // CPU: the simulated limit (RSS has none to hit). GPU: none; running out of memory decides.
  FitsFn simulated_fits(amplab::Precision precision, int64_t every) const;
  void set_cap(int64_t bytes);  // the GPU's memory cap (0 lifts it); nothing on the CPU
};

// The model, its estimated need and the memory limit (the GPU's cap set here), printed and kept.
void describe_setup(Harness& h, amplab::Results& results);

// "bf16-mixed + checkpointing/2": a setting's name in the tables.
std::string setting_name(amplab::Precision precision, int64_t every);

// The precisions of `names` this device runs; each other one noted in `notes`.
std::vector<amplab::Precision> supported(const Names& names, const std::string& key, torch::Device device, std::string& notes);

// One setting at one batch size: the model from its initial parameters, a fresh Trainer (the
// core's step) and fresh data; the timed steps through your measure().
Measurement run_setting(Harness& h, amplab::Precision precision, int64_t every, int64_t batch);

double samples_per_second(const Measurement& m, int64_t batch);

}  // namespace memory_optimization
