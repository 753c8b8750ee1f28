// Capped splits and the fortunes LM data for the task files (task_data.h).
#include "framework/recipe/tasks/task_data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "framework/core/error.h"
#include "framework/data/char_tokenizer.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/language_id.h"
#include "framework/data/text_corpus.h"
#include "framework/format/hdf5.h"
#include "framework/format/image.h"
#include "framework/format/input_file.h"
#include "framework/format/safetensors.h"
#include "framework/text/bpe_tokenizer.h"
#include "framework/text/bpe_trainer.h"
#include "framework/text/tokenizer.h"
#include "framework/text/utf8.h"

namespace qforge::tasks {

void attach_fashion_mnist(Task& t, const Recipe& r, bool with_data) {
  const auto& d = r.data;
  t.metric = "accuracy";
  for (int64_t c = 0; c < 10; ++c) t.class_names.push_back(data::fashion_mnist_class_name(c));
  if (!with_data) return;
  const data::FashionMnist fm = data::load_fashion_mnist(d.validation_size, r.seed);
  t.train = tasks::capped(std::make_shared<train::TensorBatches>(fm.train.images, fm.train.labels), d.max_train_examples);
  t.validation = tasks::capped(std::make_shared<train::TensorBatches>(fm.validation.images, fm.validation.labels),
                               d.max_eval_examples);
  t.test = tasks::capped(std::make_shared<train::TensorBatches>(fm.test.images, fm.test.labels), d.max_eval_examples);
  t.baselines["majority_class_accuracy"] = at::bincount(fm.test.labels).max().item<double>() / fm.test.size();
}

namespace fs = std::filesystem;

std::map<std::string, at::Tensor> read_data_file(const std::string& path, const std::vector<std::string>& names,
                                                 std::vector<std::string>* held) {
  const auto wanted = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  io::require_regular_file(path, "data.file");
  QF_REQUIRE(fs::exists(path), "data.file ", path, " does not exist");
  std::map<std::string, at::Tensor> out;
  if (io::h5::is_hdf5_file(path)) {
    std::vector<std::string> all;
    out = io::h5::read_untrusted(path, [&] {
      std::map<std::string, at::Tensor> t;
      const io::h5::File f = io::h5::File::open(path);
      const io::h5::Group root = f.root();
      all = root.children();
      for (const std::string& name : all)
        if (wanted(name) && root.child_type(name) == io::h5::ObjectType::kDataset) t[name] = root.read_tensor(name);
      return t;
    });
    if (held != nullptr) *held = all;
  } else {
    io::SafetensorsFile f;
    try {
      f = io::read_safetensors(path);
    } catch (const Error& e) {
      throw Error("data.file " + path + " is neither an HDF5 file (no HDF5 signature) nor a safetensors file: " + e.what());
    }
    for (auto& [name, t] : f.tensors) {
      if (held != nullptr) held->push_back(name);
      if (wanted(name)) out[name] = std::move(t);
    }
  }
  for (auto& [name, t] : out)
    if (t.scalar_type() == at::kDouble || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16)
      t = t.to(at::kFloat);
  return out;
}


namespace {

// Lower-case extension of `p` without the dot.
std::string extension_of(const fs::path& p) {
  std::string e = p.extension().string();
  if (!e.empty()) e.erase(0, 1);
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return e;
}

struct ImageList {
  std::vector<std::string> classes, files;
  std::vector<int64_t> labels;
  std::vector<std::string> skipped;
};

ImageList list_image_folder(const std::string& folder) {
  QF_REQUIRE(fs::is_directory(folder), "data.folder ", folder, " is not a folder");
  ImageList out;
  for (const auto& e : fs::directory_iterator(folder, fs::directory_options::follow_directory_symlink))
    if (e.is_directory()) out.classes.push_back(e.path().filename().string());
  std::sort(out.classes.begin(), out.classes.end());
  QF_REQUIRE(!out.classes.empty(), "data.folder ", folder, " holds no class folders (torchvision's ImageFolder layout: ",
             folder, "/<class>/<image>.png)");
  const std::vector<std::string> decoded{"png", "jpg", "jpeg"};
  const std::vector<std::string> other_images{"bmp", "gif", "ppm", "pgm", "pbm", "tif", "tiff", "webp"};
  for (size_t c = 0; c < out.classes.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(folder) / out.classes[c],
                                                          fs::directory_options::follow_directory_symlink)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = extension_of(e.path());
      if (std::find(decoded.begin(), decoded.end(), ext) != decoded.end()) {
        files.push_back(e.path().string());
      } else {
        QF_REQUIRE(std::find(other_images.begin(), other_images.end(), ext) == other_images.end(), "data.folder: ",
                   e.path().string(), " is a ", ext, " image; qforge reads PNG and JPEG images only (convert it)");
        out.skipped.push_back(e.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    QF_REQUIRE(!files.empty(), "data.folder: class folder ", (fs::path(folder) / out.classes[c]).string(),
               " holds no PNG or JPEG image");
    for (std::string& f : files) {
      out.files.push_back(std::move(f));
      out.labels.push_back(static_cast<int64_t>(c));
    }
  }
  return out;
}

// Memory shared with a forked child: the child decodes into it, this process reads what it wrote
// (so this process never parses the files itself). Unmapped at scope exit.
class SharedBytes {
 public:
  explicit SharedBytes(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    p_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    QF_REQUIRE(p_ != MAP_FAILED, "data.folder: cannot map ", bytes_, " bytes for the decoded images: ", std::strerror(errno));
  }
  ~SharedBytes() { ::munmap(p_, bytes_); }
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }

 private:
  size_t bytes_;
  void* p_;
};

// The images as [N, C, H, W] floats in [0, 1] (pixel / 255), decoded in a forked child (the
// decoders trust what they parse: a crash there is an error naming the file being decoded).
at::Tensor decode_images(const std::string& folder, const std::vector<std::string>& files, const std::vector<int64_t>& chw) {
  const int64_t n = static_cast<int64_t>(files.size()), c = chw[0], h = chw[1], w = chw[2], image = c * h * w;
  constexpr size_t kHeader = 64;  // the index of the file being decoded, then the pixels
  SharedBytes shared(kHeader + static_cast<size_t>(n * image));
  auto* current = reinterpret_cast<std::atomic<int64_t>*>(shared.data());
  new (current) std::atomic<int64_t>(-1);
  uint8_t* pixels = shared.data() + kHeader;
  const auto decode_all = [&] {
    for (int64_t i = 0; i < n; ++i) {
      current->store(i);
      const io::Image img = io::read_image(files[static_cast<size_t>(i)], c, h, w);
      std::copy(img.pixels.begin(), img.pixels.end(), pixels + i * image);
    }
    return 0;
  };
  try {
    io::h5::run_isolated("the images of data.folder " + folder, decode_all,
                         std::chrono::minutes(10) + std::chrono::milliseconds(100) * n, "libpng / libjpeg");
  } catch (const Error& e) {
    const int64_t i = current->load();
    const std::string at = i >= 0 && i < n ? files[static_cast<size_t>(i)] : std::string();
    if (!at.empty() && std::string(e.what()).find(at) == std::string::npos)
      throw Error(std::string(e.what()) + " (while decoding " + at + ")");
    throw;
  }
  return at::from_blob(pixels, {n, h, w, c}, at::kByte).permute({0, 3, 1, 2}).to(at::kFloat).div_(255.0f);
}

}  // namespace

int64_t attach_language_id(Task& t, const Recipe& r) {
  const auto& d = r.data;
  data::LanguageIdOptions o;
  o.seed = r.seed;
  if (d.examples_per_language > 0) o.train_per_language = d.examples_per_language;
  const data::LanguageId lid = data::load_language_id(o);
  const int64_t ngram = d.tokens == "trigrams" ? 3 : d.tokens == "bigrams" ? 2 : 1;
  const data::CharTokenizer tok = data::CharTokenizer::build(lid.train.text, ngram);
  auto split = [&](const auto& s, int64_t cap) {
    return capped(std::make_shared<train::TensorBatches>(train::text_classification_batches(s, tok, d.seq_len)), cap);
  };
  t.train = split(lid.train, d.max_train_examples);
  t.validation = split(lid.validation, d.max_eval_examples);
  t.test = split(lid.test, d.max_eval_examples);
  t.class_names = lid.languages;
  const at::Tensor labels = at::tensor(lid.test.label, at::kLong);
  t.baselines["majority_class_accuracy"] = at::bincount(labels).max().item<double>() / labels.numel();
  return tok.vocab_size();
}

void attach_image_folder(Task& t, const Recipe& r) {
  const auto& d = r.data;
  const ImageList list = list_image_folder(d.folder);
  if (!list.skipped.empty())
    std::fprintf(stderr, "qtrain: data.folder: skipped %zu files that are not PNG or JPEG images (the first: %s)\n",
                 list.skipped.size(), list.skipped.front().c_str());
  at::Tensor x = decode_images(d.folder, list.files, r.model.input_shape);
  if (!d.mean.empty()) {
    const auto opts = at::TensorOptions().dtype(at::kFloat);
    const at::Tensor mean = at::tensor(std::vector<float>(d.mean.begin(), d.mean.end()), opts).view({1, -1, 1, 1});
    const at::Tensor sd = at::tensor(std::vector<float>(d.std.begin(), d.std.end()), opts).view({1, -1, 1, 1});
    x = (x - mean) / sd;
  }
  const int64_t n = x.size(0), v = d.validation_size;
  QF_REQUIRE(v > 0 && v < n, "data.folder ", d.folder, " holds ", n,
             " images: data.validation_size (", v, ") must leave some for calibration and some for evaluation");
  const at::Tensor y = at::tensor(list.labels, at::kLong);
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(r.seed);
  const at::Tensor order = at::randperm(n, g, at::kLong);
  const at::Tensor xs = x.index_select(0, order), ys = y.index_select(0, order);
  auto split = [&](int64_t begin, int64_t end, int64_t cap) {
    return capped(std::make_shared<train::TensorBatches>(xs.slice(0, begin, end), ys.slice(0, begin, end)), cap);
  };
  t.train = split(0, n - v, d.max_train_examples);
  t.validation = split(n - v, n, d.max_eval_examples);
  t.test = t.validation;
  t.class_names = list.classes;
  t.baselines["majority_class_accuracy"] =
      at::bincount(ys.slice(0, n - v, n)).max().item<double>() / static_cast<double>(v);
}

namespace {

// The first n examples of a source.
class Prefix : public train::BatchSource {
 public:
  Prefix(std::shared_ptr<train::BatchSource> base, int64_t n) : base_(std::move(base)), n_(n) {}
  int64_t size() const override { return n_ > 0 ? std::min(n_, base_->size()) : base_->size(); }
  train::Batch get(const at::Tensor& indices) const override { return base_->get(indices); }

