// Few-query attention straight from the paged KV pools (CPU decode steps, speculative verify
// windows, small decode batches).
//
// Row t of q [T, H, D] belongs to request b = rows[t, 0] and sees the keys whose pool slots are
// gather_slots[b, lo:hi) (lo = rows[t, 1], hi = rows[t, 2]: its causal / sliding-window range).
// For every (row, KV head) pair the `rep = H / Hkv` query heads sharing that KV head (GQA: query
// head h reads KV head h / rep) are computed together, so each K/V row is loaded once for all of
// them:
//   pass 1: s[r][j] = scale * dot(q_r, k_j) for j in [0, L), L = hi - lo, in float32
//   pass 2: m_r = max_j s[r][j]; p = exp(s - m_r); l_r = sum_j p   (float32)
//   pass 3: o_r = (sum_j p[r][j] * v_j) / l_r                       (float32, one rounding at the end)
//
// Bitwise batch invariance by construction: a pair's result depends only on its query row, its
// own keys in order and L. The reduction orders are fixed functions of L (blocks of 16 keys
// counted from the row's first key; a dot product's lanes summed by a fixed tree), never of T,
// of the row's place in the call, of other rows, of where lo sits in gather_slots, or of the
// thread split (one pair is computed by one thread, start to end; on the AVX2 path the unit is one
// (row, query head), whose arithmetic does not depend on the heads computed beside it, so a split
// may cut a row's heads anywhere). So a verify-window row gets
// the bits a lone one-token decode step gets for it, and speculative decoding stays exactly plain
// greedy. Slots outside [lo, hi) are never read, so garbage (NaN) past a request's range cannot
// leak into it.
//
// Pools are float32 or bfloat16 ([num_slots, Hkv, D], contiguous), q the same or the other of the
// two; the output has q's dtype. The AVX-512 path needs D % 16 == 0, the AVX2 path (x86 without
// AVX-512) D % 8 == 0; everything else takes the portable scalar path (same math, its own fixed
// order). Each path is bitwise invariant on its own; `attention_isa()` names the one compiled.

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels.h"

#if defined(__AVX512F__)
#define AUGURY_ATTN_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define AUGURY_ATTN_AVX2 1
#include <immintrin.h>
#endif

namespace {

inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) { return static_cast<float>(x); }

// ---------------------------------------------------------------------------------------------
// Portable path: one (row, KV head) pair, scalar float32 in plain index order.
template <typename KT>
void pair_scalar(const float* q, int rep, int64_t D, const KT* kp, const KT* vp, const int64_t* slots, int64_t L,
                 int64_t slot_stride, float scale, float* s, float* out) {
  for (int r = 0; r < rep; ++r) {
    const float* qr = q + r * D;
    float* sr = s + r * L;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < L; ++j) {
      const KT* k = kp + slots[j] * slot_stride;
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc += qr[d] * to_f(k[d]);
      sr[j] = acc * scale;
      m = std::max(m, sr[j]);
    }
    float l = 0.f;
    for (int64_t j = 0; j < L; ++j) {
      sr[j] = std::exp(sr[j] - m);
      l += sr[j];
    }
    float* o = out + r * D;
    std::fill(o, o + D, 0.f);
    for (int64_t j = 0; j < L; ++j) {
      const KT* v = vp + slots[j] * slot_stride;
      for (int64_t d = 0; d < D; ++d) o[d] += sr[j] * to_f(v[d]);
    }
    for (int64_t d = 0; d < D; ++d) o[d] /= l;
  }
}

#if defined(AUGURY_ATTN_AVX512) || defined(AUGURY_ATTN_AVX2)
// Software prefetch of the first `bytes` bytes of pool slots [j0, j1) from `base` (slot_bytes apart),
// into L1, or into L2 where the rows are needed later. A decode step finds the pools cold (the layer's
// weights streamed through the caches since the last step), and a head's rows alone are a strided
// pattern the hardware prefetchers follow poorly.
template <bool ToL2 = false>
inline void prefetch_slots(const char* base, const int64_t* slots, int64_t j0, int64_t j1, int64_t slot_bytes,
                           int64_t bytes) {
  for (int64_t j = j0; j < j1; ++j) {
    const char* row = base + slots[j] * slot_bytes;
    for (int64_t b = 0; b < bytes; b += 64) {
      if constexpr (ToL2)
        _mm_prefetch(row + b, _MM_HINT_T1);
      else
        _mm_prefetch(row + b, _MM_HINT_T0);
    }
  }
}
#endif

