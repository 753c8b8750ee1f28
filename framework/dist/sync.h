// Data-parallel calibration and QAT: every rank runs the same model on its own shard of the data
// (dist::shard_indices); these calls make the ranks agree where it matters.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>
#include <string>

#include "framework/dist/world.h"

namespace qforge::dist {

// Call after the calibration forwards, before Calibration::finish(): every observer of the model
// gathers all ranks' states and merges them in rank order (rank 0's first), so every rank holds
// the same observer and finish() gives every rank the same qparams. For min/max observers the
// merge is the minimum and maximum over all ranks' data, bit for bit what one process seeing all
// of it computes; histogram observers merge as Observer::merge does. A static KV cache being
// calibrated merges its ranges likewise (kv_static_scales.h). Returns the observers merged.
int64_t sync_observers(torch::nn::Module& model, const World& world);

// Call after backward, before the optimizer step: every parameter's gradient becomes the mean over
// the ranks (all-reduce SUM over flattened buckets of at most bucket_bytes, in parameter order,
// then / size), LSQ's learnable scales included. A parameter without a gradient takes part as
// zeros, so every rank reduces the same buckets. With equal shard sizes and a mean loss this is
// the gradient of the whole batch.
void average_gradients(torch::nn::Module& model, const World& world, int64_t bucket_bytes = int64_t{25} << 20);

// average_gradients overlapped with backward, as DDP's reducer does it: hooks on the parameters
// copy each gradient into its bucket as backward produces it, and a full bucket starts its
// all-reduce at once (on Gloo's thread) while backward goes on, buckets strictly in order so every
// rank issues the same collectives. Buckets of at most bucket_bytes (the first at most 1 MiB, as
// DDP's, so that one starts early) hold the parameters in reverse registration order (roughly the
// order backward produces them). finish(), after backward, starts
// what is left (a parameter backward did not reach takes part as zeros), waits, and writes the
// means into the gradients: the same values as average_gradients. One backward per step (the
// hooks see that backward's gradient, not an accumulated one). The hooks go with the object.
class GradientAverager {
 public:
  GradientAverager(torch::nn::Module& model, const World& world, int64_t bucket_bytes = int64_t{25} << 20);
  ~GradientAverager();
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  void finish();
  // Of the last finish(): seconds spent waiting for all-reduces after backward (the part the
  // overlap did not hide) and buckets already started during backward.
  double last_wait_s() const { return last_wait_s_; }
  int64_t last_overlapped_buckets() const { return last_overlapped_; }

 private:
  struct Bucket;
  void ready(size_t param, const at::Tensor& grad);
  void launch_ready();

  const World& world_;
  std::vector<at::Tensor> params_;
  std::vector<unsigned> hooks_;
  std::vector<std::pair<size_t, int64_t>> where_;  // param -> (bucket, offset)
  std::vector<std::unique_ptr<Bucket>> buckets_;
  size_t next_launch_ = 0;
  double last_wait_s_ = 0;
  int64_t last_overlapped_ = 0;
};

// Every buffer (BatchNorm running statistics, quantizer scales, ...) from `root` to every rank,
// as DDP's broadcast_buffers does: call after steps that update buffers from local data (BatchNorm
// in training mode), at least before check_replicas and before saving.
void broadcast_buffers(torch::nn::Module& model, const World& world, int root = 0);

// Every observer's state from `root` to every rank (as broadcast_buffers for buffers): after steps
// in which each rank's observers saw only its own shard (QAT with observers not frozen).
void broadcast_observers(torch::nn::Module& model, const World& world, int root = 0);

// One named piece of a replica's state, in the order check_replicas looks for a difference.
struct ReplicaField {
  std::string where;  // a qforge layer's path, or a parameter's / buffer's name
  std::string what;   // "weight quantizer settings", "frozen weight", "parameter", ...
  std::string value;  // readable for settings, "hash <16 hex digits>" for tensors
};

// Every qforge layer's quantization state, then every parameter and buffer (name, dtype, shape,
// bytes): per layer the scheme and chosen widths (describe()'s weights and activations), the
// kernel and whether frozen; per quantizer its settings (qtype, granularity, axis, group size,
// symmetry, range, activation mode, observer kind, LSQ, calibrated / observing / fake-quant /
// observer-frozen flags), its qparams (scale, zero point, codebook) and its observer's state;
// a frozen layer's packed weight (codes, scale, zero point, codebook, tensor scale) and bias.
std::vector<ReplicaField> replica_fields(const torch::nn::Module& model);

// Every rank must hold the same model (at start, after each epoch, after calibration and freeze):
// compares a 64-bit hash of replica_fields across ranks; when any differs, every rank gathers
// the fields (the same two collectives on every rank, so none waits for a collective the others
// skip) and throws qforge::Error naming `when`, the ranks that differ from rank 0 and, for each,
// the first layer and field that differs with both values.
void check_replicas(const torch::nn::Module& model, const World& world, const std::string& when);

// Every rank must run with the same `value` of `what` (the recipe's sha256, the stages, the float
// checkpoint's bytes): gathers it from every rank and throws qforge::Error naming the ranks whose
// value differs from rank 0's, with both values, on every rank alike.
void check_agreement(const World& world, const std::string& what, const std::string& value);

// The 64-bit FNV-1a hash check_replicas compares: of replica_fields, in order.
uint64_t replica_hash(const torch::nn::Module& model);

}  // namespace qforge::dist
