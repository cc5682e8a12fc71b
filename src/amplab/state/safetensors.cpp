// The safetensors format (safetensors.hpp): the JSON header, its checks, reading and writing.
#include "amplab/state/safetensors.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/paths.hpp"

// The data is the host's own bytes, copied as they are: the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.cpp assumes a little-endian host");

namespace amplab {

namespace {

// The safetensors package's header limit (bytes): a larger header is refused there, so here too.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct Dtype {
  const char* name;  // as the file spells it
  c10::ScalarType type;
  int64_t bytes;     // per element
};

constexpr Dtype kDtypes[] = {
    {"F64", c10::ScalarType::Double, 8},         {"F32", c10::ScalarType::Float, 4},
    {"F16", c10::ScalarType::Half, 2},           {"BF16", c10::ScalarType::BFloat16, 2},
    {"I64", c10::ScalarType::Long, 8},           {"I32", c10::ScalarType::Int, 4},
    {"I16", c10::ScalarType::Short, 2},          {"I8", c10::ScalarType::Char, 1},
    {"U8", c10::ScalarType::Byte, 1},            {"BOOL", c10::ScalarType::Bool, 1},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn, 1}, {"F8_E5M2", c10::ScalarType::Float8_e5m2, 1},
};

std::string dtype_names() {
  std::string out;
  for (const Dtype& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

const Dtype* dtype_of(c10::ScalarType type) {
  for (const Dtype& d : kDtypes)
    if (d.type == type) return &d;
  return nullptr;
}

const Dtype* dtype_named(const std::string& name) {
  for (const Dtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

// "F32 [128, 9216]": how messages show a tensor.
std::string describe(const at::Tensor& t) {
  const Dtype* d = dtype_of(t.scalar_type());
  return std::string(d ? d->name : c10::toString(t.scalar_type())) + " " + c10::str(t.sizes());
}

// Text from a file, safe to put in a one-line message: no control bytes, at most 60 characters.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 60)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return out + (text.size() > 60 ? "..." : "");
}

// One entry of the header, checked against the format but not yet against the other entries.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data
};

// A JSON value that must be a non-negative integer below 2^63 (shapes, offsets).
bool to_count(const nlohmann::json& value, uint64_t& out) {
  if (value.is_number_unsigned()) out = value.get<uint64_t>();
  else if (value.is_number_integer() && value.get<int64_t>() >= 0) out = static_cast<uint64_t>(value.get<int64_t>());
  else return false;
  return out <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

// Checks one tensor's entry: its fields, and that its offsets span exactly its elements' bytes
// and lie within the `data_bytes` of data.
Entry parse_entry(const std::string& name, const nlohmann::json& value, uint64_t data_bytes,
                  const std::function<Error(const std::string&)>& fail) {
  Entry e;
  e.name = name;
  const std::string who = "tensor '" + printable(name) + "'";
  if (!value.is_object()) throw fail(who + " is described by " + std::string(value.type_name()) + ", not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) throw fail(who + " has no \"" + field + "\"");
  const auto& dtype = value["dtype"];
  if (!dtype.is_string() || !(e.dtype = dtype_named(dtype.get<std::string>())))
    throw fail(who + " has dtype " + printable(dtype.dump()) + ", not one of " + dtype_names());
  const auto& shape = value["shape"];
  if (!shape.is_array()) throw fail(who + " has shape " + printable(shape.dump()) + ", not a list of sizes");
  uint64_t elements = 1;
  for (const auto& size : shape) {
    uint64_t n = 0;
    if (!to_count(size, n)) throw fail(who + " has shape " + printable(shape.dump()) + ", not a list of sizes >= 0");
    if (n != 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / n)
      throw fail(who + " has shape " + printable(shape.dump()) + ": more elements than any file holds");
    elements *= n;
    e.shape.push_back(static_cast<int64_t>(n));
  }
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !to_count(offsets[0], e.begin) || !to_count(offsets[1], e.end))
    throw fail(who + " has data_offsets " + printable(offsets.dump()) + ", not [begin, end] in bytes");
  const std::string span = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) throw fail(who + " has data_offsets " + span + " out of order (end before begin)");
  if (e.end > data_bytes)
    throw fail(who + " has data_offsets " + span + " past the end of the data (" + std::to_string(data_bytes) +
               " bytes after the header; a truncated file?)");
  const uint64_t expected = elements * static_cast<uint64_t>(e.dtype->bytes);
  if (e.end - e.begin != expected)
    throw fail(who + " is " + e.dtype->name + " " + c10::str(c10::IntArrayRef(e.shape)) + ", " + std::to_string(expected) +
               " bytes, but its data_offsets " + span + " hold " + std::to_string(e.end - e.begin));
  return e;
}

// The "__metadata__" entry: names to strings.
std::map<std::string, std::string> parse_metadata(const nlohmann::json& value,
                                                  const std::function<Error(const std::string&)>& fail) {
  if (!value.is_object()) throw fail("has \"__metadata__\" " + printable(value.dump()) + ", not an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string())
      throw fail("has \"__metadata__\" entry '" + printable(key) + "' = " + printable(text.dump()) + ", not a string");
    out[key] = text.get<std::string>();
  }
  return out;
}

// Sorted by offset, the tensors must tile the data exactly: each starts where the previous one
// ended, and the last ends where the data does (the safetensors package refuses anything else).
void check_tiling(std::vector<Entry>& entries, uint64_t data_bytes, const std::function<Error(const std::string&)>& fail) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  auto span = [](const Entry& e) { return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]"; };
  for (const Entry& e : entries) {
    if (e.begin < cursor)
      throw fail("has overlapping tensors: '" + printable(previous->name) + "' at " + span(*previous) + " and '" +
                 printable(e.name) + "' at " + span(e));
    if (e.begin > cursor)
      throw fail("has " + std::to_string(e.begin - cursor) + " bytes of data no tensor holds, at [" +
                 std::to_string(cursor) + ", " + std::to_string(e.begin) + "] before tensor '" + printable(e.name) + "'");
    cursor = e.end;
    previous = &e;
  }
  if (cursor != data_bytes)
    throw fail("has " + std::to_string(data_bytes - cursor) + " bytes after its last tensor that no tensor holds");
}