#ifdef AUGURY_ATTN_AVX512
// ---------------------------------------------------------------------------------------------
// AVX-512 path.

// Software prefetch on the AVX-512 path (AUGURY_ATTN_PREFETCH=0 turns it off; the bits are the same either
// way). A decode step finds the pools cold, and a pair reads its KV head's 256-byte slice of scattered slots,
// a pattern the hardware prefetchers follow poorly: pass 1 asks for K rows kPfKeys keys ahead into L1 and for
// the V rows of the keys it scores into L2, so pass 3 finds them there. Measured on a 2-core Zen 4 host,
// SmolLM2's shapes at B=8, 30 layers of cold pools: 85.0 -> 71.0 us a layer at 96 keys, 268 -> 214 at 300
// (docs/benchmarks.md, twenty-ninth session).
constexpr int64_t kPfKeys = 16;
bool prefetch_on() {
  static const bool on = augury_cpu::env_switch_on("AUGURY_ATTN_PREFETCH");
  return on;
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // bf16 -> f32 is exact: the bits move up 16
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp for x <= 0 (softmax after max subtraction): Cephes' expf polynomial on the reduced argument,
// scaled by 2^n with scalef (which underflows to 0 cleanly). ~1 ulp.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// a[0..15] (one accumulator per key) -> one vector whose lane i is the lane sum of a[perm[i]]:
// a transpose-and-add tree (each output lane sums only its own key's lanes, in a fixed order,
// so a key's score does not depend on the other keys of its block). `kPerm` undoes the tree's
// lane order; it is measured once at start-up (see key_order()).
inline __m512 hsum16(__m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: key i in the low half, key i + 8 in the high
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lanes
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[i], b[i + 4], 0x88), _mm512_shuffle_f32x4(b[i], b[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // pairs of floats
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[i], c[i + 2], 0x44), _mm512_shuffle_ps(c[i], c[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

// The permutation putting hsum16's output lanes back in key order, found by running it on
// one-hot inputs (so it cannot disagree with the shuffles above).
__m512i key_order() {
  alignas(64) float lanes[16];
  __m512 a[16];
  for (int i = 0; i < 16; ++i) {
    std::fill(lanes, lanes + 16, 0.f);
    lanes[0] = static_cast<float>(i);
    a[i] = _mm512_load_ps(lanes);
  }
  _mm512_store_ps(lanes, hsum16(a));
  alignas(64) int32_t idx[16];
  for (int i = 0; i < 16; ++i) idx[static_cast<int>(lanes[i])] = i;
  return _mm512_load_si512(idx);
}

// pass 1 for one query head: s[j] = scale * q . k_j, 16 keys at a time
template <typename KT>
void scores16(const float* q, int64_t D, const KT* kp, const int64_t* slots, int64_t L, int64_t slot_stride,
              float scale, __m512i perm, float* s, int64_t pf_bytes = 0, const KT* vpf = nullptr) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const int64_t slot_bytes = slot_stride * static_cast<int64_t>(sizeof(KT));
  for (int64_t j0 = 0; j0 < L; j0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, L - j0));
    if (pf_bytes) {
      prefetch_slots(reinterpret_cast<const char*>(kp), slots, j0 + kPfKeys, std::min(L, j0 + kPfKeys + 16),
                     slot_bytes, pf_bytes);
      if (vpf) prefetch_slots<true>(reinterpret_cast<const char*>(vpf), slots, j0, j0 + n, slot_bytes, pf_bytes);
    }
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      __m512 qd = _mm512_loadu_ps(q + d);
      for (int i = 0; i < n; ++i)
        acc[i] = _mm512_fmadd_ps(qd, load16(kp + slots[j0 + i] * slot_stride + d), acc[i]);
    }
    __m512 sum = _mm512_permutexvar_ps(perm, hsum16(acc));
    _mm512_mask_storeu_ps(s + j0, static_cast<__mmask16>((1u << n) - 1), _mm512_mul_ps(sum, vscale));
  }
}

