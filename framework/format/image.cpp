// PNG (libpng's simplified API) and JPEG (libjpeg) decoding for image.h. Colour is converted as
// PIL converts it, which torchvision's ImageFolder uses (`Image.convert("RGB")`, then `"L"` for a
// grey model): an alpha channel is dropped, not composited, and grey is PIL's integer luma
// (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16 of the 8-bit sRGB values.
#include "framework/format/image.h"

#include <jpeglib.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "framework/core/error.h"

namespace qforge::io {

namespace {

// Pixels a decoded image may hold when the caller states no size: 2^26 (64 megapixels).
constexpr int64_t kMaxPixels = int64_t{1} << 26;

bool starts_with(const std::string& path, const unsigned char* sig, size_t n) {
  std::ifstream f(path, std::ios::binary);
  unsigned char head[8] = {};
  if (!f.read(reinterpret_cast<char*>(head), static_cast<std::streamsize>(n))) return false;
  return std::memcmp(head, sig, n) == 0;
}

constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr unsigned char kJpeg[3] = {0xff, 0xd8, 0xff};

// The header's size against the caller's (height, width > 0) or the pixel cap, before decoding.
void check_size(const std::string& path, int64_t h, int64_t w, int64_t want_h, int64_t want_w) {
  QF_REQUIRE(h > 0 && w > 0, "image ", path, ": its header gives a size of ", h, " x ", w);
  if (want_h > 0 && want_w > 0)
    QF_REQUIRE(h == want_h && w == want_w, "image ", path, " is ", h, " x ", w, " (height x width), the model takes ",
               want_h, " x ", want_w, "; resize the images first");
  QF_REQUIRE(h * w <= kMaxPixels, "image ", path, " is ", h, " x ", w, ": more than ", kMaxPixels, " pixels");
}

// Interleaved 8-bit pixels of `from` channels (1 or 3, after any alpha is dropped) as `to`.
void convert_channels(std::vector<uint8_t>& px, int64_t pixels, int64_t from, int64_t to) {
  if (from == to) return;
  std::vector<uint8_t> out(static_cast<size_t>(pixels * to));
  for (int64_t i = 0; i < pixels; ++i) {
    if (to == 1) {  // RGB -> L, PIL's ImagingConvert rgb2l
      const uint32_t r = px[i * 3], g = px[i * 3 + 1], b = px[i * 3 + 2];
      out[i] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
    } else {  // L -> RGB
      out[i * 3] = out[i * 3 + 1] = out[i * 3 + 2] = px[i];
    }
  }
  px.swap(out);
}

// Keeps the first `keep` of every `stride` bytes (drops an interleaved alpha channel).
void drop_alpha(std::vector<uint8_t>& px, int64_t pixels, int64_t keep, int64_t stride) {
  for (int64_t i = 0; i < pixels; ++i)
    for (int64_t c = 0; c < keep; ++c) px[i * keep + c] = px[i * stride + c];
  px.resize(static_cast<size_t>(pixels * keep));
}

Image read_png(const std::string& path, int64_t channels, int64_t want_h, int64_t want_w) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  struct Free {
    png_image* p;
    ~Free() { png_image_free(p); }  // a no-op once finish_read succeeded
  } free_on_exit{&img};
  QF_REQUIRE(png_image_begin_read_from_file(&img, path.c_str()) != 0, "image ", path, ": not a readable PNG file (libpng: ",
             img.message, ")");
  check_size(path, img.height, img.width, want_h, want_w);
  img.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;  // 16-bit samples are sRGB-encoded, scaled to 8 bits
  const bool color = (img.format & PNG_FORMAT_FLAG_COLOR) != 0, alpha = (img.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  img.format = (color ? PNG_FORMAT_FLAG_COLOR : 0) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);  // 8-bit, no colormap
  Image out;
  out.height = img.height, out.width = img.width;
  const int64_t stored = (color ? 3 : 1) + (alpha ? 1 : 0), pixels = out.height * out.width;
  out.pixels.resize(static_cast<size_t>(pixels * stored));
  QF_REQUIRE(png_image_finish_read(&img, nullptr, out.pixels.data(), 0, nullptr) != 0, "image ", path,
             ": a corrupt or truncated PNG file (libpng: ", img.message, ")");
  if (alpha) drop_alpha(out.pixels, pixels, stored - 1, stored);
  convert_channels(out.pixels, pixels, color ? 3 : 1, channels);
  out.channels = channels;
  return out;
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

// What the decoder touches between setjmp and a longjmp: plain data behind a pointer, so nothing
// with a destructor is skipped and no automatic variable is left indeterminate.
struct JpegState {
  jpeg_decompress_struct d;
  JpegError err;
  std::FILE* file = nullptr;
  bool created = false;
  uint8_t* pixels = nullptr;  // malloc'd
  int64_t height = 0, width = 0, stored = 0;
  char problem[256] = {};  // a refusal found between setjmp and the end (no throw there)
};

// 0 on success; the error (libjpeg's message, or state->problem) in the state otherwise.
int decode_jpeg(JpegState* s, const char* path, int64_t want_h, int64_t want_w) {
  s->d.err = jpeg_std_error(&s->err.mgr);
  s->err.mgr.error_exit = [](j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
  };
  s->err.mgr.output_message = [](j_common_ptr) {};  // warnings (corrupt-data recoveries) stay quiet
  if (setjmp(s->err.jump)) return 1;
  jpeg_create_decompress(&s->d);
  s->created = true;
  jpeg_stdio_src(&s->d, s->file);
  jpeg_read_header(&s->d, TRUE);
  s->height = s->d.image_height, s->width = s->d.image_width;
  const bool sized = s->height > 0 && s->width > 0 &&
                     (want_h > 0 && want_w > 0 ? s->height == want_h && s->width == want_w
                                               : s->height * s->width <= kMaxPixels);
  if (!sized) return 2;  // check_size says why, outside
  if (s->d.jpeg_color_space == JCS_CMYK || s->d.jpeg_color_space == JCS_YCCK) {
    std::snprintf(s->problem, sizeof s->problem, "CMYK / YCCK colour (convert it to RGB first)");
    return 1;
  }
  const bool grey = s->d.jpeg_color_space == JCS_GRAYSCALE;
  s->d.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&s->d);
  s->stored = s->d.output_components;
  s->pixels = static_cast<uint8_t*>(std::malloc(static_cast<size_t>(s->height * s->width * s->stored)));
  if (s->pixels == nullptr) {
    std::snprintf(s->problem, sizeof s->problem, "out of memory for its pixels");
    return 1;
  }
  while (s->d.output_scanline < s->d.output_height) {
    JSAMPROW row = s->pixels + static_cast<int64_t>(s->d.output_scanline) * s->width * s->stored;
    jpeg_read_scanlines(&s->d, &row, 1);
  }
  jpeg_finish_decompress(&s->d);
  return 0;
}

Image read_jpeg(const std::string& path, int64_t channels, int64_t want_h, int64_t want_w) {
  auto s = std::make_unique<JpegState>();
  s->file = std::fopen(path.c_str(), "rb");
  QF_REQUIRE(s->file != nullptr, "image ", path, ": cannot open it");
  const int rc = decode_jpeg(s.get(), path.c_str(), want_h, want_w);
  if (s->created) jpeg_destroy_decompress(&s->d);
  std::fclose(s->file);
  std::unique_ptr<uint8_t, decltype(&std::free)> pixels(s->pixels, &std::free);
  if (rc == 2) check_size(path, s->height, s->width, want_h, want_w);
  QF_REQUIRE(rc == 0, "image ", path, ": not a readable JPEG file (",
             s->problem[0] != 0 ? std::string(s->problem) : "libjpeg: " + std::string(s->err.message), ")");
  Image out;
  out.height = s->height, out.width = s->width;
  const int64_t n = out.height * out.width;
  out.pixels.assign(pixels.get(), pixels.get() + n * s->stored);
  convert_channels(out.pixels, n, s->stored, channels);
  out.channels = channels;
  return out;
}

}  // namespace

bool is_image_file(const std::string& path) {
  return starts_with(path, kPng, sizeof kPng) || starts_with(path, kJpeg, sizeof kJpeg);
}

Image read_image(const std::string& path, int64_t channels, int64_t height, int64_t width) {
  QF_REQUIRE(channels == 1 || channels == 3, "read_image: channels must be 1 or 3, got ", channels);
  if (starts_with(path, kPng, sizeof kPng)) return read_png(path, channels, height, width);
  if (starts_with(path, kJpeg, sizeof kJpeg)) return read_jpeg(path, channels, height, width);
  throw Error("image " + path + ": neither a PNG nor a JPEG file (by its first bytes)");
}

}  // namespace qforge::io
