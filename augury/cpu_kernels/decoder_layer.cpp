// One decoder layer (Llama-style pre-norm, or Gemma 3's sandwich norms) for few-row eager CPU steps, as one call.
//
// Why native: an eager decode step of SmolLM2 on 2 cores spends ~2.4 ms of its ~6.4 ms in Python
// around ~15 small torch calls per layer (norm, four int4 products, rope, two K/V writes, attention,
// chunk, SiLU, mul, two residual adds). This file runs the same calls, in the same order and with the
// same casts as LlamaDecoderLayer.forward's eager CPU path (layers/norm.py, Int4Linear.forward,
// layers/rope.py, layers/attention.py paged_attention -> native_rows_cpu), from C++: the same ATen
// kernels and the same augury_cpu kernels, so the results are bitwise those of the Python path;
// only the interpreter between them is gone. Callers check eligibility (layers/cpu_decode.py).

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>

namespace {

using at::Tensor;

Tensor int4_mm(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t group_size) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("augury_cpu::int4_mm", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t)>();
  return op.call(x, packed, scales, group_size);
}

Tensor rms_norm_rows(const Tensor& x, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("augury_cpu::rms_norm", "")
                       .typed<Tensor(const Tensor&, double)>();
  return op.call(x, eps);
}

Tensor attention_rows(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool, const Tensor& gather_slots,
                      const Tensor& rows, double scale, bool parallel) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("augury_cpu::paged_attention_rows", "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     double, bool)>();
  return op.call(q, k_pool, v_pool, gather_slots, rows, scale, parallel);
}

// RMSNorm's eager CPU path (layers/norm.py): rms_norm(x.float()) over the last dim, then
// Llama: weight * h.to(x.dtype); Gemma: (h * (1 + weight.float())).to(x.dtype)
Tensor norm(const Tensor& x, const Tensor& weight, double eps, bool gemma) {
  auto h = rms_norm_rows(x.to(at::kFloat).reshape({-1, x.size(-1)}).contiguous(), eps).view(x.sizes());
  if (gemma) return (h * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
  return weight * h.to(x.scalar_type());
}

// Int4Linear.forward's plain 2-D path: the kernel on float32, cast back to x's dtype
Tensor linear(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t group_size) {
  return int4_mm(x.to(at::kFloat).contiguous(), packed, scales, group_size).to(x.scalar_type());
}

// h [T, hidden]; per linear (qkv, o, gate_up, down): packed, scales; cos/sin [T, 1, D];
// pools [S, Hkv, D]; slot_mapping [T]; gather_slots/rows: the step's native attention plan.
// Llama (models/llama.py): h += attn(norm_in(h)); h += mlp(norm_mlp(h)).
// Gemma 3 (models/gemma3.py, sandwich norms): h += norm_attn_out(attn(norm_in(h)));
// h += norm_mlp_out(mlp(norm_mlp(h))). qk_norm: one RMSNorm over [T, H + Hkv, D] before rope.
// act: 0 SiLU, 1 GELU (tanh).
Tensor decoder_layer_rows(const Tensor& h, const Tensor& norm_in, const Tensor& norm_mlp,
                          const c10::optional<Tensor>& norm_attn_out, const c10::optional<Tensor>& norm_mlp_out,
                          const c10::optional<Tensor>& qk_norm, double eps, bool gemma, int64_t act,
                          const Tensor& qkv_p, const Tensor& qkv_s, const Tensor& o_p, const Tensor& o_s,
                          const Tensor& gu_p, const Tensor& gu_s, const Tensor& down_p, const Tensor& down_s,
                          int64_t group_size, const Tensor& cos, const Tensor& sin, Tensor k_pool, Tensor v_pool,
                          const Tensor& slot_mapping, const Tensor& gather_slots, const Tensor& rows, double scale,
                          bool parallel, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  TORCH_CHECK(h.dim() == 2, "decoder_layer_rows: h must be [T, hidden]");
  TORCH_CHECK(act == 0 || act == 1, "decoder_layer_rows: act 0 (SiLU) or 1 (GELU tanh)");
  const int64_t T = h.size(0), H = num_heads, Hkv = num_kv_heads, D = head_dim;
  // attention block (models/base.py AttentionBlock.attend)
  auto qkv = linear(norm(h, norm_in, eps, gemma), qkv_p, qkv_s, group_size).view({T, H + 2 * Hkv, D});
  auto qk = qkv.slice(1, 0, H + Hkv);
  if (qk_norm.has_value()) qk = norm(qk, *qk_norm, eps, gemma);
  qk = qk * cos + qk.roll({D / 2}, {-1}) * sin;  // layers/rope.py apply_rope
  auto q = qk.slice(1, 0, H), k = qk.slice(1, H, H + Hkv), v = qkv.slice(1, H + Hkv, H + 2 * Hkv);
  k_pool.index_copy_(0, slot_mapping, k.to(k_pool.scalar_type()));
  v_pool.index_copy_(0, slot_mapping, v.to(v_pool.scalar_type()));
  auto o = attention_rows(q.contiguous(), k_pool, v_pool, gather_slots, rows, scale, parallel);
  auto a = linear(o.reshape({T, H * D}), o_p, o_s, group_size);
  auto x = h + (norm_attn_out.has_value() ? norm(a, *norm_attn_out, eps, gemma) : a);
  // MLP (layers/mlp.py GatedMLP)
  auto gu = linear(norm(x, norm_mlp, eps, gemma), gu_p, gu_s, group_size).chunk(2, -1);
  auto g = act == 0 ? at::silu(gu[0]) : at::gelu(gu[0], "tanh");
  auto m = linear(g * gu[1], down_p, down_s, group_size);
  return x + (norm_mlp_out.has_value() ? norm(m, *norm_mlp_out, eps, gemma) : m);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("decoder_layer_rows(Tensor h, Tensor norm_in, Tensor norm_mlp, Tensor? norm_attn_out, Tensor? norm_mlp_out, "
        "Tensor? qk_norm, float eps, bool gemma, int act, Tensor qkv_p, Tensor qkv_s, Tensor o_p, Tensor o_s, "
        "Tensor gu_p, Tensor gu_s, Tensor down_p, Tensor down_s, int group_size, Tensor cos, Tensor sin, "
        "Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slot_mapping, Tensor gather_slots, Tensor rows, float scale, "
        "bool parallel, int num_heads, int num_kv_heads, int head_dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("decoder_layer_rows", &decoder_layer_rows);
}
