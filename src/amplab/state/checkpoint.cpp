// Checkpoint files (header, CRC, torch archive), loading that verifies before it restores, and the checkpoint directory with its `latest` pointers.
#include "amplab/state/checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/api/include/torch/version.h>
#include <torch/serialize/archive.h>
#include <torch/torch.h>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'A', 'M', 'P', 'L', 'A', 'B', 'C', 'K'};
constexpr size_t kHeaderSize = 8 + 4 + 8 + 4;  // magic, version, payload length, CRC-32

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const std::string& in, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[offset + i])) << (8 * i);
  return v;
}

const char* optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "sgd";
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "adam";
  return "other";
}

int64_t parameter_count(const torch::optim::Optimizer& optimizer) {
  int64_t n = 0;
  for (const auto& group : optimizer.param_groups()) n += static_cast<int64_t>(group.params().size());
  return n;
}

std::string shape_string(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// The model's parameters, then its buffers, in registration order, with prefixed names.
std::vector<std::pair<std::string, torch::Tensor>> model_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters(true)) out.emplace_back("param:" + item.key(), item.value());
  for (const auto& item : model.named_buffers(true)) out.emplace_back("buffer:" + item.key(), item.value());
  return out;
}

int64_t cuda_generator_count() {
#ifdef AMPLAB_WITH_CUDA
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
#else
  return 0;
#endif
}

// Reads the header, checks it against the file's size, then reads exactly the payload it
// announces: a device, a FIFO or a huge sparse file is refused before anything is read from it.
std::string read_checkpoint_bytes(const std::string& path, uint32_t& version, uint32_t& crc) {
  if (std::string problem = regular_file_problem(path); !problem.empty())
    throw Error("checkpoint '" + path + "' " + problem);
  std::ifstream in(path, std::ios::binary);
  std::string header(kHeaderSize, '\0');
  in.read(header.data(), static_cast<std::streamsize>(kHeaderSize));
  if (static_cast<size_t>(in.gcount()) < kHeaderSize || std::memcmp(header.data(), kMagic, sizeof kMagic) != 0)
    throw Error("checkpoint '" + path + "' is not an amplab checkpoint (no AMPLABCK header; a PyTorch .pt file "
                "or another file?)");
  version = static_cast<uint32_t>(get_le(header, 8, 4));
  uint64_t length = get_le(header, 12, 8);
  crc = static_cast<uint32_t>(get_le(header, 20, 4));
  if (version < kOldestReadableCheckpointVersion || version > kCheckpointFormatVersion)
    throw Error("checkpoint '" + path + "' has format version " + std::to_string(version) + "; this build reads versions " +
                std::to_string(kOldestReadableCheckpointVersion) + " to " + std::to_string(kCheckpointFormatVersion) +
                (version > kCheckpointFormatVersion ? " (written by a newer amplab)" : ""));
  std::error_code ec;
  uint64_t actual = fs::file_size(path, ec) - kHeaderSize;
  if (ec || actual != length)
    throw Error("checkpoint '" + path + "' is " + (actual < length ? "truncated" : "too long") + ": header promises " +
                std::to_string(length) + " bytes of data, file has " + std::to_string(actual));
  std::string payload(length, '\0');
  in.read(payload.data(), static_cast<std::streamsize>(length));
  if (static_cast<uint64_t>(in.gcount()) != length)
    throw Error("checkpoint '" + path + "' is truncated: header promises " + std::to_string(length) +
                " bytes of data, " + std::to_string(in.gcount()) + " could be read");
  return payload;
}

// Verifies the file: header, length, checksum, version. Returns the payload and the header's version.
std::string verified_payload(const std::string& path, uint32_t& version) {
  uint32_t crc = 0;
  std::string payload = read_checkpoint_bytes(path, version, crc);
  uint32_t computed = crc32_of(payload);
  if (computed != crc)
    throw Error("checkpoint '" + path + "' is corrupt: checksum " + hex32(computed) + " does not match the recorded " +
                hex32(crc) + " (bit rot or an interrupted copy); use an older checkpoint");
  return payload;
}

