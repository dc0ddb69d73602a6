//! `report --cpu`: the stack samples of a trace (CPU time from
//! `record --cpu-time`, events from `heapprofd_request_stack`, or any
//! writer's `PerfSample`s), per (process, event): the hot functions by self
//! and inclusive weight (like `jfr view cpu-time-hot-methods`), and the
//! per-thread totals with the samples each thread lost.
//!
//! Weights are what the samples stand for: CPU nanoseconds for CPU time
//! (each sample's period), the event's count otherwise. A function's
//! *self* weight is that of the samples whose innermost frame it is; its
//! *inclusive* weight that of the samples whose stack it is anywhere in
//! (counted once per sample, however often it recurses).

use std::collections::HashMap;
use std::io::{self, Write};

use heapprofd_model::trace::{SampleProfile, TraceData};
use serde::Serialize;

use crate::names::shorten;
use crate::units::human_ns;

/// One function's weights in a [`CpuProfile`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotFunction {
    /// Function name (or `module+0xpc`).
    pub function: String,
    /// Weight of the samples it is the innermost frame of.
    pub self_weight: u64,
    /// Weight of the samples it is in.
    pub inclusive_weight: u64,
    /// `self_weight` as a percentage of the total.
    pub self_percent: f64,
    /// `inclusive_weight` as a percentage of the total.
    pub inclusive_percent: f64,
}

/// One thread's totals in a [`CpuProfile`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThreadTotal {
    /// Thread id.
    pub tid: u32,
    /// Its name (from the trace's process tree), or empty.
    pub name: String,
    /// Samples.
    pub samples: u64,
    /// Their weight.
    pub weight: u64,
    /// `weight` as a percentage of the process's.
    pub percent: f64,
    /// Timer expirations merged into recorded samples (their CPU time is
    /// in the samples' weights: not lost).
    pub lost_overrun: u64,
    /// Samples (CPU: timer expirations) lost in the client: ring full, or
    /// the thread was inside the client.
    pub lost_dropped: u64,
}

/// The stack samples of one (process, event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuProfile {
    /// Process id.
    pub pid: u32,
    /// Its command line.
    pub cmdline: String,
    /// `cpu-time` or the event's name.
    pub event: String,
    /// Whether weights are CPU nanoseconds.
    pub nanoseconds: bool,
    /// Samples.
    pub samples: u64,
    /// Their weight.
    pub weight: u64,
    /// Samples whose stack could not be walked to its end (in the
    /// profile, ending in an `ERROR <KIND>` frame).
    pub unwind_errors: u64,
    /// Functions by self weight, then inclusive (at most `top` of each).
    pub by_self: Vec<HotFunction>,
    /// Functions by inclusive weight.
    pub by_inclusive: Vec<HotFunction>,
    /// Threads by weight.
    pub threads: Vec<ThreadTotal>,
}

/// The sample profiles of `data` (of process `pid` if given).
pub fn cpu_profiles(data: &TraceData, pid: Option<u32>, top: usize) -> Vec<CpuProfile> {
    data.samples
        .iter()
        .filter(|p| pid.is_none_or(|x| x == p.pid))
        .map(|p| profile(data, p, top))
        .collect()
}

