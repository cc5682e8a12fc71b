// The start-up and finish every lab's main() shares (lab_main.hpp).
#include "amplab/lab_main.hpp"

#include <c10/util/Exception.h>

#include <iostream>
#include <stdexcept>

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

int run_body(const std::function<int()>& body, const std::string& size_keys) {
  const std::string lower = size_keys.empty() ? "the sizes set in the config (see --help)" : size_keys;
  try {
    return body();
  } catch (const c10::OutOfMemoryError& e) {
    std::string message = e.what_without_backtrace();
    throw std::runtime_error("out of GPU memory: " + message.substr(0, message.find('\n')) + "; lower " + lower);
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    message = message.substr(0, message.find('\n'));
    if (message.find("can't allocate memory") == std::string::npos) throw;
    throw std::runtime_error("out of CPU memory: " + message + "; lower " + lower);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of CPU memory; lower " + lower);
  }
}

}  // namespace detail
}  // namespace amplab