// The archive's entries that are not the model, the optimizer's own archive or the RNG states'
// tensors: the version, then what the rest of the file must be checked against.
constexpr const char* kFormatVersionKey = "meta_format_version";
struct StateShape {
  std::string model_names;  // "param:fc.weight\nbuffer:norm.running_mean\n...", in model_tensors' order
  std::string optimizer_kind;
  int64_t optimizer_parameters = 0;
  bool scaler_enabled = false;
  int64_t rng_cuda_count = 0;

  template <class V>
  void fields(V& v) {
    v.entry("model_names", model_names);
    v.entry("optimizer_kind", optimizer_kind);
    v.entry("optimizer_parameters", optimizer_parameters);
    v.entry("scaler_enabled", scaler_enabled);
    v.entry("rng_cuda_count", rng_cuda_count);
  }
};
// The loss scaler's state, written when it is enabled.
template <class V>
void scaler_fields(V& v, GradScalerState& s) {
  v.entry("scaler_scale", s.scale);
  v.entry("scaler_growth_factor", s.growth_factor);
  v.entry("scaler_backoff_factor", s.backoff_factor);
  v.entry("scaler_growth_interval", s.growth_interval);
  v.entry("scaler_growth_tracker", s.growth_tracker);
}
// The tensors and nested archives, numbered where there are several.
std::string model_tensor_key(size_t i) { return "model_t" + std::to_string(i); }
std::string cuda_rng_key(int64_t i) { return "rng_cuda" + std::to_string(i); }
constexpr const char* kOptimizerStateKey = "optimizer_state";
constexpr const char* kCpuRngKey = "rng_cpu";

// Writes each entry a fields() list names.
class EntryWriter {
 public:
  explicit EntryWriter(torch::serialize::OutputArchive& archive) : archive_(archive) {}
  template <class T>
  void entry(const char* key, const T& value, uint32_t /*since*/ = 1) {
    if constexpr (std::is_same_v<T, uint64_t>) archive_.write(key, c10::IValue(static_cast<int64_t>(value)));
    else archive_.write(key, c10::IValue(value));
  }

 private:
  torch::serialize::OutputArchive& archive_;
};

// Reads each entry a fields() list names: a missing entry is an error naming it, unless the
// file's version is older than the one that added it (the field keeps its default).
class EntryReader {
 public:
  EntryReader(torch::serialize::InputArchive& archive, std::string path, uint32_t version)
      : archive_(archive), path_(std::move(path)), version_(version) {}
  template <class T>
  void entry(const char* key, T& value, uint32_t since = 1) {
    c10::IValue read;
    if (!archive_.try_read(key, read)) {
      if (version_ < since) return;
      throw Error("checkpoint '" + path_ + "' lacks '" + key + "'");
    }
    if constexpr (std::is_same_v<T, std::string>) value = read.toStringRef();
    else if constexpr (std::is_same_v<T, double>) value = read.toDouble();
    else if constexpr (std::is_same_v<T, bool>) value = read.toBool();
    else value = static_cast<T>(read.toInt());
  }

 private:
  torch::serialize::InputArchive& archive_;
  std::string path_;
  uint32_t version_;
};

// The metadata, after checking that the archive's version is the header's.
CheckpointInfo read_info(torch::serialize::InputArchive& archive, const std::string& path, uint32_t header_version) {
  CheckpointInfo info;
  EntryReader reader(archive, path, header_version);
  int64_t archive_version = 0;
  reader.entry(kFormatVersionKey, archive_version);
  if (archive_version != header_version)
    throw Error("checkpoint '" + path + "' is inconsistent: its header says format version " +
                std::to_string(header_version) + ", its archive " + std::to_string(archive_version) +
                " (pieced together from two files?); use another checkpoint");
  info.format_version = header_version;
  info.fields(reader);
  return info;
}

