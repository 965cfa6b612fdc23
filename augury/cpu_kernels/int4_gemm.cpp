// int4 weight x int8 activation matmul for few rows (decode steps, speculative verify windows).
//
// Weights: w = (q - 8) * s + z, q in 0..15, one (s, z) per `group_size` input columns of an output
// row (the Int4Linear convention). Activations are quantized per row and per block of 32 columns to
// int8 with one float scale d (round to nearest even of x / d, d = max|x| / 127), as llama.cpp's Q8
// activations are. Then for a block b of 32 columns:
//     y += s * d_b * sum(q * qx) - 8 * s * d_b * sum(qx) + z * d_b * sum(qx)
//        = s * d_b * (acc_b - 8 * S_b) + z * (d_b * S_b),   acc_b = sum(q * qx) exact in int32
// which is two float FMAs per block and output, in block order.
//
// Bitwise row invariance: an output element is computed by the same instructions in the same order
// whatever the number of rows M, the row's place among them, or the thread split (one output tile
// belongs to one thread; integer sums are exact), so a verify-window row gets exactly the bits its
// lone decode step gets. The tests hold this.
//
// Packed layout (built in Python, augury/cpu_kernels/int4.py), for AVX-512 VNNI's vpdpbusd (u8 x s8,
// four products per 32-bit lane): output rows in tiles of 16 (one per lane), input columns in blocks
// of 32 = 8 quads of 4. Tile t, block b holds 4 x 64 bytes; in 64-byte vector i, bytes 4j..4j+3 are
// row j's quad 2i in the low nibbles and quad 2i+1 in the high nibbles. Scales: bf16 [T, G, 2, 16]
// (s then z for the tile's 16 rows, per group).

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define AUGURY_VNNI 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define AUGURY_AVX2 1  // x86 without AVX-512 VNNI (e.g. AMD Zen 2/3): vpdpbusd emulated, same sums
#include <immintrin.h>
#endif

namespace {

constexpr int kTile = 16;   // output rows per tile
constexpr int kBlock = 32;  // input columns per activation block
constexpr int kBlockBytes = kTile * kBlock / 2;

inline float bf16_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A thread's share of a product's WarmRanges window (kernels.h), prefetched into L2 one line per
// weight block the thread multiplies (a block reads 5 lines of weights and scales itself): the
// side stream stays well under the product's own, so it never makes the product wait. Measured on
// a 2-core AVX2 host, SmolLM2 int4 decode, alternating in one process: one line a block took
// attention from 1.29 to 0.83 ms a step at B=1 (82 -> 88-90 tok/s); two lines a block, or all of a
// layer's K/V at once, slowed the products by as much as the attention gained.
constexpr int64_t kWarmLinesPerBlock = 1;

struct WarmCursor {
  const augury_cpu::WarmRanges* w = nullptr;
  size_t r = 0;      // current range
  int64_t off = 0;   // line within it
  int64_t left = 0;  // lines still to prefetch

  WarmCursor() = default;
  WarmCursor(const augury_cpu::WarmRanges* w_, int64_t first, int64_t count) : w(w_), left(count) {
    while (r < w->lines.size() && first >= w->lines[r]) first -= w->lines[r++];
    off = first;
    if (r == w->lines.size()) left = 0;
  }

  inline void step() {  // kWarmLinesPerBlock lines
    for (int64_t i = 0; i < kWarmLinesPerBlock && left > 0; ++i, --left) {
#if defined(__GNUC__) || defined(__clang__)
      __builtin_prefetch(w->start[r] + 64 * off, 0, 2);  // read, into L2 (prefetcht1 on x86)
#endif
      if (++off == w->lines[r]) {
        ++r;
        off = 0;
      }
    }
  }
};

// Row r of x [M, K] -> qx [K] int8, d [K/32], S [K/32] (sum of the block's qx).
void quantize_row(const float* x, int64_t K, int8_t* qx, float* d, int32_t* S) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
#ifdef AUGURY_VNNI
    __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    __m512 a = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
    float amax = _mm512_reduce_max_ps(a);
    float db = amax / 127.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qx + b * kBlock), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qx + b * kBlock + 16), _mm512_cvtsepi32_epi8(q1));
    S[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#elif defined(AUGURY_AVX2)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 xv[4], a = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      xv[i] = _mm256_loadu_ps(xb + 8 * i);
      a = _mm256_max_ps(a, _mm256_andnot_ps(sign, xv[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 0x55));
    const float amax = _mm_cvtss_f32(h);  // a max is exact in any order: the portable path's value
    float db = amax / 127.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    __m256i q[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {  // round to nearest even, |x * id| <= 127: no clamp needed
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(xv[i], _mm256_set1_ps(id)));
      sum = _mm256_add_epi32(sum, q[i]);
    }
    // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute puts them back
    __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p16 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qx + b * kBlock), p16);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    S[b] = _mm_cvtsi128_si32(s4);
