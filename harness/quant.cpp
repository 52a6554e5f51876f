#include "quant.hpp"

#include "fp16.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace smoe::harness {

namespace {

// ---- exact decoding (D2) ---------------------------------------------------------------

/// lut[code] = float((code - c) / c), the level of each code, rounded once from double
/// exactly as smoe.quant does; a weight is then lut[code] * scale in float32.
struct Levels {
    float q[BITS_Q4 + 1][1u << BITS_Q4];
    Levels() {
        for (uint32_t bits : {BITS_Q2, BITS_Q4}) {
            const double c = code_centre(bits);  // 1.5 or 7.5, exact
            for (uint32_t code = 0; code < (1u << bits); ++code)
                q[bits][code] = static_cast<float>((code - c) / c);
        }
    }
};
const Levels LEVELS;

template <uint32_t BITS>
void dequantize_bits(const QTensor& q, uint64_t first, uint64_t count, float* out) {
    constexpr uint32_t PER = 8 / BITS, MASK = (1u << BITS) - 1;
    const float* lut = LEVELS.q[BITS];
    uint64_t group = ~uint64_t{0};
    float scale = 0;
    for (uint64_t i = first; i < first + count; ++i) {
        if (i / GROUP_SIZE != group) {
            group = i / GROUP_SIZE;
            scale = load_fp16(q.scales + group * SCALE_BYTES);
        }
        const uint32_t code = (q.packed[i / PER] >> ((i % PER) * BITS)) & MASK;
        out[i - first] = lut[code] * scale;
    }
}

// ---- SIMD kernels ----------------------------------------------------------------------
// GCC/Clang vector extensions: portable C++ that compiles to SSE2 by default and to AVX2
// in the copies built with target("avx2") below (picked at run time).

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
// Unaligned, aliasing-safe views for loads (macros: passing or returning a 32-byte
// vector by value would change the ABI between the SSE2 and AVX2 copies).
typedef float v8f_unaligned __attribute__((vector_size(32), aligned(1), may_alias));
typedef int32_t v8i_unaligned __attribute__((vector_size(32), aligned(1), may_alias));
#define LOAD8F(p) (*reinterpret_cast<const v8f_unaligned*>(p))
#define LOAD8I(p) (*reinterpret_cast<const v8i_unaligned*>(p))

/// Codes per 32-bit word and weights per 32-byte block (8 words): a block is one group
/// for Q4 and two groups for Q2.
template <uint32_t BITS>
constexpr uint32_t WORD_CODES = 32 / BITS;
template <uint32_t BITS>
constexpr uint32_t BLOCK_WEIGHTS = 8 * WORD_CODES<BITS>;
constexpr uint32_t BLOCK_BYTES = 32;

/// y = W x for a matrix whose rows are whole 32-byte blocks (cols % 64 == 0 for Q4,
/// % 128 for Q2), fused with decoding so no weight is ever stored.
///
/// A block is loaded as eight 32-bit lanes; lane k holds the codes of weights
/// k * WORD_CODES + t (t = 0.., LSB first), so code t of every lane is one shift and
/// one mask away, all in 32-bit lanes. x is pre-permuted to match (xp, see
/// permute_input): xp[t * 8 + k] = x[k * WORD_CODES + t] within each block. Each group
/// then contributes scale * sum((code - c) * x), and y is divided by c at the end.
template <uint32_t BITS>
[[gnu::always_inline]] inline void matvec_blocks(const uint8_t* packed, const uint8_t* scales,
                                                 uint32_t rows, uint32_t cols, const float* xp,
                                                 float* y) {
    constexpr uint32_t CODES = WORD_CODES<BITS>;
    constexpr int32_t MASK = (1 << BITS) - 1;
    constexpr float C = code_centre(BITS);
    const uint64_t blocks = cols / BLOCK_WEIGHTS<BITS>;
    const uint8_t* p = packed;
    const uint8_t* sc = scales;
    for (uint32_t r = 0; r < rows; ++r) {
        v8f acc0 = {}, acc1 = {};
        for (uint64_t b = 0; b < blocks; ++b, p += BLOCK_BYTES) {
            const v8i words = LOAD8I(p);
            const float* xb = xp + b * BLOCK_WEIGHTS<BITS>;
            v8f part0 = {}, part1 = {};  // two chains to hide add latency
#pragma GCC unroll 16
            for (uint32_t t = 0; t < CODES; t += 2) {
                const v8f l0 = __builtin_convertvector((words >> (t * BITS)) & MASK, v8f) - C;
                const v8f l1 = __builtin_convertvector((words >> ((t + 1) * BITS)) & MASK, v8f) - C;
                part0 += l0 * LOAD8F(xb + t * 8);
                part1 += l1 * LOAD8F(xb + (t + 1) * 8);
            }
            v8f scale;
            if constexpr (BITS == BITS_Q4) {  // one group per block
                const float s = load_fp16(sc);
                scale = v8f{s, s, s, s, s, s, s, s};
                sc += SCALE_BYTES;
            } else {  // lanes 0-3 are one group, lanes 4-7 the next
                const float s0 = load_fp16(sc), s1 = load_fp16(sc + SCALE_BYTES);
                scale = v8f{s0, s0, s0, s0, s1, s1, s1, s1};
                sc += 2 * SCALE_BYTES;
            }
            if (b & 1)
                acc1 += (part0 + part1) * scale;
            else
                acc0 += (part0 + part1) * scale;
        }
        const v8f acc = acc0 + acc1;
        float total = 0;
        for (int k = 0; k < 8; ++k)
            total += acc[k];
        y[r] = total / C;
    }
}

/// xp for matvec_blocks: x reordered within each block to the lanes' code order.
template <uint32_t BITS>
void permute_input(const float* x, uint32_t cols, float* xp) {
    constexpr uint32_t CODES = WORD_CODES<BITS>, W = BLOCK_WEIGHTS<BITS>;
    for (uint32_t b0 = 0; b0 < cols; b0 += W)
        for (uint32_t t = 0; t < CODES; ++t)
            for (uint32_t k = 0; k < 8; ++k)
                xp[b0 + t * 8 + k] = x[b0 + k * CODES + t];
}

/// Dot product with eight-lane vector accumulators (the compiler will not reorder a
/// scalar float sum by itself).
[[gnu::always_inline]] inline float dot(const float* a, const float* b, uint32_t n) {
    v8f acc0 = {}, acc1 = {};
    uint32_t k = 0;
    for (; k + 16 <= n; k += 16) {
        acc0 += LOAD8F(a + k) * LOAD8F(b + k);
        acc1 += LOAD8F(a + k + 8) * LOAD8F(b + k + 8);
    }
    const v8f acc = acc0 + acc1;
    float total = 0;
    for (int j = 0; j < 8; ++j)
        total += acc[j];
    for (; k < n; ++k)
        total += a[k] * b[k];
    return total;
}

void matvec_q4(const uint8_t* p, const uint8_t* s, uint32_t r, uint32_t c, const float* xp,
               float* y) {
    matvec_blocks<BITS_Q4>(p, s, r, c, xp, y);
}
void matvec_q2(const uint8_t* p, const uint8_t* s, uint32_t r, uint32_t c, const float* xp,
               float* y) {
    matvec_blocks<BITS_Q2>(p, s, r, c, xp, y);
}
using MatvecFn = void (*)(const uint8_t*, const uint8_t*, uint32_t, uint32_t, const float*, float*);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
[[gnu::target("avx2")]] void matvec_q4_avx2(const uint8_t* p, const uint8_t* s, uint32_t r,
                                            uint32_t c, const float* xp, float* y) {
    matvec_blocks<BITS_Q4>(p, s, r, c, xp, y);
}
[[gnu::target("avx2")]] void matvec_q2_avx2(const uint8_t* p, const uint8_t* s, uint32_t r,
                                            uint32_t c, const float* xp, float* y) {
    matvec_blocks<BITS_Q2>(p, s, r, c, xp, y);
}
bool have_avx2() {
    // SMOE_STREAM_NO_AVX2 forces the portable path (the tests run both).
    static const bool yes = __builtin_cpu_supports("avx2") && !std::getenv("SMOE_STREAM_NO_AVX2");
    return yes;
}
#else
bool have_avx2() {
    return false;
}
#endif

MatvecFn pick_matvec(uint32_t bits) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2())
        return bits == BITS_Q4 ? matvec_q4_avx2 : matvec_q2_avx2;
