// The MLP step benchmark (bench.enabled), given: the plain MLP alone, then each version of
// gradient synchronization bench.settings names, each step timed by itself and back to back.
#pragma once

#include "amplab/report/results.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/trainer.hpp"
#include "config.hpp"
#include "ddp_lab.hpp"

namespace ddp_lab {

// Time per step of the MLP under each setting. Scaling efficiency = time alone (the plain MLP) /
// time of the setting; exposed communication = time of the setting - time alone (what backward
// could not hide). Rows into `results` on every rank; rank 0 prints the tables. The steps run
// with train.fast_path on (the course's step, lab 2's train_step) and the fast path's
// `fused_optimizer` (the app hands it in).
int run_bench(const DdpConfig& config, const Setup& setup, const amplab::RunDir& run, amplab::Results& results,
              const amplab::OptimizerFactory& fused_optimizer);

}  // namespace ddp_lab
