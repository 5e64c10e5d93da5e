// jlearngene CPU kernels: multi-head softmax attention, forward and backward, as XLA FFI
// handlers. Both read q, k and v from the fused projection's output qkv (B, T, 3, H, Dh); the
// forward writes o (B, T, H, Dh), the layout the output projection reads, and the
// probabilities (B, H, T, T); the backward takes those probabilities and dO and writes dqkv
// in qkv's layout, the layout of the projection's gradient (no concatenate).
//
// XLA:CPU runs this core as six small batched products (T x T x Dh per head) with
// transposes, a concatenate and softmax passes between them, at about a third of the dense
// layers' speed. Here each (batch, head) is one task on XLA's intra-op pool: its q, k, v (and
// dO) are copied into contiguous tiles that stay in L1/L2, and every product runs through
// one register-tiled micro-kernel that reads its left operand in place or transposed. The
// arithmetic is float32: logits = (q k^T) scale, probs = exp(logits - max) / sum,
// o = probs v; backward dlogits = probs (dprobs - sum(probs dprobs)), dq = (dlogits scale) k,
// dk = (dlogits scale)^T q. Against the model's definition ((q scale) k^T) only the
// summation order differs where the scale is a power of 2 (Dh a power of 4), and the
// scale's rounding elsewhere. Compiled at first use by jlearngene.ops.cpu.library.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "simd.h"

namespace ffi = xla::ffi;

namespace jlearngene {
namespace {

// Rows of the register tile (of C); it is kRows x (V vectors) with V = 2, or 1 at a tail.
#if defined(__AVX512F__)
constexpr int64_t kRows = 8;  // 16 accumulators, 2 of b, 1 of a
#else
constexpr int64_t kRows = 6;  // 12 accumulators, 2 of b, 1 of a
#endif

inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A matrix operand read in place: element (r, t) is at data[r * rs + t * cs], so a row-major
// matrix and the transpose of one are both read without copying.
struct Operand {
  const float* data;
  int64_t rs, cs;
};

// c[0:rows, 0:V*kLanes] = sum_{t<k} A(r, t) b[t, :] for rows <= kRows, b row-major with row
// stride ldb. A tile of fewer rows reads A's last row in place of the missing ones and
// keeps those results in registers: nothing outside A's rows is read or C's rows written.
template <int V>
inline void Tile(Operand a, int64_t rows, const float* b, int64_t ldb, int64_t k, float* c,
                 int64_t ldc) {
  int64_t offset[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) offset[r] = std::min<int64_t>(r, rows - 1) * a.rs;
  Vec acc[kRows][V];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = Zero();
  const float* at = a.data;
  for (int64_t t = 0; t < k; ++t, at += a.cs, b += ldb) {
    Vec bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = Load(b + v * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const Vec av = Broadcast(at[offset[r]]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = Fma(av, bv[v], acc[r][v]);
    }
  }
  if (rows == kRows) {
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) Store(c + r * ldc + v * kLanes, acc[r][v]);
  } else {
    alignas(64) float edge[kRows][V * kLanes];
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) Store(edge[r] + v * kLanes, acc[r][v]);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(c + r * ldc, edge[r], sizeof(float) * V * kLanes);
  }
}

// C (m x n, row stride ldc) = A (m x k) B (k x n, row stride ldb); n a multiple of kLanes.
void Gemm(Operand a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m, int64_t n,
          int64_t k) {
  for (int64_t j = 0; j < n;) {
    const bool wide = n - j >= 2 * kLanes;
    for (int64_t i = 0; i < m; i += kRows) {
      const Operand ai{a.data + i * a.rs, a.rs, a.cs};
      const int64_t rows = std::min(kRows, m - i);
      if (wide)
        Tile<2>(ai, rows, b + j, ldb, k, c + i * ldc + j, ldc);
      else
        Tile<1>(ai, rows, b + j, ldb, k, c + i * ldc + j, ldc);
    }
    j += wide ? 2 * kLanes : kLanes;
  }
}

// The shapes of one call; `cols` is T rounded up to whole vectors (the local T x T tiles'
// row length, zero beyond T).
struct Shape {
  int64_t batch, tokens, heads, dim;  // B, T, H, Dh
  int64_t cols;
  Shape(int64_t b, int64_t t, int64_t h, int64_t d)
      : batch(b), tokens(t), heads(h), dim(d), cols(RoundUp(t, kLanes)) {}
  int64_t QkvStride() const { return 3 * heads * dim; }  // between tokens in qkv
  int64_t OutStride() const { return heads * dim; }      // between tokens in o
  // Token 0 of part (0 q, 1 k, 2 v) of head h of batch element b in qkv, and of o.
  int64_t Qkv(int64_t b, int64_t part, int64_t h) const {
    return (b * tokens * 3 + part) * heads * dim + h * dim;
  }
  int64_t Out(int64_t b, int64_t h) const { return b * tokens * heads * dim + h * dim; }
};

// This thread's scratch of at least n floats.
float* Scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  return AtLeast(buffer, n);
}