// pass 3 for query heads [r0, r0 + NR), D columns [d0, d0 + 16 * NC): acc += p[r][j] * v_j
// (pf_bytes > 0: each V row's first pf_bytes asked for kPfKeys keys ahead)
template <int NR, int NC, typename KT>
void pv_tile(const float* s, int64_t L, const KT* vp, const int64_t* slots, int64_t slot_stride, int64_t d0,
             float* out, int64_t D, int64_t pf_bytes = 0) {
  __m512 acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < L; ++j) {
    const KT* v = vp + slots[j] * slot_stride + d0;
    if (pf_bytes && j + kPfKeys < L)
      prefetch_slots(reinterpret_cast<const char*>(vp), slots, j + kPfKeys, j + kPfKeys + 1,
                     slot_stride * static_cast<int64_t>(sizeof(KT)), pf_bytes);
    __m512 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load16(v + 16 * c);
    for (int r = 0; r < NR; ++r) {
      __m512 p = _mm512_set1_ps(s[r * L + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + r * D + d0 + 16 * c, acc[r][c]);
}

template <int NC, typename KT>
void pv_heads(const float* s, int rep, int64_t L, const KT* vp, const int64_t* slots, int64_t slot_stride,
              int64_t d0, float* out, int64_t D, int64_t pf_bytes = 0) {
  int r = 0;
  for (; r + 3 <= rep; r += 3, pf_bytes = 0)
    pv_tile<3, NC>(s + r * L, L, vp, slots, slot_stride, d0, out + r * D, D, pf_bytes);
  if (rep - r == 2) pv_tile<2, NC>(s + r * L, L, vp, slots, slot_stride, d0, out + r * D, D, pf_bytes);
  if (rep - r == 1) pv_tile<1, NC>(s + r * L, L, vp, slots, slot_stride, d0, out + r * D, D, pf_bytes);
}

template <typename KT>
void pair_avx512(const float* q, int rep, int64_t D, const KT* kp, const KT* vp, const int64_t* slots, int64_t L,
                 int64_t slot_stride, float scale, __m512i perm, float* s, float* lsum, float* out, bool pf = false) {
  const int64_t esz = static_cast<int64_t>(sizeof(KT)), row_bytes = D * esz, slot_bytes = slot_stride * esz;
  if (pf) prefetch_slots(reinterpret_cast<const char*>(kp), slots, 0, std::min(L, kPfKeys), slot_bytes, row_bytes);
  for (int r = 0; r < rep; ++r)
    scores16(q + r * D, D, kp, slots, L, slot_stride, scale, perm, s + r * L, pf && r == 0 ? row_bytes : 0,
             pf && r == 0 ? vp : nullptr);
  if (pf) prefetch_slots(reinterpret_cast<const char*>(vp), slots, 0, std::min(L, kPfKeys), slot_bytes, row_bytes);
  for (int r = 0; r < rep; ++r) {  // pass 2: max, exp, sum in 16-lane chunks from the row's first key
    float* sr = s + r * L;
    __m512 vm = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < L; j += 16) {
      __mmask16 k = static_cast<__mmask16>((1u << std::min<int64_t>(16, L - j)) - 1);
      vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(vm, k, sr + j));
    }
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
    __m512 vl = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j += 16) {
      __mmask16 k = static_cast<__mmask16>((1u << std::min<int64_t>(16, L - j)) - 1);
      __m512 p = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + j), m)));
      _mm512_mask_storeu_ps(sr + j, k, p);
      vl = _mm512_add_ps(vl, p);
    }
    lsum[r] = _mm512_reduce_add_ps(vl);  // the lanes added by a fixed tree
  }
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) pv_heads<4>(s, rep, L, vp, slots, slot_stride, d0, out, D, pf && d0 == 0 ? row_bytes : 0);
  for (; d0 < D; d0 += 16) pv_heads<1>(s, rep, L, vp, slots, slot_stride, d0, out, D);
  for (int r = 0; r < rep; ++r) {
    const __m512 vl = _mm512_set1_ps(lsum[r]);
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(out + r * D + d, _mm512_div_ps(_mm512_loadu_ps(out + r * D + d), vl));
  }
}
#endif  // AUGURY_ATTN_AVX512

