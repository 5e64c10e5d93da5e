// jlearngene CPU kernel: the weight gradient of a dense layer, C = A^T B, as an XLA FFI
// handler. A (K, M) is the layer's input and B (K, N) the gradient of its output, both
// row-major with the K = tokens axis leading; C (M, N) is float32, accumulated in float32.
//
// XLA:CPU's oneDNN dot transposes A and re-blocks B on every call for this product (both
// are activations), and runs it at about half the speed of the forward products. This
// kernel reads both in place: per block of kKC tokens it packs A into kMR-column panels and
// B into kNR-column strips, and a micro-kernel keeps a tile of C in registers: 8 x 48 in 24
// registers with AVX-512, 6 x 16 in 12 registers with AVX2 (chosen by the build's flags).
// The tokens are split into two fixed chunks per thread of XLA's intra-op pool, and the
// chunks' partial C are summed in chunk order, so the result is deterministic.
// Compiled at first use by jlearngene.kernels.cpu.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The register tile: kMR rows of C by kVecs vectors of kLanes floats, all in registers.
#if defined(__AVX512F__)
using Vec = __m512;  // 32 registers: 24 accumulators, 3 of b, 1 of a
constexpr int64_t kLanes = 16, kMR = 8, kVecs = 3;
#define JLG_PS(op) _mm512_##op##_ps
#define JLG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define JLG_VECS(X, i) X(i, 0) X(i, 1) X(i, 2)
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;  // 16 registers: 12 accumulators, 2 of b, 1 of a
constexpr int64_t kLanes = 8, kMR = 6, kVecs = 2;
#define JLG_PS(op) _mm256_##op##_ps
#define JLG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define JLG_VECS(X, i) X(i, 0) X(i, 1)
#else
#error "jlearngene weight_grad needs AVX-512F or AVX2 with FMA (compile with -mavx512f or -mavx2 -mfma)"
#endif
// The vector operations, one definition for both widths (JLG_PS names the intrinsic).
inline Vec Zero() { return JLG_PS(setzero)(); }
inline Vec Load(const float* p) { return JLG_PS(loadu)(p); }
inline void Store(float* p, Vec v) { JLG_PS(storeu)(p, v); }
inline Vec Broadcast(float x) { return JLG_PS(set1)(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return JLG_PS(fmadd)(a, b, c); }
inline Vec Add(Vec a, Vec b) { return JLG_PS(add)(a, b); }
constexpr int64_t kNR = kVecs * kLanes;  // columns of C per micro-tile: 48 or 16
constexpr int64_t kKC = 128;  // tokens per block: a B strip (kKC x kNR) stays in L1

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

// c = a[k_begin:k_end]^T b[k_begin:k_end] for row-major a (K, m), b (K, n), c (m, n).
// Each block of kKC tokens is summed on its own and then added to c, so the rounding error
// grows with the number of blocks, not the number of tokens.
void WeightGradTokens(const float* a, const float* b, float* c, int64_t k_begin,
                      int64_t k_end, int64_t m, int64_t n) {
  std::fill(c, c + m * n, 0.f);
  const int64_t panels = (m + kMR - 1) / kMR;
  // Packing buffers of this thread, kept between calls (no fresh pages on every call).
  thread_local std::vector<float> a_pack, b_pack(kKC * kNR);
  if (static_cast<int64_t>(a_pack.size()) < panels * kKC * kMR) a_pack.resize(panels * kKC * kMR);
  alignas(64) float edge[kMR * kNR];
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKC) {
    const int64_t kc = std::min(kKC, k_end - k0);
    // a's block as (kc, kMR) panels, row by row of a; the last panel zero-padded. Copies of
    // a constant kMR / kNR floats compile to vector moves (a variable size calls memcpy).
    const int64_t full_panels = m / kMR, tail = m - full_panels * kMR;
    for (int64_t t = 0; t < kc; ++t) {
      const float* src = a + (k0 + t) * m;
      float* dst = a_pack.data() + t * kMR;
      for (int64_t p = 0; p < full_panels; ++p)
        std::memcpy(dst + p * kc * kMR, src + p * kMR, sizeof(float) * kMR);
      if (tail) {
        float* last = dst + full_panels * kc * kMR;
        std::memset(last, 0, sizeof(float) * kMR);
        std::memcpy(last, src + full_panels * kMR, sizeof(float) * tail);
      }
    }
    for (int64_t n0 = 0; n0 < n; n0 += kNR) {
      const int64_t nr = std::min(kNR, n - n0);
      for (int64_t t = 0; t < kc; ++t) {  // b's strip as (kc, kNR), zero-padded
        float* dst = b_pack.data() + t * kNR;
        const float* src = b + (k0 + t) * n + n0;
        if (nr == kNR) {
          std::memcpy(dst, src, sizeof(float) * kNR);
        } else {
          std::memset(dst, 0, sizeof(float) * kNR);
          std::memcpy(dst, src, sizeof(float) * nr);
        }
      }
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t m0 = p * kMR, mr = std::min(kMR, m - m0);
        const float* ap = a_pack.data() + p * kc * kMR;
        if (mr == kMR && nr == kNR) {
          MicroKernel(ap, b_pack.data(), kc, c + m0 * n + n0, n, /*accumulate=*/true);
        } else {
          MicroKernel(ap, b_pack.data(), kc, edge, kNR, /*accumulate=*/false);
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j) c[(m0 + i) * n + n0 + j] += edge[i * kNR + j];
        }
      }
    }
  }
}

// One call's work: the tokens in a fixed number of chunks, claimed from a counter by the
// calling thread and by helpers scheduled on XLA's pool. Chunk 0 writes c, chunk i > 0 its
// own scratch matrix, and c adds them in chunk order: which thread ran which chunk does not
// change a bit of the result. A helper that starts late finds nothing left, and the caller
// waits only for chunks already running, never for a task still queued.
struct Job {
  const float* a;
  const float* b;
  float* c;
  float* scratch;  // (chunks - 1) matrices of (m, n)
  int64_t k, m, n, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Run() {
    const int64_t blocks = (k + kKC - 1) / kKC;
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_acq_rel)) < chunks;) {
      float* out = i == 0 ? c : scratch + (i - 1) * m * n;
      const int64_t begin = kKC * (blocks * i / chunks);
      const int64_t end = std::min(k, kKC * (blocks * (i + 1) / chunks));
      WeightGradTokens(a, b, out, begin, end, m, n);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
  }
};

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
  // Two chunks per thread: a helper that starts late costs at most one chunk of waiting.
  const int64_t chunks = threads > 1 ? std::min<int64_t>(2 * threads, blocks) : 1;
  // Scratch of the calling thread, kept between calls: no fresh pages on every call.
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < (chunks - 1) * m * n) scratch.resize((chunks - 1) * m * n);
  auto job = std::make_shared<Job>();
  job->a = a.typed_data();
  job->b = b.typed_data();
  job->c = c->typed_data();
  job->scratch = scratch.data();
  job->k = k;
  job->m = m;
  job->n = n;
  job->chunks = chunks;
  for (int64_t h = 1; h < threads; ++h) pool.Schedule([job] { job->Run(); });
  job->Run();
  while (job->done.load(std::memory_order_acquire) < chunks) _mm_pause();
  float* out = job->c;
  for (int64_t i = 1; i < chunks; ++i) {
    const float* s = job->scratch + (i - 1) * m * n;
    for (int64_t j = 0; j < m * n; ++j) out[j] += s[j];
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JlearngeneWeightGrad, WeightGrad,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