// dst (tokens x dim, contiguous) <- `tokens` rows of dim floats at src + t * stride. Products
// read their operands from these copies: in place, rows that far apart map to a few cache
// sets and evict each other.
void CopyRows(const Shape& s, const float* src, int64_t stride, float* dst) {
  for (int64_t t = 0; t < s.tokens; ++t)
    std::memcpy(dst + t * s.dim, src + t * stride, sizeof(float) * s.dim);
}

// Asks for `tokens` rows of dim floats at src + t * stride to be brought into the cache: the
// next head's operands, while this one computes. Rows this far apart are each in another
// page, where the hardware prefetcher does not follow.
void PrefetchRows(const Shape& s, const float* src, int64_t stride) {
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t d = 0; d < s.dim; d += 64 / sizeof(float))
      _mm_prefetch(reinterpret_cast<const char*>(src + t * stride + d), _MM_HINT_T0);
}

// dst (dim x cols) <- the transpose of src (tokens x dim), zero beyond `tokens`.
void Transpose(const Shape& s, const float* src, float* dst) {
  for (int64_t d = 0; d < s.dim; ++d)
    std::fill(dst + d * s.cols + s.tokens, dst + (d + 1) * s.cols, 0.f);
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t d = 0; d < s.dim; ++d) dst[d * s.cols + t] = src[t * s.dim + d];
}

float HorizontalMax(Vec v) {
  alignas(64) float lanes[kLanes];
  Store(lanes, v);
  return *std::max_element(lanes, lanes + kLanes);
}

float HorizontalSum(Vec v) {
  alignas(64) float lanes[kLanes];
  Store(lanes, v);
  float sum = 0.f;
  for (int64_t i = 0; i < kLanes; ++i) sum += lanes[i];
  return sum;
}

// probs = softmax(scale * x) over the first `tokens` columns of each row of x (tokens x
// cols), in place; columns beyond `tokens` become 0.
void Softmax(const Shape& s, float scale, float* x) {
  const Vec vscale = Broadcast(scale);
  const int64_t full = s.tokens / kLanes * kLanes;  // columns in whole vectors of logits
  for (int64_t i = 0; i < s.tokens; ++i) {
    float* row = x + i * s.cols;
    // Scale the row and take the maximum of its whole vectors in one pass.
    Vec vmax = Broadcast(row[0] * scale);
    for (int64_t j = 0; j < s.cols; j += kLanes) {
      const Vec v = Mul(Load(row + j), vscale);
      Store(row + j, v);
      if (j < full) vmax = Max(vmax, v);
    }
    float max = HorizontalMax(vmax);
    for (int64_t j = full; j < s.tokens; ++j) max = std::max(max, row[j]);
    vmax = Broadcast(max);
    for (int64_t j = 0; j < s.cols; j += kLanes) Store(row + j, Exp(Sub(Load(row + j), vmax)));
    std::fill(row + s.tokens, row + s.cols, 0.f);
    Vec vsum = Zero();
    for (int64_t j = 0; j < s.cols; j += kLanes) vsum = Add(vsum, Load(row + j));
    const Vec total = Broadcast(HorizontalSum(vsum));
    for (int64_t j = 0; j < s.cols; j += kLanes) Store(row + j, Div(Load(row + j), total));
  }
}

