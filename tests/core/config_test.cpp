// The YAML config binding: values, defaults, every kind of error, --set, round trips, fuzzing.
#include <gtest/gtest.h>

#include <random>

#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/infra/config_json.hpp"
#include "amplab/train/precision.hpp"
#include "support.hpp"

namespace amplab {
namespace {

struct OptimSection {
  double lr = 0.01;
  int64_t warmup_steps = 0;
  template <class V>
  void fields(V& v) {
    v.field("lr", lr, "learning rate", Range<double>::positive());
    v.field("warmup_steps", warmup_steps, "linear warm-up", Range<int64_t>::at_least(0));
  }
};

struct TrainSection {
  int epochs = 1;
  int64_t batch_size = 64;
  bool shuffle = true;
  Precision precision = Precision::fp32;
  std::string name = "demo";
  std::vector<std::string> modes = {"cpu"};
  std::vector<int64_t> sizes = {1, 2};
  OptimSection optim;
  template <class V>
  void fields(V& v) {
    v.field("epochs", epochs, "passes over the data", Range<int64_t>::between(1, 1000));
    v.field("batch_size", batch_size, "samples per step", Range<int64_t>::at_least(1));
    v.field("shuffle", shuffle, "shuffle each epoch");
    v.field("precision", precision, "numeric precision");
    v.field("name", name, "a label");
    v.field("modes", modes, "modes to run", {"cpu", "gpu", "gpu-amp"});
    v.field("sizes", sizes, "sizes", Range<int64_t>::at_least(1));
    v.section("optim", optim);
  }
};

struct TopConfig {
  TrainSection train;
  std::string device = "auto";
  template <class V>
  void fields(V& v) {
    v.field("device", device, "where to run");
    v.section("train", train);
  }
};

TopConfig bind(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  TopConfig c;
  ConfigSource::parse(yaml, "test.yaml", sets).bind(c);
  return c;
}

TEST(Config, EmptyDocumentKeepsDefaults) {
  auto c = bind("");
  EXPECT_EQ(c.train.epochs, 1);
  EXPECT_EQ(c.train.batch_size, 64);
  EXPECT_EQ(c.train.precision, Precision::fp32);
  EXPECT_DOUBLE_EQ(c.train.optim.lr, 0.01);
  EXPECT_EQ(c.device, "auto");
}

TEST(Config, ReadsEveryFieldType) {
  auto c = bind(
      "device: cuda:1\n"
      "train:\n"
      "  epochs: 7\n"
      "  batch_size: 256\n"
      "  shuffle: false\n"
      "  precision: bf16-mixed\n"
      "  name: hello world\n"
      "  modes: [gpu, gpu-amp]\n"
      "  sizes: [4, 8, 16]\n"
      "  optim:\n"
      "    lr: 1.5e-3\n");
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_EQ(c.train.epochs, 7);
  EXPECT_EQ(c.train.batch_size, 256);
  EXPECT_FALSE(c.train.shuffle);
  EXPECT_EQ(c.train.precision, Precision::bf16_mixed);
  EXPECT_EQ(c.train.name, "hello world");
  EXPECT_EQ(c.train.modes, (std::vector<std::string>{"gpu", "gpu-amp"}));
  EXPECT_EQ(c.train.sizes, (std::vector<int64_t>{4, 8, 16}));
  EXPECT_DOUBLE_EQ(c.train.optim.lr, 1.5e-3);
  EXPECT_EQ(c.train.optim.warmup_steps, 0);
}

TEST(Config, UnknownKeyNamesLineAndClosestKey) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: 2\n  bach_size: 3\n"); },
                                {"test.yaml:3", "unknown key 'train.bach_size'", "did you mean 'train.batch_size'"}));
}

TEST(Config, MisplacedKeySuggestsItsSection) {
  EXPECT_TRUE(test::throws_with([] { bind("lr: 0.1\n"); }, {"test.yaml:1", "unknown key 'lr'", "'train.optim.lr'"}));
}

TEST(Config, UnknownKeyWithoutCloseMatchListsValidKeys) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  zzzzzzzzzzzz: 1\n"); },
                                {"test.yaml:2", "unknown key 'train.zzzzzzzzzzzz'", "valid keys here", "epochs"}));
}

