// A file that text is appended to as it comes (logs, metrics.csv), which never drops text
// silently: what the disk refuses (full, over quota) waits in memory and is written by the next
// append or retry(), in order, once there is room again. Whatever is still unwritten when the
// file is closed is reported by unwritten_files(), which the lab binaries check before they exit.
// No torch here: the logging target uses it too.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace amplab {

class AppendFile {
 public:
  AppendFile() = default;
  // Opens (creates) `path` for appending; truncate empties it first. Throws amplab::IoError.
  AppendFile(const std::string& path, bool truncate);
  ~AppendFile();  // a last retry; what is still pending is recorded for unwritten_files()
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Writes what is pending, then `text`; keeps in memory whatever the disk refuses.
  void append(std::string_view text);
  // Writes what is pending; true when nothing is left.
  bool retry();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  int fd_ = -1;
  std::string path_;
  std::string pending_;  // bytes not written yet, in order
  int last_errno_ = 0;   // why the last write failed
};

// One line per file closed with text it could not write, and per open file with text still
// pending: "runs/mnist/.../metrics.csv: 1234 bytes not written (No space left on device)".
std::vector<std::string> unwritten_files();

}  // namespace amplab
