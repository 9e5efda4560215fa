// Decoders for the four request image formats (see image_decode.h for the rules and the libraries).
#include "vision/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include <gif_lib.h>
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#include "base/error.h"

namespace m3::vision {

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::Jpeg: return "JPEG";
    case ImageFormat::Png: return "PNG";
    case ImageFormat::Webp: return "WebP";
    case ImageFormat::Gif: return "GIF";
    default: return "unknown";
  }
}

ImageFormat sniff_image_format(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::Jpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return ImageFormat::Png;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return ImageFormat::Webp;
  if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) return ImageFormat::Gif;
  return ImageFormat::Unknown;
}

uint8_t composite_on_white(uint8_t c, uint8_t a) {
  // Pillow's BLEND / DIV255: t = in1 * (255 - m) + in2 * m + 128; (t + (t >> 8)) >> 8.
  unsigned t = 255u * (255u - a) + unsigned(c) * a + 128u;
  return uint8_t((t + (t >> 8)) >> 8);
}

namespace {

void check_dims(const char* fmt, int64_t w, int64_t h, const DecodeLimits& lim) {
  if (w <= 0 || h <= 0)
    throw Error(std::string(fmt) + " image has zero size (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w > lim.max_side || h > lim.max_side || w * h > lim.max_pixels)
    throw Error(std::string(fmt) + " image is " + std::to_string(w) + "x" + std::to_string(h) +
                ", above the decode limit (at most " + std::to_string(lim.max_side) + " pixels a side and " +
                std::to_string(lim.max_pixels) + " pixels)");
}

RgbImage alloc_rgb(int w, int h) {
  RgbImage im;
  im.width = w;
  im.height = h;
  im.rgb.resize(size_t(w) * size_t(h) * 3);
  return im;
}

// ---- JPEG (libjpeg-turbo) ----
struct JpegErr {
  jpeg_error_mgr mgr;
  std::jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
};

void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  std::longjmp(e->jb, 1);
}

// Pillow refuses a truncated JPEG ("image file is truncated"); libjpeg only warns and pads with grey,
// so that one warning is an error here. Other warnings are ignored, as Pillow does.
void jpeg_message(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegErr*>(c->err);
    std::snprintf(e->msg, sizeof e->msg, "truncated data");
    std::longjmp(e->jb, 1);
  }
}

