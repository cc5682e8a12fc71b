// Lab 5, data-parallel training in C++: one process per GPU (or CPU processes for testing),
// gradients averaged by the version of gradient synchronization that dist.sync names (naive, flat,
// overlapped, bucketed: labs/ddp/data_parallel.hpp). Launch with our launcher or torchrun:
//   build/bin/amplab-run --nproc-per-node 2 -- build/bin/ddp [--set key=value ...]
//   torchrun --standalone --nproc-per-node 2 --no-python build/bin/ddp
// A single process (no launcher) trains alone, which is the baseline.
#include <torch/torch.h>

#include <iostream>
#include <memory>

#include "amplab/data/mnist.hpp"
#include "amplab/dist/trainer_sync.hpp"  // the loop's hooks
#include "amplab/fast/fast_path.hpp"
#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/lab_main.hpp"  // run_lab_body
#include "amplab/measure/gpu_timeline.hpp"  // run.gpu_monitor
#include "amplab/models/models.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/results.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"
#include "bench.hpp"
#include "config.hpp"
#include "ddp_lab.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "mechanisms.hpp"

namespace {

using ddp_lab::DdpConfig;

// Trains the MNIST network data-parallel with dist.sync, then checks that every rank holds the
// same parameters; the epochs and the check go into `results`.
int train(const DdpConfig& config, const ddp_lab::Setup& setup, amplab::RunDir& run, const std::string& yaml,
          const amplab::CommandLine& cli, amplab::Results& results) {
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
                          config.train, setup.device, amplab::course_mechanisms(), {}, amplab::make_fast_path_optimizer);
  trainer.set_gradient_sync(sync.get());
  amplab::TensorBatches batches(images, labels,
                                ddp_lab::make_sampler(images.size(0), config.train.batch_size,
                                                      static_cast<uint64_t>(config.run.seed), world),
                                setup.device);
  amplab::FitOptions options;
  options.lab = amplab::this_lab::kName;
  options.tag = "mnist";
  options.config_yaml = yaml;
  options.data_seed = static_cast<uint64_t>(config.run.seed);
  options.run_dir = &run;
  options.checkpoint = config.checkpoint;
  options.checkpoint_dir = amplab::checkpoint_dir_for(config.checkpoint, config.run, amplab::this_lab::kName);
  options.resume = cli.resume;  // "auto" after an elastic restart: every rank loads rank 0's latest
  options.force_resume = cli.force;
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
  const auto [identical, mine] = amplab::dist::check_parameters_identical(*setup.comm, *net);
  if (world.is_main())
    std::cout << "parameters identical on all " << world.world_size << " rank(s): " << (identical ? "yes" : "NO")
              << " (crc32 " << mine << ")\n";
  auto& epochs = results.table("epochs", {{"epoch", ""}, {"seconds", ""}, {"train_loss", ""}, {"samples_per_second_global", ""}, {"eval", ""}});
  for (const auto& e : fit.epochs) epochs.add({e.epoch, e.seconds, e.train_loss, e.samples_per_second * world.world_size, e.eval});
  results.set("world_size", world.world_size);
  results.set("backend", setup.comm->backend());
  results.set("sync", amplab::enum_to_string(config.dist.sync));
  results.set("fast_path", config.train.fast_path);
  results.set("parameters_identical", identical);
  results.set("fingerprint", mine);
  return identical ? amplab::kExitOk : amplab::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&]() -> int {
    DdpConfig config, defaults;
    amplab::CommandLine cli;
    if (auto code = amplab::parse_command_line(argc, argv, amplab::this_lab::kName, amplab::this_lab::kTitle,
                                               amplab::describe_keys(defaults), cli))
      return *code;
    const auto source = amplab::load_lab_config(cli, config);
    if (config.bench.first_layer_pieces > config.bench.width)
      throw amplab::Error(source.where("bench.first_layer_pieces") + ": bench.first_layer_pieces: " +
                          std::to_string(config.bench.first_layer_pieces) +
                          " pieces of a layer with bench.width = " + std::to_string(config.bench.width) + " outputs (" +
                          source.where("bench.width") + "); allowed: 1 to bench.width");
    const std::string yaml = amplab::to_yaml(config);
    ddp_lab::Setup setup = ddp_lab::init_distributed(config.dist, config.run.device);
    amplab::dist::require_same_config(*setup.comm, yaml);
    amplab::RunDir run = ddp_lab::make_run_dir(config.run, yaml, setup.world);
    amplab::apply_run_settings(config.run);
    amplab::InterruptHandler interrupts;
    amplab::log::info(setup.world.describe() + " on " + amplab::describe(setup.device));
    // run.gpu_monitor: rank 0's GPU, sampled into rank 0's run directory (the other ranks write no files).
    std::unique_ptr<amplab::GpuTimeline> gpu_timeline;
    if (config.run.gpu_monitor && run.enabled() && setup.device.is_cuda())
      gpu_timeline = std::make_unique<amplab::GpuTimeline>(setup.device, run.file("gpu_monitor.csv"));
    amplab::Results results;
    const std::string size_keys = config.bench.enabled ? "bench.width, bench.layers or bench.batch"
                                                       : "train.batch_size or data.train_limit";
    const int code = amplab::run_lab_body(
        [&] {
          return config.bench.enabled ? ddp_lab::run_bench(config, setup, run, results, amplab::course_mechanisms(),
                                                                  amplab::make_fast_path_optimizer)
                                      : train(config, setup, run, yaml, cli, results);
        },
        size_keys).exit_code;
    if (gpu_timeline && gpu_timeline->available()) {
      gpu_timeline->stop();
      results.set("gpu_monitor", gpu_timeline->summary());
    }
    results.write(run);  // rank 0's run directory only
    std::cout << std::flush;  // before the plot script writes to the same stream
    if (config.bench.enabled && run.enabled()) {
      amplab::make_plots(amplab::this_lab::kName, run);
      amplab::write_report(run);  // the README's questions with this run's tables and plot
    }
    if (gpu_timeline && gpu_timeline->available() && code == amplab::kExitOk) amplab::make_plots("gpu_monitor", run);
    setup.comm->shutdown();
    return code;
  });
}
