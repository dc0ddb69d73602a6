//! Which heaps a profile samples and at which intervals: `record --heaps`,
//! `--all-heaps`, `--heap-interval NAME=BYTES`, a HeapprofdConfig's
//! `heaps` / `all_heaps` / `heap_sampling_intervals` / `exclude_heaps`,
//! turned into the client configuration's heap list.
//!
//! The rule is Perfetto's: with no list and no `all`, `libc.malloc` alone
//! is sampled (at the profile's interval); a list names every heap sampled
//! (`libc.malloc` included only if listed); `all` samples every heap a
//! process registers at the profile's interval unless the heap has its own
//! or is excluded. A heap with its own interval is sampled.

use serde::{Deserialize, Serialize};

use heapprofd_proto::wire::{ClientConfig, HEAP_LIBC_MALLOC_NAME, MAX_CUSTOM_HEAP_NAME, MAX_HEAPS};

/// The heap part of a profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeapSelection {
    /// Heaps sampled (empty: `libc.malloc` alone, unless `all`).
    pub names: Vec<String>,
    /// Every heap a process registers.
    pub all: bool,
    /// Heaps with their own interval (sampled too).
    pub intervals: Vec<(String, u64)>,
    /// Heaps never sampled (with `all`).
    pub exclude: Vec<String>,
}

/// Whether `name` can be a heap name: 1 to 63 bytes, no NUL, no comma.
pub fn valid_heap_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_CUSTOM_HEAP_NAME && !name.contains(['\0', ','])
}

impl HeapSelection {
    /// The first problem, in words.
    pub fn check(&self) -> Result<(), String> {
        let all_names = self
            .names
            .iter()
            .chain(self.intervals.iter().map(|(n, _)| n))
            .chain(&self.exclude);
        for n in all_names {
            if !valid_heap_name(n) {
                return Err(format!(
                    "`{}` is not a heap name (1 to {MAX_CUSTOM_HEAP_NAME} bytes, no comma)",
                    n.escape_debug()
                ));
            }
        }
        if let Some((n, _)) = self.intervals.iter().find(|(_, i)| *i == 0) {
            return Err(format!(
                "the interval of heap `{n}` must be at least 1 byte"
            ));
        }
        let mut c = ClientConfig::new(1, 0);
        self.apply(1, &mut c)
    }

    /// Writes the heap list into `c`; `interval` is the profile's.
    pub fn apply(&self, interval: u64, c: &mut ClientConfig) -> Result<(), String> {
        c.clear_heaps();
        let mut add = |name: &str, iv: u64| {
            if c.set_heap(name, iv) {
                Ok(())
            } else {
                Err(format!(
                    "more than {MAX_HEAPS} heaps named (or `{}` does not fit)",
                    name.escape_debug()
                ))
            }
        };
        if self.names.is_empty() && !self.all {
            add(HEAP_LIBC_MALLOC_NAME, interval)?;
        }
        for n in &self.names {
            add(n, interval)?;
        }
        for (n, iv) in &self.intervals {
            add(n, *iv)?;
        }
        for n in &self.exclude {
            add(n, 0)?;
        }
        if self.all {
            c.flags |= ClientConfig::FLAG_ALL_HEAPS;
        } else {
            c.flags &= !ClientConfig::FLAG_ALL_HEAPS;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(h: &HeapSelection) -> ClientConfig {
        let mut c = ClientConfig::new(4096, 1 << 20);
        h.apply(4096, &mut c).expect("apply");
        c
    }

    #[test]
    fn perfettos_rule() {
        let c = config(&HeapSelection::default());
        assert_eq!(c.interval_for("libc.malloc"), 4096);
        assert_eq!(c.interval_for("pool"), 0);
        let c = config(&HeapSelection {
            names: vec!["pool".into()],
            ..HeapSelection::default()
        });
        assert_eq!(
            (c.interval_for("libc.malloc"), c.interval_for("pool")),
            (0, 4096)
        );
        let c = config(&HeapSelection {
            all: true,
            intervals: vec![("pool".into(), 1)],
            exclude: vec!["arena".into()],
            ..HeapSelection::default()
        });
        assert_eq!(c.interval_for("libc.malloc"), 4096);
        assert_eq!(c.interval_for("pool"), 1);
        assert_eq!(c.interval_for("arena"), 0);
        assert_eq!(c.interval_for("other"), 4096);
        let c = config(&HeapSelection {
            intervals: vec![("pool".into(), 512)],
            ..HeapSelection::default()
        });
        assert_eq!(
            (c.interval_for("libc.malloc"), c.interval_for("pool")),
            (4096, 512)
        );
    }

    #[test]
    fn checks() {
        assert_eq!(HeapSelection::default().check(), Ok(()));
        let bad = |h: HeapSelection| h.check().unwrap_err();
        assert!(
            bad(HeapSelection {
                names: vec!["x".repeat(64)],
                ..HeapSelection::default()
            })
            .contains("not a heap name")
        );
        assert!(
            bad(HeapSelection {
                intervals: vec![("pool".into(), 0)],
                ..HeapSelection::default()
            })
            .contains("at least 1 byte")
        );
        assert!(
            bad(HeapSelection {
                names: (0..65).map(|i| format!("h{i}")).collect(),
                ..HeapSelection::default()
            })
            .contains("more than 64 heaps")
        );
    }
}
