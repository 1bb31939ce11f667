// Special functions for the element-wise kernels, accurate to a few ulp in float32.
//
// WGSL has no erf, and its exp() / pow() lose accuracy in proportion to the size of
// the argument (exp(a) is exp2(a * log2 e), pow(x, y) is exp2(y * log2 x), each
// argument rounded to float32). Compilers may also reassociate additions and evaluate
// fma() unfused, so error-free transformations built from additions (two-sum) do not
// survive; what is exact here is exact by construction: a float is split by masking
// its bits into a 12-bit head and the exact remainder, so products of heads and tails
// have at most 24 significant bits and are exact. Special values are decided on bit
// patterns, as everywhere.

// The 12 most significant bits of x (the remainder x - head is exact).
fn head12(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) & 0xfffff000u);
}

// a * 2^n for any integer n (two exact scalings keep each factor a normal float).
fn scale2(a: f32, n: i32) -> f32 {
    let n1 = clamp(n / 2, -126, 127);
    let n2 = clamp(n - n1, -126, 127);
    return a * bitcast<f32>(u32(n1 + 127) << 23u) * bitcast<f32>(u32(n2 + 127) << 23u);
}

// exp(a) with the range reduced exactly: a = n ln2 + f with n * 0.693359375 exact and
// a - n * 0.693359375 exact (the two are within ln2 of each other), so the error does
// not grow with |a| as the builtin's does.
fn exp_reduced(a: f32) -> f32 {
    if (a < -104.0) {
        return 0.0;
    }
    if (a > 89.0) {
        return f32_inf();
    }
    let n = round(a * 1.4426950408889634);
    let f = (a - n * 0.693359375) + n * 2.12194440e-4;
    return scale2(exp(f), i32(n));
}

// erfc(z) for z >= 0 given z * z = sq + sq_lo exactly (Numerical Recipes' erfcc,
// fractional error < 1.2e-7): t exp(-z^2 + P(t)) with t = 1 / (1 + z / 2).
fn erfc_pos(z: f32, sq: f32, sq_lo: f32) -> f32 {
    if (z > 10.1) {
        return 0.0; // below the smallest float32
    }
    let t = 1.0 / (1.0 + 0.5 * z);
    var r = 0.17087277;
    r = r * t - 0.82215223;
    r = r * t + 1.48851587;
    r = r * t - 1.13520398;
    r = r * t + 0.27886807;
    r = r * t - 0.18628806;
    r = r * t + 0.09678418;
    r = r * t + 0.37409196;
    r = r * t + 1.00002368;
    r = r * t - 1.26551223;
    return t * exp_reduced(-sq) * exp(r - sq_lo);
}

// z * z as (sq, sq_lo) with sq + sq_lo exact up to the rounding of the small parts.
fn square_split(z: f32) -> vec2<f32> {
    let h = head12(z);
    let l = z - h;
    return vec2<f32>(h * h, (2.0 * h + l) * l);
}

fn erf_f32(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    let ax = abs(x);
    if (ax < 0.5) {
        // erf(x) / x as a polynomial in x^2 (least-squares fit, relative error 1.4e-9).
        let s = x * x;
        var r = 0.0047195053534025595;
        r = r * s - 0.026757944332230905;
        r = r * s + 0.11282834739145917;
        r = r * s - 0.3761260917334039;
        r = r * s + 1.128379165614794;
        return r * x;
    }
    let sq = square_split(ax);
    let e = 1.0 - erfc_pos(ax, sq.x, sq.y);
    return select(e, -e, x < 0.0);
}

// GELU (erf form) 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2), with no
// cancellation for negative x; the exponent -x^2 / 2 is taken from x itself. IEEE at
// the ends: +inf -> +inf, -inf -> -inf * 0 = NaN.
fn gelu(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (is_inf(x)) {
        return select(f32_nan(), x, x > 0.0);
    }
    let z = abs(x) * 0.70710678118654752;
    let sq = square_split(x);
    let c = erfc_pos(z, 0.5 * sq.x, 0.5 * sq.y);
    return 0.5 * x * select(2.0 - c, c, x < 0.0);
}

// GELU (tanh form) 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
fn gelu_tanh(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (is_inf(x)) {
        return select(f32_nan(), x, x > 0.0);
    }
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp_reduced(-2.0 * u));
}