TEST(Config, WrongTypeNamesKeyAndWhatIsAllowed) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: many\n"); },
                                {"test.yaml:2", "train.epochs", "an integer in [1, 1000]", "'many'"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  shuffle: maybe\n"); }, {"train.shuffle", "true or false"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: 1.5\n"); }, {"train.epochs", "an integer"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  modes: gpu\n"); }, {"train.modes", "a list of"}));
  EXPECT_TRUE(test::throws_with([] { bind("train: 3\n"); }, {"test.yaml:1", "'train' is a section"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: [1]\n"); }, {"train.epochs", "a list"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs:\n"); }, {"train.epochs", "has no value"}));
}

TEST(Config, OutOfRangeValues) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: 0\n"); }, {"train.epochs", "[1, 1000]", "'0'"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  optim:\n    lr: -1\n"); }, {"test.yaml:3", "train.optim.lr", "> 0"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  optim:\n    lr: .nan\n"); }, {"train.optim.lr", "> 0"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  optim:\n    lr: .inf\n"); }, {"train.optim.lr"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  batch_size: 99999999999999999999\n"); }, {"train.batch_size"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  sizes: [1, 0]\n"); }, {"train.sizes", ">= 1", "'0'"}));
}

TEST(Config, ChoicesListTheAllowedValues) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  precision: fp8\n"); },
                                {"train.precision", "fp32, tf32, fp16-mixed, bf16-mixed", "'fp8'"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  modes: [cpu, tpu]\n"); }, {"train.modes", "cpu, gpu, gpu-amp", "'tpu'"}));
}

TEST(Config, DuplicateKeyIsAnError) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: 2\n  epochs: 3\n"); }, {"test.yaml:3", "train.epochs", "twice"}));
  // Blamed on the file's line, not on an unrelated --set of the same section.
  try {
    bind("train:\n  epochs: 2\ntrain:\n  batch_size: 3\n", {"train.optim.lr=0.5"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("test.yaml:3: key 'train' appears twice", 0), 0u) << e.what();
  }
}

// run.device is checked when the config is read: a typo is one line naming the file and line.
TEST(Config, RunDeviceIsAutoCpuCudaOrCudaN) {
  for (const char* good : {"auto", "cpu", "cuda", "cuda:0", "cuda:7"}) {
    RunConfig run;
    EXPECT_NO_THROW(ConfigSource::parse(std::string("device: ") + good + "\n", "run.yaml").bind(run)) << good;
    EXPECT_EQ(run.device, good);
  }
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "gpu", "CUDA"}) {
    RunConfig run;
    EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse(std::string("device: '") + bad + "'\n", "run.yaml").bind(run); },
                                  {"run.yaml:1", "device", "expected auto, cpu, cuda or cuda:N", bad}))
        << bad;
  }
}

TEST(Config, SyntaxErrorNamesLineAndColumn) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: [1, 2\n"); }, {"test.yaml:", "not valid YAML"}));
  EXPECT_TRUE(test::throws_with([] { bind("- a\n- b\n"); }, {"test.yaml:1", "expected a map of keys"}));
}

TEST(Config, MissingFileSaysWhichPathWasTried) {
  EXPECT_TRUE(test::throws_with([] { ConfigSource::load("/nonexistent/x.yaml"); },
                                {"'/nonexistent/x.yaml'", "cannot be opened"}));
}

TEST(Config, ADirectoryIsNotAConfigFile) {
  test::TempDir dir;  // an ifstream opens a directory and reads nothing: it was an empty config
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::load(dir.path().string()); }, {"'" + dir.path().string() + "'", "is a directory"}));
}

TEST(Config, BinaryFileIsRefused) {
  test::TempDir dir;
  auto path = dir.write("bin.yaml", std::string("a: 1\0\x01\x02", 7));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::load(path); }, {path, "not a text file"}));
}

TEST(Config, SetOverridesFileValuesAndCreatesSections) {
  auto c = bind("train:\n  epochs: 2\n", {"train.epochs=5", "train.optim.lr=0.5", "train.modes=[gpu]", "device=cpu"});
  EXPECT_EQ(c.train.epochs, 5);
  EXPECT_DOUBLE_EQ(c.train.optim.lr, 0.5);
  EXPECT_EQ(c.train.modes, (std::vector<std::string>{"gpu"}));
  EXPECT_EQ(c.device, "cpu");
}

