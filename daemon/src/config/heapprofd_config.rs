//! Perfetto's `HeapprofdConfig` (protos/perfetto/config/profiling/
//! heapprofd_config.proto), field for field, read from the text format.
//!
//! [`FIELDS`] is the schema: every field name, number and type of the
//! official message (a test compares it with the descriptor of the official
//! `perfetto` Python package). Decoding refuses what the official parser
//! refuses: unknown fields (all of them are named, with where they were
//! written), values of the wrong type, a non-repeated field given twice.
//! What the fields *mean* for a profile is [`super::profile_config`].

use super::textproto::{Field, Message, Pos, Scalar, Value};

/// A field's type in the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `uint64`.
    U64,
    /// `uint32`.
    U32,
    /// `bool`.
    Bool,
    /// `string`.
    Str,
    /// `ContinuousDumpConfig`.
    ContinuousDump,
}

/// One field of the schema: name, number, type, repeated.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    /// The field's name.
    pub name: &'static str,
    /// Its number in the official message.
    pub number: u32,
    /// Its type.
    pub kind: Kind,
    /// Whether it is `repeated`.
    pub repeated: bool,
}

const fn f(name: &'static str, number: u32, kind: Kind, repeated: bool) -> FieldSpec {
    FieldSpec {
        name,
        number,
        kind,
        repeated,
    }
}

/// Every field of `HeapprofdConfig` ("Next id: 28"; 3 was never used and 12,
/// `idle_allocations`, is reserved).
pub const FIELDS: &[FieldSpec] = &[
    f("sampling_interval_bytes", 1, Kind::U64, false),
    f("adaptive_sampling_shmem_threshold", 24, Kind::U64, false),
    f(
        "adaptive_sampling_max_sampling_interval_bytes",
        25,
        Kind::U64,
        false,
    ),
    f("process_cmdline", 2, Kind::Str, true),
    f("pid", 4, Kind::U64, true),
    f("target_installed_by", 26, Kind::Str, true),
    f("heaps", 20, Kind::Str, true),
    f("exclude_heaps", 27, Kind::Str, true),
    f("stream_allocations", 23, Kind::Bool, false),
    f("heap_sampling_intervals", 22, Kind::U64, true),
    f("all_heaps", 21, Kind::Bool, false),
    f("all", 5, Kind::Bool, false),
    f("min_anonymous_memory_kb", 15, Kind::U32, false),
    f("max_heapprofd_memory_kb", 16, Kind::U32, false),
    f("max_heapprofd_cpu_secs", 17, Kind::U64, false),
    f("skip_symbol_prefix", 7, Kind::Str, true),
    f("continuous_dump_config", 6, Kind::ContinuousDump, false),
    f("shmem_size_bytes", 8, Kind::U64, false),
    f("block_client", 9, Kind::Bool, false),
    f("block_client_timeout_us", 14, Kind::U32, false),
    f("no_startup", 10, Kind::Bool, false),
    f("no_running", 11, Kind::Bool, false),
    f("dump_at_max", 13, Kind::Bool, false),
    f("disable_fork_teardown", 18, Kind::Bool, false),
    f("disable_vfork_detection", 19, Kind::Bool, false),
];

/// The fields of `HeapprofdConfig.ContinuousDumpConfig`.
pub const CONTINUOUS_DUMP_FIELDS: &[FieldSpec] = &[
    f("dump_phase_ms", 5, Kind::U32, false),
    f("dump_interval_ms", 6, Kind::U32, false),
];

/// `HeapprofdConfig.ContinuousDumpConfig`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContinuousDumpConfig {
    /// Delay before the first dump.
    pub dump_phase_ms: u32,
    /// Time between dumps (0: no continuous dumps).
    pub dump_interval_ms: u32,
}

