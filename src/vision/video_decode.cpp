// Video decoding through libav (see the header). Every libav object is owned by a small RAII holder so
// that each error path (an m3::Error thrown from the middle of the loop) frees it.
#include "vision/video_decode.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libswscale/swscale.h>
}

#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "base/error.h"

namespace m3::vision {
namespace {

struct Reader {  // the AVIOContext's view of the request bytes
  const uint8_t* data;
  size_t n, pos = 0;
};

int read_cb(void* opaque, uint8_t* buf, int size) {
  auto* r = static_cast<Reader*>(opaque);
  if (r->pos >= r->n) return AVERROR_EOF;
  const size_t k = std::min(size_t(size), r->n - r->pos);
  std::memcpy(buf, r->data + r->pos, k);
  r->pos += k;
  return int(k);
}

int64_t seek_cb(void* opaque, int64_t offset, int whence) {
  auto* r = static_cast<Reader*>(opaque);
  if (whence & AVSEEK_SIZE) return int64_t(r->n);
  int64_t base = 0;
  switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = int64_t(r->pos); break;
    case SEEK_END: base = int64_t(r->n); break;
    default: return -1;
  }
  const int64_t p = base + offset;
  if (p < 0 || p > int64_t(r->n)) return -1;
  r->pos = size_t(p);
  return p;
}

// A container must not make libav open anything else: HLS / DASH playlists and the concat demuxer read
// nested URLs (file://, http://), which would let a request read the server's files or reach its network.
int refuse_nested_open(AVFormatContext*, AVIOContext**, const char*, int, AVDictionary**) { return AVERROR(EPERM); }

// The demuxers a request video may use: the common video containers (no playlists, no raw images).
const char* kVideoFormats = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,flv,mpegts,mpeg,ogg,asf,m4v,h264,hevc,ivf,nut";

std::string av_err(int e) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(e, buf, sizeof buf);
  return buf;
}

struct Io {
  AVIOContext* ctx = nullptr;
  ~Io() {
    if (ctx) av_freep(&ctx->buffer);
    avio_context_free(&ctx);
  }
};
struct Fmt {
  AVFormatContext* ctx = nullptr;
  ~Fmt() { avformat_close_input(&ctx); }
};
struct Codec {
  AVCodecContext* ctx = nullptr;
  ~Codec() { avcodec_free_context(&ctx); }
};
struct Packet {
  AVPacket* p = av_packet_alloc();
  ~Packet() { av_packet_free(&p); }
};
struct Frame {
  AVFrame* f = av_frame_alloc();
  ~Frame() { av_frame_free(&f); }
};
struct Sws {
  SwsContext* ctx = nullptr;
  ~Sws() { sws_freeContext(ctx); }
};

}  // namespace

