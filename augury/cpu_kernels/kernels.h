// The kernels one augury_cpu file calls in another (decoder_layer.cpp calls the products, the norm
// and attention directly, not through the dispatcher: a layer makes a dozen such calls per step).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace augury_cpu {

// An A/B switch from the environment: on unless it is set to a value starting with '0'. Callers keep
// the answer in a function-local static (read once per process), so no kernel call pays for getenv.
inline bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && e[0] == '0');
}

// Memory a product warms into L2 while it runs, for whatever reads it next: decoder_layer.cpp
// passes the next layer's K/V slots to the products between a layer's attention and the next
// one's, so that attention finds its keys in cache rather than in DRAM (a decode step's K/V is cold:
// the weights streamed through the caches since the last step). Byte ranges as 64-byte lines,
// merged when contiguous; a product prefetches lines [first, first + count), each of its threads
// an equal share, one line per weight block it multiplies (int4_gemm.cpp kWarmLinesPerBlock).
struct WarmRanges {
  std::vector<const char*> start;  // 64-byte aligned
  std::vector<int64_t> lines;
  int64_t total = 0;
  int64_t first = 0, count = 0;  // the window the next product prefetches
  void add(const void* p, int64_t bytes) {
    if (bytes <= 0) return;
    const auto a = reinterpret_cast<uintptr_t>(p), lo = a & ~uintptr_t(63), hi = (a + bytes + 63) & ~uintptr_t(63);
    const int64_t n = static_cast<int64_t>((hi - lo) / 64);
    if (!start.empty() && reinterpret_cast<uintptr_t>(start.back()) + 64 * lines.back() == lo) {
      lines.back() += n;
    } else {
      start.push_back(reinterpret_cast<const char*>(lo));
      lines.push_back(n);
    }
    total += n;
  }
  // the next product's window: the `capacity` lines after the previous window
  void next_window(int64_t capacity) {
    first += count;
    count = std::max<int64_t>(0, std::min(capacity, total - first));
  }
};

#if defined(__AVX2__)
// attention.cpp, rms_norm.cpp, int8_gemm.cpp: 8 float lanes combined by a fixed tree (halves, then
// pairs, then the last two), so a sum's bits depend only on its lanes
inline float reduce8(__m256 v, bool take_max) {
  __m128 h = take_max ? _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
                      : _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 s = _mm_movehl_ps(h, h);
  h = take_max ? _mm_max_ps(h, s) : _mm_add_ps(h, s);
  s = _mm_shuffle_ps(h, h, 0x55);
  return _mm_cvtss_f32(take_max ? _mm_max_ss(h, s) : _mm_add_ss(h, s));
}
#endif

// int4_gemm.cpp: x [M, K] float32 -> [M, N] float32; `warm`: its window of lines to prefetch meanwhile
// (or null). int4_warm_capacity: how many lines one such call prefetches at most (one per block it runs).
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t group_size,
                   const WarmRanges* warm = nullptr);
int64_t int4_warm_capacity(const at::Tensor& packed, int64_t rows);

// rms_norm.cpp: rows of D floats, y = x / sqrt(mean(x^2) + eps) (the op rms_norm, on raw rows)
void rms_norm_rows(const float* x, float* y, int64_t rows, int64_t D, float eps);

// attention.cpp: q [T, H, D]; pools [S, Hkv, D] -> [T, H, D] in q's dtype
at::Tensor paged_attention_rows(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                const at::Tensor& gather_slots, const at::Tensor& rows, double scale, bool parallel);

}  // namespace augury_cpu