/// `HeapprofdConfig`, as written (absent optional scalars are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
// Each field is the official field of the same name.
pub struct HeapprofdConfig {
    pub sampling_interval_bytes: Option<u64>,
    pub adaptive_sampling_shmem_threshold: Option<u64>,
    pub adaptive_sampling_max_sampling_interval_bytes: Option<u64>,
    pub process_cmdline: Vec<String>,
    pub pid: Vec<u64>,
    pub target_installed_by: Vec<String>,
    pub heaps: Vec<String>,
    pub exclude_heaps: Vec<String>,
    pub stream_allocations: bool,
    pub heap_sampling_intervals: Vec<u64>,
    pub all_heaps: bool,
    pub all: bool,
    pub min_anonymous_memory_kb: Option<u32>,
    pub max_heapprofd_memory_kb: Option<u32>,
    pub max_heapprofd_cpu_secs: Option<u64>,
    pub skip_symbol_prefix: Vec<String>,
    pub continuous_dump_config: Option<ContinuousDumpConfig>,
    pub shmem_size_bytes: Option<u64>,
    pub block_client: bool,
    pub block_client_timeout_us: Option<u32>,
    pub no_startup: bool,
    pub no_running: bool,
    pub dump_at_max: bool,
    pub disable_fork_teardown: bool,
    pub disable_vfork_detection: bool,
}

/// What is wrong with a config, every problem at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(Vec<(Pos, String)>);

impl Problems {
    /// Adds one.
    pub fn push(&mut self, pos: Pos, message: impl std::fmt::Display) {
        self.0.push((pos, format!("{pos}: {message}")));
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every problem, in the order of the text.
    pub fn into_sorted(mut self) -> Vec<String> {
        self.0.sort_by_key(|(p, _)| (p.line, p.col));
        self.0.into_iter().map(|(_, m)| m).collect()
    }
}

/// A decoded field value.
enum Decoded {
    U64(u64),
    Bool(bool),
    Str(String),
    Dump(ContinuousDumpConfig),
}

/// Decodes a parsed `HeapprofdConfig` message; `context` names it in
/// messages (`HeapprofdConfig`, or its path inside a TraceConfig).
pub fn decode(m: &Message, context: &str, problems: &mut Problems) -> HeapprofdConfig {
    let mut c = HeapprofdConfig::default();
    for (spec, field, value) in decode_fields(m, FIELDS, context, problems) {
        apply(&mut c, spec, value, field.pos, problems);
    }
    c
}

/// Checks every field of `m` against `specs`: the known ones decoded, in
/// order, the problems (unknown names, wrong types, repeats) collected.
fn decode_fields<'m>(
    m: &'m Message,
    specs: &'static [FieldSpec],
    context: &str,
    problems: &mut Problems,
) -> Vec<(&'static FieldSpec, &'m Field, Decoded)> {
    let mut out = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for field in &m.fields {
        let Some(spec) = specs.iter().find(|s| s.name == field.name) else {
            problems.push(
                field.pos,
                format!(
                    "unknown field `{}` in {context}{}",
                    field.name,
                    hint(&field.name, specs)
                ),
            );
            continue;
        };
        if !spec.repeated {
            if seen.contains(&spec.name) {
                problems.push(
                    field.pos,
                    format!(
                        "`{}` is not repeated but is given more than once",
                        spec.name
                    ),
                );
                continue;
            }
            seen.push(spec.name);
        }
        match decode_value(spec, &field.value) {
            Ok(Decoded::Dump(_)) if spec.kind == Kind::ContinuousDump => {
                let Value::Message(inner) = &field.value else {
                    continue;
                };
                let ctx = format!("{context}.{}", spec.name);
                let mut d = ContinuousDumpConfig::default();
                for (s, _, v) in decode_fields(inner, CONTINUOUS_DUMP_FIELDS, &ctx, problems) {
                    if let Decoded::U64(n) = v {
                        match s.name {
                            "dump_phase_ms" => d.dump_phase_ms = n as u32,
                            _ => d.dump_interval_ms = n as u32,
                        }
                    }
                }
                out.push((spec, field, Decoded::Dump(d)));
            }
            Ok(v) => out.push((spec, field, v)),
            Err(e) => problems.push(field.pos, format!("`{}`: {e}", spec.name)),
        }
    }
    out
}

/// ` (did you mean `x`?)` for a name close to a known one.
fn hint(name: &str, specs: &[FieldSpec]) -> String {
    // A known name that extends the one written (or is extended by it)
    // first, then the closest one within a few edits.
    specs
        .iter()
        .filter_map(|s| {
            let n = s.name;
            if n.starts_with(name) || name.starts_with(n) {
                Some((0, n))
            } else {
                let d = distance(name, n);
                (d <= 2 + n.len() / 8).then_some((d, n))
            }
        })
        .min()
        .map_or_else(String::new, |(_, n)| format!(" (did you mean `{n}`?)"))
}

