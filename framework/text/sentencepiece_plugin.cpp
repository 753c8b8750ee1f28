// libqforge_sentencepiece.so: libsentencepiece behind the table of sentencepiece_plugin.h (why
// a plugin: see that header).
#include "framework/text/sentencepiece_plugin.h"

#include <sentencepiece_processor.h>

namespace {

using sentencepiece::SentencePieceProcessor;

const SentencePieceProcessor& sp(const void* p) { return *static_cast<const SentencePieceProcessor*>(p); }

void* load(const std::string& path, std::string* error) {
  auto* p = new SentencePieceProcessor();
  const auto status = p->Load(path);
  if (status.ok()) return p;
  *error = status.ToString();
  delete p;
  return nullptr;
}

void release(void* p) { delete static_cast<SentencePieceProcessor*>(p); }

bool encode(const void* p, const std::string& text, std::vector<int>* ids, std::string* error) {
  const auto status = sp(p).Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool decode(const void* p, const std::vector<int>& ids, std::string* text, std::string* error) {
  const auto status = sp(p).Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int piece_size(const void* p) { return sp(p).GetPieceSize(); }
int piece_to_id(const void* p, const std::string& piece) { return sp(p).PieceToId(piece); }
std::string id_to_piece(const void* p, int id) { return sp(p).IdToPiece(id); }
int bos_id(const void* p) { return sp(p).bos_id(); }
int eos_id(const void* p) { return sp(p).eos_id(); }
int unk_id(const void* p) { return sp(p).unk_id(); }

const qforge::text::SentencePieceApi kApi{qforge::text::kSentencePiecePluginVersion,
                                          load,
                                          release,
                                          encode,
                                          decode,
                                          piece_size,
                                          piece_to_id,
                                          id_to_piece,
                                          bos_id,
                                          eos_id,
                                          unk_id};

}  // namespace

extern "C" const qforge::text::SentencePieceApi* qforge_sentencepiece_api() { return &kApi; }
