// Special functions for the element-wise kernels, accurate to a few ulp in float32.
//
// WGSL has no erf, its sin() / cos() may reduce large arguments in single precision,
// and its exp() / pow() lose accuracy in proportion to the size of
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

// c * exp(a) with the range reduced exactly: a = n ln2 + f with n * 0.693359375 exact
// and a - n * 0.693359375 exact (the two are within ln2 of each other), so the error
// does not grow with |a| as the builtin's does; 2^n is applied last, so a result in the
// subnormal range is rounded once.
fn mul_exp(c: f32, a: f32) -> f32 {
    if (a < -300.0) {
        return c * 0.0;
    }
    let n = round(a * 1.4426950408889634);
    let f = (a - n * 0.693359375) + n * 2.12194440e-4;
    return scale2(c * exp(f), i32(n));
}

fn exp_reduced(a: f32) -> f32 {
    if (a > 89.0) {
        return f32_inf();
    }
    return mul_exp(1.0, a);
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

// c / (1 + exp(-t)) for finite t, as c exp(t) / (1 + exp(t)) below 0 so that exp never
// overflows and a result in the subnormal range keeps its accuracy.
fn times_logistic(c: f32, t: f32) -> f32 {
    if (t >= 0.0) {
        return c / (1.0 + exp_reduced(-t));
    }
    return mul_exp(c, t) / (1.0 + exp_reduced(t));
}

// GELU (tanh form) 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
fn gelu_tanh(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (is_inf(x)) {
        return select(f32_nan(), x, x > 0.0);
    }
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return times_logistic(x, 2.0 * u);
}

// SiLU x * sigmoid(x); -inf gives NaN (-inf * 0) as IEEE does.
fn silu(x: f32) -> f32 {
    if (is_nan(x)) {
        return x;
    }
    if (is_inf(x)) {
        return select(f32_nan(), x, x > 0.0);
    }
    return times_logistic(x, x);
}

fn is_odd_integer(y: f32) -> bool {
    let ay = abs(y);
    if (ay >= 16777216.0 || floor(ay) != ay) {
        return false; // beyond 2^24 every float32 is even
    }
    return (u32(ay) & 1u) == 1u;
}

// log2(1 + k / 128) = LOG2_HI[k] + LOG2_LO[k]; LOG2_HI has 11 fraction bits (12 significant).
const LOG2_HI = array<f32, 129>(
    0.0, 0.01123046875, 0.0224609375, 0.033203125, 0.04443359375, 0.05517578125,
    0.06591796875, 0.07666015625, 0.08740234375, 0.09814453125, 0.1083984375, 0.119140625,
    0.12939453125, 0.1396484375, 0.14990234375, 0.15966796875, 0.169921875, 0.1796875,
    0.18994140625, 0.19970703125, 0.20947265625, 0.21923828125, 0.22900390625, 0.23828125,
    0.248046875, 0.25732421875, 0.2666015625, 0.2763671875, 0.28564453125, 0.29443359375,
    0.3037109375, 0.31298828125, 0.32177734375, 0.3310546875, 0.33984375, 0.3486328125,
    0.357421875, 0.3662109375, 0.375, 0.3837890625, 0.39208984375, 0.40087890625,
    0.4091796875, 0.41796875, 0.42626953125, 0.4345703125, 0.44287109375, 0.451171875,
    0.45947265625, 0.4677734375, 0.4755859375, 0.48388671875, 0.49169921875, 0.5,
    0.5078125, 0.515625, 0.5234375, 0.53125, 0.5390625, 0.546875,
    0.5546875, 0.56201171875, 0.56982421875, 0.57763671875, 0.5849609375, 0.59228515625,
    0.60009765625, 0.607421875, 0.61474609375, 0.6220703125, 0.62939453125, 0.63671875,
    0.64404296875, 0.65087890625, 0.658203125, 0.66552734375, 0.67236328125, 0.6796875,
    0.6865234375, 0.693359375, 0.70068359375, 0.70751953125, 0.71435546875, 0.72119140625,
    0.72802734375, 0.73486328125, 0.74169921875, 0.748046875, 0.7548828125, 0.76171875,
    0.76806640625, 0.77490234375, 0.78125, 0.7880859375, 0.79443359375, 0.80078125,
    0.80712890625, 0.81396484375, 0.8203125, 0.82666015625, 0.8330078125, 0.83935546875,
    0.845703125, 0.8515625, 0.85791015625, 0.8642578125, 0.87060546875, 0.87646484375,
    0.8828125, 0.888671875, 0.89501953125, 0.90087890625, 0.90673828125, 0.9130859375,
    0.9189453125, 0.9248046875, 0.9306640625, 0.9365234375, 0.9423828125, 0.9482421875,
    0.9541015625, 0.9599609375, 0.9658203125, 0.9716796875, 0.97705078125, 0.98291015625,
    0.98876953125, 0.994140625, 1.0,
);
const LOG2_LO = array<f32, 129>(
    0.0, -3.213326635886915e-06, -9.312447218690068e-05, 0.00021987654326949269, -3.947439108742401e-05, 0.00010665425361366943,
    0.00017122170538641512, 0.00015544079360552132, 6.0497499362099916e-05, -0.00011244828783674166, 0.00012601928028743714, -0.00019955227617174387,
    -0.00011151430226163939, -9.708510333439335e-05, -0.000155224246555008, 0.0002033680211752653, 3.1264423796528718e-06, 0.00022159001673571765,
    -0.00011684736819006503, -3.468641443760134e-05, -1.9290620912215672e-05, -6.976079021114856e-05, -0.0001852157583925873, 0.00012348932796157897,
    -0.00011936155351577327, 6.362394196912646e-05, 0.00018497819837648422, -0.0002427822328172624, -0.0002423123805783689, 0.00018715513579081744,
    6.98106741765514e-05, -0.00010532596206758171, 0.0001507511333329603, -0.00013780938752461225, 6.2528847593057435e-06, 9.53417329583317e-05,
    0.00013012961426284164, 0.0001112767422455363, 3.94313465221785e-05, -8.47700284793973e-05, 0.00022757903207093477, 5.300321959111898e-07,
    0.00021124863997101784, -0.00011623511090874672, -4.776547939400189e-06, 5.791513831354678e-05, 7.240210106829181e-05, 3.923683107132092e-05,
    -4.1037612390937284e-05, -0.0001678874104982242, 0.00014749346883036196, -7.094148895703256e-05, 0.00015387758321594447, -0.00015411291678901762,
    -1.7859802028397098e-05, 7.483828085241839e-05, 0.00012445605534594506, 0.00013146051787771285, 9.631110879126936e-05, 1.9459886971162632e-05,
    -9.864832099992782e-05, 0.0002307054674020037, 3.138957981718704e-05, -0.00020789071277249604, 1.5632211898264359e-06, 0.00017188102356158197,
    -0.00018481406732462347, -9.15612472454086e-05, -3.6249635741114616e-05, -1.849304317147471e-05, -3.7911169783910736e-05, -9.412945655640215e-05,
    -0.00018677896878216416, 0.0001727849303279072, 8.357751539733727e-06, -0.00019142655946779996, 6.2060724303592e-05, -0.00020740048785228282,
    -2.2910317056812346e-05, 0.00012758250522892922, -0.00024387560551986098, -0.00016039916954468936, -0.00010995108459610492, -9.221754589816555e-05,
    -0.0001068891870090738, -0.0001536610216135159, -0.00023223234165925533, 0.00014597458357457072, 4.68966345579247e-06, -0.00016751755902078003,
    0.0001179185273940675, -0.00011528415052453056, 0.00010971352458000183, -0.00018337811343371868, -1.77273996087024e-05, 0.00011864992120536044,
    0.0002260158071294427, -0.00018365253345109522, -0.0001335375854978338, -0.00011166896001668647, -0.0001177983358502388, -0.00015168065147008747,
    -0.00021307406132109463, 0.0001865414233179763, 7.083887612679973e-05, -7.166784780565649e-05, -0.00024074917018879205, 5.2102815971011296e-05,
    -0.00016945063543971628, 7.137389911804348e-05, -0.00020176793623249978, -1.2098269507987425e-05, 0.0001523143582744524, -0.0001966012641787529,
    -8.207522478187457e-05, 7.816105608071666e-06, 7.327506318688393e-05, 0.0001145015048678033, 0.00013169283920433372, 0.00012504408368840814,
    9.474788384977728e-05, 4.0994567825691774e-05, -3.6027839087182656e-05, -0.00013613354531116784, 0.00022914225701242685, 8.341844659298658e-05,
    -8.484447607770562e-05, 0.00021281186491250992, 0.0,
);

// x^y for finite x > 0 and finite nonzero y, from x = m 2^e, m = c (1 + r) with
// c = 1 + k / 128 (|r| <= 1/256): log2(x) = e + LOG2_HI[k] + (LOG2_LO[k] + log2(1 + r)).
// With y = yh + yl (12-bit head and exact tail), the products yh e, yh LOG2_HI[k], yl e
// and yl LOG2_HI[k] are exact, so their integer parts split off exactly; only
// y * (the small remainder, below 0.012) is rounded. Within a few ulp for any y.
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
    let m = bitcast<f32>(mant | 0x3f800000u); // [1, 2)
    let k = u32(round((m - 1.0) * 128.0));
    let c = 1.0 + f32(k) * 0.0078125;
    let r = (m - c) / c; // m - c is exact
    let series = r * (1.0 + r * (-0.5 + r * (0.33333334 - r * 0.25)));
    var table_lo = LOG2_LO;
    var table_hi = LOG2_HI;
    let small = table_lo[k] + series * 1.4426950408889634;
    let th = table_hi[k];
    let fe = f32(e);
    let yh = head12(y);
    let yl = y - yh;
    let p1 = yh * fe;
    let p2 = yh * th;
    let p3 = yl * fe;
    let p4 = yl * th;
    let rest = y * small;
    let approx = p1 + p2 + p3 + p4 + rest;
    if (approx > 129.0) {
        return f32_inf();
    }
    if (approx < -152.0) {
        return 0.0;
    }
    let n1 = round(p1);
    let n2 = round(p2);
    let n3 = round(p3);
    let n4 = round(p4);
    var f = (p1 - n1) + (p2 - n2) + (p3 - n3) + (p4 - n4) + rest;
    let n5 = round(f);
    f = f - n5;
    return scale2(exp2(f), i32(n1) + i32(n2) + i32(n3) + i32(n4) + i32(n5));
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

// ---------------------------------------------------------------- sin / cos
//
// Builtin sin / cos reduce large arguments in single precision (sin(1e30) can come out
// as 1). Here x = r + q pi/2 is reduced exactly in integers (Payne-Hanek): the 24-bit
// mantissa times a 96-bit window of 2/pi chosen by the exponent gives q mod 4 and 64
// bits of the fraction, so r is right to float32 precision for every finite x. Then
// minimax polynomials on |r| <= pi/4 (Cephes' sinf / cosf).

// 2/pi in binary, 32 bits a word, most significant first.
const TWO_OVER_PI = array<u32, 9>(
    0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u,
    0x3c439041u, 0xfe5163abu, 0xdebbc561u, 0xb7246e3au,
);

// Bits [b, b + 32) of 2/pi's fraction (bit 0 is the 1/2 place).
fn two_over_pi_bits(b: u32) -> u32 {
    var table = TWO_OVER_PI;
    let w = b / 32u;
    let off = b % 32u;
    if (off == 0u) {
        return table[w];
    }
    return (table[w] << off) | (table[w + 1u] >> (32u - off));
}

// The 56-bit product of a 24-bit m and a 32-bit w as (high word, low word).
fn mul_24_32(m: u32, w: u32) -> vec2<u32> {
    let a0 = m & 0xffffu;
    let a1 = m >> 16u;
    let b0 = w & 0xffffu;
    let b1 = w >> 16u;
    let p00 = a0 * b0;
    let mid = a0 * b1 + a1 * b0; // < 2^32: a1 has at most 8 bits
    let lo = p00 + (mid << 16u);
    let carry = select(0u, 1u, lo < p00);
    return vec2<u32>(a1 * b1 + (mid >> 16u) + carry, lo);
}

// Bits [pos, pos + 32) of the 160-bit little-endian number p.
fn bits_at(p: array<u32, 5>, pos: u32) -> u32 {
    var q = p;
    let w = pos / 32u;
    let off = pos % 32u;
    if (off == 0u) {
        return q[w];
    }
    return (q[w] >> off) | (q[w + 1u] << (32u - off));
}

// |x| = r + q pi/2 with |r| <= pi/4, for finite |x| >= pi/4: (r, q mod 4 as a float).
fn reduce_half_pi(ax: f32) -> vec2<f32> {
    let bits = bitcast<u32>(ax);
    let k = i32(bits >> 23u) - 150; // ax = m 2^k
    let m = (bits & 0x007fffffu) | 0x00800000u;
    // The 96 bits of 2/pi from bit s on; bits before s only add multiples of 4.
    let s = u32(max(0, k - 2));
    let w0 = two_over_pi_bits(s);
    let w1 = two_over_pi_bits(s + 32u);
    let w2 = two_over_pi_bits(s + 64u);
    // p = m * (w0 w1 w2): 120 bits, little-endian words.
    let t2 = mul_24_32(m, w2);
    let t1 = mul_24_32(m, w1);
    let t0 = mul_24_32(m, w0);
    let p1 = t2.x + t1.y;
    let c1 = select(0u, 1u, p1 < t2.x);
    let p2a = t1.x + t0.y;
    let c2a = select(0u, 1u, p2a < t1.x);
    let p2 = p2a + c1;
    let c2 = c2a + select(0u, 1u, p2 < p2a);
    let p3 = t0.x + c2;
    let p = array<u32, 5>(t2.y, p1, p2, p3, 0u);
    // value = p / 2^sh with sh = 96 + s - k (the window's last bit is 2^-(s + 96)).
    let sh = u32(96 + i32(s) - k);
    var q = bits_at(p, sh) & 3u;
    var hi = bits_at(p, sh - 32u);
    var lo = bits_at(p, sh - 64u);
    var sign = 1.0;
    if ((hi & 0x80000000u) != 0u) {
        // Fraction >= 1/2: take the next quadrant and the negated fraction.
        q = (q + 1u) & 3u;
        hi = ~hi;
        lo = ~lo;
        lo += 1u;
        hi += select(0u, 1u, lo == 0u);
        sign = -1.0;
    }
    // The 64-bit fraction (hi, lo) / 2^64 as a float32.
    var f: f32;
    if (hi != 0u) {
        let z = countLeadingZeros(hi);
        let top = select(hi, (hi << z) | (lo >> (32u - z)), z != 0u);
        f = scale2(f32(top >> 8u), i32(z) * -1 - 24);
    } else {
        let z = countLeadingZeros(lo);
        f = scale2(f32((lo << z) >> 8u), -56 - i32(z));
    }
    return vec2<f32>(sign * f * 1.5707963267948966, f32(q));
}

fn sin_poly(r: f32) -> f32 {
    let z = r * r;
    return r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
}

fn cos_poly(r: f32) -> f32 {
    let z = r * r;
    return 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
}

// sin (want_cos false) or cos of x; NaN for NaN and +-inf.
fn sin_cos(x: f32, want_cos: bool) -> f32 {
    if (!is_finite(x)) {
        return f32_nan();
    }
    let ax = abs(x);
    var r = ax;
    var q = 0u;
    if (ax > 0.78539816) {
        let red = reduce_half_pi(ax);
        r = red.x;
        q = u32(red.y);
    }
    if (want_cos) {
        q = (q + 1u) & 3u; // cos(x) = sin(|x| + pi/2)
    }
    var v = select(sin_poly(r), cos_poly(r), (q & 1u) == 1u);
    if (q >= 2u) {
        v = -v;
    }
    if (!want_cos && x < 0.0) {
        v = -v;
    }
    return v;
}
