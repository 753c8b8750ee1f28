// PTQ solvers: what a model gets instead of (or beside) round-to-nearest when there is no budget
// for QAT, run on the calibration batches a user already has.
//
//   before quantize():  equalize()     cross-layer equalisation of layer pairs around ReLU (Nagel 2019)
//   after quantize():   smooth_quant() activation outliers moved into the weights (Xiao et al. 2022)
//   after calibration:  solve()        GPTQ or AdaRound weight rounding, bias correction, per layer;
//                                      AutoRound and BRECQ per transformer block (framework/ptq/autoround.h,
//                                      framework/ptq/brecq.h)
//
// Each works on the layers of any model made of qforge layers: inputs are captured through the
// layers' input taps (one layer, or the layers sharing its input, at a time; the forward stops
// once they are captured), and each transform checks its own promise (equalisation and
// smoothing leave the float output unchanged, or are undone and reported).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/imatrix.h"
#include "framework/ptq/adaround.h"
#include "framework/ptq/autoround.h"
#include "framework/ptq/brecq.h"
#include "framework/ptq/gptq.h"

namespace qforge::ptq {

// Runs the model's forward on calibration batch b (0 <= b < batches) and returns its output; the
// solvers call it with autograd off and the model in eval mode.
using RunBatch = std::function<at::Tensor(int64_t b)>;

// kKMeans: codebook (qkmeans*) weights only: the codebook is refit by k-means weighted by the
// diagonal of the layer's input Hessian, H_kk = mean over rows of x_k^2 (the energy of input
// feature k), so the levels follow the weights that move the output most.
// kAutoRound: the Linears inside the transformer blocks of Llama-family and GPT-2 models, trained
// block by block against the float block's output; as the default rounding of such a model, GPTQ
// rounds its Linears outside the blocks (the head).
// kBrecq: the same blocks, AdaRound's rounding variables trained block by block against the float
// block's output weighted by the diagonal Fisher (framework/ptq/brecq.h); the head likewise.
enum class Rounding : uint8_t { kNearest, kGptq, kAdaRound, kKMeans, kAutoRound, kBrecq };
const char* to_string(Rounding r);
Rounding rounding_from_name(const std::string& name);  // "rtn" | "gptq" | "adaround" | "kmeans" | "autoround" | "brecq"
std::vector<std::string> rounding_names();

struct SolveRule {
  std::string pattern;  // shell-style on the module path, first match wins (framework/api/scheme.h)
  Rounding rounding = Rounding::kNearest;
};

struct SolveOptions {
  Rounding rounding = Rounding::kNearest;  // layers no rule matches
  std::vector<SolveRule> rules;
  bool bias_correction = false;  // fold the mean output error into the bias
  GptqOptions gptq;
  AdaRoundOptions adaround;
  AutoRoundOptions autoround;
  BrecqOptions brecq;
  int64_t sample_rows = 4096;  // input rows kept per layer (AdaRound, bias correction, errors); GPTQ's H uses all
  uint64_t seed = 0;
  // The calibration's importance matrix (framework/ptq/imatrix.h), or null: GPTQ then takes the
  // columns of the layers it covers in order of decreasing E[x²] (act_order by the imatrix).
  // With it, GPTQ also searches each grid's range weighted by it (GptqOptions::clip_importance),
  // except on these layers (AWQ searched their clipping on the full input covariance already).
  const Imatrix* imatrix = nullptr;
  std::vector<std::string> clipped_by_awq;
};

// A rule names a method for layers that cannot take it (the index into SolveOptions::rules, or
// -1 for the default rounding): the recipe maps it to the rule's file:line:column.
class SolveError : public Error {
 public:
  SolveError(int rule, const std::string& what) : Error(what), rule_(rule) {}
  int rule() const { return rule_; }

