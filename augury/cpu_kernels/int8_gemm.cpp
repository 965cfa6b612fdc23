// int8 weight x float activation products for few rows (CPU decode steps with --weights int8).
//
// y[m, n] = scale[n] * sum_k x[m, k] * w[n, k], w int8 [N, K] with one scale per output row (the
// Int8Linear convention), x float32 [M, K] (bf16-valued when the module's activations are bf16: each
// product is then exact in float32). torch's `_weight_int8pack_mm` ran SmolLM2's int8 decode at
// ~22 tok/s on a 2-core AVX2 EPYC, half of the step inside it (~6 GB/s of weights); here each weight
// row is widened to float32 in registers (exact) and streamed once for every activation row.
//
// Bitwise row invariance: an output element takes the same instructions in the same order whatever
// M, the row's place among them or the thread split. Per (m, n): four 8-lane accumulators over
// 32-column steps in column order (a 16-column tail into the first two), then acc0 + acc1, acc2 + acc3,
// their sum, and kernels.h's fixed 8-lane tree; the scale last. Rows are taken in pairs only to share
// the widened weights: a row's own chain does not depend on its partner. The portable path (no AVX2 +
// FMA) has its own fixed order, invariant too.

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "kernels.h"

namespace {

constexpr int64_t kAhead = 8;  // weight rows prefetched ahead of the one being multiplied

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 widen8(const int8_t* p) {  // 8 int8 -> 8 float32 (exact)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// rows m0 .. m0 + R - 1 (R = 1 or 2) of x times weight row w: R sums (before the scale)
template <int R>
inline void dot_rows(const float* x, int64_t K, const int8_t* w, float* out) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) a[r][i] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256 w0 = widen8(w + k), w1 = widen8(w + k + 8), w2 = widen8(w + k + 16), w3 = widen8(w + k + 24);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + k;
      a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a[r][0]);
      a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a[r][1]);
      a[r][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), a[r][2]);
      a[r][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), a[r][3]);
    }
  }
  if (k < K) {  // K % 16 == 0: one 16-column step left
    const __m256 w0 = widen8(w + k), w1 = widen8(w + k + 8);
    for (int r = 0; r < R; ++r) {
      a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * K + k), a[r][0]);
      a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * K + k + 8), a[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = augury_cpu::reduce8(
        _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3])), false);
}
#endif

template <typename ST>
void run(const float* x, const int8_t* w, const ST* scales, float* y, int64_t M, int64_t N, int64_t K) {
  auto rows = [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* wn = w + n * K;
      if (n + kAhead < n1)
        for (int64_t b = 0; b < K; b += 64) __builtin_prefetch(wn + kAhead * K + b, 0, 0);
      const float s = static_cast<float>(scales[n]);
      int64_t m = 0;
#if defined(__AVX2__) && defined(__FMA__)
      float d[2];
      for (; m + 2 <= M; m += 2) {
        dot_rows<2>(x + m * K, K, wn, d);
        y[m * N + n] = d[0] * s;
        y[(m + 1) * N + n] = d[1] * s;
      }
      for (; m < M; ++m) {
        dot_rows<1>(x + m * K, K, wn, d);
        y[m * N + n] = d[0] * s;
      }
#else
      for (; m < M; ++m) {
        const float* xm = x + m * K;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};  // four interleaved sums, then a fixed combine
        for (int64_t k = 0; k < K; ++k) acc[k & 3] += xm[k] * static_cast<float>(wn[k]);
        y[m * N + n] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * s;
      }
#endif
    }
  };
  at::parallel_for(0, N, 64, rows);  // one output element = one thread, start to end
}

}  // namespace

namespace augury_cpu {

// x [M, K] float32, w [N, K] int8 (K % 16 == 0), scales [N] float32 or bf16 -> [M, N] float32
at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "int8_mm: x must be [M, K] float32 contiguous");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous() && w.size(1) == x.size(1),
              "int8_mm: w must be [N, K] int8 contiguous with x's K");
  TORCH_CHECK(w.size(1) % 16 == 0, "int8_mm: K must be a multiple of 16 (Int8Linear pads it)");
  TORCH_CHECK(scales.dim() == 1 && scales.size(0) == w.size(0) && scales.is_contiguous() &&
                  (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kBFloat16),
              "int8_mm: scales must be [N] float32 or bfloat16");
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  auto y = at::empty({M, N}, x.options());
  if (scales.scalar_type() == at::kFloat)
    run(x.data_ptr<float>(), w.data_ptr<int8_t>(), scales.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
  else
    run(x.data_ptr<float>(), w.data_ptr<int8_t>(), scales.data_ptr<c10::BFloat16>(), y.data_ptr<float>(), M, N,
        K);
  return y;
}

}  // namespace augury_cpu

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("int8_mm(Tensor x, Tensor w, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("int8_mm", &augury_cpu::int8_mm);
}
