// linear's P3' epilogue in CUDA C (contract linear v2, `linear_finish`): one element
//     y = RN_out(C * 2**(ex + ew - 47))              without a bias,
//     y = RN_out(RN32(RN32(C * 2**(ex + ew - 47)) + bias))   with one,
// canonical NaN where the x row or the weight row is non-finite (exponent sentinel 2**20).
//
// Integer operations and IEEE binary64/binary32 operations in round-to-nearest-even only (build
// with FMA contraction off: NVRTC --fmad=false, g++ -ffp-contract=off), so the same source gives
// the same bits on the GPU and on the host, where tests/test_cuda_epilogue.py compares it with the
// contract on adversarial values (ties, subnormals, overflow, signed zeros, sentinels).
//
// Steps: |C| rounded to odd at 53 bits (exact below 2**53; above, the truncation with its last bit
// set where bits were dropped), times 2**ex and 2**(ew - 47) (powers of two, exact: exponents lie
// in [-149, 128]), rounded once to the output format: fp32 directly; bf16 / fp16 through a round to
// odd at fp32's 24 bits, then the format's nearest-even rounding (RN_p(RO_q(v)) = RN_p(v) for
// q >= p + 2). The sign is set from C's, so a negative value that rounds to zero gives -0.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define RLK_HD __host__ __device__ __forceinline__  // not static: no unused-function warnings
#else
#define RLK_HD static inline
#include <string.h>
#endif

typedef long long rlk_i64;
typedef unsigned long long rlk_u64;
typedef unsigned int rlk_u32;

#define RLK_SENTINEL (1LL << 20)

RLK_HD double rlk_f64_from_bits(rlk_u64 b) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)b);
#else
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
#endif
}

RLK_HD rlk_u32 rlk_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return (rlk_u32)__float_as_uint(f);
#else
    rlk_u32 b;
    memcpy(&b, &f, sizeof b);
    return b;
#endif
}

RLK_HD float rlk_f32_from_bits(rlk_u32 b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
#endif
}

RLK_HD int rlk_clz64(rlk_u64 v) {  // v > 0
#if defined(__CUDA_ARCH__)
    return __clzll((long long)v);
#else
    return __builtin_clzll(v);
#endif
}

// explicit round-to-nearest operations (never contracted, whatever the build's options)
RLK_HD double rlk_dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

RLK_HD float rlk_fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// 2**k as fp64 for k in [-1022, 1023]
RLK_HD double rlk_pow2(int k) { return rlk_f64_from_bits((rlk_u64)(k + 1023) << 52); }

// mag (0 <= mag < 2**63) rounded to odd at 53 bits, as fp64
RLK_HD double rlk_ro53(rlk_u64 mag) {
    if (mag < (1ULL << 53)) return (double)(rlk_i64)mag;  // exact
    const int drop = 11 - rlk_clz64(mag);                   // bits below the 53 kept ones (1..10)
    const rlk_u64 kept = (mag >> drop) | ((mag & ((1ULL << drop) - 1)) != 0);
    return rlk_dmul((double)(rlk_i64)kept, rlk_pow2(drop));  // both exact
}

