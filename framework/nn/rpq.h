// Reverse product quantization (RPQ) layers: the weight is generated just in time from
// `num_codebooks` shared codebooks of 256 sub-vectors and uint8 indices (docs/rpq.md).
//
// One split dimension S of the weight (the output features / channels) is cut into
// H = num_codebooks blocks of D = S / H; the other dimensions flatten to C columns. Then
//   W_split[h * D + d, c] = codebooks[h, indices[h, c], d]     codebooks [H, 256, D] (parameter)
//                                                             indices   [H, C] uint8 (buffer)
// so a layer stores H * 256 * D floats + H * C bytes instead of S * C floats. Codebooks train
// (they are parameters); indices are fixed buffers. The expanded weight is built inside forward
// and never kept, so gradient checkpointing recomputes it instead of storing it.
//
// Layers (drop-in for their torch::nn twins: same options, forward and initial weight
// distribution, plus num_codebooks): RPQLinear, RPQEmbedding, RPQConv1d/2d/3d,
// RPQConvTranspose1d/2d/3d, RPQBilinear. S must be divisible by num_codebooks (clear error
// otherwise): out_features (Linear, Bilinear), out_channels (Conv), out_channels / groups
// (ConvTranspose), embedding_dim (Embedding: a row is H sub-vectors, gathered directly).
//
// freeze() (or qforge::freeze on the model) moves codebooks, indices and bias into a packed
// weight (framework/nn/packed_weight_rpq.cpp): codebooks and bias stop being parameters, forward
// runs the packed weight, and the layer stays on the CPU (docs/rpq.md, "Frozen form").
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/options/conv.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/api/kmeans.h"
#include "framework/nn/packed_weight.h"

namespace qforge::nn {

// Sub-vectors per codebook (uint8 indices).
constexpr int64_t kRpqCodebookSize = 256;
// Linear inputs of up to this many rows run the per-codebook look-up sums; more expand the weight.
constexpr int64_t kRpqLutMaxRows = 16;

// Expands codebooks [H, 256, D] and indices [H, C] into the split-first weight [H * D, C].
at::Tensor rpq_expand(const at::Tensor& codebooks, const at::Tensor& indices);
// Row h * 256 + indices[h, c] of the codebooks viewed [H * 256, D]: sub-vector (h, c), as int64 [H, C].
at::Tensor rpq_codebook_rows(const at::Tensor& indices);
// y = x W_splitᵀ + bias for x [..., C] (W_split the expansion, [S, C]): up to kRpqLutMaxRows rows,
//   y[m, h * D + d] = sum_k (sum_{c : indices[h, c] = k} x[m, c]) * codebooks[h, k, d]
// without building the weight; more rows, at::linear on the expanded weight. Differentiable. The
// unfrozen RPQLinear and its packed weight both run this.
at::Tensor rpq_linear(const at::Tensor& x, const at::Tensor& codebooks, const at::Tensor& indices, const at::Tensor& bias);
// Rows `flat` (int64 [n], each in [0, C)) of the table W_splitᵀ [C, S]: each row's H sub-vectors
// gathered from the codebooks, [n, S]. The unfrozen RPQEmbedding and its packed weight run this.
at::Tensor rpq_gather_rows(const at::Tensor& codebooks, const at::Tensor& indices, const at::Tensor& flat);

// What a frozen RPQ layer's packed weight runs in forward (framework/nn/packed_weight_rpq.cpp).
enum class RpqForward : uint8_t {
  kLinear,     // rpq_linear: x [..., C] -> [..., S]
  kEmbedding,  // rpq_gather_rows: integer ids [...] -> [..., S]
  kDense,      // none: the layer runs its ATen op (convolution, bilinear) on the expanded weight
};

// State and bookkeeping every RPQ layer shares.
class RPQLayer {
 public:
  virtual ~RPQLayer() = default;
  virtual const char* layer_type() const = 0;
  // The expanded weight in the twin's layout (a new tensor each call, differentiable).
  virtual at::Tensor weight() const = 0;
  // The twin's weight shape (without expanding anything).
  virtual std::vector<int64_t> weight_shape() const = 0;
  int64_t num_codebooks() const { return H_; }
  int64_t codebook_dim() const { return D_; }
  const at::Tensor& codebooks() const { return codebooks_; }
  const at::Tensor& indices() const { return indices_; }
  bool has_bias() const { return bias_.defined(); }
  // Bytes held: codebooks (float32), indices (uint8) and bias.
  int64_t storage_bytes() const;
  // Bytes the twin's float32 weight would take.
  int64_t dense_weight_bytes() const;
  // The twin-layout weight `w` viewed split-first [S, C] (what the codebooks reconstruct).
  virtual at::Tensor split_of(const at::Tensor& w) const = 0;
  // Sets codebooks, indices and (when the layer has one) bias; shapes must match.
  void set_rpq_state(const at::Tensor& codebooks, const at::Tensor& indices, const at::Tensor& bias);
  // What forward runs for an input of `rows` rows (Linear: "rpq_lut" or "rpq_expand+at::linear"),
  // and why when it expands.
  virtual std::string kernel(int64_t rows) const;

