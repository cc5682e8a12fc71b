// Errors a user can act on. Anything thrown as amplab::Error is printed as one line by
// guarded_main() (app.hpp) and ends the program with exit code 2 (4 for IoError); NotImplemented marks a student hole.
#pragma once

#include <stdexcept>
#include <string>

namespace amplab {

// A problem with the user's input or environment: bad config, missing data, no GPU...
// The message is complete on its own (what, where, what to do next).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reading or writing a file failed (disk full, no permission, I/O error): the input was fine,
// the machine was not. Lab binaries exit with a code of its own (4), apart from usage errors (2).
class IoError : public Error {
 public:
  using Error::Error;
};

// Another process of a distributed run died or stopped answering: nothing this one can fix. The
// message names the rank; lab binaries exit with 1, and a launcher stops (or restarts) the job.
class PeerLost : public Error {
 public:
  using Error::Error;
};

// Thrown by every unfilled hole of a lab's starter code; `todo_id` is like "mnist-2". The message
// names the TODO, the function and the file it is in, and where its lab's hand-out is.
class NotImplemented : public Error {
 public:
  explicit NotImplemented(const std::string& todo_id, const std::string& file = "", const std::string& function = "")
      : Error(message(todo_id, file, function)), todo_id_(todo_id) {}
  const std::string& todo_id() const { return todo_id_; }

 private:
  static std::string message(const std::string& todo_id, std::string file, const std::string& function) {
    // "...amplab/starter/amp_training/grad_scaler.cpp" -> "starter/amp_training/grad_scaler.cpp"
    for (const char* root : {"/starter/", "/student-src/"}) {
      auto at = file.rfind(root);
      if (at != std::string::npos) file = "starter/" + file.substr(at + std::string(root).size());
    }
    // "bool amp_training::GradScaler::step(torch::optim::Optimizer&)" -> "amp_training::GradScaler::step"
    std::string name = function.substr(0, function.find('('));
    name = name.substr(name.rfind(' ') == std::string::npos ? 0 : name.rfind(' ') + 1);
    const std::string lab = todo_id.substr(0, todo_id.rfind('-'));
    std::string where = name.empty() ? "" : " (" + name + (file.empty() ? "" : " in " + file) + ")";
    return "TODO(" + todo_id + ") is not implemented yet" + where + ": fill in its body, marked '// TODO(" + todo_id +
           ")' (the hints are above it; the theory is in labs/" + lab + "/README.md)";
  }
  std::string todo_id_;
};

// The body of a starter hole: `AMPLAB_TODO("mnist-2");`
#define AMPLAB_TODO(id) throw ::amplab::NotImplemented(id, __FILE__, __PRETTY_FUNCTION__)

// The body of a starter hole in device code (a CUDA kernel), which cannot throw: it does nothing.
// The kernel's host-side launcher has a hole of the same TODO, whose AMPLAB_TODO names it.
#define AMPLAB_TODO_DEVICE(id) ((void)0)

}  // namespace amplab
