// The boundary between qforge and libsentencepiece. Debian's libsentencepiece carries its own
// copy of protobuf-lite with exported symbols; linked into a process that also loads
// libprotobuf (LibTorch does, through libonnx_proto), each library's protobuf calls land in the
// other's copy and the process crashes at start-up. So libsentencepiece is only ever linked into
// the plugin libqforge_sentencepiece.so, which SentencePieceTokenizer loads with dlopen(RTLD_LOCAL
// | RTLD_DEEPBIND): its symbols stay out of the process's global scope and it binds to its own
// protobuf first. The plugin exports one function returning this table.
#pragma once

#include <string>
#include <vector>

namespace qforge::text {

inline constexpr int kSentencePiecePluginVersion = 1;
inline constexpr const char* kSentencePiecePluginEntry = "qforge_sentencepiece_api";

struct SentencePieceApi {
  int version;  // kSentencePiecePluginVersion of the plugin's build
  // A loaded processor, or nullptr with SentencePiece's reason in *error.
  void* (*load)(const std::string& path, std::string* error);
  void (*release)(void* processor);
  bool (*encode)(const void* processor, const std::string& text, std::vector<int>* ids, std::string* error);
  bool (*decode)(const void* processor, const std::vector<int>& ids, std::string* text, std::string* error);
  int (*piece_size)(const void* processor);
  int (*piece_to_id)(const void* processor, const std::string& piece);
  std::string (*id_to_piece)(const void* processor, int id);
  int (*bos_id)(const void* processor);  // -1 when the model has none, as SentencePiece says
  int (*eos_id)(const void* processor);
  int (*unk_id)(const void* processor);
};

}  // namespace qforge::text

extern "C" const qforge::text::SentencePieceApi* qforge_sentencepiece_api();
