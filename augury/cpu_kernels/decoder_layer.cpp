// One pre-norm (Llama-style) decoder layer for few-row eager CPU steps, as one call.
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

// RMSNorm's eager CPU path: weight * rms_norm(x.float()).to(x.dtype)
Tensor norm(const Tensor& x, const Tensor& weight, double eps) {
  auto h = rms_norm_rows(x.to(at::kFloat).reshape({-1, x.size(-1)}).contiguous(), eps).view(x.sizes());
  return weight * h.to(x.scalar_type());
}

// Int4Linear.forward's plain 2-D path: the kernel on float32, cast back to x's dtype
Tensor linear(const Tensor& x, const Tensor& packed, const Tensor& scales, int64_t group_size) {
  return int4_mm(x.to(at::kFloat).contiguous(), packed, scales, group_size).to(x.scalar_type());
}

// h [T, hidden]; per linear (qkv, o, gate_up, down): packed, scales; cos/sin [T, 1, D];
// pools [S, Hkv, D]; slot_mapping [T]; gather_slots/rows: the step's native attention plan.
Tensor llama_layer_rows(const Tensor& h, const Tensor& norm1, double eps1, const Tensor& qkv_p, const Tensor& qkv_s,
                        const Tensor& o_p, const Tensor& o_s, const Tensor& norm2, double eps2, const Tensor& gu_p,
                        const Tensor& gu_s, const Tensor& down_p, const Tensor& down_s, int64_t group_size,
                        const Tensor& cos, const Tensor& sin, Tensor k_pool, Tensor v_pool,
                        const Tensor& slot_mapping, const Tensor& gather_slots, const Tensor& rows, double scale,
                        bool parallel, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  TORCH_CHECK(h.dim() == 2, "llama_layer_rows: h must be [T, hidden]");
  const int64_t T = h.size(0), H = num_heads, Hkv = num_kv_heads, D = head_dim;
  // attention block (models/base.py AttentionBlock.attend, without q/k norm)
  auto qkv = linear(norm(h, norm1, eps1), qkv_p, qkv_s, group_size).view({T, H + 2 * Hkv, D});
  auto qk = qkv.slice(1, 0, H + Hkv);
  qk = qk * cos + qk.roll({D / 2}, {-1}) * sin;  // layers/rope.py apply_rope
  auto q = qk.slice(1, 0, H), k = qk.slice(1, H, H + Hkv), v = qkv.slice(1, H + Hkv, H + 2 * Hkv);
  k_pool.index_copy_(0, slot_mapping, k.to(k_pool.scalar_type()));
  v_pool.index_copy_(0, slot_mapping, v.to(v_pool.scalar_type()));
  auto o = attention_rows(q.contiguous(), k_pool, v_pool, gather_slots, rows, scale, parallel);
  auto x = h + linear(o.reshape({T, H * D}), o_p, o_s, group_size);
  // MLP (layers/mlp.py GatedMLP, SiLU)
  auto gu = linear(norm(x, norm2, eps2), gu_p, gu_s, group_size).chunk(2, -1);
  return x + linear(at::silu(gu[0]) * gu[1], down_p, down_s, group_size);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(augury_cpu, m) {
  m.def("llama_layer_rows(Tensor h, Tensor norm1, float eps1, Tensor qkv_p, Tensor qkv_s, Tensor o_p, Tensor o_s, "
        "Tensor norm2, float eps2, Tensor gu_p, Tensor gu_s, Tensor down_p, Tensor down_s, int group_size, "
        "Tensor cos, Tensor sin, Tensor(a!) k_pool, Tensor(b!) v_pool, Tensor slot_mapping, Tensor gather_slots, "
        "Tensor rows, float scale, bool parallel, int num_heads, int num_kv_heads, int head_dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(augury_cpu, CPU, m) {
  m.impl("llama_layer_rows", &llama_layer_rows);
}
