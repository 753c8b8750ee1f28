#include "framework/text/sentencepiece_tokenizer.h"

#include "framework/core/error.h"
#include "framework/text/sentencepiece_plugin.h"
#include "framework/text/utf8.h"

#include <dlfcn.h>

#include <cstdlib>

namespace qforge::text {

namespace {

constexpr const char* kMissingPackage =
    "qforge's SentencePiece plugin is not available: install Debian's libsentencepiece-dev and reconfigure qforge";

// The plugin's path: $QFORGE_SENTENCEPIECE_PLUGIN, else the one this build made (empty when CMake
// found no libsentencepiece).
std::string plugin_path() {
  if (const char* env = std::getenv("QFORGE_SENTENCEPIECE_PLUGIN"); env && *env) return env;
  return QFORGE_SENTENCEPIECE_PLUGIN;
}

// The plugin's table, loaded once; nullptr with the reason in `error` when it cannot be.
const SentencePieceApi* plugin(std::string* error) {
  static std::string load_error;
  static const SentencePieceApi* api = [] () -> const SentencePieceApi* {
    const std::string path = plugin_path();
    if (path.empty()) return load_error = kMissingPackage, nullptr;
    // RTLD_LOCAL | RTLD_DEEPBIND: libsentencepiece's protobuf stays apart from LibTorch's.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!handle) return load_error = std::string(kMissingPackage) + " (" + dlerror() + ")", nullptr;
    auto entry = reinterpret_cast<const SentencePieceApi* (*)()>(dlsym(handle, kSentencePiecePluginEntry));
    if (!entry) return load_error = path + " has no " + kSentencePiecePluginEntry, nullptr;
    const SentencePieceApi* table = entry();
    if (table->version != kSentencePiecePluginVersion)
      return load_error = path + " was built for another qforge (plugin version mismatch)", nullptr;
    return table;
  }();
  if (!api && error) *error = load_error;
  return api;
}

std::optional<int64_t> defined_id(int id) {
  if (id < 0) return std::nullopt;  // SentencePiece's -1: the model has no such piece
  return id;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  const SentencePieceApi* api = nullptr;
  void* processor = nullptr;
  SentencePieceOptions options;
  ~Impl() {
    if (processor) api->release(processor);
  }
};

bool SentencePieceTokenizer::available() { return plugin(nullptr) != nullptr; }

std::string SentencePieceTokenizer::unavailable_reason() {
  std::string reason;
  plugin(&reason);
  return reason;
}

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& path, const SentencePieceOptions& options) {
  std::string error;
  auto impl = std::make_unique<Impl>();
  impl->api = plugin(&error);
  QF_REQUIRE(impl->api != nullptr, path, ": ", error);
  impl->processor = impl->api->load(path, &error);
  QF_REQUIRE(impl->processor != nullptr, path, ": not a readable SentencePiece model (", error, ")");
  impl->options = options;
  return SentencePieceTokenizer(std::move(impl));
}

std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& text, bool add_special_tokens) const {
  require_utf8(text, "framework/text: encode");
  std::vector<int> pieces;
  std::string error;
  QF_REQUIRE(impl_->api->encode(impl_->processor, text, &pieces, &error),
             "framework/text: SentencePiece encode failed: ", error);
  std::vector<int64_t> ids;
  ids.reserve(pieces.size() + 2);
  const bool bos = add_special_tokens && impl_->options.add_bos && bos_id();
  const bool eos = add_special_tokens && impl_->options.add_eos && eos_id();
  if (bos) ids.push_back(*bos_id());
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  if (eos) ids.push_back(*eos_id());
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids, bool) const {
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    QF_REQUIRE(ids[i] >= 0 && ids[i] < vocab_size(), "framework/text: decode: ids[", i, "] = ", ids[i],
               " is not in the vocabulary (", vocab_size(), " ids)");
    pieces.push_back(static_cast<int>(ids[i]));
  }
  std::string text, error;
  QF_REQUIRE(impl_->api->decode(impl_->processor, pieces, &text, &error),
             "framework/text: SentencePiece decode failed: ", error);
  return text;
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->api->piece_size(impl_->processor); }

std::optional<int64_t> SentencePieceTokenizer::token_to_id(const std::string& token) const {
  const int id = impl_->api->piece_to_id(impl_->processor, token);
  // PieceToId answers unk_id for any unknown piece; only the unknown piece itself maps there.
  if (id == impl_->api->unk_id(impl_->processor) && impl_->api->id_to_piece(impl_->processor, id) != token)
    return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::id_to_token(int64_t id) const {
  QF_REQUIRE(id >= 0 && id < vocab_size(), "framework/text: id ", id, " is not in the vocabulary (", vocab_size(),
             " ids)");
  return impl_->api->id_to_piece(impl_->processor, static_cast<int>(id));
}

std::optional<int64_t> SentencePieceTokenizer::bos_id() const { return defined_id(impl_->api->bos_id(impl_->processor)); }
std::optional<int64_t> SentencePieceTokenizer::eos_id() const { return defined_id(impl_->api->eos_id(impl_->processor)); }

}  // namespace qforge::text
