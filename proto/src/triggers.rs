//! The startup-trigger store: which programs a running service wants to
//! profile from their first allocation, and how a process's name is derived
//! from its command line (bionic's rules).
//!
//! On Android the daemon sets the system properties `heapprofd.enable`
//! (`1`, or `all` for a whole-system profile) and `heapprofd.enable.<name>`
//! while a profile wants them, with a reference count per name, and bionic
//! checks them when a process starts. On Linux the service writes this store
//! instead (a small text file in its directory, see [`crate::service`]),
//! replacing it atomically (write + rename) whenever the set changes, and
//! the dormant client reads it in its constructor:
//!
//! ```text
//! heapprofd-rs triggers 1
//! all 1
//! name 2 python3
//! name 1 my server
//! ```
//!
//! The first line is [`HEADER`]; a file that does not start with it is not
//! a store and wants nothing. Then one entry per line: `all <count>` (every
//! process), `name <count> <name>` (processes whose [`process_name`] is
//! `<name>`, which may contain spaces). Counts are the number of profiles
//! that want the entry (for people reading the file; the client only needs
//! to know that an entry is there). Unknown lines are ignored, so later
//! versions can add entries. Names hold at most [`MAX_NAME_LEN`] bytes, no
//! NUL and no newline.
//!
//! Everything here is allocation-free except [`encode`] (daemon side): the
//! client matches with [`StartupMatch`] over the lines it reads with raw
//! system calls into a fixed buffer.

/// The first line of a store.
pub const HEADER: &[u8] = b"heapprofd-rs triggers 1";
/// Longest name an entry may hold (a file name's limit).
pub const MAX_NAME_LEN: usize = 255;
/// How much of `/proc/PID/cmdline` the name is taken from (bionic reads 512
/// bytes).
pub const CMDLINE_READ_MAX: usize = 512;

/// The name a process is matched by, from its command line as
/// `/proc/PID/cmdline` holds it (arguments separated by NULs): the first
/// argument, cut at its first `@` (an Android app's `name@version`), then
/// the part after its last `/`. A command line without a NUL (a program that
/// rewrote it) counts as one argument. Empty when there is no name (an empty
/// first argument, or one that ends in `/`), which matches nothing. This is
/// what bionic and Perfetto's `NormalizeCmdLine` do.
pub fn process_name(cmdline: &[u8]) -> &[u8] {
    let first = match cmdline.iter().position(|&b| b == 0) {
        Some(end) => cmdline.get(..end).unwrap_or(&[]),
        None => cmdline,
    };
    let first = match first.iter().position(|&b| b == b'@') {
        Some(at) => first.get(..at).unwrap_or(&[]),
        None => first,
    };
    match first.iter().rposition(|&b| b == b'/') {
        Some(slash) => first.get(slash + 1..).unwrap_or(&[]),
        None => first,
    }
}

/// Whether `name` may be stored as a `name` entry.
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN && !name.iter().any(|&b| b == 0 || b == b'\n')
}

/// One line of a store (without its newline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// `all <count>`: every process.
    All,
    /// `name <count> <name>`.
    Name(&'a [u8]),
    /// Anything else (ignored).
    Other,
}

/// Parses one line (without its newline).
pub fn parse_entry(line: &[u8]) -> Entry<'_> {
    let (word, rest) = split_word(line);
    let (count, rest) = split_word(rest);
    if count.is_empty() || !count.iter().all(u8::is_ascii_digit) {
        return Entry::Other;
    }
    match word {
        b"all" if rest.is_empty() => Entry::All,
        b"name" if valid_name(rest) => Entry::Name(rest),
        _ => Entry::Other,
    }
}

/// `line` split at its first space: the word before and what follows.
fn split_word(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b' ') {
        Some(i) => (
            line.get(..i).unwrap_or(&[]),
            line.get(i + 1..).unwrap_or(&[]),
        ),
        None => (line, &[]),
    }
}

/// Decides, line by line, whether a store wants the process named `name`
/// ([`process_name`]); allocation-free, for the client's constructor.
#[derive(Debug, Clone, Copy)]
pub struct StartupMatch<'a> {
    name: &'a [u8],
    lines: u64,
    is_store: bool,
    wanted: bool,
}