// The header's JSON, with a name given twice refused (JSON keeps only one of them).
nlohmann::json parse_header(const std::string& text, const std::function<Error(const std::string&)>& fail) {
  std::string duplicate;
  std::set<std::string> seen;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0 && what.find("] ") != std::string::npos) what = what.substr(what.find("] ") + 2);
    throw fail("has a header that is not valid JSON: " + printable(what.substr(0, 120)));
  }
  if (!header.is_object()) throw fail("has a header that is not a JSON object");
  if (!duplicate.empty()) throw fail("names '" + printable(duplicate) + "' twice in its header");
  return header;
}

// A BOOL tensor's bytes must be 0 or 1: any other byte is not a bool torch can hold.
void check_bools(const Entry& e, const char* bytes, const std::function<Error(const std::string&)>& fail) {
  for (uint64_t i = 0; i < e.end - e.begin; ++i)
    if (static_cast<unsigned char>(bytes[i]) > 1)
      throw fail("tensor '" + printable(e.name) + "' (BOOL) holds byte " +
                 std::to_string(static_cast<unsigned char>(bytes[i])) + " at element " + std::to_string(i) +
                 ", not 0 or 1");
}

void put_le64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

at::Tensor SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  return {};
}

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> contents;  // on the CPU, row-major
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string who = "safetensors: cannot save tensor '" + printable(name) + "': ";
    if (name == "__metadata__") throw Error(who + "the format reserves that name for the metadata");
    if (!names.insert(name).second) throw Error(who + "the name appears twice");
    if (!t.defined()) throw Error(who + "it is undefined");
    const Dtype* dtype = dtype_of(t.scalar_type());
    if (!dtype)
      throw Error(who + "its dtype " + std::string(c10::toString(t.scalar_type())) + " has no safetensors name (" +
                  dtype_names() + ")");
    if (t.layout() != c10::kStrided) throw Error(who + "only dense tensors can be saved, not " + c10::str(t.layout()));
    contents.push_back(t.detach().to(c10::kCPU).contiguous());
    const uint64_t bytes = static_cast<uint64_t>(contents.back().numel()) * static_cast<uint64_t>(dtype->bytes);
    header[name] = {{"dtype", dtype->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw Error("safetensors: cannot save: a tensor name or metadata string is not valid UTF-8");
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned (the length field is 8 bytes)
  std::string out;
  out.reserve(8 + json.size() + offset);
  put_le64(out, json.size());
  out += json;
  for (const at::Tensor& c : contents)
    out.append(static_cast<const char*>(c.const_data_ptr()), c.numel() * static_cast<size_t>(c.element_size()));
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name) {
  // "safetensors file 'PATH' has ...", or "safetensors file 'PATH': tensor 'x' is ...".
  std::function<Error(const std::string&)> fail = [&](const std::string& what) {
    return Error("safetensors file '" + name + "'" + (what.rfind("tensor '", 0) == 0 ? ": " : " ") + what);
  };
  if (bytes.size() < 8)
    throw fail("is truncated: " + std::to_string(bytes.size()) + " bytes, less than the 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 0; i < 8; ++i) header_bytes |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (header_bytes > bytes.size() - 8)
    throw fail("announces a header of " + std::to_string(header_bytes) + " bytes, longer than the " +
               std::to_string(bytes.size() - 8) + " bytes after the length (truncated, or not a safetensors file)");
  if (header_bytes > kMaxHeaderBytes)
    throw fail("announces a header of " + std::to_string(header_bytes) + " bytes, over the format's limit of " +
               std::to_string(kMaxHeaderBytes));
  const std::string text = bytes.substr(8, header_bytes);
  if (text.empty() || text[0] != '{') throw fail("has a header that does not start with '{' (not a safetensors file?)");
  const nlohmann::json header = parse_header(text, fail);

  const uint64_t data_bytes = bytes.size() - 8 - header_bytes;
  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") file.metadata = parse_metadata(value, fail);
    else entries.push_back(parse_entry(key, value, data_bytes, fail));
  }
  check_tiling(entries, data_bytes, fail);

  const char* data = bytes.data() + 8 + header_bytes;
  for (const Entry& e : entries) {
    if (e.dtype->type == c10::ScalarType::Bool) check_bools(e, data + e.begin, fail);
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type));
    if (e.end > e.begin) std::memcpy(t.mutable_data_ptr(), data + e.begin, e.end - e.begin);
    file.tensors.emplace_back(e.name, t);
  }
  return file;
}

