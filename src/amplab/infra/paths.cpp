// Paths as users type them (paths.hpp): what is not a regular file, what only a shell expands.
#include "amplab/infra/paths.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace amplab {

namespace {
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}
}  // namespace

std::string regular_file_problem(const std::string& path) {
  struct stat link {};
  struct stat target {};
  if (path.empty()) return "is an empty path";
  if (::lstat(path.c_str(), &link) != 0) {
    std::string problem = errno == ENOENT ? "does not exist" : std::string("cannot be read: ") + std::strerror(errno);
    // The shell expands '~' only unquoted at the start of a word (not in --set k=~/x, --config=~/x).
    if (path[0] == '~') problem += " (" + check_path_value(path) + ")";
    return problem;
  }
  if (::stat(path.c_str(), &target) != 0) {
    if (S_ISLNK(link.st_mode) && errno == ENOENT) {
      std::error_code ec;
      return "is a dangling symbolic link (to '" + std::filesystem::read_symlink(path, ec).string() + "', which does not exist)";
    }
    return std::string("cannot be read: ") + std::strerror(errno);
  }
  if (S_ISDIR(target.st_mode)) return "is a directory";
  if (!S_ISREG(target.st_mode)) return std::string("is ") + kind_of(target.st_mode) + ", not a regular file";
  // Permission and the like: the OS's reason, from an open that cannot block (a regular file).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::string("cannot be read: ") + std::strerror(errno);
  ::close(fd);
  return "";
}

std::string check_path_value(const std::string& path) {
  if (path.empty() || path[0] != '~') return "";
  const auto slash = path.find('/');
  return "'" + path + "' starts with '~', which only a shell expands (and not after '='): write the full path, e.g. $HOME" +
         (slash == std::string::npos ? "" : path.substr(slash));
}

std::string file_name_safe(const std::string& text) {
  std::string out;
  for (char c : text) {
    bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
    if (keep) out.push_back(c);
    else if (!out.empty() && out.back() != '_') out.push_back('_');
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

}  // namespace amplab