impl<'a> StartupMatch<'a> {
    /// A matcher for the process named `name`.
    pub fn new(name: &'a [u8]) -> StartupMatch<'a> {
        StartupMatch {
            name,
            lines: 0,
            is_store: false,
            wanted: false,
        }
    }

    /// Feeds the next line (without its newline). A line that was too long
    /// to be read whole is fed as an empty slice (it matches nothing).
    pub fn line(&mut self, line: &[u8]) {
        self.lines += 1;
        if self.lines == 1 {
            self.is_store = line == HEADER;
            return;
        }
        if !self.is_store {
            return;
        }
        match parse_entry(line) {
            Entry::All => self.wanted = true,
            Entry::Name(n) if !self.name.is_empty() && n == self.name => self.wanted = true,
            _ => {}
        }
    }

    /// Whether more lines could still change the answer.
    pub fn undecided(&self) -> bool {
        !self.wanted && (self.lines == 0 || self.is_store)
    }

    /// Whether the store wants the process.
    pub fn wanted(&self) -> bool {
        self.wanted
    }
}

/// The bytes of a store wanting every process (`all` profiles, if any) and
/// the `names` with their counts. Names that are not [`valid_name`]s are
/// left out (the daemon refuses them earlier).
pub fn encode<'n>(all: u32, names: impl IntoIterator<Item = (&'n str, u32)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(HEADER);
    out.push(b'\n');
    if all > 0 {
        out.extend_from_slice(format!("all {all}\n").as_bytes());
    }
    for (name, count) in names {
        if count > 0 && valid_name(name.as_bytes()) {
            out.extend_from_slice(format!("name {count} {name}\n").as_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_bionic() {
        // The cases of Perfetto's NormalizeCmdLine tests, and ours.
        let cases: &[(&[u8], &[u8])] = &[
            (b"surfaceflinger\0", b"surfaceflinger"),
            (b"surfaceflinger\0--foo\0", b"surfaceflinger"),
            (b"/system/bin/surfaceflinger\0", b"surfaceflinger"),
            (b"some.app@2.0\0", b"some.app"),
            (b"\0", b""),
            (b"foo@\0", b"foo"),
            (b"@\0", b""),
            (b"foo/\0", b""),
            (b"/\0", b""),
            (b"surfaceflinger/\0--foo\0", b""),
            (b"\0--foo\0", b""),
            (b"/usr/bin/python3\0script.py\0", b"python3"),
            (b"/a/b@c/d\0", b"b"),
            (b"x\0y@z\0", b"x"),
            (
                b"rewritten cmdline without nul",
                b"rewritten cmdline without nul",
            ),
            (b"", b""),
        ];
        for (cmdline, name) in cases {
            assert_eq!(
                process_name(cmdline),
                *name,
                "{}",
                String::from_utf8_lossy(cmdline)
            );
        }
    }

    #[test]
    fn entries() {
        assert_eq!(parse_entry(b"all 1"), Entry::All);
        assert_eq!(parse_entry(b"all 12"), Entry::All);
        assert_eq!(parse_entry(b"all"), Entry::Other);
        assert_eq!(parse_entry(b"all x"), Entry::Other);
        assert_eq!(parse_entry(b"all 1 more"), Entry::Other);
        assert_eq!(parse_entry(b"name 2 python3"), Entry::Name(b"python3"));
        assert_eq!(parse_entry(b"name 1 my server"), Entry::Name(b"my server"));
        assert_eq!(parse_entry(b"name 1 "), Entry::Other);
        assert_eq!(parse_entry(b"name python3"), Entry::Other);
        assert_eq!(parse_entry(b"pid 1 2"), Entry::Other);
        assert_eq!(parse_entry(b""), Entry::Other);
        let long = [b'a'; MAX_NAME_LEN + 1];
        let mut line = b"name 1 ".to_vec();
        line.extend_from_slice(&long);
        assert_eq!(parse_entry(&line), Entry::Other);
    }

    fn wants(store: &[u8], name: &[u8]) -> bool {
        let mut m = StartupMatch::new(name);
        for line in store.split(|&b| b == b'\n') {
            if !m.undecided() {
                break;
            }
            m.line(line);
        }
        m.wanted()
    }

    #[test]
    fn matching() {
        let store = encode(0, [("python3", 2), ("my server", 1), ("gone", 0)]);
        assert_eq!(
            store,
            b"heapprofd-rs triggers 1\nname 2 python3\nname 1 my server\n"
        );
        assert!(wants(&store, b"python3"));
        assert!(wants(&store, b"my server"));
        assert!(!wants(&store, b"gone"));
        assert!(!wants(&store, b"python"));
        assert!(!wants(&store, b""));
        let all = encode(1, []);
        assert_eq!(all, b"heapprofd-rs triggers 1\nall 1\n");
        assert!(wants(&all, b"anything"));
        assert!(
            wants(&all, b""),
            "a whole-system profile wants nameless processes too"
        );
        assert!(!wants(b"not a store\nall 1\n", b"x"));
        assert!(!wants(b"", b"x"));
        assert!(!wants(&encode(0, []), b"x"));
        // Names that cannot be stored are left out.
        assert_eq!(encode(0, [("a\nall 1", 1)]), encode(0, []));
    }
}