#else
    float amax = 0.0f;
    for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    float db = amax / 127.0f;
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < kBlock; ++i) {
      int32_t q = static_cast<int32_t>(std::nearbyint(xb[i] * id));
      q = q > 127 ? 127 : (q < -127 ? -127 : q);
      qx[b * kBlock + i] = static_cast<int8_t>(q);
      s += q;
    }
    S[b] = s;
#endif
    d[b] = db;
  }
}

#if defined(AUGURY_VNNI) || defined(AUGURY_AVX2)
// Weight blocks prefetched this far ahead of the block being multiplied, with the non-temporal hint
// (into L1, kept out of the outer caches where the hardware allows). A decode step streams ~84 MB of
// SmolLM2 weights in ~120 short products; on a 2-core AVX2 host the hardware prefetchers alone left
// the products at ~11 GB/s of a ~20 GB/s machine. Measured there, all 121 products of a SmolLM2
// token in sequence: 7.7-9.8 -> 6.5-8.9 ms (medians of 12, alternating in one process); decode
// 80-87 -> 82-91 tok/s. Prefetching past a tensor's end never faults.
constexpr int64_t kPrefetchBlocks = 16;

inline void prefetch_weight_block(const uint8_t* p) {  // a block's 4 lines of packed weights
  const char* a = reinterpret_cast<const char*>(p);
  for (int i = 0; i < 4; ++i) _mm_prefetch(a + 64 * i, _MM_HINT_NTA);
}
#endif

#ifdef AUGURY_VNNI
// Software prefetch of the weight stream on the VNNI path (AUGURY_INT4_PREFETCH=0 turns it off, read
// once per process; the bits are the same either way): kPrefetchBlocks blocks ahead of the block being
// multiplied, with the non-temporal hint, as the AVX2 path does. Measured on a 2-core Zen 4 host, SmolLM2
// int4, alternating in one engine (docs/benchmarks.md, thirtieth session): B=1 233 -> 249 and 230 -> 242
// tok/s, B=8 566 -> 599 and 576 -> 603; prefill 1k/4k unchanged (995 -> 1016, 543 -> 548). 8 and 32 blocks
// ahead measured the same as 16, 4 slower; the T0 and T1 hints gained less.
bool weight_prefetch_on() {
  static const bool on = augury_cpu::env_switch_on("AUGURY_INT4_PREFETCH");
  return on;
}

