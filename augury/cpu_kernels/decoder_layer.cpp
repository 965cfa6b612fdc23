// One decoder layer (Llama-style pre-norm, or Gemma 3's sandwich norms) for few-row eager CPU steps, as one call.
//
// Why native: an eager decode step of SmolLM2 on 2 cores spent ~2.4 ms of its ~6.4 ms in Python around
// ~15 small torch calls per layer; running those ATen calls from C++ still left ~20 dispatches and
// allocations a layer (~90 us of a ~330 us layer on a 2-core AVX2 host). So this file calls augury's
// kernels directly (kernels.h) and does the elementwise work (norm weights, rope, the K/V writes,
// the residual adds, the gate product) in plain loops, each element with the same IEEE operations, in
// the same order, as LlamaDecoderLayer.forward's eager CPU path (layers/norm.py, Int4Linear.forward,
// layers/rope.py, layers/attention.py paged_attention -> native_rows_cpu, layers/mlp.py): one rounding
// per multiply and per add (the library is built with -ffp-contract=off, so no FMA fuses them). The
// activation (SiLU / GELU-tanh) stays ATen's own op on the same tensor view, as its vectorized exp
// is not reproducible by hand. So the results are still bitwise those of the Python path (tested).
// Float32 activations only (the CPU default); callers check eligibility (layers/cpu_decode.py).

#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

using at::Tensor;

const float* fptr(const Tensor& t) { return t.data_ptr<float>(); }

// RMSNorm's eager CPU path: rms_norm over rows of D, then Llama: weight * h; Gemma: h * (1 + weight)
void norm_rows(const float* x, float* y, int64_t rows, int64_t D, const Tensor& weight, float eps, bool gemma) {
  augury_cpu::rms_norm_rows(x, y, rows, D, eps);
  const float* w = fptr(weight);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * D;
    if (gemma)
      for (int64_t i = 0; i < D; ++i) yr[i] = yr[i] * (1.0f + w[i]);
    else
      for (int64_t i = 0; i < D; ++i) yr[i] = w[i] * yr[i];
  }
}

Tensor normed(const Tensor& x, const Tensor& weight, float eps, bool gemma) {
  auto y = at::empty_like(x);
  norm_rows(fptr(x), y.data_ptr<float>(), x.size(0), x.size(1), weight, eps, gemma);
  return y;
}

// x * cos + roll(x, D/2) * sin_signed for one head row (layers/rope.py apply_rope); two loops
// without the index select so the compiler vectorizes them (elementwise: the same bits)
inline void rope_row(const float* x, const float* c, const float* s, int64_t D, float* out) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * c[i] + x[i + half] * s[i];
  for (int64_t i = half; i < D; ++i) out[i] = x[i] * c[i] + x[i - half] * s[i];
}

template <typename PT>
void store_row(const float* src, int64_t n, PT* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<PT>(src[i]);  // bf16: round to nearest even, as .to()
}

