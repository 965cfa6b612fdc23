// RMS normalization of rows, x * 1 / sqrt(mean(x^2) + eps), without the weight (callers scale).
//
// Why native: eager decode steps on the CPU call RMSNorm twice per layer, and torch's rms_norm costs
// ~15 us on a 576-wide row (several ops and dispatches); this is one call. Each row is summed in one
// fixed order whatever the number of rows, so rows stay bitwise invariant (a verify-window row gets
// the bits of its own decode step). Compiled graphs keep torch's op, which inductor fuses.

#include <torch/library.h>
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "kernels.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

void norm_row(const float* x, float* y, int64_t D, float eps) {
  float ss;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= D; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  ss = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  // 8 lanes, then a fixed tree (kernels.h reduce8): a serial chain of D FMAs was ~0.8 us
  // on a 576-wide row, twice a layer per row (~0.4 ms of an 8-row SmolLM2 step)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= D; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  ss = augury_cpu::reduce8(acc, false);
#else
  ss = 0.0f;
#endif
  for (; i < D; ++i) ss = std::fma(x[i], x[i], ss);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
  i = 0;
#if defined(__AVX512F__)
  const __m512 rv = _mm512_set1_ps(r);
  for (; i + 16 <= D; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), rv));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 rv = _mm256_set1_ps(r);
  for (; i + 8 <= D; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), rv));
#endif
  for (; i < D; ++i) y[i] = x[i] * r;
}

}  // namespace

namespace augury_cpu {

void rms_norm_rows(const float* x, float* y, int64_t rows, int64_t D, float eps) {
  // one thread: a decode step's rows are a few kilobytes, less than a parallel region costs
  for (int64_t r = 0; r < rows; ++r) norm_row(x + r * D, y + r * D, D, eps);
}

at::Tensor rms_norm(const at::Tensor& x, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "rms_norm: x must be [rows, D] float32 contiguous");
  auto y = at::empty_like(x);
  rms_norm_rows(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), static_cast<float>(eps));
  return y;
}

}  // namespace augury_cpu

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("rms_norm(Tensor x, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("rms_norm", &augury_cpu::rms_norm);
}
