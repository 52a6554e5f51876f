// SMOE-Q2/Q4 decoding (ruling D2) and the expert's SwiGLU forward pass.
#pragma once

#include "vault.hpp"

#include <cstdint>
#include <vector>

namespace smoe::harness {

/// One quantised weight matrix inside an in-memory blob.
struct QTensor {
    const uint8_t* packed;  // ceil(rows * cols * bits / 8) bytes, LSB-first codes
    const uint8_t* scales;  // ceil(rows * cols / 64) little-endian fp16
    uint32_t rows, cols, bits;
};

/// The three matrices of expert `e`, whose blob (raw bytes from offset 0) is at `blob`.
void expert_tensors(const Expert& e, const uint8_t* blob, uint32_t bits, QTensor out[3]);

/// Exact D2 decoding of weights [first, first + count) of the row-major flattening:
/// w = lut[code] * scale, lut[code] = float((code - c) / c). Bit-identical to
/// smoe.quant.decode.
void dequantize(const QTensor& q, uint64_t first, uint64_t count, float* out);

/// SwiGLU expert: y = down(silu(gate x) * up x); x has gate.cols floats, y down.rows.
/// Vectorised (SIMD for whole-group rows, x86 AVX2 when the CPU has it).
class ExpertKernel {
public:
    void forward(const QTensor t[3], const float* x, float* y);

private:
    void matvec(const QTensor& q, const float* x, float* y);
    std::vector<float> h_, u_, xp_, row_;
};

/// The plain scalar loop the benchmark compares against: decode every weight as it
/// is used, one multiply-add at a time.
void forward_scalar_reference(const QTensor t[3], const float* x, float* y);

/// Name of the SIMD path matvec uses on this CPU ("avx2" or "generic").
const char* simd_path();

}  // namespace smoe::harness