TEST(Config, SetErrorsNameTheOverride) {
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.epochs=abc"}); }, {"--set train.epochs=abc", "train.epochs", "an integer"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.epoch=3"}); },
                                {"--set train.epoch=3", "unknown key 'train.epoch'", "did you mean 'train.epochs'"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.epochs"}); }, {"--set train.epochs", "KEY=VALUE"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train..epochs=1"}); }, {"empty key part"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.epochs="}); }, {"empty"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"device.x=1"}); }, {"--set device.x=1", "device: expected a string"}));
}

// A --set value means what it says: YAML that would drop part of it (a '#' comment, an anchor)
// keeps the whole text as a string, or is refused; a path starting with '~' is refused (only a
// shell expands it); a second document is refused, in a file or a value.
TEST(Config, SetValuesAreTakenWholeOrRefused) {
  EXPECT_EQ(bind("", {"device=runs #2"}).device, "runs #2");
  EXPECT_EQ(bind("", {"device=&anchor x"}).device, "&anchor x");
  EXPECT_EQ(bind("", {"device=#1"}).device, "#1");
  EXPECT_EQ(bind("", {"device=\"quoted # kept\""}).device, "quoted # kept");
  EXPECT_EQ(bind("", {"train.modes=[gpu, cpu]"}).train.modes, (std::vector<std::string>{"gpu", "cpu"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.modes=[gpu] # fast"}); }, {"--set train.modes=[gpu] # fast", "'#'", "comment"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"train.epochs=3 # three"}); }, {"train.epochs", "'3 # three'"}));
  EXPECT_TRUE(test::throws_with([] { bind("", {"device=a\n---\nb"}); }, {"--set device=", "second YAML document"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  epochs: 2\n---\ntrain:\n  epochs: 3\n"); },
                                {"test.yaml:3", "second YAML document"}));
  RunConfig run;
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("", "t.yaml", {"out_dir=~/runs"}).bind(run); },
                                {"out_dir", "'~/runs' starts with '~'", "$HOME/runs"}));
}

struct NarrowConfig {
  int count = 1;
  template <class V>
  void fields(V& v) {
    v.field("count", count, "an int", Range<int64_t>::at_least(1));
  }
};

// Beyond the field's type: said so, with the limit, not only the range's other end.
TEST(Config, NumbersBeyondTheirTypeAreNamedAsSuch) {
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  batch_size: 99999999999999999999\n"); },
                                {"train.batch_size", "beyond the range of a 64-bit integer"}));
  EXPECT_TRUE(test::throws_with([] { bind("train:\n  optim:\n    lr: 1e400\n"); }, {"train.optim.lr", "beyond the range of a double"}));
  NarrowConfig narrow;
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("count: 1000000000000\n", "t.yaml").bind(narrow); },
                                {"count", "larger than 2147483647"}));
}

// For checks across keys: where each value came from.
TEST(Config, WhereNamesTheLineTheOverrideOrTheFile) {
  auto source = ConfigSource::parse("train:\n  epochs: 2\n  optim:\n    lr: 0.5\n", "test.yaml", {"device=cpu"});
  EXPECT_EQ(source.where("train.epochs"), "test.yaml:2");
  EXPECT_EQ(source.where("train.optim.lr"), "test.yaml:4");
  EXPECT_EQ(source.where("device"), "--set device=cpu");
  EXPECT_EQ(source.where("train.modes"), "test.yaml");       // absent: its default
  EXPECT_EQ(source.where("train.epochs.more"), "test.yaml");  // under a value, not a section
  EXPECT_EQ(source.where("train.modes"), "test.yaml");       // looking up added nothing
}

TEST(Config, WrittenYamlReadsBackToTheSameValues) {
  auto c = bind("train:\n  epochs: 3\n  precision: fp16-mixed\n  modes: [gpu-amp, cpu]\n  optim:\n    lr: 0.1\n");
  std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("# learning rate"), std::string::npos) << yaml;
  TopConfig again;
  ConfigSource::parse(yaml, "resolved.yaml").bind(again);
  EXPECT_EQ(to_yaml(again), yaml);
  EXPECT_EQ(again.train.precision, Precision::fp16_mixed);
  EXPECT_DOUBLE_EQ(again.train.optim.lr, 0.1);
}

