//! Fields of `/proc/PID/status`.

/// `Key:\tvalue` fields of `/proc/PID/status`.
pub(crate) fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// The first number of a field (`Uid:\t1000\t1000...` gives 1000).
pub(crate) fn first_number(s: Option<&str>) -> Option<u32> {
    s?.split_whitespace().next()?.parse().ok()
}

/// The second number of a field (`Uid:\t1000\t0...` gives 0: the
/// effective user id).
pub(crate) fn second_number(s: Option<&str>) -> Option<u32> {
    s?.split_whitespace().nth(1)?.parse().ok()
}
