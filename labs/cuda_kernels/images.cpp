// Grey images to and from scripts/images.py (images.hpp); its raw format: int64 height,
// int64 width, then float32 row by row.
#include "images.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"

namespace cuda_kernels {

namespace {

// Runs `python scripts/images.py args...` (the project's .venv, else python3); true when it exits 0.
bool images_py(std::vector<std::string> args) {
  const std::string venv = amplab::source_dir() + "/.venv/bin/python";
  args.insert(args.begin(), {std::filesystem::exists(venv) ? venv : "python3", amplab::source_dir() + "/scripts/images.py"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = fork();
  if (pid == 0) {
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

torch::Tensor read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int64_t shape[2] = {0, 0};
  in.read(reinterpret_cast<char*>(shape), sizeof(shape));
  if (!in || shape[0] < 1 || shape[1] < 1) throw amplab::Error(path + ": not an image written by scripts/images.py");
  torch::Tensor image = torch::empty({shape[0], shape[1]});
  in.read(reinterpret_cast<char*>(image.data_ptr<float>()), image.nbytes());
  if (!in) throw amplab::Error(path + ": shorter than its " + std::to_string(shape[0]) + " x " + std::to_string(shape[1]) + " pixels");
  return image;
}

void write_f32(const std::string& path, const torch::Tensor& image) {
  torch::Tensor host = image.to(torch::kCPU, torch::kFloat32).contiguous();
  std::ofstream out(path, std::ios::binary);
  const int64_t shape[2] = {host.size(0), host.size(1)};
  out.write(reinterpret_cast<const char*>(shape), sizeof(shape));
  out.write(reinterpret_cast<const char*>(host.data_ptr<float>()), host.nbytes());
}

}  // namespace

torch::Tensor load_grey_image(const std::string& path, const std::string& scratch) {
  std::vector<std::string> args = {"load"};
  if (!path.empty()) args.push_back(path);
  args.push_back(scratch);
  if (!images_py(args)) return {};
  torch::Tensor image = read_f32(scratch);
  std::filesystem::remove(scratch);
  return image;
}

bool write_grey_pngs(const std::vector<std::pair<std::string, torch::Tensor>>& images, const std::string& montage) {
  std::vector<std::string> args = {"png", "--montage", montage};
  for (const auto& [stem, image] : images) {
    args.push_back(stem + ".f32");
    write_f32(args.back(), image);
  }
  return images_py(args);
}

}  // namespace cuda_kernels
