// Lab 8: ZeRO-3's sharded checkpoint. See labs/sharded_training/README.md, "A sharded checkpoint".
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <map>

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
void save_sharded(FullyShardedModel& model, const std::string& dir) {
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
// Pitfall: copying as you check leaves a half-loaded model when a later tensor is wrong.
void load_sharded(FullyShardedModel& model, const std::string& dir) {
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

// TODO(sharded_training-7): load a checkpoint that save_sharded wrote on W' ranks (any number)
// into this job's W ranks. Find W' from the files' names (`dir`/rank-0-of-<W'>.safetensors).
// Each unit's flat buffer was cut into W' shards of shard_numel(numel, W') elements
// (amplab::dist::shard_numel), laid end to end: element i of the unit lies in saved rank
// i / s' at offset i % s'. This rank's new shard covers [rank x s, rank x s + s) of the same
// flat buffer, with s its layout's shard_numel. Fill it, and its two moments, from the saved
// pieces that overlap it; elements at or past the unit's numel are padding, zero. Read only the
// files you need, each once. As in load_sharded, check everything (each file there, each
// tensor there with s' elements, the same step count in every file you read) before copying
// anything, then set the step count.
// Pitfalls: copying saved shard r into new shard r works only when W' == W; the last saved
// shard, and the last new one, may be partly padding; a rank's new shard may span two or more
// saved shards, or lie entirely in the padding.
void load_resharded(FullyShardedModel& model, const std::string& dir) {
  // BEGIN SOLUTION
  const int rank = model.communicator().rank();
  int saved_world = 0;
  if (std::filesystem::is_directory(dir))
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string(), prefix = "rank-0-of-", suffix = ".safetensors";
      if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size() + suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        if (saved_world != 0) throw amplab::Error("sharded checkpoint '" + dir + "': files of two world sizes");
        const std::string world = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
        if (world.find_first_not_of("0123456789") != std::string::npos || world.size() > 6)
          throw amplab::Error("sharded checkpoint '" + dir + "': " + name + " is not a file save_sharded writes");
        saved_world = std::stoi(world);
      }
    }
  if (saved_world <= 0) throw amplab::Error("sharded checkpoint '" + dir + "': no rank-0-of-<W>.safetensors there");

  std::map<int, amplab::SafetensorsFile> files;  // the saved ranks this rank needs, read once
  auto file_of = [&](int r) -> const amplab::SafetensorsFile& {
    auto it = files.find(r);
    if (it != files.end()) return it->second;
    const std::string file = (std::filesystem::path(dir) / ("rank-" + std::to_string(r) + "-of-" +
                                                            std::to_string(saved_world) + ".safetensors")).string();
    if (!std::filesystem::exists(file))
      throw amplab::Error("sharded checkpoint '" + dir + "': no " + file + " (the checkpoint of " +
                          std::to_string(saved_world) + " ranks is incomplete)");
    return files.emplace(r, amplab::load_safetensors(file)).first->second;
  };

  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (into, from), all checked first
  for (size_t u = 0; u < model.units().size(); ++u) {
    auto& unit = model.units()[u];
    const std::string name = "unit" + std::to_string(u);
    const int64_t saved_shard = amplab::dist::shard_numel(unit.layout.numel, saved_world);
    const int64_t begin = unit.layout.shard_begin(rank);
    const int64_t end = std::min(begin + unit.layout.shard_numel, unit.layout.numel);
    for (auto [suffix, into] : {std::pair{".shard", unit.shard}, {".exp_avg", unit.exp_avg}, {".exp_avg_sq", unit.exp_avg_sq}}) {
      torch::Tensor mine = torch::zeros({unit.layout.shard_numel}, into.options().device(torch::kCPU).requires_grad(false));
      for (int64_t at = begin; at < end;) {
        const int r = static_cast<int>(at / saved_shard);
        const int64_t offset = at - r * saved_shard, n = std::min(end, (r + 1) * saved_shard) - at;
        const torch::Tensor from = file_of(r).find(name + suffix);
        if (!from.defined() || from.numel() != saved_shard || from.scalar_type() != into.scalar_type())
          throw amplab::Error("sharded checkpoint '" + dir + "': rank " + std::to_string(r) + "'s " + name + suffix +
                              (from.defined() ? " does not fit the model's unit " + std::to_string(u) : " is missing"));
        mine.narrow(0, at - begin, n).copy_(from.narrow(0, offset, n));
        at += n;
      }
      copies.push_back({into, mine});
    }
  }
  const amplab::SafetensorsFile& first = files.empty() ? file_of(0) : files.begin()->second;  // a shard all padding reads rank 0's
  const std::string step = first.metadata.count("step") ? first.metadata.at("step") : "";
  if (step.empty() || step.find_first_not_of("0123456789") != std::string::npos)
    throw amplab::Error("sharded checkpoint '" + dir + "': a file without a step count");
  for (const auto& [r, file] : files)
    if (!file.metadata.count("step") || file.metadata.at("step") != step)
      throw amplab::Error("sharded checkpoint '" + dir + "': rank " + std::to_string(r) + "'s file has another step count");
  torch::NoGradGuard no_grad;
  for (auto& [into, from] : copies) into.copy_(from);
  model.set_steps(std::stoll(step));
  // END SOLUTION
}

}  // namespace zero_lab
