// The collectives benchmark (collectives.hpp): given, no TODOs.
#include "collectives.hpp"

#include <algorithm>
#include <functional>

#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/table.hpp"

namespace ddp_lab {
namespace {

constexpr int64_t kCpuLimitKib = 1024;

// What nccl-tests calls the bus bandwidth: the algorithm bandwidth (bytes / time, the bytes of
// the whole buffer) times the share of them each rank must send over its links, so that every
// collective at full speed shows the link's bandwidth. All-reduce sends 2(W-1)/W of the buffer,
// reduce-scatter and all-gather (W-1)/W each.
double bus_factor(const std::string& op, int world) {
  const double w = world;
  return op == "reduce-scatter" || op == "all-gather" ? (w - 1) / w : 2 * (w - 1) / w;
}

// Milliseconds per call of `call` (median over windows of `iterations` calls back to back),
// after `warmup` untimed calls; all ranks start each window together.
double ms_per_call(const std::function<void()>& call, const DdpCollectivesConfig& config, const Setup& setup) {
  for (int i = 0; i < config.warmup; ++i) call();
  std::vector<double> windows;
  amplab::DeviceTimer timer(setup.device);
  for (int w = 0; w < config.windows; ++w) {
    amplab::synchronize(setup.device);
    setup.comm->barrier();
    timer.start();
    for (int i = 0; i < config.iterations; ++i) call();
    windows.push_back(timer.stop_ms() / config.iterations);
  }
  return amplab::summarize(windows).median;
}

}  // namespace

int run_collectives_bench(const DdpCollectivesConfig& config, const Setup& setup, amplab::Results& results) {
  auto& comm = *setup.comm;
  const int world = comm.size(), rank = comm.rank();
  auto& table = results.table("collectives", {{"op", "collective"}, {"kib", "KiB", amplab::decimals(0)},
                                              {"us", "us/call", amplab::decimals(1)},
                                              {"algbw_gbps", "algbw GB/s", amplab::decimals(2)},
                                              {"busbw_gbps", "busbw GB/s", amplab::decimals(2)}});
  for (int64_t kib : config.sizes_kib) {
    if (comm.backend() == "cpu" && kib > kCpuLimitKib) {
      if (rank == 0)
        amplab::log::warn("collectives.sizes_kib: " + std::to_string(kib) + " KiB skipped: the cpu backend sends every "
                          "byte through rank 0's store, so sizes above " + std::to_string(kCpuLimitKib) +
                          " KiB take minutes there; they are for GPUs");
      continue;
    }
    // The whole buffer in fp32, rounded up to a multiple of the world size.
    const int64_t numel = world * amplab::dist::shard_numel(kib * 1024 / 4, world), shard = numel / world;
    auto options = torch::TensorOptions().dtype(torch::kFloat32).device(setup.device);
    auto whole = torch::ones({numel}, options), part = whole.narrow(0, rank * shard, shard);
    const std::vector<std::pair<std::string, std::function<void()>>> calls = {
        {"all-reduce", [&] { comm.all_reduce_sum({whole})->wait(); }},
        {"reduce-scatter", [&] { comm.reduce_scatter(part, whole)->wait(); }},
        {"all-gather", [&] { comm.all_gather(whole, part)->wait(); }},
        {"reduce-scatter + all-gather", [&] {
           comm.reduce_scatter(part, whole)->wait();
           comm.all_gather(whole, part)->wait();
         }}};
    for (const auto& [op, call] : calls) {
      whole.fill_(1);  // sums of sums stay finite
      const double ms = ms_per_call(call, config, setup);
      const double bytes = static_cast<double>(numel) * 4, algbw = bytes / (ms * 1e-3) / 1e9;
      table.add({op, bytes / 1024, ms * 1e3, algbw, algbw * bus_factor(op, world)});
    }
  }
  results.set("world_size", world);
  results.set("backend", comm.backend());
  if (rank != 0) return amplab::kExitOk;
  results.print("collectives",
                "Collectives on " + std::to_string(world) + " rank(s), " + comm.backend() + ", fp32",
                "us/call: median over " + std::to_string(config.windows) + " windows of " +
                    std::to_string(config.iterations) +
                    " calls back to back; KiB: the whole buffer (all-reduce's tensor, reduce-scatter's input, "
                    "all-gather's output); algbw = its bytes / time; busbw = algbw x 2(W-1)/W for all-reduce and the pair, "
                    "x (W-1)/W for reduce-scatter and all-gather (nccl-tests' definition)\n");
  return amplab::kExitOk;
}

}  // namespace ddp_lab
