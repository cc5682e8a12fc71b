// The C++ side of safetensors_interop.py, which checks our files against Python's own package:
//   safetensors_tool write PATH      writes the awkward tensors (safetensors_samples.hpp) and metadata
//   safetensors_tool read PATH       reads a file
//   safetensors_tool mnist IN OUT    loads IN into amplab::MnistNet, saves the module to OUT
// write and read print what this side holds as JSON on stdout: the metadata, and per tensor its
// name, torch dtype, shape and bytes (hex, in memory order), for Python to compare bit for bit.
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "amplab/infra/error.hpp"
#include "amplab/models/models.hpp"
#include "amplab/state/safetensors.hpp"
#include "safetensors_samples.hpp"

namespace {

// Python's name of the dtype (str(torch.float32) without "torch.").
std::string python_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return c10::toString(type);
  }
}

std::string hex_of(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.const_data_ptr());
  std::string out;
  char two[3];
  for (int64_t i = 0; i < c.numel() * c.element_size(); ++i) {
    std::snprintf(two, sizeof two, "%02x", bytes[i]);
    out += two;
  }
  return out;
}

nlohmann::json dump(const amplab::NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json out = {{"metadata", metadata}, {"tensors", nlohmann::json::array()}};
  for (const auto& [name, t] : tensors)
    out["tensors"].push_back({{"name", name}, {"dtype", python_dtype(t.scalar_type())}, {"shape", t.sizes().vec()},
                              {"hex", hex_of(t)}});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  try {
    if (command == "write" && argc == 3) {
      const std::map<std::string, std::string> metadata = {{"written_by", "amplab"}, {"note", "ünïcode and \"quotes\""}};
      const amplab::NamedTensors tensors = amplab::test::awkward_tensors();
      amplab::save_safetensors(argv[2], tensors, metadata);
      std::cout << dump(tensors, metadata).dump() << "\n";
      return 0;
    }
    if (command == "read" && argc == 3) {
      amplab::SafetensorsFile file = amplab::load_safetensors(argv[2]);
      std::cout << dump(file.tensors, file.metadata).dump() << "\n";
      return 0;
    }
    if (command == "mnist" && argc == 4) {
      amplab::MnistNet net;
      amplab::load_module_safetensors(*net, argv[2]);
      amplab::save_module_safetensors(*net, argv[3]);
      return 0;
    }
  } catch (const amplab::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "usage: safetensors_tool write PATH | read PATH | mnist IN OUT\n";
  return 2;
}