inline __m512 load_bf16x16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows [r0, r0 + MT) of one output tile.
template <int MT>
void tile_rows(const uint8_t* wt, const uint16_t* szt, int64_t nblocks, int gshift,
               const int8_t* qx, const float* d, const int32_t* S, int64_t K, int64_t r0, float* y,
               int64_t N, int64_t t, WarmCursor& wc) {
  __m512 acc_f[MT];
  for (int r = 0; r < MT; ++r) acc_f[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t KB = K / kBlock;
  // the first row chunk streams the tile in; later chunks (M > 8) find it in L1
  const bool pf = r0 == 0 && weight_prefetch_on();
  for (int64_t b = 0; b < nblocks; ++b) {
    if (wc.left) wc.step();
    if (pf) prefetch_weight_block(wt + (b + kPrefetchBlocks) * kBlockBytes);
    const uint8_t* wb = wt + b * kBlockBytes;
    __m512i w[8];
    for (int i = 0; i < 4; ++i) {
      __m512i p = _mm512_loadu_si512(wb + 64 * i);
      w[2 * i] = _mm512_and_si512(p, low);
      w[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
    const uint16_t* sz = szt + (b >> gshift) * 2 * kTile;
    __m512 s = load_bf16x16(sz), z = load_bf16x16(sz + kTile);
    for (int r = 0; r < MT; ++r) {
      const int64_t row = r0 + r;
      const int32_t* q4 = reinterpret_cast<const int32_t*>(qx + row * K + b * kBlock);
      __m512i acc = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i) acc = _mm512_dpbusd_epi32(acc, w[i], _mm512_set1_epi32(q4[i]));
      const int32_t Sb = S[row * KB + b];
      const float db = d[row * KB + b];
      acc = _mm512_sub_epi32(acc, _mm512_set1_epi32(8 * Sb));
      acc_f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(s, _mm512_set1_ps(db)), acc_f[r]);
      acc_f[r] = _mm512_fmadd_ps(z, _mm512_set1_ps(db * static_cast<float>(Sb)), acc_f[r]);
    }
  }
  for (int r = 0; r < MT; ++r) _mm512_storeu_ps(y + (r0 + r) * N + t * kTile, acc_f[r]);
}
#endif

#ifdef AUGURY_AVX2
inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Rows [r0, r0 + MT) of one output tile: both 8-row halves (8 int32 lanes each) in one pass, so
// each activation broadcast and each per-(row, block) scalar serves the tile's 16 output rows. Per
// row and block, vpdpbusd's sum of four u8 x s8 products per lane is vpmaddubsw (pairs into int16:
// |15 * 127 * 2| fits) summed over the block's 8 quads in int16 (at most 30,480: no overflow), then
// vpmaddwd with ones (into int32): the same exact integer as the VNNI path, and the same two FMAs
// per lane after it, so every path gives the same bits. E8S = 8 * S and DS = d * float(S) per
// (row, block) are computed once per call. Against one pass per half (the previous form), all 120
// products of a SmolLM2 token on a 2-core AVX2 host: 1 row 1.01-1.07x, 8 rows 1.22x faster.
template <int MT>
void tile_rows_avx2(const uint8_t* wt, const uint16_t* szt, int64_t nblocks, int gshift,
                         const int8_t* qx, const float* d, const int32_t* E8S, const float* DS, int64_t K,
                         int64_t r0, float* y, int64_t N, int64_t t, WarmCursor& wc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t KB = K / kBlock;
  __m256 acc_f[MT][2];
  for (int r = 0; r < MT; ++r) acc_f[r][0] = acc_f[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    if (wc.left) wc.step();
    prefetch_weight_block(wt + (b + kPrefetchBlocks) * kBlockBytes);
    _mm_prefetch(reinterpret_cast<const char*>(szt + ((b + kPrefetchBlocks) >> gshift) * 2 * kTile),
                 _MM_HINT_NTA);
    const uint8_t* wb = wt + b * kBlockBytes;
    __m256i acc16[MT][2];
    for (int i = 0; i < 4; ++i) {
      const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * i));
      const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * i + 32));
      const __m256i l0 = _mm256_and_si256(p0, low), h0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), low);
      const __m256i l1 = _mm256_and_si256(p1, low), h1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), low);
      for (int r = 0; r < MT; ++r) {
        const int32_t* q4 = reinterpret_cast<const int32_t*>(qx + (r0 + r) * K + b * kBlock);
        const __m256i xl = _mm256_set1_epi32(q4[2 * i]), xh = _mm256_set1_epi32(q4[2 * i + 1]);
        const __m256i a0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl), _mm256_maddubs_epi16(h0, xh));
        const __m256i a1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl), _mm256_maddubs_epi16(h1, xh));
        if (i == 0) {
          acc16[r][0] = a0;
          acc16[r][1] = a1;
        } else {
          acc16[r][0] = _mm256_add_epi16(acc16[r][0], a0);
          acc16[r][1] = _mm256_add_epi16(acc16[r][1], a1);
        }
      }
    }
    const uint16_t* sz = szt + (b >> gshift) * 2 * kTile;
    const __m256 s0 = load_bf16x8(sz), s1 = load_bf16x8(sz + 8);
    const __m256 z0 = load_bf16x8(sz + kTile), z1 = load_bf16x8(sz + kTile + 8);
    for (int r = 0; r < MT; ++r) {
      const int64_t rb = (r0 + r) * KB + b;
      const __m256i e8s = _mm256_set1_epi32(E8S[rb]);
      const __m256 db = _mm256_set1_ps(d[rb]), ds = _mm256_set1_ps(DS[rb]);
      const __m256i c0 = _mm256_sub_epi32(_mm256_madd_epi16(acc16[r][0], ones), e8s);
      const __m256i c1 = _mm256_sub_epi32(_mm256_madd_epi16(acc16[r][1], ones), e8s);
      acc_f[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), _mm256_mul_ps(s0, db), acc_f[r][0]);
      acc_f[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), _mm256_mul_ps(s1, db), acc_f[r][1]);
      acc_f[r][0] = _mm256_fmadd_ps(z0, ds, acc_f[r][0]);
      acc_f[r][1] = _mm256_fmadd_ps(z1, ds, acc_f[r][1]);
    }
  }
  for (int r = 0; r < MT; ++r) {
    _mm256_storeu_ps(y + (r0 + r) * N + t * kTile, acc_f[r][0]);
    _mm256_storeu_ps(y + (r0 + r) * N + t * kTile + 8, acc_f[r][1]);
  }
}
#endif

