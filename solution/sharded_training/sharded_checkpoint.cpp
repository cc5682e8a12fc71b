// Lab 8: ZeRO-3's sharded checkpoint. See labs/sharded_training/README.md, "A sharded checkpoint".
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>

#include "amplab/infra/error.hpp"
#include "amplab/state/safetensors.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-6): each rank saves its own part. Write `dir`/rank-<r>-of-<W>.safetensors
// (amplab::save_safetensors: the course's safetensors writer, atomic) holding, for each unit u,
// its shard and its two moments under names of your choosing (e.g. "unit0.shard"), and as
// metadata (strings) the step count, the rank and the world size. Then wait for the other ranks
// (a barrier): the checkpoint exists only once every rank's file does.
// Pitfalls: a rank that writes the whole model defeats the point (and W ranks writing it race
// for the same file); the step count is part of the state: AdamW's bias correction needs it to
// go on exactly.
void save_sharded(FullyShardedMlp& model, const std::string& dir) {
  // BEGIN SOLUTION
  auto& comm = model.communicator();
  amplab::NamedTensors tensors;
  for (size_t u = 0; u < model.units().size(); ++u) {
    const auto& unit = model.units()[u];
    const std::string name = "unit" + std::to_string(u);
    tensors.push_back({name + ".shard", unit.shard.detach()});
    tensors.push_back({name + ".exp_avg", unit.exp_avg});
    tensors.push_back({name + ".exp_avg_sq", unit.exp_avg_sq});
  }
  const std::string file = "rank-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size()) + ".safetensors";
  amplab::save_safetensors((std::filesystem::path(dir) / file).string(), tensors,
                           {{"step", std::to_string(model.steps())},
                            {"rank", std::to_string(comm.rank())},
                            {"world_size", std::to_string(comm.size())}});
  comm.barrier();
  // END SOLUTION
}

// TODO(sharded_training-6): each rank reads `dir`/rank-<r>-of-<W>.safetensors
// (amplab::load_safetensors, which checks the file's format and names the file in its errors),
// checks it against this job and this model (world size, rank, every unit's tensors present
// with their shapes), and only then copies each tensor into the model and sets the step count
// (model.set_steps). A checkpoint of another world size has other files: a missing file names
// the world size it would need.
// Pitfalls: copying as you check leaves a half-loaded model when a later tensor is wrong; the
// shards require grad: copy into them under torch::NoGradGuard.
void load_sharded(FullyShardedMlp& model, const std::string& dir) {
  // BEGIN SOLUTION
  auto& comm = model.communicator();
  const std::string file = (std::filesystem::path(dir) / ("rank-" + std::to_string(comm.rank()) + "-of-" +
                                                          std::to_string(comm.size()) + ".safetensors")).string();
  if (!std::filesystem::exists(file))
    throw amplab::Error("sharded checkpoint '" + dir + "': no " + file + " for rank " + std::to_string(comm.rank()) +
                        " of " + std::to_string(comm.size()) + " (was it saved by another number of ranks?)");
  const amplab::SafetensorsFile saved = amplab::load_safetensors(file);
  auto meta = [&](const std::string& key) {
    auto it = saved.metadata.find(key);
    if (it == saved.metadata.end()) throw amplab::Error("sharded checkpoint '" + file + "': no '" + key + "' in its metadata");
    return it->second;
  };
  if (meta("world_size") != std::to_string(comm.size()) || meta("rank") != std::to_string(comm.rank()))
    throw amplab::Error("sharded checkpoint '" + file + "': written by rank " + meta("rank") + " of " +
                        meta("world_size") + ", read by rank " + std::to_string(comm.rank()) + " of " +
                        std::to_string(comm.size()));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from), all checked first
  for (size_t u = 0; u < model.units().size(); ++u) {
    auto& unit = model.units()[u];
    const std::string name = "unit" + std::to_string(u);
    for (auto [suffix, into] : {std::pair{".shard", unit.shard}, {".exp_avg", unit.exp_avg}, {".exp_avg_sq", unit.exp_avg_sq}}) {
      const torch::Tensor from = saved.find(name + suffix);
      if (!from.defined() || from.sizes() != into.sizes() || from.scalar_type() != into.scalar_type())
        throw amplab::Error("sharded checkpoint '" + file + "': " + name + suffix +
                            (from.defined() ? " has another shape or dtype than the model's" : " is missing"));
      copies.push_back({into, from});
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [into, from] : copies) into.copy_(from);
  model.set_steps(std::stoll(meta("step")));
  // END SOLUTION
}

}  // namespace zero_lab