TEST(Config, DoublesSurviveTheRoundTripExactly) {
  TopConfig c;
  c.train.optim.lr = 0.1 + 1e-17 * 3;  // not representable in fewer than 17 digits
  c.train.optim.lr = 1.0 / 3.0;
  TopConfig again;
  ConfigSource::parse(to_yaml(c), "r.yaml").bind(again);
  EXPECT_EQ(again.train.optim.lr, c.train.optim.lr);
}

// summary.json's copy of the resolved config: every key, each scalar with its type.
TEST(Config, ResolvedYamlAsJsonKeepsEveryKeyAndItsType) {
  TopConfig c = bind("device: \"0\"\ntrain:\n  name: \"\"\n  optim:\n    lr: 1e-08\n");
  nlohmann::json j = config_yaml_to_json(to_yaml(c));
  EXPECT_EQ(j["device"], "0");  // quoted: stays a string
  EXPECT_EQ(j["train"]["name"], "");
  EXPECT_EQ(j["train"]["epochs"], 1);
  EXPECT_TRUE(j["train"]["epochs"].is_number_integer());
  EXPECT_EQ(j["train"]["shuffle"], true);
  EXPECT_EQ(j["train"]["precision"], "fp32");
  EXPECT_EQ(j["train"]["modes"], nlohmann::json::array({"cpu"}));
  EXPECT_EQ(j["train"]["sizes"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(j["train"]["optim"]["lr"].get<double>(), 1e-08);
  EXPECT_EQ(j["train"]["optim"]["warmup_steps"], 0);
}

TEST(Config, DescribeKeysListsEveryKeyWithDefaults) {
  TopConfig c;
  std::string keys = describe_keys(c);
  EXPECT_NE(keys.find("train.optim.lr = 0.01"), std::string::npos) << keys;
  EXPECT_NE(keys.find("train.precision = fp32"), std::string::npos) << keys;
  EXPECT_NE(keys.find("fp16-mixed"), std::string::npos) << keys;
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

// Mutates valid configs thousands of times (flip, insert, delete, duplicate bytes and lines):
// the loader must never crash, and every failure must be an amplab::Error naming the source.
TEST(ConfigFuzz, MutatedConfigsFailCleanly) {
  const std::vector<std::string> seeds = {
      "device: cpu\ntrain:\n  epochs: 7\n  batch_size: 256\n  shuffle: false\n  precision: bf16-mixed\n"
      "  modes: [gpu, gpu-amp]\n  sizes: [4, 8]\n  optim:\n    lr: 1.5e-3\n    warmup_steps: 10\n",
      "train: {epochs: 2, optim: {lr: 0.1}}\n",
      "# comment\ntrain:\n  name: \"quoted: value\"\n  modes:\n    - cpu\n    - gpu\n"};
  const std::string alphabet = ":-[]{},#&*!|>'\"%@` \n\t0123456789.eE+abcxyz\x7f\xff";
  std::mt19937 rng(12345);
  int ok = 0, errors = 0;
  const int iterations = 20000;
  for (int i = 0; i < iterations; ++i) {
    std::string text = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      size_t pos = rng() % text.size();
      switch (rng() % 5) {
        case 0: text[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: text.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: text.erase(pos, 1 + rng() % 8); break;
        case 3: text.insert(pos, text.substr(pos, rng() % 16)); break;
        case 4: text[pos] = static_cast<char>(rng() % 256); break;
      }
    }
    try {
      TopConfig c;
      ConfigSource::parse(text, "fuzz.yaml").bind(c);
      ++ok;
    } catch (const Error& e) {
      std::string message = e.what();
      ASSERT_NE(message.find("fuzz.yaml"), std::string::npos) << "input:\n" << text << "\nmessage: " << message;
      ASSERT_EQ(message.find('\n'), std::string::npos) << "multi-line message: " << message;
      ++errors;
    }
  }
  std::cout << "[ fuzz     ] config loader: " << iterations << " mutated inputs, " << ok << " accepted, " << errors
            << " rejected with a clean error, 0 crashes\n";
  EXPECT_EQ(ok + errors, iterations);
  EXPECT_GT(errors, iterations / 10);
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

// A config file's `cpu:` section: its values replace the file's on a CPU run, --set wins over
// both, and the section itself is never a key.
TEST(ConfigOverlay, CpuSectionReplacesTheFilesValuesAndSetWins) {
  const std::string yaml = "train:\n  epochs: 10\n  batch_size: 256\ncpu:\n  train:\n    epochs: 1\n    optim: {lr: 0.5}\n";
  auto source = ConfigSource::parse(yaml, "lab.yaml", {"train.batch_size=32"});
  ASSERT_TRUE(source.has_overlay("cpu"));
  TopConfig gpu, cpu;
  source.bind(gpu);
  source.with_overlay("cpu").bind(cpu);
  EXPECT_EQ(gpu.train.epochs, 10);
  EXPECT_EQ(cpu.train.epochs, 1);
  EXPECT_DOUBLE_EQ(gpu.train.optim.lr, 0.01);
  EXPECT_DOUBLE_EQ(cpu.train.optim.lr, 0.5);
  EXPECT_EQ(gpu.train.batch_size, 32);
  EXPECT_EQ(cpu.train.batch_size, 32);

  auto overridden = ConfigSource::parse(yaml, "lab.yaml", {"train.epochs=3"}).with_overlay("cpu");
  TopConfig c;
  overridden.bind(c);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(overridden.where("train.epochs"), "--set train.epochs=3");
}

TEST(ConfigOverlay, MistakesInTheSectionNameTheirLine) {
  TopConfig c;
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("cpu:\n  train:\n    epoch: 1\n", "lab.yaml").with_overlay("cpu").bind(c); },
                                {"lab.yaml:3", "unknown key 'train.epoch'", "train.epochs"}));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("cpu: 3\n", "lab.yaml"); }, {"lab.yaml:1", "'cpu' must be a section"}));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("cpu:\n  run:\n    device: cuda\n", "lab.yaml"); },
                                {"lab.yaml:3", "cpu.run.device", "set run.device instead"}));
}

