// qtrain's stages over the reference models and datasets.
#include "framework/recipe/pipeline.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <sstream>

#include "framework/data/char_tokenizer.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/language_id.h"
#include "framework/data/text_corpus.h"
#include "framework/io/calibration_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/models/bert.h"
#include "framework/models/cnn.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/models/state_dict.h"
#include "framework/quantize.h"
#include "framework/train/batches.h"
#include "framework/train/trainer.h"

namespace qforge {

namespace fs = std::filesystem;

const std::vector<std::string>& pipeline_stages() {
  static const std::vector<std::string> kStages{"float", "calibrate", "ptq", "qat", "freeze", "export"};
  return kStages;
}

namespace {

// The first n examples of a source (quick runs and CI).
class Prefix : public train::BatchSource {
 public:
  Prefix(std::shared_ptr<train::BatchSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_ > 0 ? std::min(n_, base_->size()) : base_->size(); }
  train::Batch get(const at::Tensor& indices) const override { return base_->get(indices); }

 private:
  std::shared_ptr<train::BatchSource> base_;
  int64_t n_;
};

// A model, its data and how to call it.
struct Task {
  std::shared_ptr<torch::nn::Module> model;
  std::shared_ptr<train::BatchSource> train, validation, test;
  train::ForwardFn forward;
  std::string metric;  // "accuracy" or "perplexity"
  std::vector<std::string> class_names;
  std::function<void()> before_quantize;  // e.g. fold BatchNorm into the convolutions
  std::map<std::string, double> baselines;
};

std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n) {
  return n > 0 ? std::make_shared<Prefix>(std::move(s), n) : s;
}

Task make_task(const Recipe& r, bool with_data) {
  Task t;
  const auto& d = r.data;
  if (r.model.arch == "mlp" || r.model.arch == "cnn") {
    if (r.model.arch == "mlp") {
      auto m = models::Mlp(models::MlpOptions{});
      t.model = m.ptr();
      t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
    } else {
      auto m = models::SmallCnn(models::SmallCnnOptions{});
      t.model = m.ptr();
      t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
      t.before_quantize = [m]() mutable { m->fold_batch_norm(); };
    }
    t.metric = "accuracy";
    for (int64_t c = 0; c < 10; ++c) t.class_names.push_back(data::fashion_mnist_class_name(c));
    if (with_data) {
      const data::FashionMnist fm = data::load_fashion_mnist(d.validation_size, r.seed);
      t.train = capped(std::make_shared<train::TensorBatches>(fm.train.images, fm.train.labels), d.max_train_examples);
      t.validation = capped(std::make_shared<train::TensorBatches>(fm.validation.images, fm.validation.labels),
                            d.max_eval_examples);
      t.test = capped(std::make_shared<train::TensorBatches>(fm.test.images, fm.test.labels), d.max_eval_examples);
      t.baselines["majority_class_accuracy"] = at::bincount(fm.test.labels).max().item<double>() / fm.test.size();
    }
    return t;
  }
  if (r.model.arch == "bert") {
    models::BertConfig c = r.model.config_file.empty() ? models::BertConfig{} : models::BertConfig::from_file(r.model.config_file);
    if (!r.model.config.is_null()) {
      nlohmann::json merged = c.to_json();
      merged.update(r.model.config);
      c = models::BertConfig::from_json(merged);
    }
    c.max_position_embeddings = std::max(c.max_position_embeddings, d.seq_len);
    data::LanguageId lid;
    data::CharTokenizer tok;
    if (with_data) {
      data::LanguageIdOptions o;
      o.seed = r.seed;
      if (d.examples_per_language > 0) o.train_per_language = d.examples_per_language;
      lid = data::load_language_id(o);
      tok = data::CharTokenizer::build(lid.train.text);
      c.vocab_size = tok.vocab_size();
      c.num_labels = static_cast<int64_t>(lid.languages.size());
      t.class_names = lid.languages;
    } else {
      c.num_labels = 8;
      c.vocab_size = std::min<int64_t>(c.vocab_size, 256);
    }
    auto m = models::BertForSequenceClassification(c);
    t.model = m.ptr();
    t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input, b.mask); };
    t.metric = "accuracy";
    if (with_data) {
      t.train = capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.train, tok, d.seq_len)),
                       d.max_train_examples);
      t.validation = capped(
          std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.validation, tok, d.seq_len)),
          d.max_eval_examples);
      t.test = capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(lid.test, tok, d.seq_len)),
                      d.max_eval_examples);
      const at::Tensor labels = at::tensor(lid.test.label, at::kLong);
      t.baselines["majority_class_accuracy"] = at::bincount(labels).max().item<double>() / labels.numel();
    }
    return t;
  }
  // gpt2
  models::Gpt2Config c = r.model.config_file.empty() ? models::Gpt2Config{} : models::Gpt2Config::from_file(r.model.config_file);
  if (!r.model.config.is_null()) {
    nlohmann::json merged = c.to_json();
    merged.update(r.model.config);
    c = models::Gpt2Config::from_json(merged);
  }
  c.vocab_size = data::TextCorpus::kVocabSize;
  c.n_positions = std::max(c.n_positions, d.seq_len);
  auto m = models::Gpt2LMHeadModel(c);
  t.model = m.ptr();
  t.forward = [m](const train::Batch& b) mutable { return m->forward(b.input); };
  t.metric = "perplexity";
  if (with_data) {
    const data::TextCorpus corpus = data::load_fortunes();
    t.train = capped(std::make_shared<train::LmBatches>(corpus.train, d.seq_len, d.seq_len), d.max_train_examples);
    t.validation = capped(std::make_shared<train::LmBatches>(corpus.validation, d.seq_len, d.seq_len), d.max_eval_examples);
    t.test = capped(std::make_shared<train::LmBatches>(corpus.test, d.seq_len, d.seq_len), d.max_eval_examples);
    t.baselines["unigram_perplexity"] = data::unigram_perplexity(corpus.train, corpus.test);
  }
  return t;
}

