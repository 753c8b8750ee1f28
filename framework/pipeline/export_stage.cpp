// export: the files the recipe's export section asks for (calibration dump, checkpoint,
// safetensors, ONNX, GGUF; imatrix.gguf with calibrate.imatrix), and why any other was not written.
#include <cstdio>
#include <filesystem>

#include "framework/io/calibration_io.h"
#include "framework/io/model_io.h"
#include "framework/models/gguf_export.h"
#include "framework/models/gguf_imatrix.h"
#include "framework/onnx/export.h"
#include "framework/pipeline/recipe_checks.h"
#include "framework/pipeline/run_context.h"
#include "framework/pipeline/stage_registry.h"
#include "framework/api/quantize.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"
#include "framework/report/report_json.h"

namespace qforge::pipeline {

namespace fs = std::filesystem;

namespace {

// Written from the model's quantizers (observer state and qparams); after QAT/freeze the
// observers still hold their calibration statistics. The search's sensitivities and the numeric
// suite's table go in the same file (search.sensitivities_from reads them back).
void export_calibration_dump(RunContext& ctx, const fs::path& dir) {
  const Recipe& r = ctx.recipe;
  if (!r.export_.calibration_dump ||
      !(r.scheme.activations == ActivationMode::kStatic || ctx.search_record || ctx.error_record || ctx.imatrix))
    return;
  ctx.report["exported"]["calibration_dump"] = ctx.save((dir / "calibration.h5").string(), [&](const std::string& p) {
    io::save_calibration(*ctx.task.model, p, ctx.search_record ? &*ctx.search_record : nullptr,
                         ctx.error_record ? &*ctx.error_record : nullptr, ctx.imatrix ? &*ctx.imatrix : nullptr);
  });
}

// llama.cpp's imatrix file under the GGUF export's tensor names (Linear layers it names).
void export_imatrix(RunContext& ctx, const fs::path& dir) {
  std::vector<std::string> skipped;
  const io::ImatrixFile f = models::gguf_imatrix_file(*ctx.imatrix, ctx.recipe.data.dataset, ctx.recipe.data.seq_len, &skipped);
  if (f.tensors.empty()) {
    ctx.note("imatrix.gguf not written: no Linear layer has a GGUF tensor name (GPT-2 and Llama models only)");
    return;
  }
  ctx.report["exported"]["imatrix"] = ctx.save((dir / "imatrix.gguf").string(), [&](const std::string& p) {
    io::write_imatrix(p, f);
  });
  if (!skipped.empty()) ctx.report["imatrix"]["not_in_file"] = skipped;
}

// model.gguf for llama.cpp, with the export's line per tensor (its type and where it came from).
void export_gguf(RunContext& ctx, const fs::path& dir) {
  const Recipe::Export::Gguf& g = ctx.recipe.export_.gguf;
  models::GgufExportOptions o;
  o.float_type = io::ggml_type_named(g.float_type);
  o.refuse_wider = g.refuse_wider;
  models::GgufExportReport rep;
  const auto gpt2 = std::dynamic_pointer_cast<models::Gpt2LMHeadModelImpl>(ctx.task.model);
  const auto llama = std::dynamic_pointer_cast<models::LlamaForCausalLMImpl>(ctx.task.model);
  QF_REQUIRE(gpt2 || llama, "export.gguf: the model is neither a GPT-2 nor a Llama");
  ctx.report["exported"]["gguf"] = ctx.save((dir / "model.gguf").string(), [&](const std::string& p) {
    rep = gpt2 ? models::export_gguf(models::Gpt2LMHeadModel(gpt2), p, o)
               : models::export_gguf(models::LlamaForCausalLM(llama), p, o);
  });
  ctx.report["gguf"] = {{"float_type", g.float_type}, {"refuse_wider", g.refuse_wider}, {"tensors", rep.lines}};
  std::fprintf(stderr, "qtrain: model.gguf: %zu report lines, %.2f MB\n", rep.lines.size(),
               static_cast<double>(fs::file_size(ctx.report["exported"]["gguf"].get<std::string>())) / 1e6);
}

nlohmann::json not_exported(const RunContext& ctx) {
  const Recipe::Export& e = ctx.recipe.export_;
  nlohmann::json out = nlohmann::json::object();
  if (!ctx.report["exported"].contains("calibration_dump"))
    out["calibration.h5"] = e.calibration_dump
                                ? "no static activations were calibrated, no search and no numeric suite ran (nothing to dump)"
                                : "export.calibration_dump is false";
  if (!e.checkpoint) out["model.h5"] = "export.checkpoint is false";
  if (!e.safetensors) out["model.safetensors"] = "export.safetensors is false";
  if (!e.onnx) out["model.onnx"] = "export.onnx is false";
  if (ctx.task.save_torchscript && !e.torchscript) out["model.pt"] = "export.torchscript is false";
  const std::string& arch = ctx.recipe.model.arch;
  if ((arch == "gpt2" || arch == "llama") && !e.gguf.enabled) out["model.gguf"] = "export.gguf is not set";
  return out;
}

void export_onnx(RunContext& ctx, const fs::path& dir) {
  onnx_export::ExportInfo info;
  ctx.report["exported"]["onnx"] = ctx.save((dir / "model.onnx").string(), [&](const std::string& p) {
    info = onnx_export::export_onnx(*ctx.task.model, p);
  });
  ctx.report["onnx"] = report::onnx_json(info);
  std::fprintf(stderr, "qtrain: model.onnx: %s, opset %lld, %lld nodes (%lld QuantizeLinear, %lld DequantizeLinear), %.2f MB\n",
               info.model_type.c_str(), static_cast<long long>(info.opset), static_cast<long long>(info.nodes),
               static_cast<long long>(info.quantize_linear), static_cast<long long>(info.dequantize_linear),
               info.file_bytes / 1e6);
}

// What llama.cpp's architecture cannot express in the config (a Llama's sliding windows, ...), before training.
void check_gguf_config(const Recipe& r) {
  if (r.model.arch == "gpt2") models::check_gguf_exportable(tasks::model_config<models::Gpt2Config>(r));
  if (r.model.arch == "llama") models::check_gguf_exportable(tasks::model_config<models::LlamaConfig>(r));
}

class ExportStage : public Stage {
 public:
  const char* name() const override { return "export"; }
  bool applies(const Recipe& r) const override { return r.quantize; }
  // Without calibrate the model is still float: its files would carry no quantization at all.
  bool needs_calibrated_model() const override { return true; }