// Rows [0, M) in chunks of MAX, then one chunk of the remainder: f(std::integral_constant<int, n>,
// first row) for each, so every chunk runs a tile kernel compiled for its row count.
template <int MT, typename F>
void remainder_chunk(int64_t n, int64_t r, F& f) {
  if constexpr (MT > 0) {
    if (n == MT) f(std::integral_constant<int, MT>{}, r);
    else remainder_chunk<MT - 1>(n, r, f);
  }
}

template <int MAX, typename F>
void row_chunks(int64_t M, F&& f) {
  int64_t r = 0;
  for (; r + MAX <= M; r += MAX) f(std::integral_constant<int, MAX>{}, r);
  remainder_chunk<MAX - 1>(M - r, r, f);
}

// Portable form of the same arithmetic (one lane at a time).
void tile_rows_scalar(const uint8_t* wt, const uint16_t* szt, int64_t nblocks, int gshift,
                      const int8_t* qx, const float* d, const int32_t* S, int64_t K, int64_t row, float* y,
                      int64_t N, int64_t t) {
  const int64_t KB = K / kBlock;
  for (int j = 0; j < kTile; ++j) {
    float out = 0.0f;
    for (int64_t b = 0; b < nblocks; ++b) {
      const uint8_t* wb = wt + b * kBlockBytes;
      const int8_t* xb = qx + row * K + b * kBlock;
      int32_t acc = 0;
      for (int i = 0; i < 4; ++i) {
        for (int k = 0; k < 4; ++k) {
          uint8_t byte = wb[64 * i + 4 * j + k];
          acc += static_cast<int32_t>(byte & 15) * xb[8 * i + k];
          acc += static_cast<int32_t>(byte >> 4) * xb[8 * i + 4 + k];
        }
      }
      const uint16_t* sz = szt + (b >> gshift) * 2 * kTile;
      const int32_t Sb = S[row * KB + b];
      const float db = d[row * KB + b];
      out = std::fma(static_cast<float>(acc - 8 * Sb), bf16_to_float(sz[j]) * db, out);
      out = std::fma(bf16_to_float(sz[kTile + j]), db * static_cast<float>(Sb), out);
    }
    y[row * N + t * kTile + j] = out;
  }
}

}  // namespace

namespace augury_cpu {

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t group_size,
                   const WarmRanges* warm) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "int4_mm: x must be [M, K] float32 contiguous");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == kBlockBytes && packed.is_contiguous(),
              "int4_mm: packed must be [N/16, K/32, 256] uint8");
  TORCH_CHECK(sz.dim() == 4 && sz.scalar_type() == at::kBFloat16 && sz.size(2) == 2 && sz.size(3) == kTile && sz.is_contiguous(),
              "int4_mm: scales must be [N/16, G, 2, 16] bfloat16");
  TORCH_CHECK(group_size % kBlock == 0, "int4_mm: group_size must be a multiple of 32");
  const int64_t M = x.size(0), K = x.size(1), T = packed.size(0), nblocks = packed.size(1);
  TORCH_CHECK(K == nblocks * kBlock, "int4_mm: x has ", K, " columns, the weight ", nblocks * kBlock);
  const int blocks_per_group = static_cast<int>(group_size / kBlock);
  TORCH_CHECK((blocks_per_group & (blocks_per_group - 1)) == 0, "int4_mm: group_size must be 32 times a power of two");
  // the group of block b is b >> gshift: an integer division per block (two idiv in the AVX2 loop) cost
  // 0-10% of a product at 1 and 8 rows (alternating A/B on a 2-core AVX2 host)
  int gshift = 0;
  while ((1 << gshift) < blocks_per_group) ++gshift;
  TORCH_CHECK(sz.size(0) == T && sz.size(1) * blocks_per_group >= nblocks, "int4_mm: scales do not match the weight");
  const int64_t N = T * kTile;
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  // the quantized activations: per-thread scratch, reused (a step makes ~120 of these calls)
  thread_local std::vector<int8_t> qx;
  thread_local std::vector<float> d;
  thread_local std::vector<int32_t> S;
  qx.resize(M * K);
  d.resize(M * (K / kBlock));
  S.resize(M * (K / kBlock));
  const float* xp = x.data_ptr<float>();
  const int8_t* qxp = qx.data();
  const float* dp = d.data();
  const int32_t* Sp = S.data();
  for (int64_t r = 0; r < M; ++r)
    quantize_row(xp + r * K, K, qx.data() + r * K, d.data() + r * (K / kBlock), S.data() + r * (K / kBlock));
