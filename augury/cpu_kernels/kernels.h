// The kernels one augury_cpu file calls in another (decoder_layer.cpp calls the products, the norm
// and attention directly, not through the dispatcher: a layer makes a dozen such calls per step).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
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

// Whether parallel_steal lets a thread that finishes early take the others' work (on by default).
// Off gives at::parallel_for's static split: an A/B hook, set through the op augury_cpu::set_steal
// (docs/data/cpu36/sched_ab.py alternates the two in one process).
inline std::atomic<bool>& steal_on() {
  static std::atomic<bool> on{true};
  return on;
}

// Runs run(u0, u1) over [0, n) on up to at::get_num_threads() threads, at least `grain` units each.
// Each thread starts on its own contiguous share (so it streams one run of weight tiles, say) in
// chunks of 1/16 of it; one that finishes early takes chunks from the front of the others' remaining
// shares. Only for work whose units give the same bits whichever thread runs them. Why: with the
// static split and equal shares, each of a 2-core host's two threads spun in libgomp ~10% of a B=8
// decode step waiting for the other (threads run at different speeds; docs/benchmarks.md, 35th session).
template <class F>
void parallel_steal(int64_t n, int64_t grain, const F& run) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (n + grain - 1) / grain);
  if (threads <= 1 || at::in_parallel_region()) {
    run(0, n);
    return;
  }
  if (!steal_on().load(std::memory_order_relaxed)) {
    at::parallel_for(0, n, grain, run);
    return;
  }
  struct alignas(64) Share {  // a cache line each: a thread's own cursor is not shared until stolen from
    std::atomic<int64_t> next{0};
    int64_t end = 0, chunk = 1;
  };
  std::vector<Share> share(threads);
  for (int64_t i = 0; i < threads; ++i) {
    const int64_t b = n * i / threads, e = n * (i + 1) / threads;
    share[i].next.store(b, std::memory_order_relaxed);
    share[i].end = e;
    share[i].chunk = std::max<int64_t>(1, (e - b + 15) / 16);
  }
  at::parallel_for(0, threads, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = 0; k < threads; ++k) {
        Share& sh = share[(i + k) % threads];
        for (int64_t c0; (c0 = sh.next.fetch_add(sh.chunk, std::memory_order_relaxed)) < sh.end;)
          run(c0, std::min(c0 + sh.chunk, sh.end));
      }
  });
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