torch::serialize::InputArchive open_archive(const std::string& payload, const std::string& path) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(payload.data(), payload.size());
  } catch (const c10::Error& e) {
    throw Error("checkpoint '" + path + "' cannot be read as an archive: " +
                std::string(e.what_without_backtrace()).substr(0, 200));
  }
  return archive;
}

// The checkpoint's model tensors, verified against the model's: the same names, shapes and dtypes.
std::vector<torch::Tensor> stored_model_tensors(torch::serialize::InputArchive& archive, const StateShape& shape,
                                                const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                                const std::string& path) {
  std::vector<std::string> stored_names;
  {
    std::istringstream in(shape.model_names);
    for (std::string line; std::getline(in, line);) stored_names.push_back(line);
  }
  std::vector<torch::Tensor> stored(stored_names.size());
  for (size_t i = 0; i < stored_names.size(); ++i) {
    if (!archive.try_read(model_tensor_key(i), stored[i], /*is_buffer=*/true))
      throw Error("checkpoint '" + path + "' lacks tensor '" + stored_names[i] + "'");
  }
  for (size_t i = 0; i < std::max(tensors.size(), stored_names.size()); ++i) {
    if (i >= stored_names.size())
      throw Error("checkpoint '" + path + "' does not match the model: it lacks '" + tensors[i].first + "' " +
                  shape_string(tensors[i].second));
    if (i >= tensors.size())
      throw Error("checkpoint '" + path + "' does not match the model: it has '" + stored_names[i] +
                  "', which the model does not");
    if (stored_names[i] != tensors[i].first)
      throw Error("checkpoint '" + path + "' does not match the model: tensor " + std::to_string(i) + " is '" +
                  stored_names[i] + "' in the checkpoint, '" + tensors[i].first + "' in the model");
    if (stored[i].sizes() != tensors[i].second.sizes() || stored[i].scalar_type() != tensors[i].second.scalar_type())
      throw Error("checkpoint '" + path + "' does not match the model: '" + stored_names[i] + "' is " +
                  shape_string(stored[i]) + " " + std::string(c10::toString(stored[i].scalar_type())) +
                  " in the checkpoint, " + shape_string(tensors[i].second) + " " +
                  std::string(c10::toString(tensors[i].second.scalar_type())) + " in the model");
  }
  return stored;
}

}  // namespace

std::string serialize_checkpoint(const TrainingState& state, const CheckpointInfo& info) {
  torch::serialize::OutputArchive archive;
  EntryWriter writer(archive);
  writer.entry(kFormatVersionKey, static_cast<int64_t>(kCheckpointFormatVersion));
  CheckpointInfo written = info;
  written.torch_version = TORCH_VERSION;
  written.fields(writer);

  // Model: a list of names, then each tensor (moved to the CPU so that a checkpoint written on a
  // GPU loads anywhere).
  const auto tensors = model_tensors(state.model);
  StateShape shape{.optimizer_kind = optimizer_kind(state.optimizer),
                   .optimizer_parameters = parameter_count(state.optimizer),
                   .scaler_enabled = state.scaler.is_enabled(),
                   .rng_cuda_count = cuda_generator_count()};
  for (const auto& [name, t] : tensors) shape.model_names += name + "\n";
  shape.fields(writer);
  for (size_t i = 0; i < tensors.size(); ++i)
    archive.write(model_tensor_key(i), tensors[i].second.detach().cpu(), /*is_buffer=*/true);
  torch::serialize::OutputArchive optimizer_archive;
  state.optimizer.save(optimizer_archive);
  archive.write(kOptimizerStateKey, optimizer_archive);
  if (shape.scaler_enabled) {
    GradScalerState scaler = state.scaler.state();
    scaler_fields(writer, scaler);
  }
  archive.write(kCpuRngKey, at::detail::getDefaultCPUGenerator().get_state(), true);
#ifdef AMPLAB_WITH_CUDA
  for (int64_t i = 0; i < shape.rng_cuda_count; ++i)
    archive.write(cuda_rng_key(i), at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(i)).get_state(),
                  true);
