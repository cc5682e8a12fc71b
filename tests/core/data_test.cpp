// IDX reading (plain and gzip), dataset discovery and loading, the epoch sampler, and a fuzz
// test of the reader.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/stat.h>

#include <cstdlib>
#include <random>

#include "amplab/data/idx.hpp"
#include "amplab/data/mnist.hpp"
#include "amplab/data/sampler.hpp"
#include "idx_files.hpp"
#include "support.hpp"

namespace amplab {
namespace {

using test::encode_idx;
using test::gzip_member;

IdxArray make_images(int64_t n) {
  IdxArray a;
  a.dims = {n, 28, 28};
  a.data.resize(static_cast<size_t>(n) * 28 * 28);
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<uint8_t>(i * 7 % 256);
  return a;
}

IdxArray make_labels(int64_t n) {
  IdxArray a;
  a.dims = {n};
  for (int64_t i = 0; i < n; ++i) a.data.push_back(static_cast<uint8_t>(i % 10));
  return a;
}

// A tiny dataset directory in MNIST's layout.
void write_dataset(const test::TempDir& dir, int64_t train, int64_t test, bool gzip) {
  std::string gz = gzip ? ".gz" : "";
  dir.write("train-images-idx3-ubyte" + gz, encode_idx(make_images(train), gzip));
  dir.write("train-labels-idx1-ubyte" + gz, encode_idx(make_labels(train), gzip));
  dir.write("t10k-images-idx3-ubyte" + gz, encode_idx(make_images(test), gzip));
  dir.write("t10k-labels-idx1-ubyte" + gz, encode_idx(make_labels(test), gzip));
}

TEST(Idx, PlainAndGzipRoundTrip) {
  for (bool gzip : {false, true}) {
    auto original = make_images(3);
    auto parsed = parse_idx(encode_idx(original, gzip), "x");
    EXPECT_EQ(parsed.dims, original.dims);
    EXPECT_EQ(parsed.data, original.data);
  }
}

TEST(Idx, HeaderErrorsNameTheFileAndProblem) {
  std::string good = encode_idx(make_labels(10), false);
  EXPECT_TRUE(test::throws_with([] { parse_idx("ab", "f.idx"); }, {"f.idx", "too short"}));
  std::string bad_magic = good;
  bad_magic[0] = 1;
  EXPECT_TRUE(test::throws_with([&] { parse_idx(bad_magic, "f.idx"); }, {"f.idx", "not an IDX file"}));
  std::string bad_type = good;
  bad_type[2] = 0x0d;
  EXPECT_TRUE(test::throws_with([&] { parse_idx(bad_type, "f.idx"); }, {"f.idx", "0x0d", "not supported"}));
  std::string bad_dims = good;
  bad_dims[3] = 9;
  EXPECT_TRUE(test::throws_with([&] { parse_idx(bad_dims, "f.idx"); }, {"f.idx", "9 dimensions"}));
  EXPECT_TRUE(test::throws_with([&] { parse_idx(good.substr(0, 6), "f.idx"); }, {"f.idx", "truncated in the header"}));
}

TEST(Idx, TruncatedAndOverlongData) {
  std::string good = encode_idx(make_labels(10), false);
  EXPECT_TRUE(test::throws_with([&] { parse_idx(good.substr(0, good.size() - 3), "f.idx"); },
                                {"f.idx", "truncated", "promises 10 values", "has 7"}));
  EXPECT_TRUE(test::throws_with([&] { parse_idx(good + "xyz", "f.idx"); }, {"f.idx", "3 unexpected bytes"}));
}

TEST(Idx, HugeHeaderIsRejectedBeforeAllocating) {
  std::string header{'\0', '\0', '\x08', '\x03'};
  for (int i = 0; i < 3; ++i) header += std::string("\xff\xff\xff\xff", 4);
  EXPECT_TRUE(test::throws_with([&] { parse_idx(header, "f.idx"); }, {"f.idx", "more than 2 GiB"}));
}

TEST(Idx, CorruptAndTruncatedGzip) {
  std::string gz = encode_idx(make_images(4), true);
  EXPECT_TRUE(test::throws_with([&] { parse_idx(gz.substr(0, gz.size() / 2), "f.gz"); }, {"f.gz", "truncated"}));
  std::string flipped = gz;
  flipped[gz.size() / 2] ^= 0x55;
  EXPECT_TRUE(test::throws_with([&] { parse_idx(flipped, "f.gz"); }, {"f.gz"}));
  std::string bad_crc = gz;
  bad_crc[gz.size() - 6] ^= 0x01;  // inside the CRC-32 of the gzip trailer
  EXPECT_TRUE(test::throws_with([&] { parse_idx(bad_crc, "f.gz"); }, {"f.gz", "corrupt"}));
}

TEST(Idx, MissingFileNamesThePath) {
  EXPECT_TRUE(test::throws_with([] { read_idx("/nonexistent/train-images-idx3-ubyte"); },
                                {"/nonexistent/train-images-idx3-ubyte", "cannot open", "does not exist"}));
}

// What `cat a.gz b.gz` and pigz make is one file to gzip -d, and to us.
TEST(Idx, AMultiMemberGzipIsReadWhole) {
  IdxArray images = make_images(3);
  std::string raw = encode_idx(images, false);
  // Two members: the first half of the file's bytes, then the second half.
  std::string first = gzip_member(raw.substr(0, raw.size() / 2)), second = gzip_member(raw.substr(raw.size() / 2));
  IdxArray read = parse_idx(first + second, "two-members.gz");
  EXPECT_EQ(read.dims, images.dims);
  EXPECT_EQ(read.data, images.data);
  // A member cut short is still refused as truncated.
  EXPECT_TRUE(test::throws_with([&] { parse_idx(first + second.substr(0, second.size() / 2), "cut.gz"); }, {"cut.gz", "truncated"}));
}

// Special files are refused before they are opened: a FIFO with no writer would block forever.
TEST(Idx, SpecialFilesAreRefusedSayingWhatTheyAre) {
  test::TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_TRUE(test::throws_with([&] { read_idx(dir.file("fifo")); }, {dir.file("fifo"), "named pipe (FIFO)"}));
  EXPECT_TRUE(test::throws_with([&] { read_idx("/dev/zero"); }, {"/dev/zero", "character device"}));
}

// Mutated IDX files, plain and gzip: never a crash, always an amplab::Error naming the file.
TEST(IdxFuzz, MutatedFilesFailCleanly) {
  std::vector<std::string> seeds = {encode_idx(make_images(2), false), encode_idx(make_images(2), true),
                                    encode_idx(make_labels(50), false), encode_idx(make_labels(50), true)};
  std::mt19937 rng(777);
  int iterations = 20000, accepted = 0, rejected = 0;
  for (int i = 0; i < iterations; ++i) {
    std::string bytes = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      size_t pos = (rng() % 3 == 0) ? rng() % std::min<size_t>(bytes.size(), 24) : rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[pos] = static_cast<char>(rng() % 256); break;
        case 1: bytes.erase(pos, 1 + rng() % 64); break;
        case 2: bytes.insert(pos, std::string(1 + rng() % 8, static_cast<char>(rng() % 256))); break;
        case 3: bytes.resize(pos); break;
      }
    }
    try {
      auto a = parse_idx(bytes, "fuzz.idx");
      size_t count = 1;
      for (auto d : a.dims) count *= static_cast<size_t>(d);
      ASSERT_EQ(count, a.data.size());
      ++accepted;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("fuzz.idx"), std::string::npos) << e.what();
      ++rejected;
    }
  }
  std::cout << "[ fuzz     ] IDX reader: " << iterations << " mutated files, " << accepted << " accepted (consistent), "
            << rejected << " rejected with a clean error, 0 crashes\n";
  EXPECT_GT(rejected, iterations / 2);
}

