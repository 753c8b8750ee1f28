// Fuzzes the checkpoint readers on arbitrary HDF5 bytes: CheckpointReader (metadata, every entry
// read as stored and dequantized) and io::load_model into fresh float models (the /model group,
// frozen rebuilds, dequantized loads). Any input must load or throw; never crash, hang or leak.
// Seeds: tests/fixtures/{checkpoint,model,calibration}_v1.h5 (tests/fuzz/corpus/checkpoint).
#include <torch/nn/module.h>

#include <cstdint>
#include <exception>
#include <memory>

#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "tests/fuzz/fuzz_file.h"

namespace {

using namespace qforge;

// The model tests/fixtures/model_v1.h5 holds (tests/io/model_io_test.cpp), so load_model gets past
// key matching into schemes and frozen weights.
struct Net : torch::nn::Module {
  Net()
      : emb(register_module("emb", nn::Embedding(16, 32))),
        fc1(register_module("fc1", nn::Linear(32, 64))),
        fc2(register_module("fc2", nn::Linear(64, 8))) {
    counter = register_buffer("counter", at::zeros({2}, at::kLong));
  }
  nn::Embedding emb;
  nn::Linear fc1, fc2;
  at::Tensor counter;
};

void read_everything(const std::string& path) {
  const io::CheckpointReader reader(path);
  (void)reader.format_version();
  (void)reader.step();
  (void)reader.recipe();
  (void)reader.optimizer_kind();
  for (const io::EntryInfo& e : reader.entries()) {
    // One bad dataset must not hide a crash in the next: each read may throw on its own.
    try {
      (void)reader.read_tensor(e.key, e.section, /*dequantize=*/true);
    } catch (const std::exception&) {
    }
    if (e.quantized) {
      try {
        (void)reader.read_quantized(e.key, e.section);
      } catch (const std::exception&) {
      }
    }
  }
}

void load_into_fresh_model(const std::string& path, bool dequantize) {
  Net net;
  io::LoadModelOptions options;
  options.strict = false;
  options.dequantize = dequantize;
  (void)io::load_model(net, path, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (fuzz::scratch_dir() / "checkpoint.h5").string();
  fuzz::write_file(path, data, size);
  try {
    read_everything(path);
  } catch (const std::exception&) {
  }
  for (const bool dequantize : {false, true}) {
    try {
      load_into_fresh_model(path, dequantize);
    } catch (const std::exception&) {
    }
  }
  return 0;
}