void add_into(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// One layer's constant arguments (weights, norms, shapes): what the per-layer op takes on each call
// and what a LayerStack holds once.
struct LayerArgs {
  Tensor norm_in, norm_mlp;
  c10::optional<Tensor> norm_attn_out, norm_mlp_out, qk_norm;
  double eps;
  bool gemma;
  int64_t act;
  Tensor qkv_p, qkv_s, o_p, o_s, gu_p, gu_s, down_p, down_s;
  int64_t group_size, num_heads, num_kv_heads, head_dim;
};

// h [T, hidden] float32; per linear (qkv, o, gate_up, down): packed, scales; cos/sin [T, 1, D];
// pools [S, Hkv, D] (float32 or bfloat16); slot_mapping [T]; gather_slots/rows: the step's native
// attention plan. Llama (models/llama.py): h += attn(norm_in(h)); h += mlp(norm_mlp(h)).
// Gemma 3 (models/gemma3.py, sandwich norms): h += norm_attn_out(attn(norm_in(h)));
// h += norm_mlp_out(mlp(norm_mlp(h))). qk_norm: one RMSNorm over each q and k head before rope.
// act: 0 SiLU, 1 GELU (tanh).
Tensor layer_forward(const LayerArgs& A, const Tensor& h, const Tensor& cos, const Tensor& sin, Tensor k_pool,
                     Tensor v_pool, const Tensor& slot_mapping, const Tensor& gather_slots, const Tensor& rows,
                     double scale, bool parallel, augury_cpu::WarmRanges* warm_next = nullptr) {
  const auto &norm_in = A.norm_in, &norm_mlp = A.norm_mlp;
  const auto &norm_attn_out = A.norm_attn_out, &norm_mlp_out = A.norm_mlp_out, &qk_norm = A.qk_norm;
  const bool gemma = A.gemma;
  const int64_t act = A.act, group_size = A.group_size;
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat && h.is_contiguous(),
              "decoder_layer_rows: h must be [T, hidden] float32 contiguous");
  TORCH_CHECK(act == 0 || act == 1, "decoder_layer_rows: act 0 (SiLU) or 1 (GELU tanh)");
  const int64_t T = h.size(0), hid = h.size(1), H = A.num_heads, Hkv = A.num_kv_heads, D = A.head_dim;
  const float ef = static_cast<float>(A.eps);
  auto f32 = [](const Tensor& t) { return t.scalar_type() == at::kFloat && t.is_contiguous(); };
  TORCH_CHECK(f32(norm_in) && f32(norm_mlp) && (!qk_norm || f32(*qk_norm)) &&
                  (!norm_attn_out || f32(*norm_attn_out)) && (!norm_mlp_out || f32(*norm_mlp_out)),
              "decoder_layer_rows: norm weights must be float32 contiguous");
  TORCH_CHECK(f32(cos) && f32(sin) && cos.numel() == T * D && sin.numel() == T * D,
              "decoder_layer_rows: cos/sin must be [T, 1, D] float32 contiguous");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 3 && k_pool.size(1) == Hkv &&
                  k_pool.size(2) == D && k_pool.sizes() == v_pool.sizes() &&
                  k_pool.scalar_type() == v_pool.scalar_type() &&
                  (k_pool.scalar_type() == at::kFloat || k_pool.scalar_type() == at::kBFloat16),
              "decoder_layer_rows: pools must be [S, Hkv, D] float32 / bfloat16 contiguous");
  auto slots = slot_mapping.to(at::kLong).contiguous();
  TORCH_CHECK(slots.numel() == T, "decoder_layer_rows: one slot per row");
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t S = k_pool.size(0);
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < S, "decoder_layer_rows: slot ", sl[t], " outside the pool");

  // attention block (models/base.py AttentionBlock.attend)
  auto qkv = augury_cpu::int4_mm(normed(h, norm_in, ef, gemma), A.qkv_p, A.qkv_s, group_size);  // [T, (H + 2Hkv) D]
  TORCH_CHECK(qkv.size(1) == (H + 2 * Hkv) * D, "decoder_layer_rows: qkv width");
  float* qkvp = qkv.data_ptr<float>();
  const int64_t W = (H + 2 * Hkv) * D;
  if (qk_norm.has_value())  // q and k heads, in place (the module norms the [T, H + Hkv, D] slice)
    for (int64_t t = 0; t < T; ++t) norm_rows(qkvp + t * W, qkvp + t * W, H + Hkv, D, *qk_norm, ef, gemma);
  auto q = at::empty({T, H, D}, h.options());
  float* qp = q.data_ptr<float>();
  std::vector<float> krow(D);
  const bool bf16_pool = k_pool.scalar_type() == at::kBFloat16;
  for (int64_t t = 0; t < T; ++t) {
    const float *c = fptr(cos) + t * D, *s = fptr(sin) + t * D, *row = qkvp + t * W;
    for (int64_t j = 0; j < H; ++j) rope_row(row + j * D, c, s, D, qp + (t * H + j) * D);
    for (int64_t j = 0; j < Hkv; ++j) {  // k rotated, v as is, into the pools' slot (index_copy_)
      rope_row(row + (H + j) * D, c, s, D, krow.data());
      const float* v = row + (H + Hkv + j) * D;
      const int64_t off = (sl[t] * Hkv + j) * D;
      if (bf16_pool) {
        store_row(krow.data(), D, k_pool.data_ptr<at::BFloat16>() + off);
        store_row(v, D, v_pool.data_ptr<at::BFloat16>() + off);
      } else {
        store_row(krow.data(), D, k_pool.data_ptr<float>() + off);
        store_row(v, D, v_pool.data_ptr<float>() + off);
      }
    }
  }
  auto o = augury_cpu::paged_attention_rows(q, k_pool, v_pool, gather_slots, rows, scale, parallel);
  // the products from here to the next layer's qkv warm that layer's K/V slots (kernels.h
  // WarmRanges), each the next window of lines it has room for
  auto warm_for = [&](const Tensor& packed) {
    if (warm_next) warm_next->next_window(augury_cpu::int4_warm_capacity(packed, T));
    return warm_next;
  };
  auto a = augury_cpu::int4_mm(o.view({T, H * D}), A.o_p, A.o_s, group_size, warm_for(A.o_p));
  TORCH_CHECK(a.size(1) == hid, "decoder_layer_rows: o_proj width");
  if (norm_attn_out.has_value()) a = normed(a, *norm_attn_out, ef, gemma);
  auto x = at::empty_like(h);
  add_into(fptr(h), fptr(a), x.data_ptr<float>(), T * hid);
  // MLP (layers/mlp.py GatedMLP): act(gate) * up, gate and up the two halves of one product
  auto gu = augury_cpu::int4_mm(normed(x, norm_mlp, ef, gemma), A.gu_p, A.gu_s, group_size, warm_for(A.gu_p));
  const int64_t I = gu.size(1) / 2;
  auto g = act == 0 ? at::silu(gu.slice(1, 0, I)) : at::gelu(gu.slice(1, 0, I), "tanh");  // the module's view
  TORCH_CHECK(g.is_contiguous(), "decoder_layer_rows: activation layout");
  float* gp = g.data_ptr<float>();
  const float* up = fptr(gu);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) gp[t * I + i] = gp[t * I + i] * up[t * 2 * I + I + i];
  auto m = augury_cpu::int4_mm(g, A.down_p, A.down_s, group_size, warm_for(A.down_p));
  TORCH_CHECK(m.size(1) == hid, "decoder_layer_rows: down_proj width");
  if (norm_mlp_out.has_value()) m = normed(m, *norm_mlp_out, ef, gemma);
  add_into(fptr(x), fptr(m), x.data_ptr<float>(), T * hid);
  return x;
}