fn profile(data: &TraceData, p: &SampleProfile, top: usize) -> CpuProfile {
    let mut funcs: HashMap<String, (u64, u64)> = HashMap::new();
    let (mut samples, mut weight) = (0u64, 0u64);
    for s in &p.stacks {
        samples += s.samples;
        weight += s.weight;
        let mut seen: Vec<String> = Vec::new();
        for f in &s.frames {
            let name = f.display_name();
            if !seen.contains(&name) {
                funcs.entry(name.clone()).or_default().1 += s.weight;
                seen.push(name);
            }
        }
        if let Some(leaf) = s.frames.last() {
            funcs.entry(leaf.display_name()).or_default().0 += s.weight;
        }
    }
    let pct = |w: u64| {
        if weight == 0 {
            0.0
        } else {
            100.0 * w as f64 / weight as f64
        }
    };
    let all: Vec<HotFunction> = funcs
        .into_iter()
        .map(|(function, (s, i))| HotFunction {
            self_percent: pct(s),
            inclusive_percent: pct(i),
            function,
            self_weight: s,
            inclusive_weight: i,
        })
        .collect();
    let pick = |key: fn(&HotFunction) -> (u64, u64)| {
        let mut v: Vec<HotFunction> = all.iter().filter(|f| key(f).0 > 0).cloned().collect();
        v.sort_by(|a, b| key(b).cmp(&key(a)).then(a.function.cmp(&b.function)));
        v.truncate(top);
        v
    };
    let by_self = pick(|f| (f.self_weight, f.inclusive_weight));
    let by_inclusive = pick(|f| (f.inclusive_weight, f.self_weight));
    let info = data.processes.get(&p.pid);
    let thread_weight: u64 = p.threads.values().map(|t| t.weight).sum();
    let mut threads: Vec<ThreadTotal> = p
        .threads
        .iter()
        .map(|(&tid, t)| ThreadTotal {
            tid,
            name: info
                .and_then(|i| i.threads.get(&tid))
                .cloned()
                .unwrap_or_default(),
            samples: t.samples,
            weight: t.weight,
            percent: if thread_weight == 0 {
                0.0
            } else {
                100.0 * t.weight as f64 / thread_weight as f64
            },
            lost_overrun: t.lost_overrun,
            lost_dropped: t.lost_dropped,
        })
        .collect();
    threads.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.tid.cmp(&b.tid)));
    CpuProfile {
        pid: p.pid,
        cmdline: info.map(|i| i.cmdline.join(" ")).unwrap_or_default(),
        event: p.event.clone(),
        nanoseconds: p.tag == 0,
        samples,
        weight,
        unwind_errors: p.unwind_errors,
        by_self,
        by_inclusive,
        threads,
    }
}

fn weight_str(nanoseconds: bool, w: u64) -> String {
    if nanoseconds {
        human_ns(w)
    } else {
        w.to_string()
    }
}

/// Writes the profiles as text.
pub fn write_cpu(out: &mut impl Write, trace: &str, profiles: &[CpuProfile]) -> io::Result<()> {
    writeln!(out, "trace: {trace}")?;
    if profiles.is_empty() {
        writeln!(
            out,
            "\nno stack samples (record with --cpu-time, or request stacks with \
             heapprofd_request_stack)"
        )?;
    }
    for p in profiles {
        let ns = p.nanoseconds;
        writeln!(
            out,
            "\npid {} {}: {} {} samples, {}",
            p.pid,
            p.cmdline,
            p.samples,
            p.event,
            weight_str(ns, p.weight)
        )?;
        if p.unwind_errors > 0 {
            writeln!(
                out,
                "  {} of them not walked to the end (their stacks end in an ERROR frame)",
                p.unwind_errors
            )?;
        }
        writeln!(
            out,
            "  hot functions by self {}:",
            if ns { "CPU time" } else { "count" }
        )?;
        for f in &p.by_self {
            writeln!(
                out,
                "    {:>10} {:5.1}%  {:>10} {:5.1}% incl  {}",
                weight_str(ns, f.self_weight),
                f.self_percent,
                weight_str(ns, f.inclusive_weight),
                f.inclusive_percent,
                shorten(&f.function)
            )?;
        }
        writeln!(out, "  by inclusive:")?;
        for f in &p.by_inclusive {
            writeln!(
                out,
                "    {:>10} {:5.1}% incl  {:>10} {:5.1}% self  {}",
                weight_str(ns, f.inclusive_weight),
                f.inclusive_percent,
                weight_str(ns, f.self_weight),
                f.self_percent,
                shorten(&f.function)
            )?;
        }
        writeln!(out, "  threads:")?;
        for t in &p.threads {
            writeln!(
                out,
                "    tid {:<8} {:<16} {:>6} samples {:>10} {:5.1}%  lost {}  (timer overruns {}, in the time)",
                t.tid,
                t.name,
                t.samples,
                weight_str(ns, t.weight),
                t.percent,
                t.lost_dropped,
                t.lost_overrun
            )?;
        }
    }
    Ok(())
}