  // Frozen form: codebooks, indices and bias move into a CPU packed weight; codebooks and bias
  // leave the module's parameters, so no optimizer trains them (the `indices` buffer stays, sharing
  // the packed storage: LibTorch cannot remove a buffer). Forward runs the packed weight and
  // computes the same bits. Throws (changing nothing) unless the layer is on the CPU. Freezing a
  // frozen layer does nothing; there is no way back (build a fresh layer).
  virtual void freeze() = 0;
  bool frozen() const { return packed_ != nullptr; }
  // The packed weight of a frozen layer (null otherwise).
  const PackedWeightPtr& packed_weight() const { return packed_; }
  // Throws when the layer is frozen (`what` names the call that would change its codebooks).
  void require_unfrozen(const char* what) const;

 protected:
  // Registers codebooks [H, 256, S / H] and random indices [H, C] on `m`; throws unless
  // S % H == 0 (`what` names S in the message).
  void init_rpq(torch::nn::Module& m, int64_t split, int64_t columns, int64_t num_codebooks, const char* what);
  // Draws the codebooks uniformly in [-bound, bound] (the twin's kaiming-uniform bound).
  void init_codebooks_uniform(double bound);
  // The split-first weight [S, C] (a frozen layer's from its packed weight).
  at::Tensor expanded() const;
  // The layer's bias (a frozen layer's from its packed weight; undefined when it has none).
  at::Tensor layer_bias() const;
  // freeze()'s packing for the layer's forward kind (a copy of the tensors: optimizers holding the
  // old parameters cannot change it); the module then drops the tensors. Throws off the CPU.
  void pack(RpqForward form);

  int64_t H_ = 0, D_ = 0, S_ = 0, C_ = 0;
  at::Tensor codebooks_, indices_, bias_;
  PackedWeightPtr packed_;
};

// The module side every RPQ layer shares: freeze() (the tensors leave the module) and device
// moves, which frozen layers refuse for any device but the CPU.
template <class Derived>
class RPQModule : public torch::nn::Cloneable<Derived>, public RPQLayer {
 public:
  void freeze() override;
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

 protected:
  // What the packed weight runs for this layer.
  virtual RpqForward frozen_forward_kind() const { return RpqForward::kDense; }
};

class RPQLinearImpl : public RPQModule<RPQLinearImpl> {
 public:
  RPQLinearImpl(int64_t in_features, int64_t out_features, int64_t num_codebooks)
      : RPQLinearImpl(torch::nn::LinearOptions(in_features, out_features), num_codebooks) {}
  RPQLinearImpl(const torch::nn::LinearOptions& options, int64_t num_codebooks);
  void reset() override;
  // Up to kLutMaxRows rows: per-codebook sums of x over the columns that pick each sub-vector,
  // times the codebook (no weight is built); more rows: the expanded weight and at::linear.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight() const override;
  at::Tensor split_of(const at::Tensor& w) const override { return w.reshape({S_, C_}); }
  std::vector<int64_t> weight_shape() const override { return {S_, C_}; }
  const char* layer_type() const override { return "RPQLinear"; }
  std::string kernel(int64_t rows) const override;
  const at::Tensor& bias() const { return bias_; }

 protected:
  RpqForward frozen_forward_kind() const override { return RpqForward::kLinear; }

 public:
  static constexpr int64_t kLutMaxRows = kRpqLutMaxRows;
  torch::nn::LinearOptions options;
  int64_t num_codebooks_option;
};
TORCH_MODULE(RPQLinear);

class RPQEmbeddingImpl : public RPQModule<RPQEmbeddingImpl> {
 public:
  RPQEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, int64_t num_codebooks)
      : RPQEmbeddingImpl(torch::nn::EmbeddingOptions(num_embeddings, embedding_dim), num_codebooks) {}
  RPQEmbeddingImpl(const torch::nn::EmbeddingOptions& options, int64_t num_codebooks);
  void reset() override;
  // Gathers each looked-up row's H sub-vectors from the codebooks (never the whole table).
  // padding_idx rows pass no gradient, as in torch::nn::Embedding (they are not zero: their
  // sub-vectors are shared).
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor weight() const override;
  at::Tensor split_of(const at::Tensor& w) const override { return w.t(); }
  std::vector<int64_t> weight_shape() const override { return {C_, S_}; }
  const char* layer_type() const override { return "RPQEmbedding"; }
  std::string kernel(int64_t) const override { return "rpq_gather_rows"; }

 protected:
  RpqForward frozen_forward_kind() const override { return RpqForward::kEmbedding; }

 public:
  torch::nn::EmbeddingOptions options;
  int64_t num_codebooks_option;
};
TORCH_MODULE(RPQEmbedding);

