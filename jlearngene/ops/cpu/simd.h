// jlearngene CPU kernels: the vector type and operations for the build's instruction set,
// one definition for AVX-512 and AVX2 (JLG_PS names the intrinsic), the work-sharing of one
// FFI call over XLA's intra-op thread pool, and the kernels' per-thread buffers.
#ifndef JLEARNGENE_KERNELS_SIMD_H_
#define JLEARNGENE_KERNELS_SIMD_H_

#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jlearngene {

#if defined(__AVX512F__)
using Vec = __m512;
using IVec = __m512i;
constexpr int64_t kLanes = 16;
#define JLG_PS(op) _mm512_##op##_ps
#define JLG_EPI32(op) _mm512_##op##_epi32
inline Vec RoundNearest(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT); }
inline Vec AsFloat(IVec x) { return _mm512_castsi512_ps(x); }
inline IVec ToInt(Vec x) { return _mm512_cvtps_epi32(x); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
using IVec = __m256i;
constexpr int64_t kLanes = 8;
#define JLG_PS(op) _mm256_##op##_ps
#define JLG_EPI32(op) _mm256_##op##_epi32
inline Vec RoundNearest(Vec x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline Vec AsFloat(IVec x) { return _mm256_castsi256_ps(x); }
inline IVec ToInt(Vec x) { return _mm256_cvtps_epi32(x); }
#else
#error "jlearngene CPU kernels need AVX-512F or AVX2 with FMA (compile with -mavx512f or -mavx2 -mfma)"
#endif

inline Vec Zero() { return JLG_PS(setzero)(); }
inline Vec Load(const float* p) { return JLG_PS(loadu)(p); }
inline void Store(float* p, Vec v) { JLG_PS(storeu)(p, v); }
inline Vec Broadcast(float x) { return JLG_PS(set1)(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return JLG_PS(fmadd)(a, b, c); }
inline Vec Add(Vec a, Vec b) { return JLG_PS(add)(a, b); }
inline Vec Sub(Vec a, Vec b) { return JLG_PS(sub)(a, b); }
inline Vec Mul(Vec a, Vec b) { return JLG_PS(mul)(a, b); }
inline Vec Div(Vec a, Vec b) { return JLG_PS(div)(a, b); }
inline Vec Max(Vec a, Vec b) { return JLG_PS(max)(a, b); }

// exp(x) in float32 (Cephes' expf: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, 2^n through the exponent bits); relative error about 1e-7 for x in
// [-87, 88], 0 below -87.3 (the float32 range; softmax arguments are <= 0).
inline Vec Exp(Vec x) {
  x = Max(x, Broadcast(-87.3365447f));
  x = JLG_PS(min)(x, Broadcast(88.3762626f));
  const Vec n = RoundNearest(Mul(x, Broadcast(1.44269504088896341f)));
  Vec r = Fma(n, Broadcast(-0.693359375f), x);  // ln2 in two parts: exact n * hi
  r = Fma(n, Broadcast(2.12194440e-4f), r);
  Vec p = Broadcast(1.9875691500e-4f);
  p = Fma(p, r, Broadcast(1.3981999507e-3f));
  p = Fma(p, r, Broadcast(8.3334519073e-3f));
  p = Fma(p, r, Broadcast(4.1665795894e-2f));
  p = Fma(p, r, Broadcast(1.6666665459e-1f));
  p = Fma(p, r, Broadcast(5.0000001201e-1f));
  p = Fma(Mul(p, r), r, Add(r, Broadcast(1.f)));
  // 2^n: n + 127 in the exponent field (n >= -126 here, so the result is normal or 0-ish).
  const IVec e = JLG_EPI32(slli)(JLG_EPI32(add)(ToInt(n), JLG_EPI32(set1)(127)), 23);
  return Mul(p, AsFloat(e));
}

// buffer's data, grown to at least n floats. The kernels' buffers are thread_local vectors
// passed through here, kept between calls: no fresh pages on every call.
inline float* AtLeast(std::vector<float>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

// Runs task(i) for i in [0, n) on the calling thread and helpers scheduled on XLA's pool;
// returns when all are done. Tasks are claimed from a counter: a helper that starts late
// finds nothing left, and the caller waits only for tasks already running, never for a
// helper still queued. The state is shared with the helpers, so a late one touches nothing
// of the caller's frame.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, int64_t threads,
                        std::function<void(int64_t)> task) {
  struct State {
    std::function<void(int64_t)> task;
    int64_t n;
    std::atomic<int64_t> next{0}, done{0};
    void Run() {
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_acq_rel)) < n;) {
        task(i);
        done.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  };
  auto state = std::make_shared<State>();
  state->task = std::move(task);
  state->n = n;
  for (int64_t h = 1; h < threads; ++h) pool.Schedule([state] { state->Run(); });
  state->Run();
  while (state->done.load(std::memory_order_acquire) < n) _mm_pause();
}

}  // namespace jlearngene

#endif  // JLEARNGENE_KERNELS_SIMD_H_