// A head's local copies: q, k, v, dO (tokens x dim), k^T or v^T (dim x cols), P and dP
// (tokens x cols).
struct Tiles {
  float *q, *k, *v, *d_o, *t, *p, *dp;
  explicit Tiles(const Shape& s) {
    const int64_t rows = s.tokens * s.dim, square = s.tokens * s.cols;
    q = Scratch(4 * rows + s.dim * s.cols + 2 * square);
    k = q + rows;
    v = k + rows;
    d_o = v + rows;
    t = d_o + rows;
    p = t + s.dim * s.cols;
    dp = p + square;
  }
};

// Prefetches the q, k and v rows of head `task` (if < n).
void PrefetchQkv(const Shape& s, const float* qkv, int64_t task, int64_t n) {
  if (task >= n) return;
  for (int64_t part = 0; part < 3; ++part)
    PrefetchRows(s, qkv + s.Qkv(task / s.heads, part, task % s.heads), s.QkvStride());
}

void ForwardHead(const Shape& s, float scale, const float* qkv, float* out, float* probs,
                 int64_t task, int64_t next) {
  const int64_t b = task / s.heads, h = task % s.heads, stride = s.QkvStride();
  const Tiles l(s);
  CopyRows(s, qkv + s.Qkv(b, 0, h), stride, l.q);
  CopyRows(s, qkv + s.Qkv(b, 1, h), stride, l.k);
  CopyRows(s, qkv + s.Qkv(b, 2, h), stride, l.v);
  PrefetchQkv(s, qkv, next, s.batch * s.heads);
  Transpose(s, l.k, l.t);
  // logits = (q k^T) * scale, the scale applied in the softmax (exact for Dh a power of 4)
  Gemm({l.q, s.dim, 1}, l.t, s.cols, l.p, s.cols, s.tokens, s.cols, s.dim);
  Softmax(s, scale, l.p);
  float* pr = probs + task * s.tokens * s.tokens;
  for (int64_t i = 0; i < s.tokens; ++i)
    std::memcpy(pr + i * s.tokens, l.p + i * s.cols, sizeof(float) * s.tokens);
  Gemm({l.p, s.cols, 1}, l.v, s.dim, out + s.Out(b, h), s.OutStride(), s.tokens, s.dim, s.tokens);
}