 private:
  std::shared_ptr<train::BatchSource> base_;
  int64_t n_;
};

// A split's bytes as text, less the partial UTF-8 characters the corpus's byte cut may leave at
// either end (the tokenizers take whole characters only).
std::string split_text(const at::Tensor& bytes) {
  const at::Tensor b = bytes.to(at::kByte).contiguous();
  std::string s(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()), static_cast<size_t>(b.numel()));
  size_t start = 0;
  while (start < s.size() && start < 3 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
  s.erase(0, start);
  const size_t bad = text::find_invalid_utf8(s);
  if (bad != std::string::npos && bad + 4 > s.size()) s.resize(bad);
  return s;
}

at::Tensor encode_split(const text::Tokenizer& tok, const at::Tensor& bytes, const char* split) {
  const std::string s = split_text(bytes);
  text::require_utf8(s, std::string("fortunes ") + split + " text");
  const std::vector<int64_t> ids = tok.encode(s, /*add_special_tokens=*/false);
  return at::tensor(ids, at::kLong);
}

// The file data.tokenizer.file names inside a folder (or the file itself), and its export name.
fs::path tokenizer_source(const std::string& path) {
  if (!fs::is_directory(path)) return path;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(fs::path(path) / name)) return fs::path(path) / name;
  throw Error("data.tokenizer.file: " + path + " holds no tokenizer.json or tokenizer.model");
}

// The recipe's tokenizer; sets how the export stage writes it.
std::unique_ptr<text::Tokenizer> recipe_tokenizer(const Recipe& r, const data::TextCorpus& corpus, Task& t) {
  if (r.data.tokenizer_vocab_size > 0) {
    text::BpeTrainerOptions o;
    o.vocab_size = r.data.tokenizer_vocab_size;
    auto trained = std::make_shared<const text::TrainedBpe>(text::train_bpe({split_text(corpus.train)}, o));
    t.tokenizer_name = "tokenizer.json";
    t.save_tokenizer = [trained](const std::string& p) { trained->save(p); };
    return std::make_unique<text::BpeTokenizer>(text::BpeTokenizer::parse(trained->to_json(), "the trained tokenizer"));
  }
  const fs::path src = tokenizer_source(r.data.tokenizer_file);
  t.tokenizer_name = src.extension() == ".model" ? "tokenizer.model" : "tokenizer.json";
  t.save_tokenizer = [src](const std::string& p) { fs::copy_file(src, p, fs::copy_options::overwrite_existing); };
  return text::load_tokenizer(src.string());
}

}  // namespace

