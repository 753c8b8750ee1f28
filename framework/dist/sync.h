// Data-parallel calibration and QAT: every rank runs the same model on its own shard of the data
// (dist::shard_indices); these calls make the ranks agree where it matters.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>

#include "framework/dist/world.h"

namespace qforge::dist {

// Call after the calibration forwards, before Calibration::finish(): every observer of the model
// gathers all ranks' states and merges them in rank order (rank 0's first), so every rank holds
// the same observer and finish() gives every rank the same qparams. For min/max observers the
// merge is the minimum and maximum over all ranks' data, bit for bit what one process seeing all
// of it computes; histogram observers merge as Observer::merge does. Returns the observers merged.
int64_t sync_observers(torch::nn::Module& model, const World& world);

// Call after backward, before the optimizer step: every parameter's gradient becomes the mean over
// the ranks (all-reduce SUM over flattened buckets of at most bucket_bytes, in parameter order,
// then / size), LSQ's learnable scales included. A parameter without a gradient takes part as
// zeros, so every rank reduces the same buckets. With equal shard sizes and a mean loss this is
// the gradient of the whole batch.
void average_gradients(torch::nn::Module& model, const World& world, int64_t bucket_bytes = int64_t{25} << 20);

// Every buffer (BatchNorm running statistics, quantizer scales, ...) from `root` to every rank,
// as DDP's broadcast_buffers does: call after steps that update buffers from local data (BatchNorm
// in training mode), at least before check_replicas and before saving.
void broadcast_buffers(torch::nn::Module& model, const World& world, int root = 0);

// Every rank must hold the same parameters and buffers (at start, after each epoch): compares a
// 64-bit hash of their names and bytes across ranks; throws qforge::Error naming the ranks that
// differ from rank 0 and `when`.
void check_replicas(const torch::nn::Module& model, const World& world, const std::string& when);

// The 64-bit FNV-1a hash check_replicas compares (names, dtypes, shapes and bytes of every
// parameter and buffer, in registration order).
uint64_t replica_hash(const torch::nn::Module& model);

}  // namespace qforge::dist