void BackwardHead(const Shape& s, float scale, const float* qkv, const float* probs,
                  const float* d_out, float* d_qkv, int64_t task, int64_t next) {
  const int64_t b = task / s.heads, h = task % s.heads, stride = s.QkvStride();
  const Tiles l(s);
  CopyRows(s, qkv + s.Qkv(b, 0, h), stride, l.q);
  CopyRows(s, qkv + s.Qkv(b, 1, h), stride, l.k);
  CopyRows(s, qkv + s.Qkv(b, 2, h), stride, l.v);
  CopyRows(s, d_out + s.Out(b, h), s.OutStride(), l.d_o);
  PrefetchQkv(s, qkv, next, s.batch * s.heads);
  if (next < s.batch * s.heads)
    PrefetchRows(s, d_out + s.Out(next / s.heads, next % s.heads), s.OutStride());
  Transpose(s, l.v, l.t);
  const float* pr = probs + task * s.tokens * s.tokens;
  for (int64_t i = 0; i < s.tokens; ++i) {
    std::memcpy(l.p + i * s.cols, pr + i * s.tokens, sizeof(float) * s.tokens);
    std::fill(l.p + i * s.cols + s.tokens, l.p + (i + 1) * s.cols, 0.f);
  }
  // dV = P^T dO; dP = dO V^T
  Gemm({l.p, 1, s.cols}, l.d_o, s.dim, d_qkv + s.Qkv(b, 2, h), stride, s.tokens, s.dim, s.tokens);
  Gemm({l.d_o, s.dim, 1}, l.t, s.cols, l.dp, s.cols, s.tokens, s.cols, s.dim);
  // dlogits * scale = P (dP - sum(P dP)) * scale, in place of dP (0 where P is padding)
  const Vec vscale = Broadcast(scale);
  for (int64_t i = 0; i < s.tokens; ++i) {
    float* dpi = l.dp + i * s.cols;
    const float* pi = l.p + i * s.cols;
    Vec vsum = Zero();
    for (int64_t j = 0; j < s.cols; j += kLanes) vsum = Fma(Load(pi + j), Load(dpi + j), vsum);
    const Vec total = Broadcast(HorizontalSum(vsum));
    for (int64_t j = 0; j < s.cols; j += kLanes)
      Store(dpi + j, Mul(Mul(Load(pi + j), Sub(Load(dpi + j), total)), vscale));
  }
  // dq = (dlogits scale) k; dk = (dlogits scale)^T q
  Gemm({l.dp, s.cols, 1}, l.k, s.dim, d_qkv + s.Qkv(b, 0, h), stride, s.tokens, s.dim, s.tokens);
  Gemm({l.dp, 1, s.cols}, l.q, s.dim, d_qkv + s.Qkv(b, 1, h), stride, s.tokens, s.dim, s.tokens);
}

// The Shape of qkv (B, T, 3, H, Dh); false where it has another rank, no axis of 3, or Dh
// is not a whole number of vectors.
bool QkvShape(const ffi::Buffer<ffi::F32>& qkv, Shape* shape) {
  const auto d = qkv.dimensions();
  if (d.size() != 5 || d[2] != 3 || d[4] % kLanes) return false;
  *shape = Shape(d[0], d[1], d[3], d[4]);
  return true;
}

ffi::Error BadQkv() {
  return ffi::Error::InvalidArgument(
      "jlearngene attention: expected qkv of shape (B, T, 3, H, Dh) with Dh a multiple of " +
      std::to_string(kLanes));
}

// Runs head(task, next) for every (batch, head) task: chunks of kChunk consecutive heads
// are shared out by ParallelFor, so that each head knows the next one it will run (`next`,
// or the task count after its chunk's last) and can prefetch its operands.
constexpr int64_t kChunk = 8;

template <typename Head>
void ForEachHead(ffi::ThreadPool& pool, const Shape& s, Head head) {
  const int64_t tasks = s.batch * s.heads, chunks = (tasks + kChunk - 1) / kChunk;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), chunks));
  ParallelFor(pool, chunks, threads, [=](int64_t c) {
    const int64_t end = std::min(tasks, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) head(i, i + 1 < end ? i + 1 : tasks);
  });
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> qkv, float scale,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> probs) {
  Shape s(0, 0, 0, 0);
  if (!QkvShape(qkv, &s)) return BadQkv();
  const float* q = qkv.typed_data();
  float* o = out->typed_data();
  float* p = probs->typed_data();
  ForEachHead(pool, s, [=](int64_t i, int64_t next) { ForwardHead(s, scale, q, o, p, i, next); });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> qkv, ffi::Buffer<ffi::F32> probs,
                    ffi::Buffer<ffi::F32> d_out, float scale, ffi::ResultBuffer<ffi::F32> d_qkv) {
  Shape s(0, 0, 0, 0);
  if (!QkvShape(qkv, &s)) return BadQkv();
  const float* q = qkv.typed_data();
  const float* p = probs.typed_data();
  const float* g = d_out.typed_data();
  float* dq = d_qkv->typed_data();
  ForEachHead(pool, s,
              [=](int64_t i, int64_t next) { BackwardHead(s, scale, q, p, g, dq, i, next); });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jlearngene

XLA_FFI_DEFINE_HANDLER_SYMBOL(JlearngeneAttentionForward, jlearngene::Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JlearngeneAttentionBackward, jlearngene::Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());