#endif
    return bits == BITS_Q4 ? matvec_q4 : matvec_q2;
}

// ---- scalar reference ---------------------------------------------------------------------

template <uint32_t BITS>
void matvec_scalar(const QTensor& q, const float* x, float* y) {
    constexpr uint32_t PER = 8 / BITS, MASK = (1u << BITS) - 1;
    const float* lut = LEVELS.q[BITS];
    uint64_t group = ~uint64_t{0};
    float scale = 0;
    for (uint32_t r = 0; r < q.rows; ++r) {
        float acc = 0;
        for (uint32_t c = 0; c < q.cols; ++c) {
            const uint64_t i = uint64_t{r} * q.cols + c;
            if (i / GROUP_SIZE != group) {
                group = i / GROUP_SIZE;
                scale = load_fp16(q.scales + group * SCALE_BYTES);
            }
            const uint32_t code = (q.packed[i / PER] >> ((i % PER) * BITS)) & MASK;
            acc += lut[code] * scale * x[c];
        }
        y[r] = acc;
    }
}

float silu(float z) {
    return z / (1.0f + std::exp(-z));
}

}  // namespace

void expert_tensors(const Expert& e, const uint8_t* blob, uint32_t bits, QTensor out[3]) {
    for (uint32_t t = 0; t < TENSORS_PER_EXPERT; ++t) {
        const Tensor& d = e.tensors[t];
        out[t] = QTensor{blob + d.packed_offset, blob + d.scales_offset, d.rows, d.cols, bits};
    }
}