// All C++ objects live in the caller; this function holds only C state so longjmp skips no destructor.
bool decode_jpeg_c(const uint8_t* data, size_t n, const DecodeLimits& lim, RgbImage* out, std::string* err) {
  jpeg_decompress_struct cinfo;
  JpegErr jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = jpeg_fail;
  jerr.mgr.emit_message = jpeg_message;
  jerr.msg[0] = 0;
  if (setjmp(jerr.jb)) {
    jpeg_destroy_decompress(&cinfo);
    *err = std::string("corrupt or truncated JPEG: ") + jerr.msg;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    *err = "CMYK JPEG images are not supported (expected greyscale or YCbCr/RGB)";
    return false;
  }
  int64_t w = cinfo.image_width, h = cinfo.image_height;
  if (w <= 0 || h <= 0 || w > lim.max_side || h > lim.max_side || w * h > lim.max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    *err = "dims";
    out->width = int(w);
    out->height = int(h);
    return false;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  // The pixels were allocated by the caller after a header-only pass (see decode_jpeg).
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + size_t(cinfo.output_scanline) * size_t(w) * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

bool jpeg_header(const uint8_t* data, size_t n, int* w, int* h, std::string* err) {
  jpeg_decompress_struct cinfo;
  JpegErr jerr;
  cinfo.err = jpeg_std_error(&jerr.mgr);
  jerr.mgr.error_exit = jpeg_fail;
  jerr.mgr.emit_message = jpeg_message;
  jerr.msg[0] = 0;
  if (setjmp(jerr.jb)) {
    jpeg_destroy_decompress(&cinfo);
    *err = std::string("corrupt or truncated JPEG: ") + jerr.msg;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  *w = int(cinfo.image_width);
  *h = int(cinfo.image_height);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

RgbImage decode_jpeg(const uint8_t* data, size_t n, const DecodeLimits& lim) {
  std::string err;
  int w = 0, h = 0;
  if (!jpeg_header(data, n, &w, &h, &err)) throw Error(err);
  check_dims("JPEG", w, h, lim);
  RgbImage im = alloc_rgb(w, h);
  if (!decode_jpeg_c(data, n, lim, &im, &err)) throw Error(err);
  return im;
}

// ---- PNG (libpng) ----
struct PngSrc {
  const uint8_t* p;
  size_t n, off;
};

void png_read_mem(png_structp png, png_bytep dst, png_size_t len) {
  auto* s = static_cast<PngSrc*>(png_get_io_ptr(png));
  if (len > s->n - s->off) png_error(png, "truncated data");
  std::memcpy(dst, s->p + s->off, len);
  s->off += len;
}

struct PngErrMsg {
  char msg[256];
};

void png_fail(png_structp png, png_const_charp m) {
  auto* e = static_cast<PngErrMsg*>(png_get_error_ptr(png));
  std::snprintf(e->msg, sizeof e->msg, "%s", m);
  png_longjmp(png, 1);
}
void png_warn(png_structp, png_const_charp) {}

// Pass 1 (info only) fills w, h, color type and depth; pass 2 decodes into out->rgb via `rows`
// (a caller-owned buffer of one decoded row per image row when interlaced, else one row).
struct PngInfo {
  int w = 0, h = 0, color = 0, depth = 0, interlace = 0;
};

bool png_run(const uint8_t* data, size_t n, const DecodeLimits& lim, PngInfo* info, RgbImage* out,
             std::vector<uint8_t>* scratch, std::string* err) {
  PngErrMsg em;
  em.msg[0] = 0;
  PngSrc src{data, n, 0};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &em, png_fail, png_warn);
  if (!png) {
    *err = "PNG decoder could not start";
    return false;
  }
  png_infop pinfo = png_create_info_struct(png);
  if (!pinfo || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &pinfo, nullptr);
    *err = std::string("corrupt or truncated PNG: ") + em.msg;
    return false;
  }
  png_set_chunk_malloc_max(png, 8u << 20);
  png_set_read_fn(png, &src, png_read_mem);
  png_read_info(png, pinfo);
  info->w = int(png_get_image_width(png, pinfo));
  info->h = int(png_get_image_height(png, pinfo));
  info->color = png_get_color_type(png, pinfo);
  info->depth = png_get_bit_depth(png, pinfo);
  info->interlace = png_get_interlace_type(png, pinfo);
  if (!out) {
    png_destroy_read_struct(&png, &pinfo, nullptr);
    return true;
  }
  // Pillow opens 16-bit greyscale as mode I;16 and convert("RGB") clips it at 255; every other 16-bit
  // mode keeps the high byte. Palettes expand (libpng adds alpha when there is a tRNS chunk).
  const bool gray16 = info->color == PNG_COLOR_TYPE_GRAY && info->depth == 16;
  if (!gray16) {
    if (info->depth == 16) png_set_strip_16(png);
    if (info->color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (info->color == PNG_COLOR_TYPE_GRAY && info->depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (info->color == PNG_COLOR_TYPE_GRAY || info->color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  }
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, pinfo);
  const size_t rb = png_get_rowbytes(png, pinfo);
  const int ch = png_get_channels(png, pinfo);
  const size_t W = size_t(info->w), H = size_t(info->h);
  // Interlaced images need every row kept between passes; others decode row by row.
  scratch->assign(passes > 1 ? rb * H : rb, 0);
  for (int p = 0; p < passes; ++p)
    for (size_t y = 0; y < H; ++y) {
      uint8_t* row = scratch->data() + (passes > 1 ? rb * y : 0);
      png_read_row(png, row, nullptr);
      if (p + 1 < passes) continue;
      uint8_t* o = out->rgb.data() + y * W * 3;
      if (gray16) {
        for (size_t x = 0; x < W; ++x) {
          unsigned v = (unsigned(row[2 * x]) << 8) | row[2 * x + 1];
          o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = uint8_t(v > 255 ? 255 : v);
        }
      } else if (ch == 3) {
        std::memcpy(o, row, W * 3);
      } else {  // 4 channels: RGBA composites onto white (vLLM), LA / palette+tRNS drop the alpha (Pillow).
        const bool rgba = info->color == PNG_COLOR_TYPE_RGB_ALPHA;
        for (size_t x = 0; x < W; ++x)
          for (int c = 0; c < 3; ++c)
            o[3 * x + c] = rgba ? composite_on_white(row[4 * x + c], row[4 * x + 3]) : row[4 * x + c];
      }
    }
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &pinfo, nullptr);
  return true;
}

RgbImage decode_png(const uint8_t* data, size_t n, const DecodeLimits& lim) {
  std::string err;
  PngInfo info;
  std::vector<uint8_t> scratch;
  if (!png_run(data, n, lim, &info, nullptr, &scratch, &err)) throw Error(err);
  check_dims("PNG", info.w, info.h, lim);
  RgbImage im = alloc_rgb(info.w, info.h);
  if (!png_run(data, n, lim, &info, &im, &scratch, &err)) throw Error(err);
  return im;
}

// ---- WebP (libwebp) ----
RgbImage decode_webp(const uint8_t* data, size_t n, const DecodeLimits& lim) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(data, n, &f) != VP8_STATUS_OK) throw Error("corrupt or truncated WebP: header unreadable");
  if (f.has_animation) throw Error("animated WebP images are not supported (expected a still image)");
  check_dims("WebP", f.width, f.height, lim);
  RgbImage im = alloc_rgb(f.width, f.height);
  const size_t W = size_t(f.width), H = size_t(f.height);
  if (!f.has_alpha) {
    if (!WebPDecodeRGBInto(data, n, im.rgb.data(), im.rgb.size(), int(W * 3)))
      throw Error("corrupt or truncated WebP: decoding failed");
    return im;
  }
  std::vector<uint8_t> rgba(W * H * 4);
  if (!WebPDecodeRGBAInto(data, n, rgba.data(), rgba.size(), int(W * 4)))
    throw Error("corrupt or truncated WebP: decoding failed");
  for (size_t i = 0; i < W * H; ++i)
    for (int c = 0; c < 3; ++c) im.rgb[3 * i + c] = composite_on_white(rgba[4 * i + c], rgba[4 * i + 3]);
  return im;
}

// ---- GIF (giflib), first frame ----
struct GifSrc {
  const uint8_t* p;
  size_t n, off;
};

int gif_read_mem(GifFileType* g, GifByteType* dst, int len) {
  auto* s = static_cast<GifSrc*>(g->UserData);
  size_t k = std::min(size_t(len), s->n - s->off);
  std::memcpy(dst, s->p + s->off, k);
  s->off += k;
  return int(k);
}

struct GifCloser {
  GifFileType* g;
  ~GifCloser() {
    int e;
    if (g) DGifCloseFile(g, &e);
  }
};

RgbImage decode_gif(const uint8_t* data, size_t n, const DecodeLimits& lim) {
  GifSrc src{data, n, 0};
  int e = 0;
  GifFileType* g = DGifOpen(&src, gif_read_mem, &e);
  if (!g) throw Error(std::string("corrupt or truncated GIF: ") + GifErrorString(e));
  GifCloser closer{g};
  auto fail = [&](const char* what) -> Error {
    const char* s = GifErrorString(g->Error);
    return Error(std::string("corrupt or truncated GIF: ") + what + (s ? std::string(" (") + s + ")" : ""));
  };
  check_dims("GIF", g->SWidth, g->SHeight, lim);
  int transparent = -1;
  for (;;) {
    GifRecordType rt;
    if (DGifGetRecordType(g, &rt) == GIF_ERROR) throw fail("bad record");
    if (rt == TERMINATE_RECORD_TYPE) throw Error("GIF holds no image frame");
    if (rt == EXTENSION_RECORD_TYPE) {
      int code;
      GifByteType* ext;
      if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) throw fail("bad extension");
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) throw fail("bad extension");
      }
      continue;
    }
    if (rt != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(g) == GIF_ERROR) throw fail("bad image descriptor");
    const GifImageDesc& d = g->Image;
    const ColorMapObject* cmap = d.ColorMap ? d.ColorMap : g->SColorMap;
    if (!cmap) throw Error("GIF frame has no colour table");
    const int W = g->SWidth, H = g->SHeight;
    if (d.Left < 0 || d.Top < 0 || d.Width <= 0 || d.Height <= 0 || d.Left + d.Width > W || d.Top + d.Height > H)
      throw Error("GIF frame lies outside the logical screen");
    // Pillow fills what the first frame does not cover with the transparent index, else index 0.
    std::vector<uint8_t> idx(size_t(W) * size_t(H), uint8_t(transparent >= 0 ? transparent : 0));
    std::vector<GifPixelType> line(size_t(d.Width));
    auto put_row = [&](int y) {
      if (DGifGetLine(g, line.data(), d.Width) == GIF_ERROR) throw fail("truncated pixel data");
      std::memcpy(idx.data() + size_t(d.Top + y) * W + d.Left, line.data(), size_t(d.Width));
    };
    if (d.Interlace) {
      static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
      for (int p = 0; p < 4; ++p)
        for (int y = start[p]; y < d.Height; y += step[p]) put_row(y);
    } else {
      for (int y = 0; y < d.Height; ++y) put_row(y);
    }
    RgbImage im = alloc_rgb(W, H);
    for (size_t i = 0; i < idx.size(); ++i) {
      int k = idx[i];
      uint8_t r = 0, gg = 0, b = 0;
      if (k < cmap->ColorCount) {
        r = cmap->Colors[k].Red;
        gg = cmap->Colors[k].Green;
        b = cmap->Colors[k].Blue;
      }
      im.rgb[3 * i] = r;
      im.rgb[3 * i + 1] = gg;
      im.rgb[3 * i + 2] = b;
    }
    return im;
  }
}

}  // namespace

RgbImage decode_image(const uint8_t* data, size_t n, const DecodeLimits& limits) {
  if (n == 0) throw Error("image data is empty");
  if (n > limits.max_bytes)
    throw Error("image data is " + std::to_string(n) + " bytes, above the limit of " + std::to_string(limits.max_bytes));
  switch (sniff_image_format(data, n)) {
    case ImageFormat::Jpeg: return decode_jpeg(data, n, limits);
    case ImageFormat::Png: return decode_png(data, n, limits);
    case ImageFormat::Webp: return decode_webp(data, n, limits);
    case ImageFormat::Gif: return decode_gif(data, n, limits);
    default: break;
  }
  throw Error("unsupported image format (expected JPEG, PNG, WebP or GIF by their leading bytes)");
}

}  // namespace m3::vision
