// The safetensors format (src/amplab/state/safetensors.hpp): every dtype bit for bit, metadata, modules
// under the names PyTorch gives them, and each kind of bad file refused in one line naming the
// file. Python's own package reading our files, and ours reading its: safetensors_interop.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/models/models.hpp"
#include "amplab/state/safetensors.hpp"
#include "safetensors_samples.hpp"
#include "support.hpp"

namespace amplab {
namespace {

std::string bytes_of(const std::string& path) { return read_file(path); }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file made by hand: the header's length, the header as given, then `data_bytes` zero bytes.
std::string hand_made(const std::string& header, size_t data_bytes) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + std::string(data_bytes, '\0');
}

// load_safetensors refuses the file in one line that names it and says each of `parts`.
::testing::AssertionResult refused(const std::string& path, std::initializer_list<std::string> parts) {
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    std::string message = e.what();
    if (message.find('\n') != std::string::npos) return ::testing::AssertionFailure() << "not one line: " << message;
    if (message.find("safetensors file '" + path + "'") == std::string::npos)
      return ::testing::AssertionFailure() << "does not name the file: " << message;
    for (const auto& part : parts)
      if (message.find(part) == std::string::npos) return ::testing::AssertionFailure() << "lacks \"" << part << "\": " << message;
    return ::testing::AssertionSuccess() << message;
  }
  return ::testing::AssertionFailure() << "was accepted";
}

TEST(Safetensors, EveryDtypeRoundTripsBitForBit) {
  test::TempDir dir;
  const NamedTensors tensors = test::awkward_tensors();
  save_safetensors(dir.file("a.safetensors"), tensors);
  SafetensorsFile file = load_safetensors(dir.file("a.safetensors"));
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);  // written in the order given, read in the data's order
    EXPECT_TRUE(test::tensors_equal(file.tensors[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, LayoutIsTheFormatsByteForByte) {
  // One F32 [2] tensor: the length, the JSON padded with spaces to 8 bytes, 1.0f and -0.0f little-endian.
  std::string bytes = serialize_safetensors({{"w", torch::tensor({1.0f, -0.0f})}});
  const std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  ASSERT_EQ(bytes.size(), 8 + padded.size() + 8);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), padded.size());
  EXPECT_EQ(bytes.substr(1, 7), std::string(7, '\0'));
  EXPECT_EQ(bytes.substr(8, padded.size()), padded);
  EXPECT_EQ(bytes.substr(8 + padded.size()), std::string("\x00\x00\x80\x3f\x00\x00\x00\x80", 8));
}

TEST(Safetensors, ViewsAndChannelsLastAreWrittenAsTheirValues) {
  torch::manual_seed(0);
  torch::Tensor base = torch::randn({3, 5});
  torch::Tensor nhwc = torch::randn({2, 3, 4, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  SafetensorsFile file = parse_safetensors(serialize_safetensors({{"t", base.t()}, {"nhwc", nhwc}}), "views");
  EXPECT_TRUE(test::tensors_equal(file.find("t"), base.t().contiguous()));
  EXPECT_TRUE(test::tensors_equal(file.find("nhwc"), nhwc.contiguous()));
  EXPECT_FALSE(file.find("absent").defined());
}

TEST(Safetensors, MetadataRoundTrips) {
  test::TempDir dir;
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"lab", "mnist"}, {"note", "ünïcode, \"quotes\"\n"}};
  save_safetensors(dir.file("m.safetensors"), {{"x", torch::ones({2})}}, metadata);
  EXPECT_EQ(load_safetensors(dir.file("m.safetensors")).metadata, metadata);
  EXPECT_NE(bytes_of(dir.file("m.safetensors")).find("\"__metadata__\""), std::string::npos);
  // No tensors at all is a valid file too.
  save_safetensors(dir.file("none.safetensors"), {}, {{"k", "v"}});
  SafetensorsFile none = load_safetensors(dir.file("none.safetensors"));
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_EQ(none.metadata.at("k"), "v");
}

TEST(Safetensors, SaveIsAtomicAndReplacesTheOldFile) {
  test::TempDir dir;
  const std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"x", torch::zeros({4})}});
  save_safetensors(path, {{"x", torch::ones({2})}});
  EXPECT_TRUE(test::tensors_equal(load_safetensors(path).find("x"), torch::ones({2})));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
}

TEST(Safetensors, SaveRefusesWhatTheFormatCannotHold) {
  EXPECT_TRUE(test::throws_with([] { serialize_safetensors({{"c", torch::zeros({2}, torch::kComplexFloat)}}); },
                                {"cannot save tensor 'c'", "ComplexFloat", "no safetensors name"}));
  EXPECT_TRUE(test::throws_with([] { serialize_safetensors({{"a", torch::ones({1})}, {"a", torch::ones({1})}}); },
                                {"'a'", "appears twice"}));
  EXPECT_TRUE(test::throws_with([] { serialize_safetensors({{"__metadata__", torch::ones({1})}}); }, {"reserves that name"}));
  EXPECT_TRUE(test::throws_with([] { serialize_safetensors({{"u", torch::Tensor()}}); }, {"'u'", "undefined"}));
  EXPECT_TRUE(test::throws_with([] { serialize_safetensors({{std::string("\xff\xfe"), torch::ones({1})}}); }, {"not valid UTF-8"}));
}

