// jlearngene CPU kernel: the weight gradient of a dense layer, C = A^T B, as an XLA FFI
// handler. A (K, M) is the layer's input and B (K, N) the gradient of its output, both
// row-major with the K = tokens axis leading; C (M, N) is float32, accumulated in float32.
//
// XLA:CPU's oneDNN dot transposes A and re-blocks B on every call for this product (both
// are activations), and runs it at about half the speed of the forward products. This
// kernel reads both in place: per block of kKC tokens it packs A into kMR-column panels and
// B into kNR-column strips (each read row by row, in memory order, so the hardware
// prefetcher follows), and a micro-kernel keeps a tile of C in registers: 8 x 48 in 24
// registers with AVX-512, 6 x 16 in 12 registers with AVX2 (chosen by the build's flags).
// The tokens are split into one fixed chunk per thread of XLA's intra-op pool, and the
// chunks' partial C are summed in chunk order (by all threads), so the result is
// deterministic.
// Compiled at first use by jlearngene.ops.cpu.library.
#include <algorithm>
#include <cstring>
#include <vector>

#include "simd.h"

namespace ffi = xla::ffi;

namespace jlearngene {
namespace {

// The register tile: kMR rows of C by kVecs vectors of kLanes floats, all in registers.
// kKC tokens per block: a B strip (kKC x kNR floats, 24 or 16 KiB) stays in L1.
#if defined(__AVX512F__)
constexpr int64_t kMR = 8, kVecs = 3, kKC = 128;  // 32 registers: 24 accumulators, 3 of b, 1 of a
#define JLG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define JLG_VECS(X, i) X(i, 0) X(i, 1) X(i, 2)
#else
constexpr int64_t kMR = 6, kVecs = 2, kKC = 256;  // 16 registers: 12 accumulators, 2 of b, 1 of a
#define JLG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define JLG_VECS(X, i) X(i, 0) X(i, 1)
#endif
constexpr int64_t kNR = kVecs * kLanes;  // columns of C per micro-tile: 48 or 16

// out[0:kMR, 0:kNR] (+)= sum_t ap[t, 0:kMR]^T bp[t, 0:kNR] over packed panels ap (kc, kMR)
// and bp (kc, kNR). The accumulators are named variables: GCC spills an array of them.
inline void MicroKernel(const float* ap, const float* bp, int64_t kc, float* out, int64_t ldo,
                        bool accumulate) {
#define JLG_ZERO(i, j) Vec c##i##j = Zero();
#define JLG_ZERO_ROW(i) JLG_VECS(JLG_ZERO, i)
  JLG_ROWS(JLG_ZERO_ROW)
  for (int64_t t = 0; t < kc; ++t, ap += kMR, bp += kNR) {
#define JLG_LOAD_B(i, j) const Vec b##j = Load(bp + (j) * kLanes);
    JLG_VECS(JLG_LOAD_B, _)
#define JLG_FMA(i, j) c##i##j = Fma(a##i, b##j, c##i##j);
#define JLG_FMA_ROW(i)                   \
  {                                      \
    const Vec a##i = Broadcast(ap[i]);   \
    JLG_VECS(JLG_FMA, i)                 \
  }
    JLG_ROWS(JLG_FMA_ROW)
  }
#define JLG_STORE(i, j)                                                               \
  Store(out + (i) * ldo + (j) * kLanes,                                               \
        accumulate ? Add(c##i##j, Load(out + (i) * ldo + (j) * kLanes)) : c##i##j);
#define JLG_STORE_ROW(i) JLG_VECS(JLG_STORE, i)
  JLG_ROWS(JLG_STORE_ROW)
#undef JLG_ZERO
#undef JLG_ZERO_ROW
#undef JLG_LOAD_B
#undef JLG_FMA
#undef JLG_FMA_ROW
#undef JLG_STORE
#undef JLG_STORE_ROW
}

// The kc rows (of `width` floats) at src as (kc, W) panels, panel p at dst + p * kc * W; the
// last panel zero-padded. Read row by row, in memory order, so the hardware prefetcher
// follows. Copies of a constant W floats compile to vector moves (a variable size calls
// memcpy).
template <int64_t W>
void PackPanels(const float* src, int64_t width, int64_t kc, float* dst) {
  const int64_t full = width / W, tail = width - full * W;
  for (int64_t t = 0; t < kc; ++t) {
    const float* row = src + t * width;
    float* out = dst + t * W;
    for (int64_t p = 0; p < full; ++p)
      std::memcpy(out + p * kc * W, row + p * W, sizeof(float) * W);
    if (tail) {
      float* last = out + full * kc * W;
      std::memset(last, 0, sizeof(float) * W);
      std::memcpy(last, row + full * W, sizeof(float) * tail);
    }
  }
}

// c = a[k_begin:k_end]^T b[k_begin:k_end] for row-major a (K, m), b (K, n), c (m, n).
// Each block of kKC tokens is summed on its own and then added to c, so the rounding error
// grows with the number of blocks, not the number of tokens.
void WeightGradTokens(const float* a, const float* b, float* c, int64_t k_begin,
                      int64_t k_end, int64_t m, int64_t n) {
  std::fill(c, c + m * n, 0.f);
  const int64_t panels = (m + kMR - 1) / kMR;
  const int64_t strips = (n + kNR - 1) / kNR;
  thread_local std::vector<float> a_buffer, b_buffer;  // this thread's packing buffers
  float* a_pack = AtLeast(a_buffer, panels * kKC * kMR);
  float* b_pack = AtLeast(b_buffer, strips * kKC * kNR);
  alignas(64) float edge[kMR * kNR];
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int64_t kc = std::min(kKC, k_end - k0);
    PackPanels<kMR>(a + k0 * m, m, kc, a_pack);
    PackPanels<kNR>(b + k0 * n, n, kc, b_pack);
    for (int64_t n0 = 0; n0 < n; n0 += kNR) {
      const int64_t nr = std::min(kNR, n - n0);
      const float* bp = b_pack + (n0 / kNR) * kc * kNR;
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t m0 = p * kMR, mr = std::min(kMR, m - m0);
        const float* ap = a_pack + p * kc * kMR;
        if (mr == kMR && nr == kNR) {
          MicroKernel(ap, bp, kc, c + m0 * n + n0, n, /*accumulate=*/true);
        } else {
          MicroKernel(ap, bp, kc, edge, kNR, /*accumulate=*/false);
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j) c[(m0 + i) * n + n0 + j] += edge[i * kNR + j];
        }
      }
    }
  }
}

// One call's work: the tokens in one fixed chunk per thread, run by ParallelFor. Chunk 0
// writes c, chunk i > 0 its own scratch matrix, and c adds them in chunk order, split by
// ranges of elements over the threads: which thread ran which chunk or range does not change
// a bit of the result.
ffi::Error WeightGrad(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                      ffi::ResultBuffer<ffi::F32> c) {
  const auto ad = a.dimensions(), bd = b.dimensions(), cd = c->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || ad[0] != bd[0] || cd.size() != 2 ||
      cd[0] != ad[1] || cd[1] != bd[1])
    return ffi::Error::InvalidArgument(
        "jlearngene weight_grad: expected a (K, M), b (K, N) and a result (M, N)");
  const int64_t k = ad[0], m = ad[1], n = bd[1];
  const int64_t blocks = (k + kKC - 1) / kKC;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), blocks));
  // One chunk per thread: each further chunk is one more scratch matrix to write and add.
  // (Two per thread with a one-thread sum were 4-12 % slower on the benchmark's shapes.) A
  // helper that starts late finds its chunk run by the caller.
  const int64_t chunks = threads;
  thread_local std::vector<float> scratch_buffer;  // the calling thread's
  float* scratch = AtLeast(scratch_buffer, (chunks - 1) * m * n);
  const float* pa = a.typed_data();
  const float* pb = b.typed_data();
  float* out = c->typed_data();
  ParallelFor(pool, chunks, threads, [=](int64_t i) {
    const int64_t begin = kKC * (blocks * i / chunks);
    const int64_t end = std::min(k, kKC * (blocks * (i + 1) / chunks));
    WeightGradTokens(pa, pb, i == 0 ? out : scratch + (i - 1) * m * n, begin, end, m, n);
  });
  if (chunks == 1) return ffi::Error::Success();
  // The sum, by all threads, in ranges of at least 4096 elements.
  const int64_t size = m * n, ranges = std::min<int64_t>(4 * threads, (size + 4095) / 4096);
  ParallelFor(pool, ranges, threads, [=](int64_t r) {
    const int64_t begin = size * r / ranges, end = size * (r + 1) / ranges;
    for (int64_t i = 1; i < chunks; ++i) {
      const float* s = scratch + (i - 1) * size;
      for (int64_t j = begin; j < end; ++j) out[j] += s[j];
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jlearngene

XLA_FFI_DEFINE_HANDLER_SYMBOL(JlearngeneWeightGrad, jlearngene::WeightGrad,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