  // The recipe's scheme on a model built without data (as the dry run does): a layer with no QDQ
  // form fails here, before the float stage trains anything. The search may still change
  // per-layer widths; the calibrate stage checks those after quantize().
  void check(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    if (r.export_.gguf.enabled) check_gguf_config(r);
    if (!r.export_.onnx) return;
    check_onnx_recipe(r, nullptr);
    // The probe's construction draws from the default generator; the run's float model must
    // start from the same weights with or without export.onnx.
    RngStateGuard rng;
    Task probe = make_task(r, /*with_data=*/false);
    if (probe.before_quantize) probe.before_quantize();
    quantize(*probe.model, r.scheme);
    check_onnx_recipe(r, probe.model.get());
  }

  // The layer table of every quantized run, whether or not --stages exports.
  void pass(RunContext& ctx) const override { ctx.report["layers"] = report::layers_json(*ctx.task.model); }

  void run(RunContext& ctx) const override {
    const Recipe& r = ctx.recipe;
    const fs::path dir(ctx.options.out_dir);
    export_calibration_dump(ctx, dir);
    if (ctx.imatrix) export_imatrix(ctx, dir);
    ctx.report["not_exported"] = not_exported(ctx);
    if (r.export_.checkpoint) {
      io::SaveOptions so;
      so.recipe = ctx.recipe_text;
      ctx.report["exported"]["checkpoint"] =
          ctx.save((dir / "model.h5").string(), [&](const std::string& p) { io::save_model(*ctx.task.model, p, so); });
    }
    if (r.export_.safetensors)
      ctx.report["exported"]["safetensors"] = ctx.save((dir / "model.safetensors").string(), [&](const std::string& p) {
        io::export_safetensors(*ctx.task.model, p);
      });
    if (r.export_.onnx) export_onnx(ctx, dir);
    if (r.export_.gguf.enabled) export_gguf(ctx, dir);
    if (ctx.task.save_tokenizer)
      ctx.report["exported"]["tokenizer"] = ctx.save((dir / ctx.task.tokenizer_name).string(), ctx.task.save_tokenizer);
    if (r.export_.torchscript && ctx.task.save_torchscript)
      ctx.report["exported"]["torchscript"] =
          ctx.save((dir / "model.pt").string(), [&](const std::string& p) { ctx.task.save_torchscript(p); });
  }
};

}  // namespace

const Stage& export_stage() {
  static const ExportStage kStage;
  return kStage;
}

}  // namespace qforge::pipeline