TEST(ConfigOverlay, WithoutTheSectionTheSameValues) {
  auto source = ConfigSource::parse("train:\n  epochs: 4\n", "lab.yaml", {"train.shuffle=false"});
  EXPECT_FALSE(source.has_overlay("cpu"));
  TopConfig c;
  source.with_overlay("cpu").bind(c);
  EXPECT_EQ(c.train.epochs, 4);
  EXPECT_FALSE(c.train.shuffle);
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

TEST(ConfigOverlay, SetCanNameAKeyOfTheSection) {
  const std::string yaml = "train:\n  epochs: 10\ncpu:\n  train:\n    epochs: 1\n";
  auto source = ConfigSource::parse(yaml, "lab.yaml", {"cpu.train.epochs=3", "train.batch_size=16"});
  TopConfig gpu, cpu;
  source.bind(gpu);
  source.with_overlay("cpu").bind(cpu);
  EXPECT_EQ(gpu.train.epochs, 10);
  EXPECT_EQ(cpu.train.epochs, 3);
  EXPECT_EQ(cpu.train.batch_size, 16);
  EXPECT_EQ(source.with_overlay("cpu").where("train.epochs"), "--set cpu.train.epochs=3");
  TopConfig c;
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse(yaml, "lab.yaml", {"cpu.train.epoch=3"}).with_overlay("cpu").bind(c); },
                                {"unknown key 'train.epoch'"}));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse(yaml, "lab.yaml", {"cpu.run.device=cuda"}); },
                                {"cpu.run.device", "set run.device instead"}));
}

TEST(ConfigSource, HasSaysWhetherTheFileOrASetGivesAKeyAValue) {
  auto source = ConfigSource::parse("train:\n  epochs: 10\n", "lab.yaml", {"train.name=x"});
  EXPECT_TRUE(source.has("train.epochs"));
  EXPECT_TRUE(source.has("train.name"));
  EXPECT_TRUE(source.has("train"));
  EXPECT_FALSE(source.has("train.batch_size"));
  EXPECT_FALSE(source.has("device"));
  EXPECT_FALSE(source.has("train.epochs.x"));
}

}  // namespace
}  // namespace amplab
