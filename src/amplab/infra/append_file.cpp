// AppendFile (append_file.hpp): appends that wait in memory while the disk refuses them.
#include "amplab/infra/append_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "amplab/infra/error.hpp"

namespace amplab {

namespace {
std::mutex g_mutex;
std::set<const AppendFile*> g_open;      // files that may still hold pending text
std::vector<std::string> g_lost;         // reports of files closed with text unwritten

std::string report(const std::string& path, size_t bytes, int error) {
  return path + ": " + std::to_string(bytes) + " bytes not written (" + std::strerror(error) + ")";
}
}  // namespace

AppendFile::AppendFile(const std::string& path, bool truncate) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd_ < 0) throw IoError("cannot open '" + path + "' for writing: " + std::strerror(errno));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_open.insert(this);
}

AppendFile::~AppendFile() {
  if (fd_ < 0) return;
  retry();
  ::close(fd_);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_open.erase(this);
  if (!pending_.empty()) g_lost.push_back(report(path_, pending_.size(), last_errno_));
}

bool AppendFile::retry() {
  size_t done = 0;
  while (done < pending_.size()) {
    ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      last_errno_ = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  pending_.erase(0, done);
  return pending_.empty();
}

void AppendFile::append(std::string_view text) {
  if (fd_ < 0) return;
  pending_.append(text);
  retry();
}

std::vector<std::string> unwritten_files() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::string> out = g_lost;
  for (const AppendFile* file : g_open)
    if (file->pending_bytes() > 0) out.push_back(file->path() + ": " + std::to_string(file->pending_bytes()) + " bytes not written yet");
  return out;
}

}  // namespace amplab