#ifdef AUGURY_ATTN_AVX2
// ---------------------------------------------------------------------------------------------
// AVX2 path: the AVX-512 path's structure on 8 lanes. Pass 1 writes each head's scores to a row
// padded to a multiple of 8 with -inf, so pass 2 runs on whole vectors (the padding's exp is 0).

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // bf16 -> f32 is exact: the bits move up 16
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// exp for x <= 0: the same Cephes polynomial as exp16; 2^n is built in the exponent bits, so the
// argument is clamped to where 2^n is a normal float and anything below exp(-87.3) is set to 0
// (what scalef's underflow gives on the AVX-512 path, to within denormals).
inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);  // false for -inf and NaN
  x = _mm256_max_ps(x, lo);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// a[0..7] (one accumulator per key) -> lane i = the lane sum of a[perm[i]], by a transpose-and-add
// tree (each output lane sums only its own key's lanes, in a fixed order).
inline __m256 hsum8(const __m256* a) {
  __m256 b[4], c[2];
  for (int i = 0; i < 4; ++i)  // 128-bit halves: key i in the low half, key i + 4 in the high
    b[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20), _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
  for (int i = 0; i < 2; ++i)  // pairs of floats
    c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[i], b[i + 2], 0x44), _mm256_shuffle_ps(b[i], b[i + 2], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
}

// The permutation putting hsum8's lanes back in key order, measured on one-hot inputs.
__m256i key_order8() {
  alignas(32) float lanes[8];
  __m256 a[8];
  for (int i = 0; i < 8; ++i) {
    std::fill(lanes, lanes + 8, 0.f);
    lanes[0] = static_cast<float>(i);
    a[i] = _mm256_load_ps(lanes);
  }
  _mm256_store_ps(lanes, hsum8(a));
  alignas(32) int32_t idx[8];
  for (int i = 0; i < 8; ++i) idx[static_cast<int>(lanes[i])] = i;
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(idx));
}

// pass 1, keys [j0, j0 + 8) for one query head: s[j] = scale * q . k_j; keys past L get -inf
template <typename KT>
void score_block8(const float* q, int64_t D, const KT* kp, const int64_t* slots, int64_t j0, int64_t L,
                  int64_t slot_stride, __m256 vscale, __m256i perm, float* s) {
  const int n = static_cast<int>(std::min<int64_t>(8, L - j0));
  // a short block repeats its last key (masked below): a fixed trip count keeps acc in registers
  const KT* k[8];
  for (int i = 0; i < 8; ++i) k[i] = kp + slots[j0 + std::min(i, n - 1)] * slot_stride;
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    __m256 qd = _mm256_loadu_ps(q + d);
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qd, load8(k[i] + d), acc[i]);
  }
  __m256 sum = _mm256_mul_ps(_mm256_permutevar8x32_ps(hsum8(acc), perm), vscale);
  if (n < 8) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 pad = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(n - 1)));
    sum = _mm256_blendv_ps(sum, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), pad);
  }
  _mm256_storeu_ps(s + j0, sum);
}

