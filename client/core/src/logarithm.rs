//! The natural logarithm the sampler's gap draws need, computed here so
//! that the client library does not depend on libm: every profiled process
//! loads the client's dependencies, and libm was one more object to map and
//! relocate at every start (0.07 ms of `/bin/true` preloaded with it, here)
//! for two calls.
//!
//! `ln(x) = e ln 2 + ln(m)` with `x = m 2^e`, `m` in `[sqrt(1/2), sqrt(2))`,
//! and `ln(m) = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, `|s| < 0.172`, summed
//! to `s^21` (the next term is below `1e-18` of the result). `ln_1p` takes
//! the series of `ln(1 + y)` for tiny `y` and Goldberg's correction
//! `ln(u) y / (u - 1)`, `u = 1 + y`, otherwise. Both are within a few units
//! in the last place of libm's (the unit tests compare them).

/// `ln 2`, split: `LN2_HI` has its low bits zero, so `e * LN2_HI` is exact
/// for any exponent `e`.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// The natural logarithm of a finite `x > 0`; NaN for `x <= 0` or NaN,
/// infinity for infinity.
pub fn ln(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x.is_infinite() {
        return x;
    }
    let (mut m, mut e) = split(x);
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // 2 atanh(s) = 2 (s + s^3/3 + ... + s^21/21), by Horner in s^2.
    let mut p = 1.0 / 21.0;
    for k in [19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0] {
        p = p * s2 + 1.0 / k;
    }
    let ln_m = 2.0 * s * (p * s2 + 1.0);
    let e = f64::from(e);
    e * LN2_HI + (ln_m + e * LN2_LO)
}

/// `ln(1 + y)`, accurate for tiny `y` too, for `y >= -1`.
pub fn ln_1p(y: f64) -> f64 {
    if y.abs() < 1e-5 {
        // y - y^2/2 + y^3/3 - y^4/4: the next term is below 1e-20 |y|.
        return y * (1.0 - y * (0.5 - y * (1.0 / 3.0 - y * 0.25)));
    }
    let u = 1.0 + y;
    if u == 1.0 {
        return y;
    }
    ln(u) * (y / (u - 1.0))
}

/// `ln(u)` for a gap draw's uniform `u` in `[2^-53, 1]`, within `3e-11`
/// (absolute) of the exact value, about twice as fast as [`ln`]: no
/// special cases, no branch (the reduction to `m` in `[sqrt(1/2),
/// sqrt(2))` is done on the bits, as musl's `log` does; a branch on `m`
/// mispredicted for four draws in ten), and the series stops at `s^11`.
/// The error moves a gap by at most `3e-11` times the interval (a 10^-7
/// byte at 4 KiB), far below anything the sampling statistics can
/// see; `ln`, exact to a few units in the last place, stays for the
/// sampler's set-up.
#[inline]
pub fn ln_unit(u: f64) -> f64 {
    /// The bits of `sqrt(1/2)`.
    const SQRT_HALF_BITS: u64 = 0x3fe6_a09e_667f_3bcd;
    let bits = u.to_bits();
    // The exponent `e` with `u = m 2^e`, `m` in `[sqrt(1/2), sqrt(2))`.
    let e = (bits.wrapping_sub(SQRT_HALF_BITS) as i64) >> 52;
    let m = f64::from_bits(bits.wrapping_sub((e as u64) << 52));
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // 2 atanh(s) = 2 (s + s^3/3 + ... + s^11/11) + at most 2e-11 (|s| <= 0.1716).
    let p = ((((s2 * (1.0 / 11.0) + 1.0 / 9.0) * s2 + 1.0 / 7.0) * s2 + 1.0 / 5.0) * s2
        + 1.0 / 3.0)
        * s2
        + 1.0;
    let e = e as f64;
    e * LN2_HI + (2.0 * s * p + e * LN2_LO)
}

