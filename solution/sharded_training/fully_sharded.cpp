// Lab 8: ZeRO-3 (FSDP), the sharded Linear and the step. See labs/sharded_training/README.md,
// "ZeRO-3: parameters gathered when they are used".
#include <torch/csrc/autograd/custom_function.h>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

namespace {

// The Linear of one unit as an autograd function of x and the unit's shard. The shard requires
// grad so that autograd calls every layer's backward, the first one's too (its x is data); its
// gradient reaches grad_shard through reduce_scatter_gradient, not through autograd.
class ShardedLinearFunction : public torch::autograd::Function<ShardedLinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& shard,
                               FullyShardedMlp* model, int64_t u);
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_outputs);
};

// Autograd's context holds IValues only: the model's address travels as an integer. The model
// outlives every graph built through it (its owner trains with it).
FullyShardedMlp* model_of(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<FullyShardedMlp*>(ctx->saved_data["model"].toInt());
}

// TODO(sharded_training-5): forward of unit u. Gather the unit's whole parameters
// (model->gather(u): flat, [weight | bias | padding]), then start the next unit's all-gather
// (model->prefetch(u + 1)) so that it travels while this layer computes, and return
// x W^T + b with W the (out, in) view and b the (out) view of the gathered buffer. Save for
// backward what backward needs and cannot gather again: the input x (ctx->save_for_backward).
// Pitfalls: saving W, b or the gathered buffer for backward keeps this layer's whole parameters
// alive until backward, which is DDP's memory, not ZeRO-3's; a prefetch issued after the
// matmul travels only after it.
torch::Tensor ShardedLinearFunction::forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                             const torch::Tensor& /*shard*/, FullyShardedMlp* model, int64_t u) {
  ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
  ctx->saved_data["unit"] = u;
  // BEGIN SOLUTION
  const auto& unit = model->units().at(u);
  torch::Tensor whole = model->gather(u);
  model->prefetch(u + 1);
  torch::Tensor weight = whole.narrow(0, 0, unit.out * unit.in).view({unit.out, unit.in});
  torch::Tensor bias = whole.narrow(0, unit.out * unit.in, unit.out);
  ctx->save_for_backward({x});
  return torch::linear(x, weight, bias);
  // END SOLUTION
}

// TODO(sharded_training-5): backward of unit u, with g = dL/dy (N, out). Gather the whole
// parameters again (model->gather(u)) and start the previous unit's all-gather
// (model->prefetch(u - 1), for u > 0: backward goes from the last layer to the first). Then
// dL/dx, and the whole gradient of the unit's flat buffer: dL/dW where the weight lies, dL/db
// where the bias lies, zeros in the padding (lab 7 derived dL/dx and dL/dW of y = x W^T; b's
// gradient sums g over the batch). Hand that whole gradient to model->reduce_scatter_gradient,
// which starts its reduce-scatter into the unit's grad_shard without waiting. Return one
// gradient per forward input: {dL/dx, undefined, undefined, undefined} (the shard's gradient
// goes through the reduce-scatter, not through autograd).
// Pitfalls: dL/dx only when ctx->needs_input_grad(0) (the first layer's input is data); the
// whole gradient must be laid out as the parameters are, or each rank steps the wrong elements;
// under mixed precision (ShardedPrecision) x, g and the gathered parameters are bf16: compute in
// their dtype and assume no float32 anywhere.
torch::autograd::tensor_list ShardedLinearFunction::backward(torch::autograd::AutogradContext* ctx,
                                                             torch::autograd::tensor_list grad_outputs) {
  FullyShardedMlp* model = model_of(ctx);
  const auto u = static_cast<size_t>(ctx->saved_data["unit"].toInt());
  // BEGIN SOLUTION
  const auto& unit = model->units().at(u);
  const torch::Tensor x = ctx->get_saved_variables()[0];
  const torch::Tensor g = grad_outputs[0];
  torch::Tensor whole = model->gather(u);
  if (u > 0) model->prefetch(u - 1);
  const int64_t weight_numel = unit.out * unit.in;
  torch::Tensor dx;
  if (ctx->needs_input_grad(0)) dx = g.mm(whole.narrow(0, 0, weight_numel).view({unit.out, unit.in}));
  torch::Tensor whole_gradient = torch::zeros({unit.layout.padded_numel()}, g.options());
  torch::Tensor weight_gradient = whole_gradient.narrow(0, 0, weight_numel).view({unit.out, unit.in});
  torch::mm_out(weight_gradient, g.t(), x);  // straight into the buffer: no second whole-sized temporary
  whole_gradient.narrow(0, weight_numel, unit.out).copy_(g.sum(0));
  model->reduce_scatter_gradient(u, whole_gradient);
  return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  // END SOLUTION
}

}  // namespace

torch::Tensor sharded_linear(FullyShardedMlp& model, size_t u, const torch::Tensor& x) {
  return ShardedLinearFunction::apply(x, model.units().at(u).shard, &model, static_cast<int64_t>(u));
}

// TODO(sharded_training-5): the step of ZeRO-3. For every unit: wait for its gradient's
// reduce-scatter (a unit without one got no gradient in this backward: an amplab::Error naming
// the unit), forget the Work, and adamw_shard_step on its shard with its grad_shard and moments
// (one step count for all units). Nothing to all-gather: the next forward gathers each layer
// when it needs it.
void FullyShardedMlp::step() {
  // BEGIN SOLUTION
  ++steps_;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (!unit.reducing)
      throw amplab::Error("FullyShardedMlp: unit " + std::to_string(u) + " got no gradient in this backward");
    unit.reducing->wait();
    unit.reducing.reset();
    adamw_shard_step(unit.shard, unit.grad_shard, unit.exp_avg, unit.exp_avg_sq, steps_, options_);
  }
  // END SOLUTION
}

}  // namespace zero_lab