// Convolutions of D spatial dimensions; Transposed selects ConvTranspose.
template <size_t Dims, bool Transposed>
class RPQConvImpl : public RPQModule<RPQConvImpl<Dims, Transposed>> {
 public:
  using Options = std::conditional_t<Transposed, torch::nn::ConvTransposeOptions<Dims>, torch::nn::ConvOptions<Dims>>;
  // The base is dependent here: RPQLayer's members by name.
  using RPQLayer::C_;
  using RPQLayer::S_;
  using RPQLayer::bias_;
  using RPQLayer::expanded;
  using RPQLayer::init_codebooks_uniform;
  using RPQLayer::init_rpq;
  using RPQLayer::layer_bias;
  RPQConvImpl(Options options, int64_t num_codebooks);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight() const override;
  at::Tensor split_of(const at::Tensor& w) const override;
  std::vector<int64_t> weight_shape() const override;
  const char* layer_type() const override;
  const at::Tensor& bias() const { return bias_; }
  Options options;
  int64_t num_codebooks_option;
};
using RPQConv1dImpl = RPQConvImpl<1, false>;
using RPQConv2dImpl = RPQConvImpl<2, false>;
using RPQConv3dImpl = RPQConvImpl<3, false>;
using RPQConvTranspose1dImpl = RPQConvImpl<1, true>;
using RPQConvTranspose2dImpl = RPQConvImpl<2, true>;
using RPQConvTranspose3dImpl = RPQConvImpl<3, true>;
TORCH_MODULE(RPQConv1d);
TORCH_MODULE(RPQConv2d);
TORCH_MODULE(RPQConv3d);
TORCH_MODULE(RPQConvTranspose1d);
TORCH_MODULE(RPQConvTranspose2d);
TORCH_MODULE(RPQConvTranspose3d);

class RPQBilinearImpl : public RPQModule<RPQBilinearImpl> {
 public:
  RPQBilinearImpl(const torch::nn::BilinearOptions& options, int64_t num_codebooks);
  void reset() override;
  at::Tensor forward(const at::Tensor& x1, const at::Tensor& x2);
  at::Tensor weight() const override;
  at::Tensor split_of(const at::Tensor& w) const override { return w.reshape({S_, C_}); }
  std::vector<int64_t> weight_shape() const override {
    return {options.out_features(), options.in1_features(), options.in2_features()};
  }
  const char* layer_type() const override { return "RPQBilinear"; }
  const at::Tensor& bias() const { return bias_; }
  torch::nn::BilinearOptions options;
  int64_t num_codebooks_option;
};
TORCH_MODULE(RPQBilinear);

// Every RPQ layer of `model` with its module path ("" for the root), in named_modules() order.
std::vector<std::pair<std::string, const RPQLayer*>> rpq_layers(const torch::nn::Module& model);
std::vector<std::pair<std::string, RPQLayer*>> rpq_layers(torch::nn::Module& model);

// ---- conversion from float weights -----------------------------------------------------------

struct RPQConversion {
  at::Tensor codebooks;  // [H, 256, D]
  at::Tensor indices;    // [H, C] uint8
  // |W - W_rpq|^2 / |W|^2 over the whole weight.
  double relative_error = 0.0;
};

// k-means (256 centroids) on the C sub-vectors of each of the H blocks of the split-first weight
// `w_split` [S, C]. Deterministic for a given options.seed.
RPQConversion rpq_convert(const at::Tensor& w_split, int64_t num_codebooks, const KMeansOptions& options = {});

// Converts a float layer: the RPQ layer of the same options whose expanded weight is the k-means
// reconstruction of `weight` (in the twin's layout) and whose bias is `bias`; returns the relative
// error in `*relative_error`.
void rpq_load_from_float(RPQLayer& layer, const at::Tensor& weight, const at::Tensor& bias,
                         const KMeansOptions& options = {}, double* relative_error = nullptr);

// Data-aware codebooks for an RPQLinear: with its indices fixed, the codebooks that minimise the
// layer's output error on calibration inputs X [N, in] against the float `weight` [out, in]:
//   min over codebooks of |X (weight - W_rpq)ᵀ|²  (bias unchanged).
// W_rpq is linear in the codebooks, so each codebook h solves one damped least-squares system
//   (Aₕᵀ G Aₕ + λ I) Vₕ = Aₕᵀ G Wₕᵀ + λ Vₕ⁰,   G = XᵀX, Aₕ the [in, 256] one-hot of
// indices[h], Wₕ the block's D rows, Vₕ⁰ the current codebook, λ = damp · mean diagonal of the
// used codes (float64); codes no column picks keep their sub-vector. With G = I and damp = 0 this
// is each code's mean sub-vector (the k-means centroids of the current assignment).
struct RPQRefineReport {
  double output_error_before = 0.0;  // |X (W - W_rpq)ᵀ|² / |X Wᵀ|², before and after
  double output_error_after = 0.0;
};
RPQRefineReport rpq_refine_codebooks(RPQLinearImpl& layer, const at::Tensor& weight, const at::Tensor& inputs,
                                     double damp = 1e-4);  // > 0

}  // namespace qforge::nn
