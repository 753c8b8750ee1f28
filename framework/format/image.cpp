// PNG (libpng) and JPEG (libjpeg) decoding for image.h. Colour is converted as
// PIL converts it, which torchvision's ImageFolder uses (`Image.convert("RGB")`, then `"L"` for a
// grey model): an alpha channel is dropped, not composited, and grey is PIL's integer luma
// (R * 19595 + G * 38470 + B * 7471 + 0x8000) >> 16 of the 8-bit sRGB values.
#include "framework/format/image.h"

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

#include <csetjmp>
#include <csignal>
#include <cstdlib>
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

// What the PNG decoder touches between setjmp and a longjmp (libpng's error handler): plain data
// behind a pointer, as for JPEG below.
struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::FILE* file = nullptr;
  uint8_t* pixels = nullptr;  // malloc'd
  png_bytep* rows = nullptr;  // malloc'd
  int64_t height = 0, width = 0, stored = 0;
  bool color = false;
  char message[256] = {};
  char problem[160] = {};
};

// 0 on success; 2 when the header's size is refused (check_size says why); 1 otherwise, with
// libpng's message or state->problem. PIL's reading for ImageFolder: no gamma correction (a gAMA
// chunk is ignored), palettes expanded, grey below 8 bits expanded, alpha stripped (not
// composited), 16-bit colour samples truncated to their high byte; 16-bit grey is refused (PIL
// reads it as 32-bit integers, and convert("RGB") clips them).
int decode_png(PngState* s, int64_t want_h, int64_t want_w) {
  s->png = png_create_read_struct(
      PNG_LIBPNG_VER_STRING, s,
      [](png_structp p, png_const_charp msg) {
        auto* st = static_cast<PngState*>(png_get_error_ptr(p));
        std::snprintf(st->message, sizeof st->message, "%s", msg);
        png_longjmp(p, 1);
      },
      [](png_structp, png_const_charp) {});
  if (s->png == nullptr) return 1;
  s->info = png_create_info_struct(s->png);
  if (s->info == nullptr) return 1;
  if (setjmp(png_jmpbuf(s->png))) return 1;
  png_init_io(s->png, s->file);
  png_read_info(s->png, s->info);
  s->height = png_get_image_height(s->png, s->info), s->width = png_get_image_width(s->png, s->info);
  const bool sized = s->height > 0 && s->width > 0 && s->height * s->width <= kMaxPixels &&
                     (want_h <= 0 || want_w <= 0 || (s->height == want_h && s->width == want_w));
  if (!sized) return 2;
  const int type = png_get_color_type(s->png, s->info), depth = png_get_bit_depth(s->png, s->info);
  s->color = (type & PNG_COLOR_MASK_COLOR) != 0;
  if (depth == 16 && !s->color) {
    std::snprintf(s->problem, sizeof s->problem, "16-bit grey samples (convert the image to 8 bits)");
    return 1;
  }
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s->png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(s->png);
  if (depth == 16) png_set_strip_16(s->png);
  if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(s->png);
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  s->stored = png_get_channels(s->png, s->info);
  const size_t row_bytes = png_get_rowbytes(s->png, s->info);
  if (s->stored != (s->color ? 3 : 1) || row_bytes != static_cast<size_t>(s->width * s->stored)) {
    std::snprintf(s->problem, sizeof s->problem, "an unexpected layout after decoding (%lld channels)",
                  static_cast<long long>(s->stored));
    return 1;
  }
  s->pixels = static_cast<uint8_t*>(std::malloc(static_cast<size_t>(s->height) * row_bytes));
  s->rows = static_cast<png_bytep*>(std::malloc(static_cast<size_t>(s->height) * sizeof(png_bytep)));
  if (s->pixels == nullptr || s->rows == nullptr) {
    std::snprintf(s->problem, sizeof s->problem, "out of memory for its pixels");
    return 1;
  }
  for (int64_t y = 0; y < s->height; ++y) s->rows[y] = s->pixels + y * static_cast<int64_t>(row_bytes);
  png_read_image(s->png, s->rows);
  png_read_end(s->png, nullptr);
  return 0;
}

// The decoded pixels (`stored` channels a pixel) as an Image of `channels` channels.
Image finish_image(const uint8_t* pixels, int64_t height, int64_t width, int64_t stored, int64_t channels) {
  Image out;
  out.height = height, out.width = width;
  const int64_t n = height * width;
  out.pixels.assign(pixels, pixels + n * stored);
  convert_channels(out.pixels, n, stored, channels);
  out.channels = channels;
  return out;
}