SafetensorsFile load_safetensors(const std::string& path) {
  if (std::string problem = regular_file_problem(path); !problem.empty())
    throw Error("safetensors file '" + path + "' " + problem);
  return parse_safetensors(read_file(path), path);
}

NamedTensors module_tensors(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata) {
  save_safetensors(path, module_tensors(module), metadata);
}

std::map<std::string, std::string> load_module_safetensors(torch::nn::Module& module, const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  const NamedTensors mine = module_tensors(module);
  auto fail = [&](const std::string& what) { return Error("safetensors file '" + path + "' " + what); };
  auto names_of = [](const NamedTensors& tensors) {
    std::string out;
    for (size_t i = 0; i < tensors.size() && i < 8; ++i) out += (i ? ", " : "") + printable(tensors[i].first);
    return out + (tensors.size() > 8 ? ", ... (" + std::to_string(tensors.size()) + " in all)" : "");
  };
  for (const auto& [name, t] : mine) {
    at::Tensor stored = file.find(name);
    if (!stored.defined())
      throw fail("lacks '" + name + "' (" + describe(t) + "), which the model has; the file holds: " + names_of(file.tensors));
    if (stored.scalar_type() != t.scalar_type() || stored.sizes() != t.sizes())
      throw fail("does not match the model: '" + name + "' is " + describe(stored) + " in the file, " + describe(t) +
                 " in the model");
  }
  for (const auto& [name, t] : file.tensors) {
    bool known = std::any_of(mine.begin(), mine.end(), [&](const auto& m) { return m.first == name; });
    if (!known)
      throw fail("holds '" + printable(name) + "' (" + describe(t) + "), which the model does not have; the model's tensors: " +
                 names_of(mine));
  }
  at::NoGradGuard no_grad;  // parameters are leaves that require grad: copy_ into them is not a step to record
  for (const auto& [name, t] : mine) t.copy_(file.find(name));
  return file.metadata;
}

}  // namespace amplab