#endif

  std::ostringstream body;
  archive.save_to(body);
  std::string payload = body.str();
  std::string file(kMagic, sizeof kMagic);
  put_le(file, kCheckpointFormatVersion, 4);
  put_le(file, payload.size(), 8);
  put_le(file, crc32_of(payload), 4);
  return file + payload;
}

void save_checkpoint(const std::string& path, const TrainingState& state, const CheckpointInfo& info) {
  write_file_atomic(path, serialize_checkpoint(state, info));
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  uint32_t version = 0;
  std::string payload = verified_payload(path, version);
  auto archive = open_archive(payload, path);
  return read_info(archive, path, version);
}

void check_checkpoint_lab(const CheckpointInfo& info, const std::string& path, const std::string& expected_lab) {
  if (!expected_lab.empty() && info.lab != expected_lab)
    throw Error("checkpoint '" + path + "' was written by the " + info.lab + " lab, not by " + expected_lab +
                "; resume it with that lab's binary");
}

CheckpointInfo load_checkpoint(const std::string& path, TrainingState& state, const std::string& expected_lab,
                               bool restore_rng) {
  uint32_t version = 0;
  std::string payload = verified_payload(path, version);
  auto archive = open_archive(payload, path);
  CheckpointInfo info = read_info(archive, path, version);
  check_checkpoint_lab(info, path, expected_lab);
  if (info.torch_version != TORCH_VERSION)
    log::warn("checkpoint '" + path + "' was written with torch " + info.torch_version + ", this is " + TORCH_VERSION);

  // 1. Verify: every model tensor present with the same name and shape, same optimizer kind.
  EntryReader reader(archive, path, version);
  StateShape shape;
  shape.fields(reader);
  auto tensors = model_tensors(state.model);
  std::vector<torch::Tensor> stored = stored_model_tensors(archive, shape, tensors, path);
  if (shape.optimizer_kind != optimizer_kind(state.optimizer))
    throw Error("checkpoint '" + path + "' holds " + shape.optimizer_kind + " optimizer state; this run uses " +
                optimizer_kind(state.optimizer) + " (train.optimizer.name)");
  if (shape.optimizer_parameters != parameter_count(state.optimizer))
    throw Error("checkpoint '" + path + "' holds optimizer state for a different number of parameters");
  GradScalerState scaler_state;
  if (shape.scaler_enabled) scaler_fields(reader, scaler_state);
  torch::Tensor cpu_rng;
  if (!archive.try_read(kCpuRngKey, cpu_rng, true)) throw Error("checkpoint '" + path + "' lacks the CPU RNG state");
  std::vector<torch::Tensor> cuda_rng(static_cast<size_t>(shape.rng_cuda_count));
  for (int64_t i = 0; i < shape.rng_cuda_count; ++i)
    if (!archive.try_read(cuda_rng_key(i), cuda_rng[static_cast<size_t>(i)], true))
      throw Error("checkpoint '" + path + "' lacks the RNG state of cuda:" + std::to_string(i));
  torch::serialize::InputArchive optimizer_archive;
  if (!archive.try_read(kOptimizerStateKey, optimizer_archive))
    throw Error("checkpoint '" + path + "' lacks the optimizer state");

  // 2. Restore. The checks above guarantee that nothing below meets a missing or mismatched entry.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].second.copy_(stored[i]);
  }
  state.optimizer.load(optimizer_archive);
  if (shape.scaler_enabled) state.scaler.load_state(scaler_state);
  if (restore_rng) {
    at::Generator cpu_generator = at::detail::getDefaultCPUGenerator();  // a handle to the global generator
    cpu_generator.set_state(cpu_rng);
#ifdef AMPLAB_WITH_CUDA
    for (int64_t i = 0; i < std::min<int64_t>(shape.rng_cuda_count, cuda_generator_count()); ++i)
    {
      at::Generator cuda_generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(i));
      cuda_generator.set_state(cuda_rng[static_cast<size_t>(i)]);
    }