VideoInfo decode_video(const uint8_t* data, size_t n, const DecodeLimits& limits, const VideoOptions& opt,
                       bool want_pixels, const std::function<void(int64_t, RgbImage&&, const VideoInfo&)>& on_frame) {
  if (n == 0) throw Error("video: no bytes");
  if (n > limits.max_bytes)
    throw Error("video: " + std::to_string(n) + " bytes; at most " + std::to_string(limits.max_bytes) + " are accepted");
  av_log_set_level(AV_LOG_QUIET);  // errors reach the client as messages, not as server log noise
  Reader rd{data, n};
  Io io;
  const int kBuf = 1 << 15;
  auto* buf = static_cast<uint8_t*>(av_malloc(kBuf));
  if (!buf) throw Error("video: out of memory");
  io.ctx = avio_alloc_context(buf, kBuf, 0, &rd, read_cb, nullptr, seek_cb);
  if (!io.ctx) {
    av_free(buf);
    throw Error("video: out of memory");
  }
  Fmt fmt;
  fmt.ctx = avformat_alloc_context();
  if (!fmt.ctx) throw Error("video: out of memory");
  fmt.ctx->pb = io.ctx;
  fmt.ctx->flags |= AVFMT_FLAG_CUSTOM_IO;
  fmt.ctx->io_open = refuse_nested_open;
  fmt.ctx->format_whitelist = av_strdup(kVideoFormats);
  fmt.ctx->protocol_whitelist = av_strdup("");
  if (int e = avformat_open_input(&fmt.ctx, nullptr, nullptr, nullptr); e < 0)
    throw Error(std::string("video: not a video container this server reads (") + kVideoFormats + "; " + av_err(e) + ")");
  if (int e = avformat_find_stream_info(fmt.ctx, nullptr); e < 0)
    throw Error("video: cannot read the stream information (" + av_err(e) + "; corrupt or truncated?)");
  const int si = av_find_best_stream(fmt.ctx, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (si < 0) throw Error("video: the container holds no video stream");
  AVStream* st = fmt.ctx->streams[si];
  const AVCodecParameters* par = st->codecpar;
  VideoInfo info;
  info.codec = avcodec_get_name(par->codec_id);
  info.width = par->width;
  info.height = par->height;
  if (info.width <= 0 || info.height <= 0)
    throw Error("video: frames of " + std::to_string(info.width) + "x" + std::to_string(info.height) + " (zero size)");
  if (info.width > limits.max_side || info.height > limits.max_side ||
      int64_t(info.width) * info.height > limits.max_pixels)
    throw Error("video: frames of " + std::to_string(info.width) + "x" + std::to_string(info.height) +
                " are above the limit (sides up to " + std::to_string(limits.max_side) + ", " +
                std::to_string(limits.max_pixels) + " pixels)");
  AVRational rate = st->avg_frame_rate.num > 0 && st->avg_frame_rate.den > 0 ? st->avg_frame_rate : st->r_frame_rate;
  info.fps = rate.den > 0 ? av_q2d(rate) : 0.0;
  if (!(info.fps > 0) || !std::isfinite(info.fps) || info.fps > 1000)
    throw Error("video: the stream has no usable frame rate (" + std::to_string(info.fps) + " fps)");
  const double duration = fmt.ctx->duration != AV_NOPTS_VALUE ? double(fmt.ctx->duration) / AV_TIME_BASE : 0.0;
  if (duration > opt.max_duration)
    throw Error("video: " + std::to_string(duration) + " s long; at most " + std::to_string(opt.max_duration) +
                " s are accepted");
  const AVCodec* dec = avcodec_find_decoder(par->codec_id);
  if (!dec) throw Error(std::string("video: codec '") + info.codec + "' is not supported by this server's libavcodec");
  Codec cc;
  cc.ctx = avcodec_alloc_context3(dec);
  if (!cc.ctx) throw Error("video: out of memory");
  if (int e = avcodec_parameters_to_context(cc.ctx, par); e < 0)
    throw Error(std::string("video: codec '") + info.codec + "': " + av_err(e));
  cc.ctx->thread_count = 1;  // the tower's kernels use the cores; decoding one request stays on its worker
  if (int e = avcodec_open2(cc.ctx, dec, nullptr); e < 0)
    throw Error(std::string("video: cannot open the '") + info.codec + "' decoder (" + av_err(e) + ")");

  // Frames past max_duration at the stream's rate are refused as they come (a container may not say).
  const int64_t max_read = int64_t(std::floor(opt.max_duration * info.fps)) + 1;
  int64_t next = next_sample_index(-1, info.fps, opt.fps);
  Packet pkt;
  Frame fr;
  Sws sws;
  if (!pkt.p || !fr.f) throw Error("video: out of memory");
  auto take = [&]() {
    for (;;) {
      const int e = avcodec_receive_frame(cc.ctx, fr.f);
      if (e == AVERROR(EAGAIN) || e == AVERROR_EOF) return;
      if (e < 0) throw Error("video: corrupt data after frame " + std::to_string(info.frames_read) + " (" + av_err(e) + ")");
      const int64_t idx = info.frames_read++;
      if (idx >= max_read)
        throw Error("video: longer than " + std::to_string(opt.max_duration) + " s at " + std::to_string(info.fps) +
                    " fps; at most " + std::to_string(opt.max_duration) + " s are accepted");
      if (fr.f->width != info.width || fr.f->height != info.height)
        throw Error("video: frame " + std::to_string(idx) + " is " + std::to_string(fr.f->width) + "x" +
                    std::to_string(fr.f->height) + ", the stream says " + std::to_string(info.width) + "x" +
                    std::to_string(info.height) + " (a size change mid-stream is not supported)");
      if (idx == next) {
        next = next_sample_index(idx, info.fps, opt.fps);
        RgbImage im;
        if (want_pixels) {
          // Colour conversion only (same size): full-precision chroma and rounding, as exact as libswscale gets.
          sws.ctx = sws_getCachedContext(sws.ctx, info.width, info.height, AVPixelFormat(fr.f->format), info.width,
                                         info.height, AV_PIX_FMT_RGB24,
                                         SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_BITEXACT, nullptr,
                                         nullptr, nullptr);
          if (!sws.ctx)
            throw Error(std::string("video: cannot convert pixel format '") +
                        (av_get_pix_fmt_name(AVPixelFormat(fr.f->format)) ? av_get_pix_fmt_name(AVPixelFormat(fr.f->format)) : "?") +
                        "' to RGB");
          im.width = info.width;
          im.height = info.height;
          im.rgb.resize(size_t(info.width) * size_t(info.height) * 3);
          uint8_t* dst[4] = {im.rgb.data(), nullptr, nullptr, nullptr};
          int dst_stride[4] = {info.width * 3, 0, 0, 0};
          sws_scale(sws.ctx, fr.f->data, fr.f->linesize, 0, info.height, dst, dst_stride);
        }
        on_frame(idx, std::move(im), info);
      }
      av_frame_unref(fr.f);
    }
  };
  for (;;) {
    const int e = av_read_frame(fmt.ctx, pkt.p);
    if (e == AVERROR_EOF) break;
    if (e < 0) throw Error("video: cannot read the container after frame " + std::to_string(info.frames_read) +
                           " (" + av_err(e) + "; corrupt or truncated?)");
    if (pkt.p->stream_index == si) {
      const int s = avcodec_send_packet(cc.ctx, pkt.p);
      av_packet_unref(pkt.p);
      if (s < 0 && s != AVERROR(EAGAIN))
        throw Error("video: corrupt data after frame " + std::to_string(info.frames_read) + " (" + av_err(s) + ")");
      take();
    } else {
      av_packet_unref(pkt.p);
    }
  }
  avcodec_send_packet(cc.ctx, nullptr);  // drain
  take();
  if (info.frames_read == 0) throw Error(std::string("video: no frame could be decoded (codec '") + info.codec + "')");
  // Truncated where the container says how long the video is: the stream's own duration, or the file's when
  // the video is its only stream (an audio track may outlast the picture). A tenth of slack for rounding
  // and variable frame rates.
  double expect_s = st->duration != AV_NOPTS_VALUE && st->duration > 0 ? double(st->duration) * av_q2d(st->time_base)
                    : fmt.ctx->nb_streams == 1                           ? duration
                                                                         : 0.0;
  if (expect_s > 0 && double(info.frames_read + 1) / info.fps < 0.9 * expect_s)
    throw Error("video: truncated: " + std::to_string(info.frames_read) + " frames at " + std::to_string(info.fps) +
                " fps decoded of a " + std::to_string(expect_s) + " s video");
  if (st->nb_frames > 0 && info.frames_read < st->nb_frames)
    throw Error("video: truncated: " + std::to_string(info.frames_read) + " of the " + std::to_string(st->nb_frames) +
                " frames the container lists could be decoded");
  return info;
}

}  // namespace m3::vision
