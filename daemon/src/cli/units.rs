//! Durations and sizes with units, as every subcommand takes them.
//!
//! Conventions (the same for every command): durations take units (`500ms`,
//! `3s`, `2m`, `1h`; a bare number is seconds), sizes take units (`4096`,
//! `32k`, `32KiB`, `1M`, `1MiB`, `1g`; `k`/`KB`/`KiB` all mean 1024 bytes, as
//! every heap profiler's users expect).

use std::time::Duration;

/// Parses a duration: `250ms`, `1.5s`, `2m`, `1h`, `10` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        format!(
            "invalid duration `{s}`: expected a number with an optional unit (500ms, 3s, 2m, 1h)"
        )
    })?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" => 1e-6,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "invalid duration unit `{other}` in `{s}`: use ms, s, m or h"
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("duration `{s}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte size: `4096`, `32k`, `32KiB`, `1MiB`, `1g`. Multiples of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num.parse().map_err(|_| {
        format!(
            "invalid size `{s}`: expected a whole number with an optional unit (4096, 32k, 1MiB)"
        )
    })?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => {
            return Err(format!(
                "invalid size unit `{other}` in `{s}`: use k, M or G (KiB, MiB, GiB)"
            ));
        }
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32k"), Ok(32 * 1024));
        assert_eq!(parse_size("32KiB"), Ok(32 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert!(parse_size("1.5M").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err());
    }
}