// pass 3 for query heads [r0, r0 + NR), D columns [d0, d0 + 8 * NC), keys [j0, j1): out += p[r][j] * v_j
// (out carries the running sums between key blocks: a store and a reload round nothing)
template <int NR, int NC, typename KT>
void pv_tile8(const float* s, int64_t Lp, int64_t j0, int64_t j1, const KT* vp, const int64_t* slots,
              int64_t slot_stride, int64_t d0, float* out, int64_t D) {
  __m256 acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_loadu_ps(out + r * D + d0 + 8 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const KT* v = vp + slots[j] * slot_stride + d0;
    __m256 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = load8(v + 8 * c);
    for (int r = 0; r < NR; ++r) {
      __m256 p = _mm256_broadcast_ss(s + r * Lp + j);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm256_fmadd_ps(p, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out + r * D + d0 + 8 * c, acc[r][c]);
}

template <int NC, typename KT>
void pv_heads8(const float* s, int rep, int64_t Lp, int64_t j0, int64_t j1, const KT* vp, const int64_t* slots,
               int64_t slot_stride, int64_t d0, float* out, int64_t D) {
  int r = 0;  // 3 heads x 2 vectors: 6 accumulators + 2 values + 3 broadcasts of the 16 registers
  for (; r + 3 <= rep; r += 3) pv_tile8<3, NC>(s + r * Lp, Lp, j0, j1, vp, slots, slot_stride, d0, out + r * D, D);
  if (rep - r == 2) pv_tile8<2, NC>(s + r * Lp, Lp, j0, j1, vp, slots, slot_stride, d0, out + r * D, D);
  if (rep - r == 1) pv_tile8<1, NC>(s + r * Lp, Lp, j0, j1, vp, slots, slot_stride, d0, out + r * D, D);
}

// Query heads [h0, h1) of one query row (head h reads KV head h / rep): the three passes of each
// head, with the loops over keys outermost, so each key's K (pass 1) and V (pass 3) rows of all the
// KV heads read (contiguous in its slot) are read together, once. A head's own arithmetic does not
// depend on which other heads share the call: its bits are those of a lone head (so any split of a
// row's heads over threads gives the same bits). q: the row's H heads; s: (h1 - h0) rows of Lp = L
// rounded up to 8 floats; lsum, out: (h1 - h0) entries / rows. Pass 3 walks keys in blocks that stay
// in L2 while every head and column slice reads them.
template <typename KT>
void heads_avx2(const float* q, int64_t h0, int64_t h1, int rep, int64_t D, const KT* kp, const KT* vp,
                const int64_t* slots, int64_t L, int64_t slot_stride, float scale, __m256i perm, float* s,
                float* lsum, float* out) {
  const int64_t Lp = (L + 7) / 8 * 8, NH = h1 - h0, g0 = h0 / rep, g1 = (h1 - 1) / rep + 1;
  const __m256 vscale = _mm256_set1_ps(scale);
  const int64_t esz = static_cast<int64_t>(sizeof(KT)), slot_bytes = slot_stride * esz, span = (g1 - g0) * D * esz;
  const char *kb = reinterpret_cast<const char*>(kp + g0 * D), *vb = reinterpret_cast<const char*>(vp + g0 * D);
  prefetch_slots(kb, slots, 0, std::min<int64_t>(L, 16), slot_bytes, span);
  for (int64_t j0 = 0; j0 < L; j0 += 8) {
    prefetch_slots(kb, slots, std::min(L, j0 + 16), std::min(L, j0 + 24), slot_bytes, span);
    for (int64_t h = h0; h < h1; ++h)
      score_block8(q + h * D, D, kp + (h / rep) * D, slots, j0, L, slot_stride, vscale, perm, s + (h - h0) * Lp);
  }
  // ~32 KiB of V slots per block
  const int64_t JB = std::max<int64_t>(8, 32768 / span);
  prefetch_slots(vb, slots, 0, std::min(L, JB), slot_bytes, span);
  for (int64_t i = 0; i < NH; ++i) {  // pass 2: max, exp, sum in 8-lane chunks from the row's first key
    float* sr = s + i * Lp;
    __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < Lp; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sr + j));
    const __m256 m = _mm256_set1_ps(augury_cpu::reduce8(vm, true));
    __m256 vl = _mm256_setzero_ps();
    for (int64_t j = 0; j < Lp; j += 8) {
      __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sr + j), m));
      _mm256_storeu_ps(sr + j, p);
      vl = _mm256_add_ps(vl, p);
    }
    lsum[i] = augury_cpu::reduce8(vl, false);
  }
  std::fill(out, out + NH * D, 0.f);
  for (int64_t j0 = 0; j0 < L; j0 += JB) {
    const int64_t j1 = std::min(L, j0 + JB);
    prefetch_slots(vb, slots, j1, std::min(L, j1 + JB), slot_bytes, span);
    for (int64_t g = g0; g < g1; ++g) {  // this KV head's query heads among [h0, h1)
      const int64_t a = std::max(h0, g * rep) - h0, n = std::min(h1, (g + 1) * rep) - h0 - a;
      int64_t d0 = 0;
      for (; d0 + 16 <= D; d0 += 16)
        pv_heads8<2>(s + a * Lp, static_cast<int>(n), Lp, j0, j1, vp + g * D, slots, slot_stride, d0, out + a * D, D);
      for (; d0 < D; d0 += 8)
        pv_heads8<1>(s + a * Lp, static_cast<int>(n), Lp, j0, j1, vp + g * D, slots, slot_stride, d0, out + a * D, D);
    }
  }
  for (int64_t i = 0; i < NH; ++i) {
    const __m256 vl = _mm256_set1_ps(lsum[i]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + i * D + d, _mm256_div_ps(_mm256_loadu_ps(out + i * D + d), vl));
  }
}
#endif  // AUGURY_ATTN_AVX2

