// The mechanisms the labs build, gathered for the core's trainer (amplab::StepMechanisms): the
// GradScaler and the training step of lab 2, gradient accumulation of lab 3. Which code runs is
// decided by what the binary links (cmake/amplab.cmake, amplab_link_mechanisms): the instructor's
// reference, a student's own code in a hand-out, or, when grading lab N, the student's lab N and
// the reference of every other lab.
#pragma once

#include "amplab/train/trainer.hpp"

namespace amplab {

StepMechanisms course_mechanisms();

}  // namespace amplab