TEST(Mnist, LoadsBothSplitsFromAConfiguredDirectory) {
  for (bool gzip : {false, true}) {
    test::TempDir dir;
    write_dataset(dir, 20, 10, gzip);
    DataConfig config;
    config.dir = dir.path().string();
    MnistData data = load_mnist(config);
    EXPECT_EQ(data.train.images.sizes(), (std::vector<int64_t>{20, 28, 28}));
    EXPECT_EQ(data.train.images.dtype(), torch::kUInt8);
    EXPECT_EQ(data.train.labels.dtype(), torch::kInt64);
    EXPECT_EQ(data.test.size(), 10);
    EXPECT_EQ(data.train.labels[13].item<int64_t>(), 3);
    EXPECT_EQ(data.train.images[0][0][1].item<int64_t>(), 7);
  }
}

TEST(Mnist, LimitsTakeTheFirstImages) {
  test::TempDir dir;
  write_dataset(dir, 20, 10, true);
  DataConfig config;
  config.dir = dir.path().string();
  config.train_limit = 5;
  config.test_limit = 3;
  MnistData data = load_mnist(config);
  EXPECT_EQ(data.train.size(), 5);
  EXPECT_EQ(data.test.size(), 3);
}

TEST(Mnist, MissingDatasetListsWhereItLooked) {
  DataConfig config;
  config.dir = "/nonexistent/data";
  EXPECT_TRUE(test::throws_with([&] { find_dataset_dir(config); }, {"data.dir", "/nonexistent/data", "fashion-mnist"}));
  config.dir = "";
  config.dataset = "mnist";
  EXPECT_EQ(dataset_search_path(config).at(0), "data/mnist");
  // An explicit variable is the only place looked at: used or refused, never skipped.
  ::setenv("MNIST_DIR", "/nonexistent/mnist-env", 1);
  auto dirs = dataset_search_path(config);
  bool refused = test::throws_with([&] { find_dataset_dir(config); }, {"$MNIST_DIR='/nonexistent/mnist-env'", "unset it"});
  ::unsetenv("MNIST_DIR");
  EXPECT_EQ(dirs, std::vector<std::string>{"/nonexistent/mnist-env"});
  EXPECT_TRUE(refused);
}