template <typename QT>
void load_q(const QT* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f(src[i]);
}
template <typename QT>
void store_o(const float* src, int64_t n, QT* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<QT>(src[i]);  // bf16: round to nearest even
}

template <typename QT, typename KT>
void run(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool, const at::Tensor& gather,
         const at::Tensor& rows, double scale, bool parallel, at::Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_pool.size(1), W = gather.size(1);
  const int rep = static_cast<int>(H / Hkv);
  const QT* qd = q.data_ptr<QT>();
  QT* od = out.data_ptr<QT>();
  const KT* kd = k_pool.data_ptr<KT>();
  const KT* vd = v_pool.data_ptr<KT>();
  const int64_t* gd = gather.data_ptr<int64_t>();
  const int32_t* rd = rows.data_ptr<int32_t>();
  const int64_t slot_stride = Hkv * D;
#ifdef AUGURY_ATTN_AVX512
  static const __m512i perm = key_order();
  const bool pf_on = prefetch_on();
  const bool vec = D % 16 == 0;
#elif defined(AUGURY_ATTN_AVX2)
  static const __m256i perm8 = key_order8();
  const bool vec = D % 8 == 0;
#endif
#ifdef AUGURY_ATTN_AVX2
  if (vec) {  // the unit is one (row, query head); a thread takes a run of them (see heads_avx2)
    auto heads_work = [&](int64_t u0, int64_t u1) {
      thread_local std::vector<float> buf;  // parallel_steal calls this once per chunk
      for (int64_t t = u0 / H; t * H < u1; ++t) {
        const int64_t h0 = std::max(u0, t * H) - t * H, h1 = std::min(u1, (t + 1) * H) - t * H, NH = h1 - h0;
        const int64_t b = rd[3 * t], lo = rd[3 * t + 1], L = rd[3 * t + 2] - lo;
        const int64_t need = H * D + NH * D + NH + NH * ((L + 7) / 8 * 8);
        if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
        float *qf = buf.data(), *of = qf + H * D, *lsum = of + NH * D, *s = lsum + NH;
        load_q(qd + t * H * D, H * D, qf);
        heads_avx2(qf, h0, h1, rep, D, kd, vd, gd + b * W + lo, L, slot_stride, static_cast<float>(scale), perm8, s,
                   lsum, of);
        store_o(of, NH * D, od + (t * H + h0) * D);
      }
    };
    if (parallel && T * H > 1)
      augury_cpu::parallel_steal(T * H, 1, heads_work);  // any split: a head's bits do not depend on it
    else
      heads_work(0, T * H);
    return;
  }
#endif
  auto work = [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> buf;  // parallel_steal calls this once per chunk
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t t = p / Hkv, g = p % Hkv;
      const int64_t b = rd[3 * t], lo = rd[3 * t + 1], L = rd[3 * t + 2] - lo;
      const int64_t need = 2 * rep * D + rep + rep * ((L + 7) / 8 * 8);  // scores padded for AVX2
      if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
      float *qf = buf.data(), *of = qf + rep * D, *lsum = of + rep * D, *s = lsum + rep;
      load_q(qd + (t * H + g * rep) * D, rep * D, qf);
      const int64_t* slots = gd + b * W + lo;
#ifdef AUGURY_ATTN_AVX512
      if (vec)
        pair_avx512(qf, rep, D, kd + g * D, vd + g * D, slots, L, slot_stride, static_cast<float>(scale), perm, s, lsum, of,
                    pf_on);
      else
#endif
        pair_scalar(qf, rep, D, kd + g * D, vd + g * D, slots, L, slot_stride, static_cast<float>(scale), s, of);
      store_o(of, rep * D, od + (t * H + g * rep) * D);
    }
  };
  const int64_t pairs = T * Hkv;
  if (parallel && pairs > 1)
    augury_cpu::parallel_steal(pairs, 1, work);  // one pair = one thread: the split cannot change a bit
  else
    work(0, pairs);
}

}  // namespace

