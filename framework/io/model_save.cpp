// Saving qforge models: the HDF5 model checkpoint (sync and background) and the safetensors export.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <future>

#include "framework/core/error.h"
#include "framework/io/format.h"
#include "framework/io/model_file.h"
#include "framework/io/model_io.h"
#include "framework/format/safetensors.h"
#include "framework/nn/rpq.h"

namespace qforge::io {

using namespace model_file;

// ---------------------------------------------------------------------------------------------
// Saving

void save_model(const torch::nn::Module& model, const std::string& path, const SaveOptions& options) {
  at::NoGradGuard no_grad;
  write_model_file(path, collect(model, options));
}

ModelSaveHandle save_model_async(const torch::nn::Module& model, const std::string& path,
                                 const SaveOptions& options) {
  at::NoGradGuard no_grad;
  ModelFileData snap = snapshot_model(collect(model, options));  // copies before returning
  return SaveHandle(std::async(std::launch::async, [path, snap = std::move(snap)] { write_model_file(path, snap); }),
                    path);
}

// ---------------------------------------------------------------------------------------------
// safetensors export (written by io::write_safetensors, crash-safe)

namespace {

// The tensors of a safetensors export and the description of its quantized ones.
struct SafetensorsExport {
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json described = nlohmann::json::object();

  void add_plain(const ModelFileData& f) {
    for (const auto& [key, t] : f.data.parameters) tensors[key] = t;
    for (const auto& [key, t] : f.data.buffers) {
      QF_REQUIRE(!tensors.count(key), "framework/io: export_safetensors: '", key, "' is a parameter and a buffer");
      tensors[key] = t;
    }
  }

  void add_quantized(const std::string& key, const at::Tensor& codes, const at::Tensor& scale,
                     const at::Tensor& zero_point, const QSpec& spec, const std::vector<int64_t>& shape,
                     const char* packing) {
    for (const std::string& k : {key + ".scale", key + ".zero_point"})
      QF_REQUIRE(!tensors.count(k), "framework/io: export_safetensors: '", k, "' clashes with a model tensor");
    tensors[key] = codes;
    tensors[key + ".scale"] = scale;
    tensors[key + ".zero_point"] = zero_point;
    described[key] = {{"qtype", spec.qtype.name},
                      {"bits", spec.qtype.bits},
                      {"granularity", to_string(spec.granularity)},
                      {"axis", spec.axis},
                      {"group_size", spec.granularity == Granularity::kPerGroup ? spec.group_size : 0},
                      {"symmetric", spec.symmetric},
                      {"packing", packing},
                      {"shape", shape},
                      {"dequantize", spec.qtype.is_float() ? "float(fp8_decode(code)) * scale"
                                                           : "float32(q - zero_point) * scale"}};
  }

  // Level indices and their float16 levels: no scale or zero point.
  void add_codebook(const std::string& key, const QuantizedTensor& q, const QSpec& spec) {
    QF_REQUIRE(!tensors.count(key + ".codebook"), "framework/io: export_safetensors: '", key,
               ".codebook' clashes with a model tensor");
    tensors[key] = q.data;
    tensors[key + ".codebook"] = q.codebook;
    described[key] = {{"qtype", spec.qtype.name},
                      {"bits", spec.qtype.bits},
                      {"storage_bits", codebook_storage_bits(spec.qtype)},
                      {"granularity", to_string(spec.granularity)},
                      {"axis", spec.axis},
                      {"group_size", spec.granularity == Granularity::kPerGroup ? spec.group_size : 0},
                      {"packing", q.packing()},
                      {"shape", q.shape},
                      {"dequantize", "float32(codebook[..., code])"}};
  }

  // E2M1 nibbles and one scale byte per block (E8M0 / E4M3 codes), nvfp4's tensor scale.
  void add_microscaling(const std::string& key, const QuantizedTensor& q, const QSpec& spec) {
    for (const std::string& k : {key + ".scale", key + ".tensor_scale"})
      QF_REQUIRE(!tensors.count(k), "framework/io: export_safetensors: '", k, "' clashes with a model tensor");
    const bool nv = spec.qtype == qnvfp4;
    tensors[key] = q.data;
    tensors[key + ".scale"] = q.scale;
    if (nv) tensors[key + ".tensor_scale"] = q.tensor_scale.reshape({1});
    described[key] = {{"qtype", spec.qtype.name},
                      {"bits", spec.qtype.bits},
                      {"granularity", to_string(spec.granularity)},
                      {"group_size", spec.group_size},
                      {"packing", q.packing()},
                      {"shape", q.shape},
                      {"dequantize", nv ? "e2m1(code) * (e4m3(scale) * tensor_scale)" : "e2m1(code) * 2^(scale - 127)"}};
  }

  void add_quantized_weights(const ModelFileData& f) {
    for (const auto& [key, q] : f.data.quantized) {
      QSpec spec;
      const auto& m = f.meta.layers.at(split_key(key).first);
      spec = m.scheme.weights->spec;
      spec.axis = q.spec.axis;
      if (spec.qtype.is_codebook()) {
        add_codebook(key, q, spec);
        continue;
      }
      if (spec.qtype.is_microscaling()) {
        add_microscaling(key, q, spec);
        continue;
      }
      add_quantized(key, q.data, q.scale, q.zero_point, spec, q.shape, q.packing());
    }
  }

  // Float8-simulated weights are written as their codes with the layer's float8 scale.
  void add_float8_weights(const ModelFileData& f) {
    for (const auto& [path, m] : f.meta.layers) {
      if (!m.float8_scale.defined()) continue;
      const std::string key = join(path, "weight");
      const at::Tensor codes = tensors.at(key);
      tensors.erase(key);
      add_quantized(key, codes, m.float8_scale, m.float8_zero_point, m.scheme.weights->spec, codes.sizes().vec(),
                    "ocp_fp8_bytes");
    }
  }
};

// RPQ layers (docs/rpq.md), frozen or not: their tensors as they are, plus how to expand them.
nlohmann::json rpq_description(const torch::nn::Module& model) {
  nlohmann::json rpq = nlohmann::json::object();
  for (const auto& [path, l] : nn::rpq_layers(model)) {
    rpq[path] = {{"layer_type", l->layer_type()},
                 {"num_codebooks", l->num_codebooks()},
                 {"codebook_size", nn::kRpqCodebookSize},
                 {"codebook_dim", l->codebook_dim()},
                 {"weight_shape", l->weight_shape()},
                 {"codebooks", join(path, "codebooks")},
                 {"indices", join(path, "indices")},
                 {"expand", "W_split[h * codebook_dim + d, c] = codebooks[h, indices[h, c], d]; the twin's "
                            "layout from W_split as docs/rpq.md lists per layer_type"}};
  }
  return rpq;
}

}  // namespace

void export_safetensors(const torch::nn::Module& model, const std::string& path) {
  at::NoGradGuard no_grad;
  const ModelFileData f = collect(model, SaveOptions{});
  SafetensorsExport out;
  out.add_plain(f);
  out.add_quantized_weights(f);
  out.add_float8_weights(f);
  const nlohmann::json rpq = rpq_description(model);
  std::map<std::string, std::string> metadata;
  metadata["format"] = "qforge.quantized";
  metadata["qforge.quantized"] = out.described.dump();
  if (!rpq.empty()) metadata["qforge.rpq"] = rpq.dump();
  metadata["qforge_version"] = qforge_version();
  write_safetensors(path, out.tensors, metadata);
}

}  // namespace qforge::io