Tensor decoder_layer_rows(const Tensor& h, const Tensor& norm_in, const Tensor& norm_mlp,
                          const c10::optional<Tensor>& norm_attn_out, const c10::optional<Tensor>& norm_mlp_out,
                          const c10::optional<Tensor>& qk_norm, double eps, bool gemma, int64_t act,
                          const Tensor& qkv_p, const Tensor& qkv_s, const Tensor& o_p, const Tensor& o_s,
                          const Tensor& gu_p, const Tensor& gu_s, const Tensor& down_p, const Tensor& down_s,
                          int64_t group_size, const Tensor& cos, const Tensor& sin, Tensor k_pool, Tensor v_pool,
                          const Tensor& slot_mapping, const Tensor& gather_slots, const Tensor& rows, double scale,
                          bool parallel, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  const LayerArgs A{norm_in, norm_mlp, norm_attn_out, norm_mlp_out, qk_norm, eps, gemma, act, qkv_p, qkv_s, o_p, o_s,
                    gu_p, gu_s, down_p, down_s, group_size, num_heads, num_kv_heads, head_dim};
  return layer_forward(A, h, cos, sin, k_pool, v_pool, slot_mapping, gather_slots, rows, scale, parallel);
}

// A model's layers, held once (layers/cpu_decode.py builds one per model), so a step runs them all
// in one call: a per-layer call from Python costs ~50 us on a decode step (its objects come back
// cold from memory, the layers' weights having streamed through the caches since).
struct LayerStack : torch::CustomClassHolder {
  struct Entry {
    LayerArgs args;
    double scale;
    int64_t rope, group;  // indices into the step's rope / KV-group lists
  };
  std::vector<Entry> layers;

