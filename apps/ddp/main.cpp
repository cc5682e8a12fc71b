// Lab 5, data-parallel training in C++: one process per GPU (or CPU processes for testing),
// gradients averaged by the version of gradient synchronization that dist.sync names (naive, flat,
// overlapped, bucketed: labs/ddp/data_parallel.hpp). Launch with our launcher or torchrun:
//   build/bin/amplab-run --nproc-per-node 2 -- build/bin/ddp [--set key=value ...]
//   torchrun --standalone --nproc-per-node 2 --no-python build/bin/ddp
// A single process (no launcher) trains alone, which is the baseline.
#include <torch/torch.h>

#include <iostream>
#include <optional>
#include <string>

#include "amplab/data/mnist.hpp"
#include "amplab/dist/trainer_sync.hpp"  // the loop's hooks
#include "amplab/fast/fast_path.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/models/models.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"
#include "bench.hpp"
#include "collectives.hpp"
#include "config.hpp"
#include "ddp_lab.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml

namespace {

using ddp_lab::DdpConfig;

// Trains the MNIST network data-parallel with dist.sync, then checks that every rank holds the
// same parameters; the epochs and the check go into `results`.
int train(const DdpConfig& config, const ddp_lab::Setup& setup, amplab::FitOptions options, amplab::Results& results) {
  const auto& world = setup.world;
  amplab::MnistData data = amplab::load_mnist(config.data);
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  amplab::MnistNet net = amplab::make_mnist_net(config.train);  // the fused network with train.fast_path
  auto sync = ddp_lab::make_gradient_sync(config.dist.sync, net.ptr(), setup, config.dist);
  auto images = amplab::normalize_images(data.train.images.to(setup.device));
  auto labels = data.train.labels.to(setup.device);
  auto test_images = amplab::normalize_images(data.test.images.to(setup.device));
  auto test_labels = data.test.labels.to(setup.device);

  amplab::Trainer trainer(net.ptr(), [&](const amplab::Batch& b) { return torch::nll_loss(net->forward(b.input), b.target); },
                          config.train, setup.device, {}, amplab::make_fast_path_optimizer);
  trainer.set_gradient_sync(sync.get());
  amplab::TensorBatches batches(images, labels,
                                ddp_lab::make_sampler(images.size(0), config.train.batch_size,
                                                      static_cast<uint64_t>(config.run.seed), world),
                                setup.device);
  // --resume "auto" after an elastic restart: every rank loads rank 0's latest
  options.dist = amplab::dist::loop_hooks(setup.comm);
  options.evaluate = [&](int64_t) {
    torch::NoGradGuard no_grad;
    net->eval();
    auto correct = torch::zeros({}, torch::dtype(torch::kInt64).device(setup.device));
    for (int64_t start = 0; start < test_images.size(0); start += 1000) {
      int64_t n = std::min<int64_t>(1000, test_images.size(0) - start);
      amplab::AutocastGuard autocast(setup.device, config.train.precision);
      correct += net->forward(test_images.narrow(0, start, n)).argmax(1).eq(test_labels.narrow(0, start, n)).sum();
    }
    net->train();
    return nlohmann::json{{"test_accuracy", correct.item<double>() / static_cast<double>(test_images.size(0))}};
  };
  amplab::log::info("training on " + std::to_string(world.world_size) + " rank(s), " + setup.comm->backend() + ", " +
                    "dist.sync " + amplab::enum_to_string(config.dist.sync) + ", " +
                    std::to_string(config.train.batch_size) + " samples per rank per step (global batch " +
                    std::to_string(config.train.batch_size * world.world_size) + ")");
  const amplab::FastPathSteps fast = amplab::fast_path_steps(trainer, world.world_size);
  amplab::log::info(fast.description);
  options.run_step = fast.run_step;
  amplab::FitResult fit = amplab::fit(trainer, batches, options);
  if (fit.status != amplab::FitStatus::completed) {
    if (world.is_main()) std::cerr << (fit.exit_code == amplab::kExitFailure ? "error: " : "") << fit.message << "\n";
    return fit.exit_code;
  }

  // Every rank must hold bit-identical parameters after data-parallel training.
  const ddp_lab::ParameterCheck check = ddp_lab::check_parameters_identical(*setup.comm, *net);
  if (world.is_main())
    std::cout << "parameters identical on all " << world.world_size << " rank(s): "
              << (check.identical ? "yes" : "NO, rank " + std::to_string(check.first_different_rank) + " differs")
              << " (crc32 " << check.fingerprint << ")\n";
  auto& epochs = results.table("epochs", {{"epoch", ""}, {"seconds", ""}, {"train_loss", ""}, {"samples_per_second_global", ""}, {"eval", ""}});
  for (const auto& e : fit.epochs) epochs.add({e.epoch, e.seconds, e.train_loss, e.samples_per_second * world.world_size, e.eval});
  results.set("world_size", world.world_size);
  results.set("backend", setup.comm->backend());
  results.set("sync", amplab::enum_to_string(config.dist.sync));
  results.set("fast_path", config.train.fast_path);
  results.set("parameters_identical", check.identical);
  results.set("fingerprint", check.fingerprint);
  return check.identical ? amplab::kExitOk : amplab::kExitFailure;
}

// Refuses, before the run directory exists, values that do not go together.
std::optional<int> check_config(const DdpConfig& config, const amplab::ConfigSource& source) {
  if (config.bench.enabled && config.collectives.enabled)
    throw amplab::Error(source.where("collectives.enabled") + ": bench.enabled and collectives.enabled are both true (" +
                        source.where("bench.enabled") + "); a run does one of them: set the other to false");
  if (config.bench.first_layer_pieces > config.bench.width)
    throw amplab::Error(source.where("bench.first_layer_pieces") + ": bench.first_layer_pieces: " +
                        std::to_string(config.bench.first_layer_pieces) + " pieces of a layer with bench.width = " +
                        std::to_string(config.bench.width) + " outputs (" + source.where("bench.width") +
                        "); allowed: 1 to bench.width");
  return std::nullopt;
}

// The lab's body on one rank: join the job (the student's ddp-1), then train, or time the
// collectives or the MLP step.
int run_rank(amplab::Lab<DdpConfig>& lab) {
  const std::string yaml = amplab::to_yaml(lab.config);
  const DdpConfig& config = lab.config;
  ddp_lab::Setup setup = ddp_lab::join_job(lab.world, lab.device, config.dist, yaml);
  amplab::log::info(lab.world.describe() + ", " + setup.comm->backend());
  lab.size_keys = config.bench.enabled ? "bench.width, bench.bucket_sweep_width, bench.layers or bench.batch"
                                       : "train.batch_size or data.train_limit";
  lab.draw_plots = config.bench.enabled;
  int code;
  if (config.collectives.enabled) {
    lab.size_keys = "collectives.sizes_kib";
    code = ddp_lab::run_collectives_bench(config.collectives, setup, lab.results);
  } else if (config.bench.enabled) {
    code = ddp_lab::run_bench(config, setup, lab.run, lab.results, amplab::make_fast_path_optimizer);
  } else {
    code = train(config, setup, lab.fit_options("mnist"), lab.results);
  }
  setup.comm->shutdown();  // every rank leaves in order: rank 0 hosts the store
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  amplab::LabInfo info{.name = amplab::this_lab::kName, .title = amplab::this_lab::kTitle, .accepts_resume = true,
                       .size_keys = "bench.width, bench.layers or bench.batch, or train.batch_size",
                       .resume_help = "", .one_process_per_rank = true};
  return amplab::lab_main<DdpConfig>(argc, argv, info, check_config, run_rank);
}
