// jlearngene CPU kernel: the weight gradient of a dense layer, C = A^T B, as an XLA FFI
// handler. A (K, M) is the layer's input and B (K, N) the gradient of its output, both
// row-major with the K = tokens axis leading; C (M, N) is float32, accumulated in float32.
//
// XLA:CPU's oneDNN dot transposes A and re-blocks B on every call for this product (both
// are activations), and runs it at about half the speed of the forward products. This
// kernel reads both in place: per block of kKC tokens it packs A into 8-column panels and
// B into 48-column strips, and an AVX-512 micro-kernel keeps an 8 x 48 tile of C in 24
// registers. The tokens are split into two fixed chunks per thread of XLA's intra-op pool,
// and the chunks' partial C are summed in chunk order, so the result is deterministic.
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

constexpr int64_t kMR = 8;    // rows of C per micro-tile
constexpr int64_t kNR = 48;   // columns of C per micro-tile: 3 vectors of 16 floats
constexpr int64_t kKC = 128;  // tokens per block: a B strip (kKC x kNR) stays in L1

// out[0:8, 0:48] (+)= sum_t ap[t, 0:8]^T bp[t, 0:48] over packed panels ap (kc, 8) and
// bp (kc, 48). The accumulators are named variables: GCC spills an array of them.
inline void MicroKernel(const float* ap, const float* bp, int64_t kc, float* out, int64_t ldo,
                        bool accumulate) {
#define JLG_DECLARE(i) \
  __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = c##i##0, c##i##2 = c##i##0;
  JLG_DECLARE(0) JLG_DECLARE(1) JLG_DECLARE(2) JLG_DECLARE(3)
  JLG_DECLARE(4) JLG_DECLARE(5) JLG_DECLARE(6) JLG_DECLARE(7)
#undef JLG_DECLARE
  for (int64_t t = 0; t < kc; ++t, ap += kMR, bp += kNR) {
    const __m512 b0 = _mm512_loadu_ps(bp);
    const __m512 b1 = _mm512_loadu_ps(bp + 16);
    const __m512 b2 = _mm512_loadu_ps(bp + 32);
#define JLG_FMA(i)                                 \
  {                                                \
    const __m512 a = _mm512_set1_ps(ap[i]);        \
    c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);     \
    c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1);     \
    c##i##2 = _mm512_fmadd_ps(a, b2, c##i##2);     \
  }
    JLG_FMA(0) JLG_FMA(1) JLG_FMA(2) JLG_FMA(3) JLG_FMA(4) JLG_FMA(5) JLG_FMA(6) JLG_FMA(7)
#undef JLG_FMA
  }
#define JLG_STORE(i)                                                  \
  {                                                                   \
    float* o = out + (i) * ldo;                                       \
    if (accumulate) {                                                 \
      c##i##0 = _mm512_add_ps(c##i##0, _mm512_loadu_ps(o));          \
      c##i##1 = _mm512_add_ps(c##i##1, _mm512_loadu_ps(o + 16));     \
      c##i##2 = _mm512_add_ps(c##i##2, _mm512_loadu_ps(o + 32));     \
    }                                                                 \
    _mm512_storeu_ps(o, c##i##0);                                     \
    _mm512_storeu_ps(o + 16, c##i##1);                                \
    _mm512_storeu_ps(o + 32, c##i##2);                                \
  }
  JLG_STORE(0) JLG_STORE(1) JLG_STORE(2) JLG_STORE(3)
  JLG_STORE(4) JLG_STORE(5) JLG_STORE(6) JLG_STORE(7)
#undef JLG_STORE
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
    for (int64_t p = 0; p < panels; ++p) {  // a's block as (kc, 8) panels, zero-padded
      const int64_t m0 = p * kMR, mr = std::min(kMR, m - m0);
      float* dst = a_pack.data() + p * kc * kMR;
      for (int64_t t = 0; t < kc; ++t) {
        if (mr < kMR) std::memset(dst + t * kMR, 0, sizeof(float) * kMR);
        std::memcpy(dst + t * kMR, a + (k0 + t) * m + m0, sizeof(float) * mr);
      }
    }
    for (int64_t n0 = 0; n0 < n; n0 += kNR) {
      const int64_t nr = std::min(kNR, n - n0);
      for (int64_t t = 0; t < kc; ++t) {  // b's strip as (kc, 48), zero-padded
        float* dst = b_pack.data() + t * kNR;
        if (nr < kNR) std::memset(dst, 0, sizeof(float) * kNR);
        std::memcpy(dst, b + (k0 + t) * n + n0, sizeof(float) * nr);
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