  void add(const Tensor& norm_in, const Tensor& norm_mlp, const c10::optional<Tensor>& norm_attn_out,
           const c10::optional<Tensor>& norm_mlp_out, const c10::optional<Tensor>& qk_norm, double eps, bool gemma,
           int64_t act, const Tensor& qkv_p, const Tensor& qkv_s, const Tensor& o_p, const Tensor& o_s,
           const Tensor& gu_p, const Tensor& gu_s, const Tensor& down_p, const Tensor& down_s, int64_t group_size,
           int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double scale, int64_t rope, int64_t group) {
    layers.push_back({{norm_in, norm_mlp, norm_attn_out, norm_mlp_out, qk_norm, eps, gemma, act, qkv_p, qkv_s, o_p, o_s,
                       gu_p, gu_s, down_p, down_s, group_size, num_heads, num_kv_heads, head_dim},
                      scale, rope, group});
  }
  int64_t size() const { return static_cast<int64_t>(layers.size()); }
};

// The pool slots a step's attention reads in one KV group, as runs [first slot, count) of
// consecutive slots: each request's keys once (the rows of one request read nested ranges: their
// union is [min lo, max hi)); slots outside [0, S) are left out. What a layer's K/V warming reads.
std::vector<std::pair<int64_t, int64_t>> slot_runs(const Tensor& gather_slots, const Tensor& rows, int64_t S) {
  std::vector<std::pair<int64_t, int64_t>> out;
  // a plan the attention call would reject (it says why) warms nothing
  if (gather_slots.dim() != 2 || gather_slots.scalar_type() != at::kLong || !gather_slots.is_contiguous() ||
      rows.dim() != 2 || rows.size(1) != 3 || rows.scalar_type() != at::kInt || !rows.is_contiguous())
    return out;
  const int64_t B = gather_slots.size(0), W = gather_slots.size(1), T = rows.size(0);
  const int64_t* gd = gather_slots.data_ptr<int64_t>();
  const int32_t* rd = rows.data_ptr<int32_t>();
  std::vector<std::pair<int64_t, int64_t>> span(B, {W, 0});  // per request: [lo, hi)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = rd[3 * t], lo = rd[3 * t + 1], hi = rd[3 * t + 2];
    if (b < 0 || b >= B || lo < 0 || hi > W) continue;
    span[b].first = std::min(span[b].first, lo);
    span[b].second = std::max(span[b].second, hi);
  }
  for (size_t b = 0; b < span.size(); ++b)
    for (int64_t j = span[b].first; j < span[b].second; ++j) {
      const int64_t slot = gd[b * W + j];
      if (slot < 0 || slot >= S) continue;  // not a valid slot: the attention call reports it
      if (!out.empty() && out.back().first + out.back().second == slot)
        ++out.back().second;
      else
        out.push_back({slot, 1});
    }
  return out;
}

void add_slot_runs(augury_cpu::WarmRanges& warm, const std::vector<std::pair<int64_t, int64_t>>& runs,
                   const Tensor& pool) {
  const int64_t slot_bytes = pool.size(1) * pool.size(2) * static_cast<int64_t>(pool.element_size());
  const char* base = static_cast<const char*>(pool.data_ptr());
  for (const auto& r : runs) warm.add(base + r.first * slot_bytes, r.second * slot_bytes);
}

// Tests: the lines a step's warming of `pool` prefetches, as [R, 2] int64 (byte offset from the pool's
// start, 64-byte lines), for a plan (gather_slots, rows) as the attention takes it.
Tensor kv_warm_lines(const Tensor& gather_slots, const Tensor& rows, const Tensor& pool) {
  augury_cpu::WarmRanges warm;
  add_slot_runs(warm, slot_runs(gather_slots, rows, pool.size(0)), pool);
  auto out = at::empty({static_cast<int64_t>(warm.start.size()), 2}, at::kLong);
  auto* o = out.data_ptr<int64_t>();
  const char* base = static_cast<const char*>(pool.data_ptr());
  for (size_t i = 0; i < warm.start.size(); ++i) {
    o[2 * i] = warm.start[i] - base;
    o[2 * i + 1] = warm.lines[i];
  }
  return out;
}

