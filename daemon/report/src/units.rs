//! Numbers for people: byte counts, counts with thousands separators,
//! microseconds with a precision that fits their size.

/// Formats a byte count for people: `512 B`, `12.34 KiB`, `4.00 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A signed byte difference: `+2.00 MiB`, `-512 B`, `0 B`.
pub fn human_delta(d: i128) -> String {
    let mag = human_bytes(d.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    match d.signum() {
        1 => format!("+{mag}"),
        -1 => format!("-{mag}"),
        _ => mag,
    }
}

/// A count with thousands separators: `404,491`.
pub fn human_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A signed count: `+1,000`, `-3`, `0`.
pub fn human_count_delta(d: i128) -> String {
    let mag = human_count(d.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    match d.signum() {
        1 => format!("+{mag}"),
        -1 => format!("-{mag}"),
        _ => mag,
    }
}

/// Microseconds with two significant digits below 10 (`0.12`, `3.4`), whole
/// above (`126`): a mean of 0.116 us is not "0 us".
pub fn human_us(us: f64) -> String {
    if us < 1.0 {
        format!("{us:.2}")
    } else if us < 10.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

/// Nanoseconds as `12.3 ms`, `1.50 s`, `850 us`.
pub fn human_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.2} s", f / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", f / 1e6)
    } else if ns >= 1_000 {
        format!("{:.0} us", f / 1e3)
    } else {
        format!("{ns} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanoseconds() {
        assert_eq!(human_ns(1_500_000_000), "1.50 s");
        assert_eq!(human_ns(12_340_000), "12.3 ms");
        assert_eq!(human_ns(850_000), "850 us");
        assert_eq!(human_ns(7), "7 ns");
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(4 << 20), "4.00 MiB");
        assert_eq!(human_delta(2 << 20), "+2.00 MiB");
        assert_eq!(human_delta(-512), "-512 B");
        assert_eq!(human_delta(0), "0 B");
        assert_eq!(human_count(404_491), "404,491");
        assert_eq!(human_count(12), "12");
        assert_eq!(human_count(1_000_000), "1,000,000");
        assert_eq!(human_count_delta(-1000), "-1,000");
        assert_eq!(human_us(0.116), "0.12");
        assert_eq!(human_us(3.44), "3.4");
        assert_eq!(human_us(126.2), "126");
    }
}