#endif
  }
  return info;
}

std::string unique_run_token() {
  std::random_device device;
  char token[8];
  std::snprintf(token, sizeof token, "%06x", static_cast<unsigned>(device()) & 0xffffffu);
  return token;
}

CheckpointManager::CheckpointManager(std::string dir, int64_t keep_last, std::string owner, std::string pointer_dir)
    : dir_(std::move(dir)), pointer_dir_(std::move(pointer_dir)), keep_last_(keep_last), owner_(file_name_safe(owner)) {}

CheckpointManager::~CheckpointManager() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void CheckpointManager::open_for_writing() {
  if (lock_fd_ >= 0) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw IoError("checkpoint.dir: cannot create '" + dir_ + "': " + ec.message() + "; set checkpoint.dir to a writable directory");
  std::string lock_path = (fs::path(dir_) / ".lock").string();
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw IoError("checkpoint.dir: cannot write in '" + dir_ + "': " + std::strerror(errno) +
                  "; set checkpoint.dir to a writable directory");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder = read_file(lock_path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd);
    throw Error("checkpoint.dir '" + dir_ + "' is in use by another run (" + (holder.empty() ? "unknown" : holder) +
                "); wait for it to finish, or give this run its own directory with --set checkpoint.dir=DIR");
  }
  std::string me = "pid " + std::to_string(::getpid()) + (owner_.empty() ? "" : ", " + owner_) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    int saved = errno;
    ::close(fd);
    throw IoError("checkpoint.dir: cannot write in '" + dir_ + "': " + std::strerror(saved) +
                  "; free some space or set checkpoint.dir elsewhere");
  }
  lock_fd_ = fd;
  // Nobody else writes here now: a temporary file is what a killed write left behind.
  for (const auto& entry : fs::directory_iterator(dir_, ec))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) fs::remove(entry.path(), ec);
}

std::string CheckpointManager::save(const TrainingState& state, const CheckpointInfo& info) {
  open_for_writing();
  char step[32];
  std::snprintf(step, sizeof step, "step-%08lld.ckpt", static_cast<long long>(info.position.global_step));
  const std::string prefix = owner_.empty() ? "" : owner_ + "-";
  const std::string name = prefix + step;
  std::string path = (fs::path(dir_) / name).string();
  std::error_code exists_error;
  if (!written_.count(name) && fs::exists(fs::symlink_status(path, exists_error)))
    throw Error("checkpoint.dir: '" + path + "' already exists and was not written by this run; not replacing it. "
                "Give this run its own directory with --set checkpoint.dir=DIR");
  save_checkpoint(path, state, info);
  written_.insert(name);
  write_file_atomic((fs::path(dir_) / "latest").string(), name + "\n");
  if (!pointer_dir_.empty()) {
    const fs::path base = fs::absolute(pointer_dir_).lexically_normal();
    const fs::path file = fs::absolute(path).lexically_normal();
    fs::path named = file.lexically_relative(base);
    if (named.empty() || *named.begin() == "..") named = file;
    write_file_atomic((fs::path(pointer_dir_) / "latest").string(), named.string() + "\n");
  }

  // This owner's files only (with no owner: the plain step-*.ckpt files).
  std::error_code ec;
  std::vector<fs::path> mine;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".ckpt" || file.rfind(prefix + "step-", 0) != 0) continue;
    if (file.size() != prefix.size() + std::strlen(step)) continue;  // another owner whose name starts like ours
    mine.push_back(entry.path());
  }
  std::sort(mine.begin(), mine.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_last_) < mine.size(); ++i)
    if (mine[i].filename() != name) fs::remove(mine[i], ec);
  return path;
}