// fp32 -> bf16 bits, nearest-even; NaN -> 0x7FC0
RLK_HD unsigned short rlk_f32_to_bf16_bits(float f) {
    const rlk_u32 b = rlk_f32_bits(f);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// fp32 -> fp16 bits, nearest-even (subnormals, overflow to inf); NaN -> 0x7E00
RLK_HD unsigned short rlk_f32_to_f16_bits(float f) {
    const rlk_u32 b = rlk_f32_bits(f);
    const rlk_u32 sign = (b >> 16) & 0x8000u;
    const rlk_u32 a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7E00;
    if (a >= 0x477FF000u) return (unsigned short)(sign | 0x7C00u);  // >= 65520: rounds to inf
    if (a >= 0x38800000u) {                                          // >= 2**-14: a normal half
        const rlk_u32 v = a - 0x38000000u;                           // exponent rebiased from 127 to 15
        return (unsigned short)(sign | ((v + 0xFFFu + ((v >> 13) & 1u)) >> 13));
    }
    const rlk_u32 e = a >> 23;
    if (e < 102) return (unsigned short)sign;  // below 2**-25: rounds to zero
    // a subnormal half: m * 2**(e - 150) in units of 2**-24 is m >> (126 - e), rounded to even
    const rlk_u32 m = (a & 0x7FFFFFu) | 0x800000u;
    const rlk_u32 s = 126 - e;  // 14..24
    rlk_u32 q = m >> s;
    const rlk_u32 rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    q += (rem > half) || (rem == half && (q & 1u));
    return (unsigned short)(sign | q);
}

// fp64 y >= 0, exact or rounded to odd at 53 bits, rounded once to the output format (0 fp32,
// 1 bf16, 2 fp16), as the fp32 that holds that value
RLK_HD float rlk_f64_to_out(double y, int out) {
    float f = (float)y;  // nearest-even (overflow to inf)
    if (out == 0) return f;
    const double fd = (double)f;
    // round to odd at 24 bits: one ulp toward zero where the conversion went up, last bit set if inexact
    f = rlk_f32_from_bits((rlk_f32_bits(f) - (fd > y ? 1u : 0u)) | (fd != y ? 1u : 0u));
    if (out == 1) return rlk_f32_from_bits((rlk_u32)rlk_f32_to_bf16_bits(f) << 16);
    const unsigned short h = rlk_f32_to_f16_bits(f);  // f >= 0 and not NaN: a finite half or +inf
    const rlk_u32 he = (h >> 10) & 0x1Fu, hm = h & 0x3FFu;
    if (he == 0x1F) return rlk_f32_from_bits(0x7F800000u);
    if (he == 0) return (float)rlk_dmul((double)hm, rlk_pow2(-24));  // exact: a subnormal half
    return rlk_f32_from_bits(((he + 112u) << 23) | (hm << 13));
}

// fp16 / bf16 bits -> fp32 (exact)
RLK_HD float rlk_f16_bits_to_f32(unsigned short h) {
    const rlk_u32 sign = (rlk_u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return rlk_f32_from_bits(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));  // NaN quieted
    if (e == 0) return rlk_f32_from_bits(rlk_f32_bits((float)rlk_dmul((double)m, rlk_pow2(-24))) | sign);
    return rlk_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

RLK_HD float rlk_bf16_bits_to_f32(unsigned short h) { return rlk_f32_from_bits((rlk_u32)h << 16); }

// One element: C, the row's and the column's exponents, the bias (upcast to fp32; ignored without
// one), the output format; returns the output's bits (fp32 bits, or bf16 / fp16 bits in the low half)
RLK_HD rlk_u32 rlk_linear_out(rlk_i64 c, rlk_i64 ex, rlk_i64 ew, float bias, int has_bias, int out) {
    const bool live = ex != RLK_SENTINEL && ew != RLK_SENTINEL;
    float y;
    if (live) {
        const bool neg = c < 0;
        const rlk_u64 mag = neg ? (rlk_u64)0 - (rlk_u64)c : (rlk_u64)c;
        const double v = rlk_dmul(rlk_dmul(rlk_ro53(mag), rlk_pow2((int)ex)), rlk_pow2((int)ew - 47));
        y = rlk_f64_to_out(v, has_bias ? 0 : out);
        y = rlk_f32_from_bits(rlk_f32_bits(y) | (neg ? 0x80000000u : 0u));
    } else {
        y = rlk_f32_from_bits(0x7FC00000u);
    }
    if (has_bias) y = rlk_fadd(y, bias);  // one IEEE fp32 addition
    if (out == 1) return rlk_f32_to_bf16_bits(y);
    if (out == 2) return rlk_f32_to_f16_bits(y);
    const rlk_u32 b = rlk_f32_bits(y);
    return (b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : b;
}
