//! pprof output: the messages of pprof's `profile.proto`
//! (`perftools.profiles`, field numbers as published), written by hand with
//! prost, and the conversion from a trace.
//!
//! Sample types, in order: `alloc_objects/count`, `alloc_space/bytes`,
//! `inuse_objects/count`, `inuse_space/bytes` (Go's heap profile names, so
//! `pprof -sample_index=inuse_space` and speedscope know them); "inuse"
//! is what was allocated and not freed. Every sample has a `pid` (numeric)
//! and a `heap` label, and one string label per pair of the user context
//! its allocations were made in (`pprof -tagfocus endpoint=/a`). Locations carry the frame's `rel_pc` as address and
//! are already symbolized (`has_functions`).

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;
use rustc_hash::FxHashMap;

use heapprofd_model::trace::{CallstackValues, Frame, ResolvedFrame, TraceData};

use crate::diff::{FrameKey, frame_key};
use crate::filter::Filter;

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    /// What each value of a sample is.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Mapped modules.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Code locations.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Strings; entry 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regexp of frames to drop (string index).
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regexp of frames to keep (string index).
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Time of collection (Unix ns).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Duration of the profile.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// Kind of events between samples.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Events between samples.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// Preferred sample type (string index of its type).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `perftools.profiles.ValueType`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    /// String index of the type (`inuse_space`).
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// String index of the unit (`bytes`).
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `perftools.profiles.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Location ids, leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `perftools.profiles.Label`.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    /// String index of the key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String index of a string value.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// String index of the numeric value's unit.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `perftools.profiles.Mapping`.
#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Start address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End address.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// String index of the path.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// String index of the build id (hex).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Functions are known.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// File names are known.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Line numbers are known.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Inline frames are expanded.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `perftools.profiles.Location`.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Mapping id (0 = none).
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// Address.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Source lines, innermost inline frame first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Several frames folded into one.
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `perftools.profiles.Line`.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    /// Function id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Line number.
    #[prost(int64, tag = "2")]
    pub line: i64,
    /// Column number.
    #[prost(int64, tag = "3")]
    pub column: i64,
}

/// `perftools.profiles.Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// String index of the name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// String index of the mangled name.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// String index of the source file.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The four sample types, in order.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];

/// Builds a [`Profile`]: strings, mappings, functions and locations each
/// interned once.
#[derive(Default)]
pub(crate) struct Builder {
    pub(crate) p: Profile,
    strings: FxHashMap<String, i64>,
    mappings: FxHashMap<(String, Vec<u8>), u64>,
    functions: FxHashMap<(String, String), u64>,
    locations: FxHashMap<ResolvedFrame, u64>,
}

pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Builder {
    /// The index of string `s`.
    pub(crate) fn s(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    /// The id of `f`'s mapping (0: none).
    pub(crate) fn mapping(&mut self, f: &ResolvedFrame) -> u64 {
        let Some(path) = f.mapping.clone() else {
            return 0;
        };
        let key = (path, f.build_id.clone());
        if let Some(&id) = self.mappings.get(&key) {
            return id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        let hex: String = f.build_id.iter().map(|b| format!("{b:02x}")).collect();
        let m = Mapping {
            id,
            filename: self.s(&key.0),
            build_id: self.s(&hex),
            has_functions: true,
            has_filenames: f.source_file.is_some(),
            has_line_numbers: f.line.is_some(),
            ..Default::default()
        };
        self.p.mapping.push(m);
        self.mappings.insert(key, id);
        id
    }

    fn function(&mut self, f: &ResolvedFrame) -> u64 {
        let key = (f.display_name(), f.source_file.clone().unwrap_or_default());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let func = Function {
            id,
            name: self.s(&key.0),
            system_name: self.s(&key.0),
            filename: self.s(&key.1),
            start_line: 0,
        };
        self.p.function.push(func);
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, f: &ResolvedFrame) -> u64 {
        if let Some(&id) = self.locations.get(f) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        let loc = Location {
            id,
            mapping_id: self.mapping(f),
            address: f.rel_pc,
            line: vec![Line {
                function_id: self.function(f),
                line: i64::from(f.line.unwrap_or(0)),
                column: 0,
            }],
            is_folded: false,
        };
        self.p.location.push(loc);
        self.locations.insert(f.clone(), id);
        id
    }
}

/// The main executable of process `pid` among the frames of its heaps:
/// a frame of it (for its mapping path and build id).
pub fn main_executable(data: &TraceData, pid: u32) -> Option<&ResolvedFrame> {
    let frames = || {
        data.heaps
            .iter()
            .filter(move |h| h.pid == pid)
            .flat_map(|h| h.callstacks.iter())
            .flat_map(|c| c.frames.iter())
            .filter(|f| f.mapping.is_some())
    };
    let named = |n: &str| frames().find(|f| f.function.as_deref() == Some(n));
    let by_cmd = || {
        let cmd = data.processes.get(&pid)?.cmdline.first()?;
        let base = cmd.rsplit('/').next()?;
        frames().find(|f| {
            f.mapping
                .as_deref()
                .and_then(|m| m.rsplit('/').next())
                .is_some_and(|m| m == base || m.starts_with(&format!("{base}.")))
        })
    };
    named("_start")
        .or_else(|| named("main"))
        .or_else(by_cmd)
        .map(|f| &**f)
}

impl Builder {
    fn header(&mut self, data: &TraceData, filter: &Filter) -> (i64, i64) {
        self.s("");
        for (t, u) in SAMPLE_TYPES {
            let vt = ValueType {
                r#type: self.s(t),
                unit: self.s(u),
            };
            self.p.sample_type.push(vt);
        }
        let space = self.s("space");
        let bytes = self.s("bytes");
        self.p.period_type = Some(ValueType {
            r#type: space,
            unit: bytes,
        });
        let comment = self.s("converted by heapprofd-rs from a Perfetto heap profile");
        self.p.comment.push(comment);
        if let Some(first) = data.heaps.iter().find(|h| filter.matches(h))
            && let Some(exe) = main_executable(data, first.pid)
        {
            self.mapping(exe);
        }
        (self.s("pid"), self.s("heap"))
    }

    /// A sample of `frames` (outermost caller first).
    pub(crate) fn sample(&mut self, frames: &[Frame], value: Vec<i64>, label: Vec<Label>) {
        let location_id = frames.iter().rev().map(|f| self.location(f)).collect();
        self.p.sample.push(Sample {
            location_id,
            value,
            label,
        });
    }
}

fn values(c: &CallstackValues) -> [i64; 4] {
    [
        to_i64(c.alloc_count),
        to_i64(c.self_allocated),
        to_i64(c.unreleased_count()),
        to_i64(c.unreleased()),
    ]
}

/// Builds a pprof profile of the heaps `filter` selects.
pub fn to_pprof(data: &TraceData, filter: &Filter) -> Profile {
    let mut b = Builder::default();
    let (pid_key, heap_key) = b.header(data, filter);
    b.p.default_sample_type = b.s("inuse_space");
    let mut duration = 0;
    for h in data.heaps.iter().filter(|h| filter.matches(h)) {
        if b.p.period == 0 {
            b.p.period = to_i64(h.sampling_interval_bytes);
        }
        if let (Some(s), Some(e)) = (h.start_timestamp, h.timestamp) {
            duration = duration.max(e.saturating_sub(s));
        }
        let heap = b.s(&h.heap_name);
        for c in &h.callstacks {
            if c.alloc_count == 0 && c.self_allocated == 0 {
                continue;
            }
            let mut label = vec![
                Label {
                    key: pid_key,
                    num: i64::from(h.pid),
                    ..Default::default()
                },
                Label {
                    key: heap_key,
                    str: heap,
                    ..Default::default()
                },
            ];
            for (k, v) in c.context.iter().flatten() {
                label.push(Label {
                    key: b.s(k),
                    str: b.s(v),
                    ..Default::default()
                });
            }
            b.sample(&c.frames, values(c).to_vec(), label);
        }
    }
    b.p.duration_nanos = to_i64(duration);
    b.p
}

/// A pprof profile of NEW - BASE per stack (frames matched by function and
/// module, see [`crate::diff`]), over the heaps named `heap` (all if
/// `None`). The default sample type is `alloc_space`: what grew.
pub fn to_pprof_diff(base: &TraceData, new: &TraceData, heap: Option<&str>) -> Profile {
    let filter = Filter {
        pid: None,
        heap: heap.map(str::to_owned),
    };
    let mut b = Builder::default();
    let (_, heap_key) = b.header(new, &filter);
    b.p.default_sample_type = b.s("alloc_space");
    let mut stacks: FxHashMap<Vec<FrameKey>, (Vec<Frame>, [i64; 4])> = FxHashMap::default();
    let mut order: Vec<Vec<FrameKey>> = Vec::new();
    for (data, sign) in [(base, -1i64), (new, 1)] {
        for h in data.heaps.iter().filter(|h| filter.matches(h)) {
            if b.p.period == 0 {
                b.p.period = to_i64(h.sampling_interval_bytes);
            }
            for c in &h.callstacks {
                let key: Vec<FrameKey> = c.frames.iter().map(|f| frame_key(f)).collect();
                let e = stacks.entry(key.clone()).or_insert_with(|| {
                    order.push(key);
                    (c.frames.clone(), [0; 4])
                });
                for (acc, v) in e.1.iter_mut().zip(values(c)) {
                    *acc = acc.saturating_add(sign.saturating_mul(v));
                }
            }
        }
    }
    let label_heap = b.s(heap.unwrap_or("all heaps"));
    for key in order {
        let (frames, v) = &stacks[&key];
        if v.iter().all(|&x| x == 0) {
            continue;
        }
        let label = vec![Label {
            key: heap_key,
            str: label_heap,
            ..Default::default()
        }];
        b.sample(frames, v.to_vec(), label);
    }
    b.p
}

/// Writes `p` gzip-compressed (what `pprof` reads).
pub fn write_pprof_gz(p: &Profile, out: impl Write) -> std::io::Result<()> {
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&p.encode_to_vec())?;
    gz.finish()?.flush()
}