 private:
  int rule_;
};

struct LayerSolve {
  std::string path, type;
  std::string method;         // "gptq", "adaround", "autoround", "brecq", "rtn", with "+bias_correction"
  std::string note;           // why a layer kept round-to-nearest, damping raised, AdaRound convergence
  double error_before = 0;    // relative output MSE with round-to-nearest weights
  double error_after = 0;     // with the solved weights (and corrected bias)
  int64_t rows = 0;           // input rows the errors were measured on
  double seconds = 0;
};

// A layer's float weight and bias as they were before solve() replaced them (bias undefined when
// solve() left it alone), in the parameters' own shapes.
struct FloatWeights {
  at::Tensor weight, bias;
};

struct SolveReport {
  std::vector<LayerSolve> layers;  // in the order they were solved (the forward's order)
  // Path -> what solve() started from, for each layer whose weight or bias it replaced: the
  // numeric suite's float reference (NumericSuiteOptions::float_weights).
  std::map<std::string, FloatWeights> replaced;
  int64_t passes = 0;              // calibration passes (each stops after its layers' inputs)
  double seconds = 0;
};

// Which method each weighted layer of the (quantized) model gets, without running anything.
// Throws SolveError for a rule (or default) naming GPTQ or AdaRound for layers that cannot take
// it only: an Embedding, a grouped or non-zero-padded convolution, AdaRound on a float8 grid,
// AutoRound or BRECQ outside a Llama-family / GPT-2 transformer block.
// Layers the default cannot serve keep round-to-nearest with a note.
std::vector<LayerSolve> plan_solve(const torch::nn::Module& model, const SolveOptions& options);

// Solves every quantized Linear / Conv1d / Conv2d layer of a quantized, calibrated model, in
// forward order, each on inputs produced by the layers solved before it (quantized upstream).
// AutoRound and BRECQ layers go first, block by block; the other methods' layers follow.
// A solved layer keeps its float weight replaced by the dequantized codes and its weight grid
// fixed (Quantizer::set_qparams), so fake-quant, freeze() and checkpoints use exactly those codes.
SolveReport solve(torch::nn::Module& model, int64_t batches, const RunBatch& run, const SolveOptions& options);

// Output error of one layer: ‖y_q − y_f‖² / ‖y_f‖² over rows (0 when y_f is all zero and y_q too).
double relative_mse(const at::Tensor& y_quantized, const at::Tensor& y_float);
// How far a transform moved a model's output: ‖y − y0‖ / ‖y0‖ (‖y − y0‖ when y0 is all zero).
double relative_change(const at::Tensor& y, const at::Tensor& y0);

// ---- SmoothQuant ----

struct SmoothQuantOptions {
  double alpha = 0.5;  // migration strength, in [0, 1]
};
struct SmoothLayer {
  std::string path;
  double max_factor = 0, min_factor = 0;  // of s (the input is divided by s, the weight columns multiplied)
  double act_range_before = 0, act_range_after = 0;  // max |x| over channels, before and after
  int64_t floored_channels = 0;  // input channels whose max |X_j| was raised to the floor
};
struct SmoothReport {
  std::vector<SmoothLayer> layers;
  std::vector<std::string> skipped;  // "path: reason"
  std::vector<std::string> warnings;  // "path: ..." for layers whose factors span more than kSmoothExtremeSpread
  double output_change = 0;          // relative change of the float model's output on batch 0
  double seconds = 0;
};
// Floor on a layer's activation maxima, relative to its largest: a channel (almost) silent on the
// calibration batches gets no factor that shrinks its weight column to nothing.
inline constexpr double kSmoothActFloor = 1e-2;
// A layer whose factors span more than this (max / min) is warned about (lower α).
inline constexpr double kSmoothExtremeSpread = 1e3;
// For every Linear with quantized (static or dynamic) input activations, s_j = a_j^α /
// max|W_:,j|^(1−α) over calibration batches, a_j = max(max|X_j|, kSmoothActFloor · max_k max|X_k|),
// s clamped to [1e-5, 1e5]; the layer's pre_quant_scale becomes 1/s (its input
// is divided by s before quantization) and its weight columns are multiplied by s, so the float
// model computes the same function. Run after quantize() and before calibrating the observers.
// Throws for α outside [0, 1], and when the float output changes by more than 1e-4 (relative).
SmoothReport smooth_quant(torch::nn::Module& model, int64_t batches, const RunBatch& run,
                          const SmoothQuantOptions& options);

// ---- Cross-layer equalisation ----

struct EqualizedPair {
  std::string first, second;
  bool applied = false;
  std::string reason;  // why not
  double range_spread_before = 0, range_spread_after = 0;  // max/min of per-channel weight ranges, worst of the two
};
struct EqualizeReport {
  std::vector<EqualizedPair> pairs;
  double seconds = 0;
};
// For consecutive weighted layers A → B (forward order) where A's output channels are B's input
// channels, rescales A's output channel i by 1/s_i and B's input channel i by s_i with
// s_i = sqrt(r_A,i / r_B,i) (r: max |w| of the channel), which leaves the float model unchanged when
// only positively homogeneous functions (ReLU, max pooling, identity) lie between them. Each pair
// is checked on calibration batch 0 and undone when the output moves by more than 1e-4
// (relative): e.g. a GELU, a BatchNorm not folded, or a residual between them. Float model
// (before quantize()); `iterations` sweeps over the pairs.
EqualizeReport equalize(torch::nn::Module& model, const RunBatch& run, int64_t iterations = 1);

}  // namespace qforge::ptq