// A bad file in an explicit $FASHION_MNIST_DIR is refused by name, not passed over for a copy
// elsewhere.
TEST(Mnist, ABadFileInTheVariablesDirectoryIsRefused) {
  test::TempDir dir;
  write_dataset(dir, 10, 5, true);
  dir.write("t10k-labels-idx1-ubyte.gz", "not gzip");
  ::setenv("FASHION_MNIST_DIR", dir.path().c_str(), 1);
  bool refused = test::throws_with([&] { load_mnist(DataConfig{}); }, {dir.file("t10k-labels-idx1-ubyte.gz")});
  ::unsetenv("FASHION_MNIST_DIR");
  EXPECT_TRUE(refused);
}

TEST(Mnist, InconsistentFilesAreErrors) {
  test::TempDir dir;
  write_dataset(dir, 20, 10, false);
  dir.write("train-labels-idx1-ubyte", encode_idx(make_labels(19), false));
  DataConfig config;
  config.dir = dir.path().string();
  EXPECT_TRUE(test::throws_with([&] { load_mnist(config); }, {"19 labels for 20 images"}));
  IdxArray bad = make_labels(20);
  bad.data[4] = 12;
  dir.write("train-labels-idx1-ubyte", encode_idx(bad, false));
  EXPECT_TRUE(test::throws_with([&] { load_mnist(config); }, {"label 12 at index 4", "outside 0..9"}));
  IdxArray wrong_shape;
  wrong_shape.dims = {20, 27, 29};
  wrong_shape.data.resize(20 * 27 * 29);
  dir.write("train-images-idx3-ubyte", encode_idx(wrong_shape, false));
  EXPECT_TRUE(test::throws_with([&] { load_mnist(config); }, {"train-images-idx3-ubyte", "(N, 28, 28), got (20, 27, 29)"}));
}

TEST(Mnist, NormalizeMatchesPyTorchExamples) {
  auto images = torch::tensor({0, 255}, torch::kUInt8).reshape({1, 1, 2});
  auto x = normalize_images(images);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{1, 1, 1, 2}));
  EXPECT_NEAR(x[0][0][0][0].item<double>(), -0.1307 / 0.3081, 1e-6);
  EXPECT_NEAR(x[0][0][0][1].item<double>(), (1 - 0.1307) / 0.3081, 1e-6);
}

TEST(Sampler, MatchesDistributedSamplerSemantics) {
  // 10 samples over 3 ranks: 4 each, padded by wrapping the permutation around.
  std::vector<torch::Tensor> shards;
  for (int rank = 0; rank < 3; ++rank) {
    EpochSampler s(10, 2, /*seed=*/5, /*shuffle=*/true, /*drop_last=*/false, rank, 3);
    s.set_epoch(2);
    EXPECT_EQ(s.samples_per_rank(), 4);
    EXPECT_EQ(s.batches_per_epoch(), 2);
    shards.push_back(s.order());
  }
  auto all = torch::cat(shards);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5 + 2);
  auto perm = torch::randperm(10, generator, torch::kInt64);
  auto padded = torch::cat({perm, perm.narrow(0, 0, 2)});
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(test::tensors_equal(shards[rank], padded.slice(0, rank, 12, 3).contiguous()));
  EXPECT_EQ(std::get<0>(at::_unique(all)).size(0), 10);  // together the shards cover the dataset
}

TEST(Sampler, ReshufflesPerEpochAndRepeatsForTheSameSeed) {
  EpochSampler a(100, 10, 1, true, true), b(100, 10, 1, true, true);
  a.set_epoch(3);
  b.set_epoch(3);
  EXPECT_TRUE(a.order().equal(b.order()));
  auto e3 = a.order().clone();
  a.set_epoch(4);
  EXPECT_FALSE(a.order().equal(e3));
}

TEST(Sampler, RaggedLastBatchUnlessDropLast) {
  EpochSampler keep(10, 4, 0, false, false), drop(10, 4, 0, false, true);
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  EXPECT_EQ(keep.batch_indices(2).size(0), 2);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_TRUE(test::throws_with([&] { drop.batch_indices(2); }, {"outside"}));
}

}  // namespace
}  // namespace amplab