std::shared_ptr<train::BatchSource> capped(std::shared_ptr<train::BatchSource> s, int64_t n) {
  return n > 0 ? std::make_shared<Prefix>(std::move(s), n) : s;
}

int64_t fortunes_vocab_size(const Recipe& r) {
  if (r.data.tokenizer_vocab_size > 0) return r.data.tokenizer_vocab_size;
  if (!r.data.tokenizer_file.empty()) return text::load_tokenizer(tokenizer_source(r.data.tokenizer_file).string())->vocab_size();
  return data::TextCorpus::kVocabSize;
}

void attach_fortunes(Task& t, const Recipe& r, models::CausalLmForward logits) {
  const auto& d = r.data;
  const data::TextCorpus corpus = data::load_fortunes();
  at::Tensor train = corpus.train, validation = corpus.validation, test = corpus.test;
  int64_t vocab = data::TextCorpus::kVocabSize;
  if (d.tokenizer_vocab_size > 0 || !d.tokenizer_file.empty()) {
    const std::unique_ptr<text::Tokenizer> tok = recipe_tokenizer(r, corpus, t);
    train = encode_split(*tok, corpus.train, "train");
    validation = encode_split(*tok, corpus.validation, "validation");
    test = encode_split(*tok, corpus.test, "test");
    vocab = fortunes_vocab_size(r);
    QF_REQUIRE(tok->vocab_size() <= vocab, "data.tokenizer: the tokenizer has ", tok->vocab_size(),
               " tokens, more than data.tokenizer.train.vocab_size ", vocab);
  }
  t.train = capped(std::make_shared<train::LmBatches>(train, d.seq_len, d.seq_len), d.max_train_examples);
  t.validation = capped(std::make_shared<train::LmBatches>(validation, d.seq_len, d.seq_len), d.max_eval_examples);
  t.test = capped(std::make_shared<train::LmBatches>(test, d.seq_len, d.seq_len), d.max_eval_examples);
  t.baselines["unigram_perplexity"] = data::unigram_perplexity(train, test, vocab);
  // The text the capped test split covers (one more token: its last target).
  const at::Tensor text = d.max_eval_examples > 0 ? test.narrow(0, 0, std::min(test.numel(), d.max_eval_examples * d.seq_len + 1)) : test;
  const models::PerplexityOptions windows{d.seq_len, std::max<int64_t>(1, d.seq_len / 2)};
  t.sliding_perplexity = [model = t.model, logits = std::move(logits), text, windows] {
    at::NoGradGuard no_grad;
    model->eval();
    return models::sliding_window_perplexity(logits, text, windows);
  };
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    in.ignore(256, '\n');
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : -1;
}

void check_model_fits_memory(const Recipe& r, double parameters) {
  const int64_t available = available_memory_bytes();
  const double bytes = parameters * 4;  // float32, before any gradient or optimizer state
  if (available < 0 || bytes <= static_cast<double>(available)) return;
  std::ostringstream what;
  what.precision(3);
  what << "model.config";
  if (!r.model.config.is_null()) what << " " << r.model.config.dump();
  if (!r.model.config_file.empty()) what << " (over model.config_file " << r.model.config_file << ")";
  what << " describes a " << r.model.arch << " of about " << parameters << " parameters, " << bytes / 1e9
       << " GB as float32, more than the " << static_cast<double>(available) / 1e9
       << " GB of memory available (MemAvailable); lower its size keys (layers, hidden size, vocabulary)";
  throw Error(what.str());
}

}  // namespace qforge::tasks
