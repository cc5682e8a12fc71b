// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 5, step 1 (part 2): the naive synchronization. Backward runs as on one process; then every
// gradient is averaged over the ranks, one collective each. See labs/ddp/README.md, "Step 1".
#include <torch/csrc/autograd/grad_mode.h>

#include "data_parallel.hpp"

namespace ddp_lab {

// TODO(ddp-5): leave in every trainable parameter's .grad (params_) the average over the ranks of
// their gradients: one all-reduce per parameter, in the same order on every rank. While sync is
// off (sync_enabled() is false: accumulation micro-batches) do nothing: the gradients keep
// accumulating locally and the synchronized step's finish() averages their sum.
// The Communicator's collectives are asynchronous: a tensor may be read only once its work is
// waited for.
// Pitfalls: an all-reduce that sums leaves W times the average (W ranks). A parameter
// this rank did not use in this step has no .grad (undefined), but the other ranks still send
// theirs: take part with zeros, or the ranks' calls no longer pair up. Gradient recording must be
// off while you write into .grad.
void NaiveDdp::finish() {
  AMPLAB_TODO("ddp-5");
}

}  // namespace ddp_lab
