//! The contents of `/etc/ld.so.preload`, as pure functions on bytes: whether
//! it names a library, the file with a library added, the file with it
//! removed.
//!
//! glibc's dynamic linker reads the file as a list of object paths separated
//! by spaces, tabs, newlines or colons; a `#` starts a comment that runs to
//! the end of its line. Adding appends one line (after a newline if the file
//! does not end with one), so everything already there keeps its order and
//! its bytes; removing drops only lines that hold exactly the library's path
//! (surrounding blanks allowed), leaving every other byte as it was.

/// The paths a preload file names, in order (comments skipped).
pub fn entries(content: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    for line in content.split(|&b| b == b'\n') {
        let line = match line.iter().position(|&b| b == b'#') {
            Some(i) => line.get(..i).unwrap_or(&[]),
            None => line,
        };
        out.extend(
            line.split(|&b| matches!(b, b' ' | b'\t' | b':' | b'\r'))
                .filter(|w| !w.is_empty()),
        );
    }
    out
}

/// Whether the file names `lib`.
pub fn names(content: &[u8], lib: &[u8]) -> bool {
    entries(content).contains(&lib)
}

/// The file with `lib` appended on its own line (unchanged if it already
/// names it).
pub fn with_entry(content: &[u8], lib: &[u8]) -> Vec<u8> {
    let mut out = content.to_vec();
    if names(content, lib) {
        return out;
    }
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(lib);
    out.push(b'\n');
    out
}

/// The file without the lines that hold only `lib` (with blanks around it).
pub fn without_entry(content: &[u8], lib: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len());
    for piece in content.split_inclusive(|&b| b == b'\n') {
        let body = piece.strip_suffix(b"\n").unwrap_or(piece);
        if body.trim_ascii() != lib {
            out.extend_from_slice(piece);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &[u8] = b"/usr/lib/heapprofd-rs/preload/libheapprofd_client.so";

    #[test]
    fn adds_after_what_is_there_and_removes_only_its_line() {
        let before = b"# a comment\n/lib/a.so /lib/b.so:/lib/c.so\n/lib/d.so";
        let added = with_entry(before, LIB);
        assert!(added.starts_with(before));
        assert_eq!(
            entries(&added),
            vec![
                &b"/lib/a.so"[..],
                b"/lib/b.so",
                b"/lib/c.so",
                b"/lib/d.so",
                LIB
            ]
        );
        assert_eq!(
            with_entry(&added, LIB),
            added,
            "adding twice changes nothing"
        );
        assert_eq!(
            without_entry(&added, LIB),
            b"# a comment\n/lib/a.so /lib/b.so:/lib/c.so\n/lib/d.so\n"
        );
        assert_eq!(with_entry(b"", LIB), [LIB, b"\n"].concat());
        assert_eq!(without_entry(&with_entry(b"", LIB), LIB), b"");
    }

    #[test]
    fn a_commented_path_is_not_an_entry() {
        let c = [b"#".as_slice(), LIB, b"\n"].concat();
        assert!(!names(&c, LIB));
        assert_eq!(without_entry(&c, LIB), c);
        assert!(names(&with_entry(&c, LIB), LIB));
    }
}