TEST(Safetensors, ModuleRoundTripUsesPyTorchsNames) {
  test::TempDir dir;
  torch::manual_seed(1);
  MnistNet trained;
  std::vector<std::string> names;
  for (const auto& [name, t] : module_tensors(*trained)) names.push_back(name);
  // pytorch/examples' mnist Net: model.state_dict().keys() in Python.
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                             "fc1.bias", "fc2.weight", "fc2.bias"}));
  save_module_safetensors(*trained, dir.file("net.safetensors"), {{"lab", "mnist"}});

  torch::manual_seed(2);
  MnistNet fresh;
  auto metadata = load_module_safetensors(*fresh, dir.file("net.safetensors"));
  EXPECT_EQ(metadata.at("lab"), "mnist");
  for (size_t i = 0; i < trained->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_equal(fresh->parameters()[i], trained->parameters()[i])) << names[i];
  EXPECT_TRUE(fresh->parameters()[0].requires_grad()) << "loading must not turn a parameter into a non-leaf";
  EXPECT_TRUE(fresh->parameters()[0].is_leaf());
}

TEST(Safetensors, ModuleLoadRefusesAMismatchAndChangesNothing) {
  test::TempDir dir;
  torch::manual_seed(3);
  MnistNet net;
  const torch::Tensor before = net->fc2->bias.clone();
  NamedTensors tensors = module_tensors(*net);
  auto without = [&](const std::string& skip) {
    NamedTensors out;
    for (const auto& [name, t] : tensors)
      if (name != skip) out.emplace_back(name, t);
    return out;
  };
  auto replaced = [&](const std::string& target, torch::Tensor value) {
    NamedTensors out = tensors;
    for (auto& [name, t] : out)
      if (name == target) t = value;
    return out;
  };
  auto expect_refused = [&](const NamedTensors& file_tensors, std::initializer_list<std::string> parts) {
    const std::string path = dir.file("bad.safetensors");
    save_safetensors(path, file_tensors);
    try {
      load_module_safetensors(*net, path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_NE(message.find("safetensors file '" + path + "'"), std::string::npos) << message;
      for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "lacks \"" << part << "\": " << message;
    }
  };
  expect_refused(without("conv2.bias"), {"lacks 'conv2.bias' (F32 [64]), which the model has"});
  NamedTensors extra = replaced("fc2.bias", torch::zeros({10}));
  extra.emplace_back("fc3.weight", torch::zeros({2, 2}));
  expect_refused(extra, {"holds 'fc3.weight' (F32 [2, 2]), which the model does not have"});
  expect_refused(replaced("fc2.bias", torch::zeros({11})), {"'fc2.bias' is F32 [11] in the file, F32 [10] in the model"});
  expect_refused(replaced("fc2.bias", torch::zeros({10}, torch::kFloat16)),
                 {"'fc2.bias' is F16 [10] in the file, F32 [10] in the model"});
  EXPECT_TRUE(test::tensors_equal(net->fc2->bias, before)) << "a refused file changed the model";
}

TEST(Safetensors, RefusesATruncatedFile) {
  test::TempDir dir;
  const std::string good = serialize_safetensors(test::awkward_tensors());
  write_bytes(dir.file("cut.safetensors"), good.substr(0, good.size() - 3));
  EXPECT_TRUE(refused(dir.file("cut.safetensors"), {"past the end of the data", "truncated"}));
  write_bytes(dir.file("tiny.safetensors"), good.substr(0, 5));
  EXPECT_TRUE(refused(dir.file("tiny.safetensors"), {"is truncated: 5 bytes"}));
  EXPECT_TRUE(refused(dir.file("absent.safetensors"), {"does not exist"}));
}

TEST(Safetensors, RefusesAHeaderLongerThanTheFile) {
  test::TempDir dir;
  std::string bytes = hand_made(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  bytes[0] = static_cast<char>(0xff);
  bytes[1] = static_cast<char>(0x10);
  write_bytes(dir.file("h.safetensors"), bytes);
  EXPECT_TRUE(refused(dir.file("h.safetensors"), {"announces a header of 4351 bytes", "longer than the"}));
  // A torch::save archive (a zip) is not mistaken for one either.
  std::string zip("PK\x03\x04\x00\x00\x00\x00", 8);
  zip.append(64, 'x');
  write_bytes(dir.file("zip.safetensors"), zip);
  EXPECT_TRUE(refused(dir.file("zip.safetensors"), {"announces a header of"}));
}

TEST(Safetensors, RefusesOffsetsOutOfRangeOrOrder) {
  test::TempDir dir;
  write_bytes(dir.file("past.safetensors"), hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4));
  EXPECT_TRUE(refused(dir.file("past.safetensors"), {"tensor 'a' has data_offsets [0, 8] past the end of the data (4 bytes"}));
  write_bytes(dir.file("back.safetensors"), hand_made(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4));
  EXPECT_TRUE(refused(dir.file("back.safetensors"), {"tensor 'a' has data_offsets [4, 0] out of order"}));
  write_bytes(dir.file("neg.safetensors"), hand_made(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1));
  EXPECT_TRUE(refused(dir.file("neg.safetensors"), {"tensor 'a' has data_offsets [-1,0], not [begin, end]"}));
  write_bytes(dir.file("gap.safetensors"), hand_made(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  EXPECT_TRUE(refused(dir.file("gap.safetensors"), {"2 bytes of data no tensor holds, at [0, 2] before tensor 'a'"}));
  write_bytes(dir.file("tail.safetensors"), hand_made(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5));
  EXPECT_TRUE(refused(dir.file("tail.safetensors"), {"3 bytes after its last tensor"}));
}

TEST(Safetensors, RefusesOverlappingTensors) {
  test::TempDir dir;
  write_bytes(dir.file("o.safetensors"),
              hand_made(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12));
  EXPECT_TRUE(refused(dir.file("o.safetensors"), {"overlapping tensors: 'a' at [0, 8] and 'b' at [4, 12]"}));
  // An empty tensor inside another one's bytes overlaps it too.
  write_bytes(dir.file("e.safetensors"),
              hand_made(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})", 8));
  EXPECT_TRUE(refused(dir.file("e.safetensors"), {"overlapping tensors: 'a' at [0, 8] and 'z' at [4, 4]"}));
}

TEST(Safetensors, RefusesBytesThatDoNotMatchShapeAndDtype) {
  test::TempDir dir;
  write_bytes(dir.file("size.safetensors"), hand_made(R"({"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,24]}})", 24));
  EXPECT_TRUE(refused(dir.file("size.safetensors"), {"tensor 'a' is F16 [2, 3], 12 bytes, but its data_offsets [0, 24] hold 24"}));
  write_bytes(dir.file("dtype.safetensors"), hand_made(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_TRUE(refused(dir.file("dtype.safetensors"), {"tensor 'a' has dtype \"C64\", not one of F64, F32"}));
  write_bytes(dir.file("shape.safetensors"), hand_made(R"({"a":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,2]}})", 2));
  EXPECT_TRUE(refused(dir.file("shape.safetensors"), {"tensor 'a' has shape [2,-1], not a list of sizes >= 0"}));
  write_bytes(dir.file("huge.safetensors"),
              hand_made(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]}})", 2));
  EXPECT_TRUE(refused(dir.file("huge.safetensors"), {"more elements than any file holds"}));
  write_bytes(dir.file("field.safetensors"), hand_made(R"({"a":{"dtype":"U8","data_offsets":[0,2]}})", 2));
  EXPECT_TRUE(refused(dir.file("field.safetensors"), {"tensor 'a' has no \"shape\""}));
  write_bytes(dir.file("bool.safetensors"), hand_made(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 0) + "\x01\x02");
  EXPECT_TRUE(refused(dir.file("bool.safetensors"), {"tensor 'a' (BOOL) holds byte 2 at element 1, not 0 or 1"}));
}

TEST(Safetensors, RefusesAHeaderThatIsNotTheFormatsJson) {
  test::TempDir dir;
  write_bytes(dir.file("json.safetensors"), hand_made(R"({"a":{"dtype":"U8",)", 0));
  EXPECT_TRUE(refused(dir.file("json.safetensors"), {"has a header that is not valid JSON: parse error"}));
  write_bytes(dir.file("start.safetensors"), hand_made(R"(["a"])", 0));
  EXPECT_TRUE(refused(dir.file("start.safetensors"), {"does not start with '{'"}));
  write_bytes(dir.file("twice.safetensors"),
              hand_made(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2));
  EXPECT_TRUE(refused(dir.file("twice.safetensors"), {"names 'a' twice"}));
  write_bytes(dir.file("meta.safetensors"), hand_made(R"({"__metadata__":{"epochs":3}})", 0));
  EXPECT_TRUE(refused(dir.file("meta.safetensors"), {"\"__metadata__\" entry 'epochs' = 3, not a string"}));
  write_bytes(dir.file("entry.safetensors"), hand_made(R"({"a":[1,2]})", 0));
  EXPECT_TRUE(refused(dir.file("entry.safetensors"), {"tensor 'a' is described by array, not an object"}));
  // A header with a newline and control bytes still gives one printable line.
  write_bytes(dir.file("ctrl.safetensors"), hand_made("{\"a\n\x01", 0));
  EXPECT_TRUE(refused(dir.file("ctrl.safetensors"), {"not valid JSON"}));
}

TEST(Safetensors, AcceptsPaddingAndAnyEntryOrder) {
  // Python's writer pads the header with spaces and orders entries by dtype, not by offset.
  std::string bytes = hand_made(
      R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[4,5]},"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}   )", 0);
  bytes += std::string("\x07\x00\x00\x00\x09", 5);
  SafetensorsFile file = parse_safetensors(bytes, "padded");
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors[0].first, "a");  // the data's order
  EXPECT_EQ(file.find("a").item<int32_t>(), 7);
  EXPECT_EQ(file.find("b").item<uint8_t>(), 9);
}

}  // namespace
}  // namespace amplab