void dequantize(const QTensor& q, uint64_t first, uint64_t count, float* out) {
    if (q.bits == BITS_Q4)
        dequantize_bits<BITS_Q4>(q, first, count, out);
    else
        dequantize_bits<BITS_Q2>(q, first, count, out);
}

void ExpertKernel::matvec(const QTensor& q, const float* x, float* y) {
    const bool q4 = q.bits == BITS_Q4;
    if (q.cols % (q4 ? BLOCK_WEIGHTS<BITS_Q4> : BLOCK_WEIGHTS<BITS_Q2>) == 0) {
        // Every row is whole 32-byte blocks (and whole groups): the fused SIMD kernel.
        xp_.resize(q.cols);
        if (q4)
            permute_input<BITS_Q4>(x, q.cols, xp_.data());
        else
            permute_input<BITS_Q2>(x, q.cols, xp_.data());
        pick_matvec(q.bits)(q.packed, q.scales, q.rows, q.cols, xp_.data(), y);
        return;
    }
    // Other shapes (rows straddle groups or blocks): decode a row at a time, SIMD dot.
    row_.resize(q.cols);
    for (uint32_t r = 0; r < q.rows; ++r) {
        dequantize(q, uint64_t{r} * q.cols, q.cols, row_.data());
        y[r] = dot(row_.data(), x, q.cols);
    }
}

void ExpertKernel::forward(const QTensor t[3], const float* x, float* y) {
    const uint32_t ffn = t[0].rows;
    h_.resize(ffn);
    u_.resize(ffn);
    matvec(t[0], x, h_.data());
    matvec(t[1], x, u_.data());
    for (uint32_t k = 0; k < ffn; ++k)
        h_[k] = silu(h_[k]) * u_[k];
    matvec(t[2], h_.data(), y);
}

void forward_scalar_reference(const QTensor t[3], const float* x, float* y) {
    const uint32_t ffn = t[0].rows;
    std::vector<float> h(ffn), u(ffn);
    auto mv = [](const QTensor& q, const float* in, float* out) {
        if (q.bits == BITS_Q4)
            matvec_scalar<BITS_Q4>(q, in, out);
        else
            matvec_scalar<BITS_Q2>(q, in, out);
    };
    mv(t[0], x, h.data());
    mv(t[1], x, u.data());
    for (uint32_t k = 0; k < ffn; ++k)
        h[k] = silu(h[k]) * u[k];
    mv(t[2], h.data(), y);
}

const char* simd_path() {
    return have_avx2() ? "avx2" : "generic";
}

}  // namespace smoe::harness