std::map<std::string, double> metric_map(const train::Metrics& m, const std::string& metric) {
  std::map<std::string, double> out{{"loss", m.loss}};
  if (metric == "accuracy") out["accuracy"] = m.accuracy;
  else out["perplexity"] = m.perplexity;
  return out;
}

std::string fmt(double v, int prec = 4) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

void save_float_checkpoint(torch::nn::Module& model, const std::string& path, const std::string& recipe_yaml) {
  io::CheckpointData data;
  for (const auto& [k, v] : models::model_state(model)) data.parameters[k] = v;
  data.recipe = recipe_yaml;
  fs::create_directories(fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path());
  io::save_checkpoint(path, data);
}

void load_float_checkpoint(torch::nn::Module& model, const std::string& path) {
  const io::CheckpointReader reader(path);
  const io::CheckpointData data = reader.read(io::ReadOptions::parameters_only());
  models::LoadStateOptions o;
  o.source = path;
  models::load_model_state(model, data.parameters, o);
}

train::TrainOptions train_options(const Recipe& r, const train::BatchSource& data, int64_t epochs, double lr,
                                  int64_t max_steps, const std::string& label, const std::atomic<bool>* cancel) {
  train::TrainOptions o;
  o.epochs = epochs;
  o.batch_size = r.data.batch_size;
  o.lr = lr;
  o.weight_decay = r.train.weight_decay;
  o.grad_clip = r.train.grad_clip;
  o.seed = r.seed;
  o.max_steps = max_steps;
  o.label = label;
  o.cancel = cancel;
  const int64_t per_epoch = (data.size() + o.batch_size - 1) / o.batch_size;
  const int64_t total = max_steps > 0 ? std::min(max_steps, per_epoch * epochs) : per_epoch * epochs;
  o.warmup_fraction = total > 0 ? std::min(0.5, static_cast<double>(r.train.warmup_steps) / total) : 0.0;
  return o;
}

nlohmann::json layers_json(const torch::nn::Module& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerReport& l : layer_reports(model)) {
    if (l.weights == "float" && l.activations == "float") continue;
    layers.push_back({{"name", l.name}, {"type", l.type}, {"weights", l.weights}, {"activations", l.activations},
                      {"kernel", l.kernel}, {"fallback_reason", l.fallback_reason}, {"bytes", l.bytes}});
  }
  return layers;
}

}  // namespace