namespace augury_cpu {

// q [T, H, D]; k_pool, v_pool [S, Hkv, D]; gather_slots [B, W] int64; rows [T, 3] int32 (request,
// lo, hi) -> [T, H, D] in q's dtype. `parallel`: split (row, KV head) pairs over torch's threads.
at::Tensor paged_attention_rows(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                const at::Tensor& gather_slots, const at::Tensor& rows, double scale,
                                bool parallel) {
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3, "q [T, H, D], pools [S, Hkv, D]");
  TORCH_CHECK(q.is_contiguous() && k_pool.is_contiguous() && v_pool.is_contiguous(), "contiguous tensors only");
  TORCH_CHECK(k_pool.sizes() == v_pool.sizes() && k_pool.scalar_type() == v_pool.scalar_type(),
              "k_pool and v_pool differ");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), S = k_pool.size(0), Hkv = k_pool.size(1);
  TORCH_CHECK(k_pool.size(2) == D && Hkv > 0 && H % Hkv == 0, "head shapes: q ", q.sizes(), " pool ", k_pool.sizes());
  TORCH_CHECK(gather_slots.dim() == 2 && gather_slots.scalar_type() == at::kLong && gather_slots.is_contiguous(),
              "gather_slots: contiguous int64 [B, W]");
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == T && rows.size(1) == 3 && rows.scalar_type() == at::kInt &&
                  rows.is_contiguous(), "rows: contiguous int32 [T, 3]");
  const int64_t B = gather_slots.size(0), W = gather_slots.size(1);
  const int32_t* rd = rows.data_ptr<int32_t>();
  const int64_t* gd = gather_slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {  // bounds, so a bad plan is an error and never a wild read
    const int64_t b = rd[3 * t], lo = rd[3 * t + 1], hi = rd[3 * t + 2];
    TORCH_CHECK(b >= 0 && b < B && lo >= 0 && lo < hi && hi <= W, "row ", t, ": bad (request, lo, hi) = (", b,
                ", ", lo, ", ", hi, ") for gather_slots ", gather_slots.sizes());
    for (int64_t j = lo; j < hi; ++j)
      TORCH_CHECK(gd[b * W + j] >= 0 && gd[b * W + j] < S, "row ", t, ": slot ", gd[b * W + j], " outside the pool");
  }
  auto out = at::empty_like(q);
  if (T == 0) return out;
  const auto qt = q.scalar_type(), kt = k_pool.scalar_type();
  TORCH_CHECK((qt == at::kFloat || qt == at::kBFloat16) && (kt == at::kFloat || kt == at::kBFloat16),
              "float32 / bfloat16 only");
  if (qt == at::kFloat && kt == at::kFloat)
    run<float, float>(q, k_pool, v_pool, gather_slots, rows, scale, parallel, out);
  else if (qt == at::kFloat)
    run<float, c10::BFloat16>(q, k_pool, v_pool, gather_slots, rows, scale, parallel, out);
  else if (kt == at::kFloat)
    run<c10::BFloat16, float>(q, k_pool, v_pool, gather_slots, rows, scale, parallel, out);
  else
    run<c10::BFloat16, c10::BFloat16>(q, k_pool, v_pool, gather_slots, rows, scale, parallel, out);
  return out;
}

}  // namespace augury_cpu

namespace {

// Which path this build takes for head dims it vectorizes: "avx512", "avx2" or "portable".
std::string isa() {
#if defined(AUGURY_ATTN_AVX512)
  return "avx512";
#elif defined(AUGURY_ATTN_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("paged_attention_rows(Tensor q, Tensor k_pool, Tensor v_pool, Tensor gather_slots, Tensor rows, "
        "float scale, bool parallel) -> Tensor");
  m.def("attention_isa() -> str", &isa);
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("paged_attention_rows", &augury_cpu::paged_attention_rows);
}