/// `x = m 2^e` with `m` in `[1, 2)`, for a finite `x > 0` (subnormals
/// scaled first).
fn split(x: f64) -> (f64, i32) {
    let (x, bias) = if x < f64::MIN_POSITIVE {
        (x * (1u64 << 54) as f64, -54)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i32 - 1023 + bias;
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    (m, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place.
    fn ulps(a: f64, b: f64) -> u64 {
        if a == b {
            return 0;
        }
        let (a, b) = (a.to_bits() as i64, b.to_bits() as i64);
        assert!((a < 0) == (b < 0), "signs differ");
        a.abs_diff(b)
    }

    #[test]
    fn ln_matches_libm_within_a_few_ulps() {
        let mut worst = 0;
        // Every power of two, numbers near 1, and a sweep over (0, 1]
        // (what the gap draws take) and beyond.
        let mut xs: Vec<f64> = (-1074..1024).map(|e| 2f64.powi(e)).collect();
        xs.extend((1..2000).map(|i| 1.0 + f64::from(i) * 1e-6));
        xs.extend((1..2000).map(|i| 1.0 - f64::from(i) * 1e-6));
        let mut z: u64 = 0x1234_5678;
        for _ in 0..200_000 {
            z = crate::sampler::mix64(z);
            xs.push(((z >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64));
            xs.push(f64::from_bits(z >> 2)); // any positive finite double
        }
        for x in xs {
            if !(x > 0.0 && x.is_finite()) {
                continue;
            }
            let (ours, libm) = (ln(x), x.ln());
            if libm.abs() < 1e-300 {
                assert!(
                    (ours - libm).abs() < 1e-300,
                    "ln({x:e}) = {ours:e}, not {libm:e}"
                );
                continue;
            }
            let d = ulps(ours, libm);
            assert!(d <= 4, "ln({x:e}) = {ours:e}, libm {libm:e}: {d} ulps");
            worst = worst.max(d);
        }
        assert!(worst <= 4);
    }

    #[test]
    fn ln_1p_matches_libm_for_every_interval() {
        for interval in (1..200_000u64)
            .chain((17..49).map(|b| 1u64 << b))
            .chain([3, 4095, 4097])
        {
            let y = -1.0 / interval as f64;
            let (ours, libm) = (ln_1p(y), y.ln_1p());
            if interval == 1 {
                assert!(ours.is_infinite() && ours < 0.0, "{ours}");
                continue;
            }
            let d = ulps(ours, libm);
            assert!(d <= 4, "ln_1p({y:e}) = {ours:e}, libm {libm:e}: {d} ulps");
        }
        for y in [
            1e-300, -1e-300, 1e-9, -1e-9, 0.5, 1.0, 100.0, -0.5, -0.999_999,
        ] {
            let d = ulps(ln_1p(y), y.ln_1p());
            assert!(d <= 4, "ln_1p({y:e}): {d} ulps");
        }
    }

    #[test]
    fn ln_unit_is_within_3e_11_of_libm_over_every_draw() {
        let mut us: Vec<f64> = (0..=53).map(|e| 2f64.powi(-e)).collect();
        us.extend((1..2000).map(|i| 1.0 - f64::from(i) * 1e-6));
        us.extend([core::f64::consts::FRAC_1_SQRT_2, 1.0 - f64::EPSILON / 2.0]);
        let mut z: u64 = 0x9876_5432;
        for _ in 0..400_000 {
            z = crate::sampler::mix64(z);
            us.push(((z >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64));
        }
        let mut worst = 0f64;
        for u in us {
            let d = (ln_unit(u) - u.ln()).abs();
            assert!(
                d < 3e-11,
                "ln_unit({u:e}) = {:e}, libm {:e}",
                ln_unit(u),
                u.ln()
            );
            worst = worst.max(d);
        }
        // Not exact: the series is cut short on purpose.
        assert!(worst > 1e-13, "{worst:e}");
        assert_eq!(ln_unit(1.0), 0.0);
    }

    #[test]
    fn edge_cases() {
        assert!(ln(0.0).is_infinite() && ln(0.0) < 0.0);
        assert!(ln(-1.0).is_nan());
        assert!(ln(f64::NAN).is_nan());
        assert_eq!(ln(f64::INFINITY), f64::INFINITY);
        assert_eq!(ln(1.0), 0.0);
    }
}
