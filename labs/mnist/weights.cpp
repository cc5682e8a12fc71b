// The network's weights in safetensors files (weights.hpp).
#include "weights.hpp"

#include <cstdio>

#include "amplab/infra/error.hpp"
#include "amplab/infra/paths.hpp"  // file_name_safe
#include "amplab/state/safetensors.hpp"

namespace mnist {

void load_init_weights(Net& net, const std::string& path) {
  try {
    amplab::load_module_safetensors(*net, path);
  } catch (const amplab::IoError&) {
    throw;
  } catch (const amplab::Error& e) {
    throw amplab::Error(std::string("mnist.init_weights: ") + e.what());
  }
}


std::string save_weights(Net& net, const ModeResult& result, const std::string& dataset, int64_t test_images,
                         const amplab::RunDir& run) {
  const std::string path = run.file("model-" + amplab::file_name_safe(result.mode) + ".safetensors");
  char accuracy[32];
  std::snprintf(accuracy, sizeof accuracy, "%.17g", result.test_accuracy.back());
  amplab::save_module_safetensors(*net, path,
                                  {{"format", "pt"},  // what Hugging Face's tools look for in a PyTorch state dict
                                   {"lab", "mnist"},
                                   {"mode", result.mode},
                                   {"dataset", dataset},
                                   {"epochs", std::to_string(result.test_accuracy.size())},
                                   {"test_accuracy", accuracy},
                                   {"test_images", std::to_string(test_images)}});
  return path;
}

}  // namespace mnist
