// Errors a user can act on. Anything thrown as amplab::Error is printed as one line by
// run_main() (apps/) and ends the program with exit code 2; NotImplemented marks a student hole.
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

// Thrown by every unfilled hole of a lab's starter code; `todo_id` is like "mnist-2".
class NotImplemented : public Error {
 public:
  explicit NotImplemented(const std::string& todo_id)
      : Error("TODO(" + todo_id + ") is not implemented yet: fill in the body marked '// TODO(" +
              todo_id + ")' in starter/ (see the lab's README.md)"),
        todo_id_(todo_id) {}
  const std::string& todo_id() const { return todo_id_; }

 private:
  std::string todo_id_;
};

}  // namespace amplab

// The body of a starter hole: `AMPLAB_TODO("mnist-2");`
#define AMPLAB_TODO(id) throw ::amplab::NotImplemented(id)