/// Levenshtein distance (short field names only).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn decode_value(spec: &FieldSpec, value: &Value) -> Result<Decoded, String> {
    let scalar = match (value, spec.kind) {
        (Value::Message(_), Kind::ContinuousDump) => {
            return Ok(Decoded::Dump(ContinuousDumpConfig::default()));
        }
        (Value::Message(_), _) => return Err("expected a value, not a message".into()),
        (Value::Scalar(_), Kind::ContinuousDump) => {
            return Err("expected a message `{ ... }`".into());
        }
        (Value::Scalar(s), _) => s,
    };
    match spec.kind {
        Kind::U64 | Kind::U32 => {
            let max = if spec.kind == Kind::U32 {
                u64::from(u32::MAX)
            } else {
                u64::MAX
            };
            match scalar {
                Scalar::Int {
                    negative: false,
                    magnitude,
                } if *magnitude <= max => Ok(Decoded::U64(*magnitude)),
                Scalar::Int { .. } => Err(format!(
                    "out of range for an unsigned {}-bit integer",
                    if max == u64::MAX { 64 } else { 32 }
                )),
                other => Err(format!("expected an integer, found {}", describe(other))),
            }
        }
        Kind::Bool => match scalar {
            Scalar::Ident(s) if matches!(s.as_str(), "true" | "True" | "t") => {
                Ok(Decoded::Bool(true))
            }
            Scalar::Ident(s) if matches!(s.as_str(), "false" | "False" | "f") => {
                Ok(Decoded::Bool(false))
            }
            Scalar::Int {
                negative: false,
                magnitude: m @ (0 | 1),
            } => Ok(Decoded::Bool(*m == 1)),
            other => Err(format!("expected true or false, found {}", describe(other))),
        },
        Kind::Str => match scalar {
            Scalar::Str(b) => String::from_utf8(b.clone())
                .map(Decoded::Str)
                .map_err(|_| "the string is not valid UTF-8".to_string()),
            other => Err(format!(
                "expected a quoted string, found {}",
                describe(other)
            )),
        },
        Kind::ContinuousDump => Err("expected a message".into()),
    }
}

fn describe(s: &Scalar) -> String {
    match s {
        Scalar::Ident(i) => format!("`{i}`"),
        Scalar::Int {
            negative,
            magnitude,
        } => {
            format!("`{}{magnitude}`", if *negative { "-" } else { "" })
        }
        Scalar::Float(x) => format!("`{x}`"),
        Scalar::Str(_) => "a string".into(),
    }
}

