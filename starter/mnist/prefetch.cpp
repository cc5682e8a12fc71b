// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 4, TODO mnist-6: PrefetchingBatches (prefetch.hpp), host batches through pinned memory to
// the GPU on a side stream; see "The data path" in labs/mnist/README.md.
#include "prefetch.hpp"

#include <array>
#include <utility>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter

namespace mnist {

// Given: the state of the two buffers. It exists in a build with CUDA only: compile the code that
// uses it inside `#ifdef AMPLAB_WITH_CUDA` too (this build defines the macro when its LibTorch has
// CUDA; a CPU-only build must still compile and gather on the CPU).
#ifdef AMPLAB_WITH_CUDA
struct PrefetchingBatches::Slot {
  int64_t index = -1;                         // the batch copied, or being copied, out of this slot (-1: none)
  torch::Tensor pinned_input, pinned_target;  // room for a whole batch each, in page-locked host memory
  amplab::Batch on_device;                    // where the copy goes
  at::cuda::CUDAEvent copied;                 // recorded on the side stream once the copy is queued
};

struct PrefetchingBatches::Pipeline {
  explicit Pipeline(c10::cuda::CUDAStream stream) : side_stream(stream) {}
  c10::cuda::CUDAStream side_stream;  // the copies run here, beside the compute stream
  std::array<Slot, 2> slots;
};
#else
struct PrefetchingBatches::Pipeline {};
#endif

PrefetchingBatches::PrefetchingBatches(torch::Tensor inputs, torch::Tensor targets, amplab::EpochSampler sampler,
                                       torch::Device device,
                                       std::function<torch::Tensor(const torch::Tensor&)> transform)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      sampler_(std::move(sampler)),
      device_(device),
      transform_(std::move(transform)) {
  if (!inputs_.device().is_cpu() || !targets_.device().is_cpu())
    throw amplab::Error("PrefetchingBatches: the inputs and targets stay in host memory: pass CPU tensors");
  // TODO(mnist-6): On a CUDA device, set up what the copies need: a side stream of that device
  // (c10::cuda::getStreamFromPool), and in each of the two slots a pinned host buffer with room
  // for a whole batch of inputs and one of targets (torch::empty with .pinned_memory(true)). A
  // device given without an index means the current one. Then start the copy of the epoch's first
  // batch, so that it is under way before anyone asks for it. On the CPU nothing is needed.
  AMPLAB_TODO("mnist-6");
}

PrefetchingBatches::~PrefetchingBatches() = default;

void PrefetchingBatches::set_epoch(int64_t epoch) {
  // TODO(mnist-6): The sampler reshuffles for `epoch`. Whatever was prefetched belongs to the old
  // order: a batch in a slot must not be handed out for the same index of the new epoch. Start
  // the copy of the new epoch's first batch. Setting the epoch that is already set changes nothing
  // (the loop calls it at every epoch's start, a resumed run too).
  AMPLAB_TODO("mnist-6");
}

#ifdef AMPLAB_WITH_CUDA
void PrefetchingBatches::start_copy(int64_t index, Slot& slot) {
  // TODO(mnist-6): Gather batch `index`'s rows (sampler_.batch_indices) of the inputs and targets
  // into the slot's pinned buffers (the last batch of an epoch may have fewer rows), then queue
  // their copy to the device on the side stream, asynchronously (non_blocking: from pinned memory
  // the copy is a DMA the host does not wait for; from pageable memory the driver first copies
  // into a pinned buffer of its own, and the host waits). Record the slot's event after it.
  // The host writes the pinned buffer: the copy queued from it last time may still be reading it.
  AMPLAB_TODO("mnist-6");
}

amplab::Batch PrefetchingBatches::take(Slot& slot) {
  // TODO(mnist-6): The batch is read by kernels queued on the current stream of device_, which
  // knows nothing of the side stream: nothing queued there from now on may start before the copy
  // has finished (the slot's event). And the caching allocator keys each block to the stream that
  // allocated it: once the last reference is dropped on the host it would give the block to the
  // next copy on the side stream, while kernels queued on the current stream may still be reading
  // it (Tensor::record_stream). The slot lets go of the batch.
  AMPLAB_TODO("mnist-6");
}
#endif

amplab::Batch PrefetchingBatches::batch(int64_t index) {
  // TODO(mnist-6): On a CUDA device: batch `index`, whether or not it was prefetched (any index in
  // any order: a resumed run and the lab's profile start where they like), and batch index + 1 on
  // its way before returning, so that its copy overlaps what the caller queues next. Then the
  // transform, on the device. Everywhere else: gather_on_the_cpu.
  AMPLAB_TODO("mnist-6");
}

amplab::Batch PrefetchingBatches::gather_on_the_cpu(int64_t index) {
  // TODO(mnist-6): What TensorBatches does with data on the CPU: batch `index`'s rows of the
  // inputs and targets in this epoch's order, then the transform.
  AMPLAB_TODO("mnist-6");
}

}  // namespace mnist
