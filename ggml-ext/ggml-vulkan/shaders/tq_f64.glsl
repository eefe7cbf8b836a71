// tq_f64.glsl - the exactly rounded steps the encoders (tq_encode.comp, tq_tcq_encode.comp) share:
// the sanitized f64 load of an input and the f64 -> f32 (-> f16) roundings, done in integer
// arithmetic so that no driver's conversion mode or denormal flush can change a bit.
// Included after the generic head, whose data_a (the f32 input) tq_load reads.

// codec kernels/scalar.rs sanitize(): NaN -> 0, +-Inf -> +-65504; then widened to f64 exactly.
double tq_load(uint i) {
    const uint b = floatBitsToUint(data_a[i]);
    const uint e = (b >> 23) & 0xffu;
    const bool neg = (b >> 31) != 0u;
    if (e == 0xffu) {
        if ((b & 0x7fffffu) != 0u) {
            return 0.0lf;
        }
        return neg ? -65504.0lf : 65504.0lf;
    }
    if (e == 0u) {
        // zero or subnormal: m * 2^-149, exact in f64 whatever the driver does with f32 denormals
        const double m = ldexp(double(b & 0x7fffffu), -149);
        return neg ? -m : m;
    }
    return double(uintBitsToFloat(b));
}

// |r| -> the f32 bits of |r| rounded to nearest even: 0 below f32's normal range (no encoder
// needs an f32 subnormal: see the callers), Inf at 2^128 and above.
uint tq_f32_bits(const double r) {
    const uvec2 dw = unpackDouble2x32(r);
    const int e32 = int((dw.y >> 20) & 0x7ffu) - 1023 + 127;
    if (e32 <= 0) {
        return 0u;
    }
    if (e32 >= 255) {
        return 0x7f800000u;
    }
    // 23 mantissa bits, the 29 dropped ones decide; a carry moves into the exponent (Inf at most)
    const uint m = ((dw.y & 0xfffffu) << 3) | (dw.x >> 29);
    const uint rem = dw.x & 0x1fffffffu;
    uint f = (uint(e32) << 23) + m;
    if (rem > 0x10000000u || (rem == 0x10000000u && (f & 1u) != 0u)) {
        f += 1u;
    }
    return f;
}

// f64 (positive) -> f32 -> f16 bits, each rounding to nearest even; Inf clamps to 65504. Below
// f32's normal range f16 rounds to +0 either way.
uint tq_scale_bits(const double r) {
    const uint f = tq_f32_bits(r);
    const uint e = f >> 23;
    const uint mant = f & 0x7fffffu;
    if (e >= 143u) {
        return 0x7bffu; // >= 2^16: Inf in f16, clamped
    }
    if (e >= 113u) {
        uint h = ((e - 112u) << 10) | (mant >> 13);
        const uint low = mant & 0x1fffu;
        if (low > 0x1000u || (low == 0x1000u && (h & 1u) != 0u)) {
            h += 1u;
        }
        return min(h, 0x7bffu);
    }
    if (e < 102u) {
        return 0u;
    }
    // f16 subnormal: round((1.mant) * 2^(e-127) / 2^-24)
    const uint s = 126u - e;
    const uint full = mant | 0x800000u;
    uint h = full >> s;
    const uint low = full & ((1u << s) - 1u);
    const uint half_ = 1u << (s - 1u);
    if (low > half_ || (low == half_ && (h & 1u) != 0u)) {
        h += 1u;
    }
    return h;
}
