// Scalar element-wise functions shared by the scalar and vec4 element-wise kernels.
// Op codes are the UNARY_* / BINARY_* constants generated from computehal.backends._common.
// tanh accurate to a few ulp everywhere: the builtin loses all relative accuracy near 0
// on some drivers (it computes (e^2x - 1) / (e^2x + 1)). Odd Taylor polynomial below
// 0.5, 1 - 2 / (e^2|x| + 1) up to 9, +-1 beyond (tanh(9) rounds to 1 in float32).
fn tanh_f32(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    let ax = abs(x);
    if (ax < 0.5) {
        let x2 = x * x;
        var r = -929569.0 / 638512875.0;
        r = fma(r, x2, 21844.0 / 6081075.0);
        r = fma(r, x2, -1382.0 / 155925.0);
        r = fma(r, x2, 62.0 / 2835.0);
        r = fma(r, x2, -17.0 / 315.0);
        r = fma(r, x2, 2.0 / 15.0);
        r = fma(r, x2, -1.0 / 3.0);
        return fma(r * x2, x, x);
    }
    var t = 1.0;
    if (ax <= 9.0) {
        t = 1.0 - 2.0 / (exp(2.0 * ax) + 1.0);
    }
    return select(t, -t, x < 0.0);
}

// alpha: LEAKY_RELU's slope; lo, hi: CLIP's bounds (unused by the other ops).
fn apply_unary(op: u32, x: f32, alpha: f32, lo: f32, hi: f32) -> f32 {
    switch op {
        case UNARY_RELU: {
            // RELU: max(x, 0) with NaN -> 0.
            return select(0.0, x, x > 0.0);
        }
        case UNARY_SIGMOID: {
            // SIGMOID: 1 / (1 + exp(-x)); exp overflows to inf giving exactly 0.
            if (is_nan(x)) {
                return x;
            }
            return 1.0 / (1.0 + exp(-x));
        }
        case UNARY_TANH: {
            return tanh_f32(x);
        }
        case UNARY_EXP: {
            if (is_nan(x)) {
                return x;
            }
            return exp(x);
        }
        case UNARY_LOG: {
            // LOG: log(0) = -inf, log(negative) = NaN, log(inf) = inf.
            if (is_nan(x)) {
                return x;
            }
            if (x == 0.0) {
                return f32_neg_inf();
            }
            if (x < 0.0) {
                return f32_nan();
            }
            return log(x);
        }
        case UNARY_SQRT: {
            if (is_nan(x)) {
                return x;
            }
            if (x < 0.0) {
                return f32_nan();
            }
            return sqrt(x);
        }
        case UNARY_ABS: {
            return bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu);
        }
        case UNARY_NEG: {
            return bitcast<f32>(bitcast<u32>(x) ^ 0x80000000u);
        }
        case UNARY_GELU: {
            return gelu(x);
        }
        case UNARY_GELU_TANH: {
            return gelu_tanh(x);
        }
        case UNARY_SILU: {
            return silu(x);
        }
        case UNARY_ERF: {
            return erf_f32(x);
        }
        case UNARY_RECIPROCAL: {
            return ieee_div(1.0, x);
        }
        case UNARY_SQUARE: {
            return x * x;
        }
        case UNARY_SIN, UNARY_COS: {
            return sin_cos(x, op == UNARY_COS);
        }
        case UNARY_LEAKY_RELU: {
            if (is_nan(x)) {
                return x;
            }
            return select(alpha * x, x, x >= 0.0);
        }
        case UNARY_CLIP, default: {
            // min(max(x, lo), hi); NaN stays NaN.
            if (is_nan(x)) {
                return x;
            }
            let low = select(x, lo, x < lo);
            return select(low, hi, low > hi);
        }
    }
}

fn ieee_div(a: f32, b: f32) -> f32 {
    if (is_nan(a) || is_nan(b)) {
        return f32_nan();
    }
    if ((bitcast<u32>(b) & 0x7fffffffu) == 0u) {
        // x / +-0: NaN for 0 / 0, otherwise an infinity with the sign of a * b.
        if ((bitcast<u32>(a) & 0x7fffffffu) == 0u) {
            return f32_nan();
        }
        return bitcast<f32>(((bitcast<u32>(a) ^ bitcast<u32>(b)) & 0x80000000u) | 0x7f800000u);
    }
    if (is_inf(b)) {
        if (is_inf(a)) {
            return f32_nan();
        }
        // finite / inf: a signed zero.
        return bitcast<f32>((bitcast<u32>(a) ^ bitcast<u32>(b)) & 0x80000000u);
    }
    return a / b;
}

fn apply_binary(op: u32, a: f32, b: f32) -> f32 {
    switch op {
        case BINARY_ADD: {
            return a + b;
        }
        case BINARY_SUB: {
            return a - b;
        }
        case BINARY_MUL: {
            return a * b;
        }
        case BINARY_DIV: {
            return ieee_div(a, b);
        }
        case BINARY_MAX: {
            return fmax_nan(a, b);
        }
        case BINARY_MIN: {
            return fmin_nan(a, b);
        }
        case BINARY_POW, default: {
            return pow_ieee(a, b);
        }
    }
}