PipelineResult run_pipeline(const Recipe& r, const PipelineOptions& opt) {
  auto wanted = [&](const std::string& stage) {
    return opt.stages.empty() || std::find(opt.stages.begin(), opt.stages.end(), stage) != opt.stages.end();
  };
  auto interrupted = [&] { return opt.interrupted && opt.interrupted->load(); };
  at::manual_seed(r.seed);

  if (opt.dry_run) {
    Task t = make_task(r, /*with_data=*/false);
    std::printf("recipe %s (sha256 %s)\n", r.path.c_str(), r.sha256.c_str());
    std::printf("model %s, dataset %s, stages:", r.model.arch.c_str(), r.data.dataset.c_str());
    for (const auto& s : pipeline_stages()) {
      const bool applies = s == "float" || s == "export" || (r.quantize && (s == "calibrate" || s == "ptq")) ||
                           (s == "qat" && r.qat.epochs > 0) || (s == "freeze" && r.quantize && r.freeze.enabled);
      if (applies && wanted(s)) std::printf(" %s", s.c_str());
    }
    std::printf("\n");
    if (!r.quantize) return {};
    if (t.before_quantize) t.before_quantize();
    const QuantizeReport rep = quantize(*t.model, r.scheme);
    // Each layer's kernel plan: what freeze() will run on this machine (nothing is calibrated).
    std::printf("\nplan (%zu quantized layers, %zu kept float; kernels as freeze will choose them on this machine):\n%s",
                rep.quantized.size(), rep.kept_float.size(), describe(*t.model, /*planned=*/r.freeze.enabled).c_str());
    for (const auto& w : rep.warnings) std::printf("warning: %s\n", w.c_str());
    return {};
  }

  PipelineResult result;
  fs::create_directories(opt.out_dir);
  std::ofstream(fs::path(opt.out_dir) / "recipe.resolved.yaml") << "# sha256: " << r.sha256 << "\n" << r.resolved_yaml;
  nlohmann::json report = {{"recipe", r.path}, {"recipe_sha256", r.sha256}, {"metrics", nlohmann::json::object()},
                           {"timings_s", nlohmann::json::object()}, {"size_bytes", nlohmann::json::object()},
                           {"exported", nlohmann::json::object()}, {"notes", nlohmann::json::array()}};
  auto write_report = [&]() {
    report["completed_stages"] = result.completed;
    report["interrupted"] = result.interrupted;
    const fs::path json_path = fs::path(opt.out_dir) / "report.json";
    std::ofstream(json_path) << report.dump(2) << "\n";
    result.report_path = json_path.string();
    std::ostringstream md;
    md << "# qtrain report\n\nrecipe `" << r.path << "` (sha256 `" << r.sha256 << "`)\n\n| stage | ";
    const std::string metric = report.value("metric", std::string("metric"));
    md << metric << " | loss |\n|---|---|---|\n";
    for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
      if (!report["metrics"].contains(stage)) continue;
      const auto& m = report["metrics"][stage];
      md << "| " << stage << " | " << fmt(m.value(metric, 0.0)) << " | " << fmt(m.value("loss", 0.0)) << " |\n";
    }
    if (report["size_bytes"].contains("float"))
      md << "\nsize: " << report["size_bytes"]["float"].get<int64_t>() << " bytes float"
         << (report["size_bytes"].contains("frozen")
                 ? ", " + std::to_string(report["size_bytes"]["frozen"].get<int64_t>()) + " bytes frozen"
                 : std::string())
         << "\n";
    if (report.contains("layers")) {
      md << "\n| layer | type | weights | activations | kernel | fallback |\n|---|---|---|---|---|---|\n";
      for (const auto& l : report["layers"])
        md << "| " << l["name"].get<std::string>() << " | " << l["type"].get<std::string>() << " | "
           << l["weights"].get<std::string>() << " | " << l["activations"].get<std::string>() << " | "
           << l["kernel"].get<std::string>() << " | " << l["fallback_reason"].get<std::string>() << " |\n";
    }
    for (const auto& n : report["notes"]) md << "\n- " << n.get<std::string>();
    std::ofstream(fs::path(opt.out_dir) / "report.md") << md.str() << "\n";
  };
  auto run_stage = [&](const std::string& name, const std::function<void()>& body) {
    if (interrupted()) {
      result.interrupted = true;
      return false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::fprintf(stderr, "qtrain: stage %s\n", name.c_str());
    try {
      body();
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      write_report();
      throw StageError(name, e.what());
    }
    report["timings_s"][name] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (interrupted()) {
      result.interrupted = true;
      write_report();
      return false;
    }
    result.completed.push_back(name);
    write_report();
    return true;
  };
  auto record = [&](const std::string& stage, const train::Metrics& m, const Task& t) {
    result.metrics[stage] = metric_map(m, t.metric);
    report["metrics"][stage] = result.metrics[stage];
    std::fprintf(stderr, "qtrain: %s %s %.4f (loss %.4f)\n", stage.c_str(), t.metric.c_str(),
                 result.metrics[stage][t.metric], m.loss);
  };

  Task t;
  if (!run_stage("data", [&] { t = make_task(r, /*with_data=*/true); })) return result;
  report["metric"] = t.metric;
  report["baselines"] = t.baselines;
  const int64_t eval_bs = r.data.eval_batch_size;

  run_stage("float", [&] {
    const std::string ckpt = r.model.checkpoint;
    if (!ckpt.empty() && fs::exists(ckpt)) {
      load_float_checkpoint(*t.model, ckpt);
      report["notes"].push_back("float weights loaded from " + ckpt);
    } else if (!r.model.safetensors.empty()) {
      throw Error("model.safetensors import runs through the HF loaders (models::load_hf_*); use model.checkpoint here");
    } else {
      const auto o = train_options(r, *t.train, r.train.epochs, r.train.lr, r.train.max_steps, "float", opt.interrupted);
      train::fit(*t.model, *t.train, t.forward, o);
      if (interrupted()) return;  // a half-trained model is neither saved nor evaluated
      if (!ckpt.empty()) {
        save_float_checkpoint(*t.model, ckpt, r.resolved_yaml);
        report["notes"].push_back("float weights trained and saved to " + ckpt);
      }
    }
    const train::Metrics m = train::evaluate(*t.model, *t.test, t.forward, eval_bs, "float eval");
    record("float", m, t);
    if (m.confusion.defined() && !t.class_names.empty())
      report["float_confusion"] = train::format_confusion(m.confusion, t.class_names);
    report["size_bytes"]["float"] = model_size(*t.model).total_bytes;
  });
  if (!r.quantize) {
    write_report();
    return result;
  }

  if (wanted("calibrate") || wanted("ptq")) {
    run_stage("calibrate", [&] {
      if (t.before_quantize) t.before_quantize();
      const QuantizeReport q = quantize(*t.model, r.scheme);
      for (const auto& w : q.warnings) report["notes"].push_back("quantize: " + w);
      if (r.scheme.activations == ActivationMode::kStatic) {
        t.model->eval();
        Calibration calib(*t.model);
        const int64_t n = std::min(t.train->size(), r.calibrate.batches * r.data.batch_size);
        for (int64_t b = 0; b < n; b += r.data.batch_size) {
          const at::Tensor idx = at::arange(b, std::min(n, b + r.data.batch_size), at::kLong);
          t.forward(t.train->get(idx));
        }
        calib.finish();
      }
    });
    run_stage("ptq", [&] { record("ptq", train::evaluate(*t.model, *t.test, t.forward, eval_bs, "ptq eval"), t); });
  }
  if (r.qat.epochs > 0 && wanted("qat")) {
    run_stage("qat", [&] {
      QatController qat(*t.model, QatOptions{r.qat.freeze_observers_after, r.qat.freeze_bn_after});
      qat.begin_epoch();
      auto o = train_options(r, *t.train, r.qat.epochs, r.qat.lr, r.qat.max_steps, "qat", opt.interrupted);
      o.on_step = [&qat](int64_t) { qat.step(); };
      train::fit(*t.model, *t.train, t.forward, o);
      if (interrupted()) return;
      record("qat", train::evaluate(*t.model, *t.test, t.forward, eval_bs, "qat eval"), t);
    });
  }
  if (r.freeze.enabled && wanted("freeze")) {
    run_stage("freeze", [&] {
      freeze(*t.model);
      record("frozen", train::evaluate(*t.model, *t.test, t.forward, eval_bs, "frozen eval"), t);
      report["size_bytes"]["frozen"] = model_size(*t.model).total_bytes;
    });
  }
  report["layers"] = layers_json(*t.model);
  if (wanted("export")) {
    run_stage("export", [&] {
      const fs::path dir(opt.out_dir);
      if (r.export_.calibration_dump && r.scheme.activations == ActivationMode::kStatic) {
        // Written from the model's quantizers (observer state and qparams); after QAT/freeze the
        // observers still hold their calibration statistics.
        io::save_calibration(*t.model, (dir / "calibration.h5").string());
        report["exported"]["calibration_dump"] = (dir / "calibration.h5").string();
      }
      if (r.export_.checkpoint) {
        io::SaveOptions so;
        so.recipe = r.resolved_yaml;
        io::save_model(*t.model, (dir / "model.h5").string(), so);
        report["exported"]["checkpoint"] = (dir / "model.h5").string();
      }
      if (r.export_.safetensors) {
        io::export_safetensors(*t.model, (dir / "model.safetensors").string());
        report["exported"]["safetensors"] = (dir / "model.safetensors").string();
      }
    });
  }
  write_report();
  return result;
}

}  // namespace qforge
