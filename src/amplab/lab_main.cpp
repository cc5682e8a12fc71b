// The start-up and finish every lab's main() shares (lab_main.hpp).
#include "amplab/lab_main.hpp"

#include <iostream>

#include "amplab/infra/device.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/report/report.hpp"

namespace amplab {

bool config_runs_on_cpu(const std::string& device_spec) { return !resolve_device(device_spec).is_cuda(); }

namespace detail {

torch::Device start_run(const RunConfig& run, const std::string& title) {
  apply_run_settings(run);
  torch::Device device = resolve_device(run.device);
  std::cout << "== " << title << ", on " << describe(device) << " ==\n" << std::flush;
  return device;
}

void finish_run(const RunDir& run, const Results& results, const std::string& plot_kind) {
  if (!run.enabled()) return;
  results.write(run);
  std::cout << std::flush;  // before the plot script writes to the same stream
  if (!plot_kind.empty()) make_plots(plot_kind, run);
  write_report(run);
  std::cout << "\nresults: " << run.path() << "/\n";
}

}  // namespace detail
}  // namespace amplab