fn apply(c: &mut HeapprofdConfig, spec: &FieldSpec, v: Decoded, pos: Pos, problems: &mut Problems) {
    let u = |v: &Decoded| if let Decoded::U64(n) = v { *n } else { 0 };
    let b = |v: &Decoded| matches!(v, Decoded::Bool(true));
    match (spec.name, v) {
        ("continuous_dump_config", Decoded::Dump(d)) => c.continuous_dump_config = Some(d),
        ("process_cmdline", Decoded::Str(s)) => c.process_cmdline.push(s),
        ("target_installed_by", Decoded::Str(s)) => c.target_installed_by.push(s),
        ("heaps", Decoded::Str(s)) => c.heaps.push(s),
        ("exclude_heaps", Decoded::Str(s)) => c.exclude_heaps.push(s),
        ("skip_symbol_prefix", Decoded::Str(s)) => c.skip_symbol_prefix.push(s),
        (name, v) => match name {
            "sampling_interval_bytes" => c.sampling_interval_bytes = Some(u(&v)),
            "adaptive_sampling_shmem_threshold" => {
                c.adaptive_sampling_shmem_threshold = Some(u(&v))
            }
            "adaptive_sampling_max_sampling_interval_bytes" => {
                c.adaptive_sampling_max_sampling_interval_bytes = Some(u(&v));
            }
            "pid" => c.pid.push(u(&v)),
            "heap_sampling_intervals" => c.heap_sampling_intervals.push(u(&v)),
            "stream_allocations" => c.stream_allocations = b(&v),
            "all_heaps" => c.all_heaps = b(&v),
            "all" => c.all = b(&v),
            "min_anonymous_memory_kb" => c.min_anonymous_memory_kb = Some(u(&v) as u32),
            "max_heapprofd_memory_kb" => c.max_heapprofd_memory_kb = Some(u(&v) as u32),
            "max_heapprofd_cpu_secs" => c.max_heapprofd_cpu_secs = Some(u(&v)),
            "shmem_size_bytes" => c.shmem_size_bytes = Some(u(&v)),
            "block_client" => c.block_client = b(&v),
            "block_client_timeout_us" => c.block_client_timeout_us = Some(u(&v) as u32),
            "no_startup" => c.no_startup = b(&v),
            "no_running" => c.no_running = b(&v),
            "dump_at_max" => c.dump_at_max = b(&v),
            "disable_fork_teardown" => c.disable_fork_teardown = b(&v),
            "disable_vfork_detection" => c.disable_vfork_detection = b(&v),
            other => problems.push(pos, format!("`{other}` is not handled (a bug)")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::textproto::parse;
    use super::*;

    fn decoded(text: &str) -> Result<HeapprofdConfig, Vec<String>> {
        let m = parse(text).map_err(|e| vec![e.to_string()])?;
        let mut p = Problems::default();
        let c = decode(&m, "HeapprofdConfig", &mut p);
        if p.is_empty() {
            Ok(c)
        } else {
            Err(p.into_sorted())
        }
    }

    #[test]
    fn every_field() {
        let c = decoded(
            r#"sampling_interval_bytes: 4096
               adaptive_sampling_shmem_threshold: 1
               adaptive_sampling_max_sampling_interval_bytes: 2
               process_cmdline: "a" process_cmdline: "b"
               pid: 1 pid: [2, 3]
               target_installed_by: "@system"
               heaps: "libc.malloc" heaps: "x"
               exclude_heaps: "y"
               stream_allocations: false
               heap_sampling_intervals: [4096, 8192]
               all_heaps: true
               all: false
               min_anonymous_memory_kb: 5
               max_heapprofd_memory_kb: 6
               max_heapprofd_cpu_secs: 7
               skip_symbol_prefix: "/system"
               continuous_dump_config { dump_phase_ms: 10 dump_interval_ms: 20 }
               shmem_size_bytes: 8388608
               block_client: true
               block_client_timeout_us: 500
               no_startup: true
               no_running: false
               dump_at_max: True
               disable_fork_teardown: 1
               disable_vfork_detection: t"#,
        )
        .expect("valid");
        assert_eq!(c.sampling_interval_bytes, Some(4096));
        assert_eq!(c.process_cmdline, ["a", "b"]);
        assert_eq!(c.pid, [1, 2, 3]);
        assert_eq!(c.heap_sampling_intervals, [4096, 8192]);
        assert_eq!(
            c.continuous_dump_config,
            Some(ContinuousDumpConfig {
                dump_phase_ms: 10,
                dump_interval_ms: 20
            })
        );
        assert!(c.all_heaps && c.block_client && c.no_startup && c.dump_at_max);
        assert!(c.disable_fork_teardown && c.disable_vfork_detection && !c.all);
        assert_eq!(c.block_client_timeout_us, Some(500));
        assert_eq!(c.max_heapprofd_cpu_secs, Some(7));
    }

    #[test]
    fn unknown_fields_are_all_named() {
        let e = decoded(
            "sampling_interval: 1\nsampling_interval_bytes: 1\nprocess_cmdlines: \"x\"\n\
             continuous_dump_config { dump_phase: 1 }\nfrobnicate: true",
        )
        .expect_err("unknown fields");
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("1:1: unknown field `sampling_interval` in HeapprofdConfig (did you mean `sampling_interval_bytes`?)"), "{e:?}");
        assert!(
            e[1].contains("`process_cmdlines`") && e[1].contains("`process_cmdline`"),
            "{e:?}"
        );
        assert!(
            e[2].contains("`dump_phase` in HeapprofdConfig.continuous_dump_config"),
            "{e:?}"
        );
        assert!(
            e[3].starts_with("5:1: unknown field `frobnicate`") && !e[3].contains("mean"),
            "{e:?}"
        );
    }

    #[test]
    fn wrong_types_and_repeats() {
        for (text, want) in [
            ("sampling_interval_bytes: -1", "out of range"),
            ("min_anonymous_memory_kb: 4294967296", "32-bit"),
            ("all: 2", "true or false"),
            ("all: yes", "true or false"),
            ("process_cmdline: foo", "quoted string"),
            ("pid: \"1\"", "expected an integer"),
            ("continuous_dump_config: 5", "message"),
            ("all { }", "not a message"),
            ("all: true all: false", "more than once"),
            ("sampling_interval_bytes: 1.5", "expected an integer"),
        ] {
            let e = decoded(text).expect_err(text).join("\n");
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