namespace {
// The file name in `latest`, printable: a damaged file shows as such instead of raw bytes.
std::string printable(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c) : "?";
  return out + (text.size() > 80 ? "..." : "");
}

bool pointer_exists(const fs::path& pointer) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(pointer, ec));
}

// What a `latest` file holds, checked to be a readable file first.
std::string read_pointer(const fs::path& pointer) {
  if (std::string problem = regular_file_problem(pointer.string()); !problem.empty())
    throw Error("--resume latest: '" + pointer.string() + "' " + problem + "; pass a checkpoint path instead");
  std::string name = read_file(pointer.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

bool printable_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return std::isprint(static_cast<unsigned char>(c)); });
}

std::string checked_target(const fs::path& pointer, const std::string& name, const fs::path& path) {
  if (std::string problem = regular_file_problem(path.string()); !problem.empty())
    throw Error("--resume latest: '" + pointer.string() + "' names '" + name + "', which " + problem + "; pass a path instead");
  return path.string();
}

}  // namespace

// A `latest` that is a dangling link counts: --resume auto then says what is wrong with it.
// The directory's own `latest` is read when there is no run pointer, or when the directory is
// the run's out_dir's own (<out_dir>/<lab>/checkpoints). In a checkpoint.dir shared by runs of
// other out_dirs it may name another run's checkpoint: never read there.
bool CheckpointManager::directory_latest_is_ours() const {
  if (pointer_dir_.empty()) return true;
  return fs::path(dir_).lexically_normal().parent_path() == fs::path(pointer_dir_).lexically_normal();
}

bool CheckpointManager::has_latest() const {
  return (!pointer_dir_.empty() && pointer_exists(fs::path(pointer_dir_) / "latest")) ||
         (directory_latest_is_ours() && pointer_exists(fs::path(dir_) / "latest"));
}

std::string CheckpointManager::resolve(const std::string& spec) const {
  if (spec != "latest") {
    if (std::string problem = regular_file_problem(spec); !problem.empty())
      throw Error("--resume: checkpoint '" + spec + "' " + problem);
    return spec;
  }
  if (!pointer_dir_.empty() && pointer_exists(fs::path(pointer_dir_) / "latest"))
    return resolve_run_pointer((fs::path(pointer_dir_) / "latest").string());
  fs::path latest = fs::path(dir_) / "latest";
  if (!directory_latest_is_ours())
    throw Error("--resume latest: no checkpoint of a run under this run.out_dir (no 'latest' in '" + pointer_dir_ +
                "'); checkpoint.dir '" + dir_ + "' may hold other runs' checkpoints: pass a checkpoint path instead");
  if (!pointer_exists(latest))
    throw Error("--resume latest: no checkpoint in '" + dir_ + "' (no 'latest' file there" +
                (pointer_dir_.empty() ? "" : " nor in '" + pointer_dir_ + "'") + "); pass a path instead");
  return resolve_dir_pointer(latest.string());
}

// The run's `latest`: a path, relative to its folder or absolute.
std::string CheckpointManager::resolve_run_pointer(const std::string& pointer) const {
  std::string name = read_pointer(pointer);
  if (!printable_name(name))
    throw Error("--resume latest: '" + pointer + "' is damaged (it holds '" + printable(name) +
                "', not a file name); pass a checkpoint path instead");
  fs::path named(name);
  return checked_target(pointer, name, named.is_absolute() ? named : fs::path(pointer_dir_) / named);
}

// The directory's `latest`: the name of a file beside it.
std::string CheckpointManager::resolve_dir_pointer(const std::string& pointer) const {
  std::string name = read_pointer(pointer);
  if (!printable_name(name) || name.find('/') != std::string::npos)
    throw Error("--resume latest: '" + pointer + "' is damaged (it holds '" + printable(name) +
                "', not a file name); pass a checkpoint path instead");
  return checked_target(pointer, name, fs::path(dir_) / name);
}

}  // namespace amplab
