#include "amplab/fast/cuda_graph.hpp"

#include <torch/torch.h>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/autocast_mode.h>

#include "amplab/infra/error.hpp"
#include "amplab/train/fused_optimizer.hpp"

namespace amplab {

std::string cuda_graph_blocker(Trainer& trainer) {
  if (!trainer.device().is_cuda()) return "CUDA graphs need a GPU (run.device is " + trainer.device().str() + ")";
  if (trainer.config().accumulation_steps != 1) return "CUDA graphs capture one micro-batch per step: set train.accumulation_steps=1, or train.fast_path=false";
  const bool fused = dynamic_cast<FusedOptimizer*>(&trainer.optimizer()) != nullptr;
  const OptimizerConfig& optimizer = trainer.config().optimizer;
  if (trainer.scaler().is_enabled() && !fused)
    return "loss scaling decides on the host unless the optimizer is fused (make_fast_path_optimizer with train.fast_path)";
  if (trainer.scaler().is_enabled() && !trainer.scaler().skips_on_device(trainer.optimizer()))
    return kScalerOnTheHost;
  if (!fused && optimizer.name != "sgd")
    return optimizer.name + " counts its steps on the host, which a graph cannot replay: use a fused optimizer (make_fast_path_optimizer with train.fast_path)";
  if (!fused && has_schedule(optimizer))
    return "a graph would keep the first step's learning rate: a schedule needs a fused optimizer (make_fast_path_optimizer with train.fast_path)";
  return "";
}

#ifdef AMPLAB_WITH_CUDA

struct GraphedTrainStep::Impl {
  Trainer& trainer;
  int warmup;
  int64_t calls = 0;
  Batch static_batch;  // the graph reads its input from these tensors
  StepResult static_result;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  c10::cuda::CUDAStream side_stream;

  Impl(Trainer& t, int w) : trainer(t), warmup(w), side_stream(c10::cuda::getStreamFromPool(false, t.device().index())) {}
};

namespace {
// `waiter` runs what is queued after this only once everything queued on `target` so far is done.
void wait_for(c10::cuda::CUDAStream waiter, c10::cuda::CUDAStream target) {
  at::cuda::CUDAEvent event;
  event.record(target);
  event.block(waiter);
}

// Ends a capture that failed half-way, so that the error can be reported and the device used
// again: the stream leaves capture mode (what was captured is dropped), and the device's random
// generator, which only a successful CUDAGraph::capture_end takes out of capture mode, gets a
// fresh state at the same seed and offset.
void abandon_capture(c10::cuda::CUDAStream stream) {
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(stream.stream(), &partial);  // fails for an invalidated capture: expected
  if (partial != nullptr) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();  // clears the capture's error
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(stream.device_index());
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::Generator fresh = at::make_generator<at::CUDAGeneratorImpl>(stream.device_index());
  fresh.set_current_seed(generator.current_seed());
  fresh.set_offset(generator.get_offset());
  generator.graphsafe_set_state(fresh);
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

StepResult copy_of(const StepResult& r) {
  StepResult out = r;
  out.loss = r.loss.clone();
  if (r.grad_norm.defined()) out.grad_norm = r.grad_norm.clone();
  if (r.skipped.defined()) out.skipped = r.skipped.clone();
  return out;
}
}  // namespace

GraphedTrainStep::GraphedTrainStep(Trainer& trainer, int warmup_steps) {
  std::string blocker = cuda_graph_blocker(trainer);
  if (!blocker.empty()) throw Error("train.fast_path: " + blocker);
  impl_ = std::make_unique<Impl>(trainer, std::max(warmup_steps, 1));
}

GraphedTrainStep::~GraphedTrainStep() = default;

bool GraphedTrainStep::captured() const { return impl_->graph != nullptr; }

StepResult GraphedTrainStep::step(const Batch& batch) {
  ReadyBatch one(batch);
  return step(one, 0);
}

StepResult GraphedTrainStep::step(BatchSource& data, int64_t index) {
  Impl& s = *impl_;
  Trainer& trainer = s.trainer;
  const c10::DeviceIndex device_index = trainer.device().index();
  auto current = c10::cuda::getCurrentCUDAStream(device_index);

  if (!s.static_batch.input.defined()) {
    Batch first = data.batch(index);
    s.static_batch = {first.input.clone(), first.target.clone()};
  } else if (data.batch_rows(index) != s.static_batch.size()) {
    return trainer.step(data.batch(index));  // another shape (a ragged batch): eager
  } else {
    data.batch_into(index, s.static_batch);
  }

  if (!s.graph && s.calls < s.warmup) {
    // Warm-up on a side stream (cuDNN/cuBLAS pick their algorithms, the optimizer creates its state).
    wait_for(s.side_stream, current);
    StepResult r;
    {
      c10::cuda::CUDAStreamGuard guard(s.side_stream);
      r = copy_of(trainer.step(s.static_batch));
    }
    wait_for(current, s.side_stream);
    ++s.calls;
    return r;
  }

  if (!s.graph) {
    s.graph = std::make_unique<at::cuda::CUDAGraph>();
    wait_for(s.side_stream, current);
    {
      c10::cuda::CUDAStreamGuard guard(s.side_stream);
      // Autocast's cached casts must not outlive the capture's memory: off while capturing (the
      // step's AutocastGuard keeps the setting it finds).
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      s.graph->capture_begin();
      try {
        s.static_result = trainer.step(s.static_batch);
      } catch (const std::exception& e) {
        abandon_capture(s.side_stream);
        at::autocast::set_autocast_cache_enabled(cache);
        // Kept rather than destroyed: its capture never reached capture_end, and CUDAGraph's
        // clean-up assumes one that did. One object leaked, on an error path.
        (void)s.graph.release();
        throw Error(std::string("train.fast_path: the step cannot be captured as a CUDA graph, it waits for the GPU on the "
                                "host (an .item(), a copy to the CPU, a sync) [") +
                    first_line(e.what()) + "]: take that out of the step, or set train.fast_path=false");
      }
      s.graph->capture_end();
      at::autocast::set_autocast_cache_enabled(cache);
    }
    wait_for(current, s.side_stream);
    trainer.set_global_step(trainer.global_step() - 1);  // capturing ran nothing; the replay below does
  }
  s.graph->replay();
  trainer.set_global_step(trainer.global_step() + 1);
  ++s.calls;
  return copy_of(s.static_result);
}

#else

struct GraphedTrainStep::Impl {};
GraphedTrainStep::GraphedTrainStep(Trainer& trainer, int) { throw Error("train.fast_path: CUDA graphs need a build with CUDA"); }
GraphedTrainStep::~GraphedTrainStep() = default;
bool GraphedTrainStep::captured() const { return false; }
StepResult GraphedTrainStep::step(const Batch&) { return {}; }
StepResult GraphedTrainStep::step(BatchSource&, int64_t) { return {}; }

#endif

}  // namespace amplab
