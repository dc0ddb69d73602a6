//! A Perfetto `TraceConfig` around the `HeapprofdConfig` (what
//! `tools/heap_profile --print-config` writes and `perfetto --txt -c`
//! reads): the `android.heapprofd` data source's `heapprofd_config`, and the
//! session's `duration_ms`. Every other official field is accepted and has
//! no effect (buffers, flush periods: there is no tracing service here);
//! other data sources are named in a warning; a field the official schema
//! does not have is an error, like in `HeapprofdConfig`.

use super::heapprofd_config::Problems;
use super::textproto::{Field, Message, Scalar, Value};

/// Every field of the official `TraceConfig`.
pub const TRACE_CONFIG_FIELDS: &[&str] = &[
    "activate_triggers",
    "allow_user_build_tracing",
    "android_report_config",
    "buffers",
    "bugreport_filename",
    "bugreport_score",
    "builtin_data_sources",
    "cmd_trace_start_delay",
    "compression",
    "compression_type",
    "data_source_stop_timeout_ms",
    "data_sources",
    "deferred_start",
    "duration_ms",
    "enable_extra_guardrails",
    "exclusive_prio",
    "experimental_trace_buffer_v2_compaction",
    "fflush_post_write",
    "file_write_period_ms",
    "flush_period_ms",
    "flush_timeout_ms",
    "guardrail_overrides",
    "incident_report_config",
    "incremental_state_config",
    "lockdown_mode",
    "max_file_size_bytes",
    "notify_traceur",
    "output_path",
    "persist_trace_across_reboots",
    "prefer_suspend_clock_for_duration",
    "priority_boost",
    "producers",
    "session_semaphores",
    "statsd_logging",
    "statsd_metadata",
    "trace_all_machines",
    "trace_attributes",
    "trace_filter",
    "trace_uuid_lsb",
    "trace_uuid_msb",
    "trigger_config",
    "unique_session_name",
    "write_flush_mode",
    "write_into_file",
];

/// Every field of the official `TraceConfig.DataSource`.
const DATA_SOURCE_FIELDS: &[&str] = &[
    "config",
    "machine_name_filter",
    "producer_name_filter",
    "producer_name_regex_filter",
];

/// The fields of the official `DataSourceConfig` that are not a config of
/// another data source (those, `*_config` and a few others, are accepted by
/// their names only when the data source is not heapprofd's).
const DATA_SOURCE_CONFIG_FIELDS: &[&str] = &[
    "name",
    "target_buffer",
    "target_buffer_name",
    "trace_duration_ms",
    "prefer_suspend_clock_for_duration",
    "stop_timeout_ms",
    "enable_extra_guardrails",
    "session_initiator",
    "tracing_session_id",
    "buffer_exhausted_policy",
    "priority_boost",
    "heapprofd_config",
];

/// The data source heapprofd serves.
pub const HEAPPROFD_DATA_SOURCE: &str = "android.heapprofd";

/// Whether a parsed message is a `TraceConfig` rather than a bare
/// `HeapprofdConfig` (it has a field only a `TraceConfig` has).
pub fn is_trace_config(m: &Message) -> bool {
    m.fields
        .iter()
        .any(|f| matches!(f.name.as_str(), "data_sources" | "buffers" | "duration_ms"))
}

/// What a `TraceConfig` holds for us.
#[derive(Debug, Default)]
pub struct TraceConfigParts<'m> {
    /// The `heapprofd_config` of the `android.heapprofd` data source.
    pub heapprofd: Option<&'m Message>,
    /// `duration_ms`.
    pub duration_ms: Option<u64>,
    /// Data sources that are ignored.
    pub warnings: Vec<String>,
}

/// Takes a `TraceConfig` apart; problems are collected.
pub fn parts<'m>(m: &'m Message, problems: &mut Problems) -> TraceConfigParts<'m> {
    let mut out = TraceConfigParts::default();
    for f in &m.fields {
        if !TRACE_CONFIG_FIELDS.contains(&f.name.as_str()) {
            problems.push(f.pos, format!("unknown field `{}` in TraceConfig", f.name));
            continue;
        }
        match (f.name.as_str(), &f.value) {
            (
                "duration_ms",
                Value::Scalar(Scalar::Int {
                    negative: false,
                    magnitude,
                }),
            ) => {
                out.duration_ms = Some(*magnitude).filter(|&d| d > 0);
            }
            ("duration_ms", _) => problems.push(f.pos, "`duration_ms`: expected an integer"),
            ("data_sources", Value::Message(ds)) => data_source(ds, &mut out, problems),
            ("data_sources", _) => problems.push(f.pos, "`data_sources`: expected a message"),
            _ => {}
        }
    }
    out
}

fn data_source<'m>(ds: &'m Message, out: &mut TraceConfigParts<'m>, problems: &mut Problems) {
    for f in &ds.fields {
        if !DATA_SOURCE_FIELDS.contains(&f.name.as_str()) {
            problems.push(
                f.pos,
                format!("unknown field `{}` in TraceConfig.DataSource", f.name),
            );
            continue;
        }
        if f.name != "config" {
            continue;
        }
        let Value::Message(config) = &f.value else {
            problems.push(f.pos, "`config`: expected a message");
            continue;
        };
        let name = string_field(config, "name");
        if name.as_deref() != Some(HEAPPROFD_DATA_SOURCE) {
            out.warnings.push(format!(
                "data source `{}` is ignored (only {HEAPPROFD_DATA_SOURCE} is served here)",
                name.as_deref().unwrap_or("?")
            ));
            continue;
        }
        for cf in &config.fields {
            if !DATA_SOURCE_CONFIG_FIELDS.contains(&cf.name.as_str()) {
                problems.push(
                    cf.pos,
                    format!(
                        "unknown field `{}` in the DataSourceConfig of {HEAPPROFD_DATA_SOURCE}",
                        cf.name
                    ),
                );
            }
        }
        match config.fields.iter().find(|c| c.name == "heapprofd_config") {
            Some(Field {
                value: Value::Message(h),
                ..
            }) if out.heapprofd.is_none() => out.heapprofd = Some(h),
            Some(Field { pos, .. }) if out.heapprofd.is_some() => problems.push(
                *pos,
                "more than one android.heapprofd data source (run one profile per config)",
            ),
            Some(Field { pos, .. }) => {
                problems.push(*pos, "`heapprofd_config`: expected a message")
            }
            None => out.heapprofd = Some(empty()),
        }
    }
}

fn empty() -> &'static Message {
    static EMPTY: Message = Message { fields: Vec::new() };
    &EMPTY
}

fn string_field(m: &Message, name: &str) -> Option<String> {
    m.fields
        .iter()
        .find(|f| f.name == name)
        .and_then(|f| match &f.value {
            Value::Scalar(Scalar::Str(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
}
