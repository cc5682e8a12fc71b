// Paths as users type them: what keeps a path from being read as a regular file, and paths
// that only a shell would have expanded. No torch here: the config reader uses it too.
#pragma once

#include <string>

namespace amplab {

// What keeps `path` from being read as a regular file, as the end of a sentence that starts
// with the path ("does not exist", "is a named pipe (FIFO), not a regular file", "cannot be
// read: Permission denied"...), or "" when it can be. Checked before anything opens the file:
// a FIFO with no writer would block the open forever, and a device (/dev/zero) would be read
// until memory runs out.
std::string regular_file_problem(const std::string& path);

// For path-valued config keys: "" when `path` is fine, else why not (a leading '~', which only
// a shell expands, and only unquoted at the start of a word: `--set run.out_dir=~/runs` would
// make a directory named '~').
std::string check_path_value(const std::string& path);

// A file-name-safe form of `text` ("gpu-amp (bf16-mixed)" -> "gpu-amp_bf16-mixed").
std::string file_name_safe(const std::string& text);

}  // namespace amplab
