// Models several labs share.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

namespace amplab {

// The network of pytorch/examples' mnist/main.py, in plain torch ops. Input (N, 1, 28, 28),
// output (N, 10) log-probabilities.
struct MnistNetImpl : torch::nn::Module {
  MnistNetImpl();
  // Virtual so that a network with the same parameters may compute it another way (the fast
  // path's FusedMnistNet); this one is main.py's Net.forward.
  virtual torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};         // 1 -> 32 -> 64 channels, 3x3
  torch::nn::Dropout dropout1{nullptr}, dropout2{nullptr};  // p = 0.25 after pooling, 0.5 after fc1
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};             // 9216 -> 128 -> 10
};
TORCH_MODULE(MnistNet);

// Linear(in, out) computed by `pieces` smaller Linears side by side, each giving a block of
// the output features (rows of the weight, as equal as they divide): the same function, with the
// weight and bias cut into pieces. The point is backward: each piece's weight gradient is
// computed by an autograd node of its own, and is in .grad before the next piece's is computed,
// so DDP can all-reduce one piece while the next is being computed. Worth it for a network's
// first layer, whose gradient comes last, when nothing else is left to hide its all-reduce
// behind. The price: forward joins the pieces' outputs, one copy of the output (torch::cat);
// under autocast the input is cast once, not once per piece.
// Parameters: piece0.weight, piece0.bias, piece1.weight, ...
struct LinearInPiecesImpl : torch::nn::Module {
  LinearInPiecesImpl(int64_t in_features, int64_t out_features, int64_t pieces);
  torch::Tensor forward(const torch::Tensor& x);
  // Takes a Linear(in, out)'s weight and bias, cut into this module's pieces.
  void copy_from(const torch::nn::Linear& linear);
  std::vector<torch::nn::Linear> pieces;
};
TORCH_MODULE(LinearInPieces);

// `layers` x (Linear(width, width) + ReLU): the compute-bound model of the AMP and DDP labs' benchmarks
// (4 x Linear(8192, 8192)). With first_layer_pieces > 1 the first Linear is a LinearInPieces.
torch::nn::Sequential make_mlp(int64_t width, int64_t layers, int64_t first_layer_pieces = 1);

// Python's model.to(memory_format=torch.channels_last): 4-d parameters (convolution weights) in
// NHWC order, so that cuDNN need not transpose them on every call.
void to_channels_last(torch::nn::Module& model);

}  // namespace amplab
