// File helpers (files.hpp): atomic writes with fsync, whole-file reads, CRC-32.
#include "amplab/infra/files.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

namespace {

// Holds the temporary path of the write in progress for the signal handler; written before
// the file is created and cleared after the rename, so it is either empty or a valid path.
char g_temp_path[4096];
std::atomic<bool> g_temp_active{false};

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  const int error = errno;
  std::string message = what + " '" + path + "': " + std::strerror(error);
  if (error == EFBIG)
    message += "; a file-size limit (ulimit -f) or the filesystem's largest file: raise the limit or free disk space and run again";
  else if (error == ENOSPC || error == EDQUOT)
    message += "; free disk space and run again";
  throw IoError(message);
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

const char* atomic_write_in_progress() { return g_temp_active.load() ? g_temp_path : ""; }

void write_file_atomic(const std::string& path, std::string_view content) {
  std::filesystem::path target(path);
  std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  std::string temp = (std::filesystem::path(dir) / ("." + target.filename().string() + ".tmp-" +
                                                      std::to_string(::getpid()))).string();
  if (temp.size() >= sizeof g_temp_path) throw Error("path too long: " + path);
  std::memcpy(g_temp_path, temp.c_str(), temp.size() + 1);
  g_temp_active.store(true);

  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    g_temp_active.store(false);
    fail("cannot create", path);
  }
  const char* data = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int saved = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      g_temp_active.store(false);
      errno = saved;
      fail("cannot write", path);
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(temp.c_str());
    g_temp_active.store(false);
    errno = saved;
    fail("cannot flush", path);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temp.c_str());
    g_temp_active.store(false);
    errno = saved;
    fail("cannot rename into", path);
  }
  g_temp_active.store(false);
  fsync_directory(dir);
}

std::string read_file(const std::string& path) {
  if (std::string problem = regular_file_problem(path); !problem.empty())
    throw Error("'" + path + "' " + problem);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

uint32_t crc32_of(std::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed large inputs in chunks.
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {
    uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string hex32(uint32_t value) {
  char buffer[9];
  std::snprintf(buffer, sizeof buffer, "%08x", value);
  return buffer;
}

}  // namespace amplab
