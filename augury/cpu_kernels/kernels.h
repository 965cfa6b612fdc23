// The kernels one augury_cpu file calls in another (decoder_layer.cpp calls the products, the norm
// and attention directly, not through the dispatcher: a layer makes a dozen such calls per step).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace augury_cpu {

// int4_gemm.cpp: x [M, K] float32 -> [M, N] float32
at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& sz, int64_t group_size);

// rms_norm.cpp: rows of D floats, y = x / sqrt(mean(x^2) + eps) (the op rms_norm, on raw rows)
void rms_norm_rows(const float* x, float* y, int64_t rows, int64_t D, float eps);

// attention.cpp: q [T, H, D]; pools [S, Hkv, D] -> [T, H, D] in q's dtype
at::Tensor paged_attention_rows(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                const at::Tensor& gather_slots, const at::Tensor& rows, double scale, bool parallel);

}  // namespace augury_cpu