// SiLU x * sigmoid(x) = x / (1 + exp(-x)); -inf gives NaN (-inf * 0) as IEEE does.
fn silu(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (is_inf(x)) {
        return select(f32_nan(), x, x > 0.0);
    }
    return x / (1.0 + exp_reduced(-x));
}

fn is_odd_integer(y: f32) -> bool {
    let ay = abs(y);
    if (ay >= 16777216.0 || floor(ay) != ay) {
        return false; // beyond 2^24 every float32 is even
    }
    return (u32(ay) & 1u) == 1u;
}

// x^y for finite x > 0 and finite nonzero y. x = m 2^e with m in [sqrt(1/2), sqrt(2));
// y * (e + log2 m) is formed from exact products of 12-bit heads, so its integer part
// splits off exactly; the error left is that of log2(m) (a few 1e-8) times |y|.
fn pow_positive(x: f32, y: f32) -> f32 {
    let bits = bitcast<u32>(x);
    var e = i32(bits >> 23u) - 127;
    var mant = bits & 0x007fffffu;
    if (e == -127) {
        // Subnormal: normalise the integer mantissa.
        let p = firstLeadingBit(mant);
        e = i32(p) - 149;
        mant = (mant << (23u - p)) & 0x007fffffu;
    }
    var m = bitcast<f32>(mant | 0x3f800000u);
    if (m > 1.4142135) {
        m = m * 0.5;
        e += 1;
    }
    // log2(m) = 2 atanh(s) / ln 2, s = (m - 1) / (m + 1), |s| <= 0.172.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    var series = 2.0 / 13.0;
    series = series * s2 + 2.0 / 11.0;
    series = series * s2 + 2.0 / 9.0;
    series = series * s2 + 2.0 / 7.0;
    series = series * s2 + 2.0 / 5.0;
    series = series * s2 + 2.0 / 3.0;
    series = series * s2 + 2.0;
    let log2m = series * s * 1.4426950408889634;
    let fe = f32(e);
    let yh = head12(y);
    let yl = y - yh;
    let lh = head12(log2m);
    // y * (e + log2 m) = yh * e + yh * lh (both exact) + yl * e (exact) + small terms.
    let p1 = yh * fe;
    let q1 = yh * lh;
    let rest = yl * fe + (yl * lh + y * (log2m - lh));
    let approx = p1 + q1 + rest;
    if (approx > 129.0) {
        return f32_inf();
    }
    if (approx < -152.0) {
        return 0.0;
    }
    let n1 = round(p1);
    let n2 = round(q1);
    var f = (p1 - n1) + (q1 - n2) + rest; // the differences are exact
    let n3 = round(f);
    f = f - n3;
    return scale2(exp2(f), i32(n1) + i32(n2) + i32(n3));
}

// C's pow: pow(x, +-0) = 1 and pow(+1, y) = 1 even for NaN; otherwise NaN propagates; a
// negative finite base with a non-integer finite exponent gives NaN; zeros and
// infinities follow C99 Annex F.
fn pow_ieee(x: f32, y: f32) -> f32 {
    let xb = bitcast<u32>(x);
    let yb = bitcast<u32>(y);
    if ((yb & 0x7fffffffu) == 0u || xb == 0x3f800000u) {
        return 1.0;
    }
    if (is_nan(x) || is_nan(y)) {
        return f32_nan();
    }
    let ax = abs(x);
    let negative = (xb & 0x80000000u) != 0u;
    if (is_inf(y)) {
        if (ax == 1.0) {
            return 1.0; // pow(-1, +-inf)
        }
        return select(0.0, f32_inf(), (ax > 1.0) == (y > 0.0));
    }
    let odd = is_odd_integer(y);
    let sign = select(0u, 0x80000000u, negative && odd);
    if ((xb & 0x7fffffffu) == 0u) {
        // +-0: an infinity for y < 0, a zero otherwise; the sign survives odd integers.
        return bitcast<f32>(sign | select(0u, 0x7f800000u, y < 0.0));
    }
    if (is_inf(x)) {
        return bitcast<f32>(sign | select(0x7f800000u, 0u, y < 0.0));
    }
    if (negative && floor(y) != y) {
        return f32_nan();
    }
    return bitcast<f32>(sign | bitcast<u32>(pow_positive(ax, y)));
}