// Layers [0, n) of the stack on h. Per rope r: cos[r], sin[r]; per KV group g: slot_mappings[g],
// gather_slots[g], rows[g], parallel[g]; per layer i: k_pools[i], v_pools[i].
Tensor decoder_stack_rows(const c10::intrusive_ptr<LayerStack>& stack, const Tensor& h, int64_t n,
                          at::TensorList cos, at::TensorList sin, at::TensorList k_pools, at::TensorList v_pools,
                          at::TensorList slot_mappings, at::TensorList gather_slots, at::TensorList rows,
                          at::IntArrayRef parallel) {
  TORCH_CHECK(n >= 0 && n <= stack->size() && static_cast<int64_t>(k_pools.size()) >= n &&
                  static_cast<int64_t>(v_pools.size()) >= n, "decoder_stack_rows: ", n, " layers of ", stack->size());
  const auto G = static_cast<int64_t>(slot_mappings.size()), R = static_cast<int64_t>(cos.size());
  TORCH_CHECK(static_cast<int64_t>(gather_slots.size()) == G && static_cast<int64_t>(rows.size()) == G &&
                  static_cast<int64_t>(parallel.size()) == G && static_cast<int64_t>(sin.size()) == R,
              "decoder_stack_rows: one slot mapping, gather, row plan and flag per KV group; cos and sin per rope");
  if (n == 0) return h.clone();  // the schema promises a new tensor
  for (int64_t i = 0; i < n; ++i) {
    const auto& e = stack->layers[i];
    TORCH_CHECK(e.rope >= 0 && e.rope < R && e.group >= 0 && e.group < G, "decoder_stack_rows: layer ", i,
                " names a rope or KV group the call lacks");
  }
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs(G);  // per KV group, built on first use
  std::vector<bool> have_runs(G, false);
  augury_cpu::WarmRanges warm;
  Tensor x = h;
  for (int64_t i = 0; i < n; ++i) {
    const auto& e = stack->layers[i];
    augury_cpu::WarmRanges* warm_next = nullptr;
    if (i + 1 < n) {  // the next layer's K/V slots, warmed during this layer's o_proj and MLP
      const int64_t g = stack->layers[i + 1].group;
      if (!have_runs[g]) {
        runs[g] = slot_runs(gather_slots[g], rows[g], k_pools[i + 1].size(0));
        have_runs[g] = true;
      }
      warm = augury_cpu::WarmRanges();
      add_slot_runs(warm, runs[g], k_pools[i + 1]);
      add_slot_runs(warm, runs[g], v_pools[i + 1]);
      warm_next = &warm;
    }
    x = layer_forward(e.args, x, cos[e.rope], sin[e.rope], k_pools[i], v_pools[i], slot_mappings[e.group],
                      gather_slots[e.group], rows[e.group], e.scale, parallel[e.group] != 0, warm_next);
  }
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.class_<LayerStack>("LayerStack").def(torch::init<>()).def("add", &LayerStack::add).def("size", &LayerStack::size);
  m.def("decoder_layer_rows(Tensor h, Tensor norm_in, Tensor norm_mlp, Tensor? norm_attn_out, Tensor? norm_mlp_out, "
        "Tensor? qk_norm, float eps, bool gemma, int act, Tensor qkv_p, Tensor qkv_s, Tensor o_p, Tensor o_s, "
        "Tensor gu_p, Tensor gu_s, Tensor down_p, Tensor down_s, int group_size, Tensor cos, Tensor sin, "
        "Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slot_mapping, Tensor gather_slots, Tensor rows, float scale, "
        "bool parallel, int num_heads, int num_kv_heads, int head_dim) -> Tensor");
  m.def("decoder_stack_rows(__torch__.torch.classes.augury_cpu.LayerStack stack, Tensor h, int n, Tensor[] cos, "
        "Tensor[] sin, Tensor(a!)[] k_pools, Tensor(b!)[] v_pools, Tensor[] slot_mappings, Tensor[] gather_slots, "
        "Tensor[] rows, int[] parallel) -> Tensor");
  m.def("kv_warm_lines(Tensor gather_slots, Tensor rows, Tensor pool) -> Tensor");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("decoder_layer_rows", &decoder_layer_rows);
  m.impl("decoder_stack_rows", &decoder_stack_rows);
  m.impl("kv_warm_lines", &kv_warm_lines);
}