Image read_png(const std::string& path, int64_t channels, int64_t want_h, int64_t want_w) {
  auto s = std::make_unique<PngState>();
  s->file = std::fopen(path.c_str(), "rb");
  QF_REQUIRE(s->file != nullptr, "image ", path, ": cannot open it");
  const int rc = decode_png(s.get(), want_h, want_w);
  png_destroy_read_struct(s->png != nullptr ? &s->png : nullptr, s->info != nullptr ? &s->info : nullptr, nullptr);
  std::fclose(s->file);
  std::unique_ptr<uint8_t, decltype(&std::free)> pixels(s->pixels, &std::free);
  std::free(s->rows);
  if (rc == 2) check_size(path, s->height, s->width, want_h, want_w);
  QF_REQUIRE(rc == 0, "image ", path, ": ",
             s->problem[0] != 0 ? "a PNG file of " + std::string(s->problem)
                                : "a corrupt or truncated PNG file (libpng: " + std::string(s->message) + ")");
  return finish_image(pixels.get(), s->height, s->width, s->stored, channels);
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool premature_end = false;  // JWRN_JPEG_EOF: the data ended early (libjpeg pads the rest with grey)
};

// What the JPEG decoder touches between setjmp and a longjmp: plain data behind a pointer, so
// nothing with a destructor is skipped and no automatic variable is left indeterminate.
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
int decode_jpeg(JpegState* s, int64_t want_h, int64_t want_w) {
  s->d.err = jpeg_std_error(&s->err.mgr);
  s->err.mgr.error_exit = [](j_common_ptr c) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
  };
  s->err.mgr.output_message = [](j_common_ptr) {};  // warnings (corrupt-data recoveries) stay quiet
  // A truncated file is refused as PIL refuses it ("image file is truncated"); libjpeg's other
  // recoveries (extraneous bytes before a marker) are kept, as PIL keeps them.
  s->err.mgr.emit_message = [](j_common_ptr c, int level) {
    auto* e = reinterpret_cast<JpegError*>(c->err);
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) e->premature_end = true;
    if (level < 0) ++c->err->num_warnings;
  };
  if (setjmp(s->err.jump)) return 1;
  jpeg_create_decompress(&s->d);
  s->created = true;
  jpeg_stdio_src(&s->d, s->file);
  jpeg_read_header(&s->d, TRUE);
  s->height = s->d.image_height, s->width = s->d.image_width;
  const bool sized = s->height > 0 && s->width > 0 && s->height * s->width <= kMaxPixels &&
                     (want_h <= 0 || want_w <= 0 || (s->height == want_h && s->width == want_w));
  if (!sized) return 2;  // check_size says why, outside
  if (s->d.jpeg_color_space == JCS_CMYK || s->d.jpeg_color_space == JCS_YCCK) {
    std::snprintf(s->problem, sizeof s->problem, "a CMYK / YCCK JPEG: convert it to RGB");
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
  if (s->err.premature_end) {
    std::snprintf(s->problem, sizeof s->problem, "a truncated JPEG file (its data ends before the image does)");
    return 1;
  }
  jpeg_finish_decompress(&s->d);
  return 0;
}

Image read_jpeg(const std::string& path, int64_t channels, int64_t want_h, int64_t want_w) {
  auto s = std::make_unique<JpegState>();
  s->file = std::fopen(path.c_str(), "rb");
  QF_REQUIRE(s->file != nullptr, "image ", path, ": cannot open it");
  const int rc = decode_jpeg(s.get(), want_h, want_w);
  if (s->created) jpeg_destroy_decompress(&s->d);
  std::fclose(s->file);
  std::unique_ptr<uint8_t, decltype(&std::free)> pixels(s->pixels, &std::free);
  if (rc == 2) check_size(path, s->height, s->width, want_h, want_w);
  QF_REQUIRE(rc == 0, "image ", path, ": ",
             s->problem[0] != 0 ? std::string(s->problem)
                                : "not a readable JPEG file (libjpeg: " + std::string(s->err.message) + ")");
  return finish_image(pixels.get(), s->height, s->width, s->stored, channels);
}

}  // namespace

bool is_image_file(const std::string& path) {
  return starts_with(path, kPng, sizeof kPng) || starts_with(path, kJpeg, sizeof kJpeg);
}

Image read_image(const std::string& path, int64_t channels, int64_t height, int64_t width) {
  // The test seam of the HDF5 readers (docs/formats.md): crash like a decoder fault on this one
  // file, so that tests can show the image folder's reader survives it; never set outside tests.
  if (const char* crash = std::getenv("QFORGE_TEST_CRASH_READING"); crash && path == crash) std::raise(SIGSEGV);
  QF_REQUIRE(channels == 1 || channels == 3, "read_image: channels must be 1 or 3, got ", channels);
  if (starts_with(path, kPng, sizeof kPng)) return read_png(path, channels, height, width);
  if (starts_with(path, kJpeg, sizeof kJpeg)) return read_jpeg(path, channels, height, width);
  throw Error("image " + path + ": neither a PNG nor a JPEG file (by its first bytes)");
}

}  // namespace qforge::io
