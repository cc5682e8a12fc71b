// Weights in the safetensors format, the one Python's `safetensors` package reads and writes: a
// model trained here opens in Python (safetensors.torch.load_file), and weights made in Python
// start a run here. torch::save's archives cannot do either.
//
// The file: 8 bytes, the header's length N (unsigned, little-endian); N bytes of JSON mapping
// each tensor's name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (byte
// offsets into the data, which follows the header), plus an optional "__metadata__" object of
// strings; then the data, every tensor's elements contiguous, row-major, little-endian, the
// tensors back to back with neither gaps nor overlaps. Types: F64 F32 F16 BF16 I64 I32 I16 I8 U8
// BOOL F8_E4M3 F8_E5M2.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace amplab {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in the order of their data in the file, on the CPU
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when the file has none)
  // The tensor of that name, or an undefined tensor.
  at::Tensor find(const std::string& name) const;
};

// The file's bytes: a header padded with spaces to a multiple of 8 bytes (as Python's writer
// does: the data then starts 8-byte aligned), then the tensors in the order given. Tensors may
// live on any device and in any layout (channels-last, a transposed view): each is written as
// its logical row-major contents. An amplab::Error names the tensor when its type has no
// safetensors name, when a name appears twice or is "__metadata__", or is not UTF-8.
std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// Writes serialize_safetensors(...) to `path` atomically (files.hpp): a reader sees the old file
// or the whole new one, never a torn one.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and checks the whole file before returning anything: the header's length within the
// file, the JSON well formed, every entry's dtype, shape and offsets, each tensor's bytes equal
// to its elements times its type's size, the tensors covering the data exactly (no gap, no
// overlap, nothing after the last), BOOL bytes 0 or 1. A bad file is an amplab::Error of one
// line: "safetensors file 'PATH' <what is wrong>".
SafetensorsFile load_safetensors(const std::string& path);
// The same checks on bytes in memory; `name` stands for the path in messages.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name);

// The names PyTorch gives a module's state: named_parameters() then named_buffers(), dotted
// ("conv1.weight", "fc2.bias"). What torch.nn.Module.state_dict() holds in Python for the same
// module, so `model.load_state_dict(safetensors.torch.load_file(path))` takes the file there.
NamedTensors module_tensors(const torch::nn::Module& module);
void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata = {});

// Copies the file's tensors into the module's, on whatever device they live. Everything is
// checked before anything is copied, so a bad file leaves the module as it was: an amplab::Error
// names the file and the first problem: a tensor the module has and the file lacks, one the
// file has and the module does not, or a shape or dtype that differs. Returns the file's
// metadata.
std::map<std::string, std::string> load_module_safetensors(torch::nn::Module& module, const std::string& path);

}  // namespace amplab