#ifdef AUGURY_AVX2
  thread_local std::vector<int32_t> E8;
  thread_local std::vector<float> DSv;
  E8.resize(S.size());
  DSv.resize(S.size());
  for (size_t i = 0; i < S.size(); ++i) {
    E8[i] = 8 * S[i];
    DSv[i] = d[i] * static_cast<float>(S[i]);
  }
  const int32_t* e8p = E8.data();
  const float* dsp = DSv.data();
#endif
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const uint16_t* szp = reinterpret_cast<const uint16_t*>(sz.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t G = sz.size(1);
  // tiles [t0, t1): the same bits whichever thread runs them
  auto run_tiles = [&](int64_t t0, int64_t t1) {
    WarmCursor wc;
    if (warm != nullptr && warm->count > 0) {  // this thread's share of the window
      const int64_t first = warm->first + warm->count * t0 / T, last = warm->first + warm->count * t1 / T;
      wc = WarmCursor(warm, first, last - first);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* wt = wp + t * nblocks * kBlockBytes;
      const uint16_t* szt = szp + t * G * 2 * kTile;
#ifdef AUGURY_VNNI
      // up to 8 rows share one unpacking of the tile's weights (8 weight + 8 accumulator registers)
      row_chunks<8>(M, [&](auto mt, int64_t r) {
        tile_rows<decltype(mt)::value>(wt, szt, nblocks, gshift, qxp, dp, Sp, K, r, yp, N, t, wc);
      });
#elif defined(AUGURY_AVX2)
      // up to 8 rows share one unpacking of the tile's 16 weight vectors; measured against chunks
      // of 2, 4, 5 and 6 on a 2-core AVX2 host (all 120 products of a SmolLM2 token): the fastest
      // at 8 rows (the accumulators spill to L1, once per block) and no slower at 1, 2 and 4
      row_chunks<8>(M, [&](auto mt, int64_t r) {
        tile_rows_avx2<decltype(mt)::value>(wt, szt, nblocks, gshift, qxp, dp, e8p, dsp, K, r, yp, N, t, wc);
      });
#else
      for (int64_t b = 0; b < nblocks && wc.left; ++b) wc.step();
      for (int64_t r = 0; r < M; ++r) tile_rows_scalar(wt, szt, nblocks, gshift, qxp, dp, Sp, K, r, yp, N, t);
#endif
    }
  };
  parallel_steal(T, 8, run_tiles);
  return y;
}

// One line per block iteration: (tiles) x (blocks) x (row chunks of 8 on the SIMD paths).
int64_t int4_warm_capacity(const at::Tensor& packed, int64_t rows) {
  return packed.size(0) * packed.size(1) * ((rows + 7) / 8) * kWarmLinesPerBlock;
}

}  // namespace augury_cpu

namespace {

at::Tensor int4_mm_op(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t group_size) {
  return augury_cpu::int4_mm(x, packed, sz, group_size);
}

bool has_vnni() {
#ifdef AUGURY_VNNI
  return true;
#else
  return false;
#endif
}

// Which int4_mm path this build has: "avx512vnni", "avx2" or "portable" (benchmarks, tests).
std::string isa() {
#if defined(AUGURY_VNNI)
  return "avx512vnni";
#elif defined(AUGURY_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

// The A/B hook of parallel_steal (kernels.h): false = static splits, for benchmarks.
void set_steal(bool on) { augury_cpu::steal_on().store(on); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("set_steal(bool on) -> ()");
  m.def("int4_mm(Tensor x, Tensor packed, Tensor scales, int group_size) -> Tensor");
  m.def("int4_has_vnni() -> bool");
  m.def("int4_isa() -> str");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("int4_mm", &int4_mm_op);
}

TORCH_LIBRARY_IMPL(augury_cpu, CompositeExplicitAutograd, m) {
  m.impl("int4_has_vnni", &has_vnni);
  m.impl("int4_isa", &isa);
  m.impl("set_steal", &set_steal);
}
