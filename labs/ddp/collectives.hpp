// The collectives benchmark (collectives.enabled), given: all-reduce, reduce-scatter, all-gather
// and a reduce-scatter followed by an all-gather, each timed across message sizes, with the
// algorithm and bus bandwidths NVIDIA's nccl-tests report. The data behind the α-β model.
#pragma once

#include "amplab/report/results.hpp"
#include "config.hpp"
#include "ddp_lab.hpp"

namespace ddp_lab {

// One row per (collective, size) into `results`' table "collectives" on every rank; rank 0
// prints it. Every rank must call it (the timed calls are collectives).
int run_collectives_bench(const DdpCollectivesConfig& config, const Setup& setup, amplab::Results& results);

}  // namespace ddp_lab
