//! `convert --cpu --pprof`: the CPU-time samples of a trace (`record
//! --cpu-time`) as a pprof CPU profile, as Go's are: sample types
//! `samples/count` and `cpu/nanoseconds` (the default), period type
//! `cpu/nanoseconds` with the sampling period per thread. Every sample
//! has `pid` and `tid` (numeric) and `thread` (the thread's name) labels,
//! so `pprof -tagfocus thread=worker` selects a thread.

use heapprofd_model::trace::TraceData;

use crate::pprof::{Builder, Label, Profile, main_executable, to_i64};

/// The CPU-time profile of `data` (of process `pid` if given); `None` when
/// the trace has no CPU-time samples.
pub fn to_pprof_cpu(data: &TraceData, pid: Option<u32>) -> Option<Profile> {
    let profiles: Vec<_> = data
        .samples
        .iter()
        .filter(|p| p.tag == 0 && pid.is_none_or(|x| x == p.pid))
        .collect();
    if profiles.is_empty() {
        return None;
    }
    let mut b = Builder::default();
    b.s("");
    for (t, u) in [("samples", "count"), ("cpu", "nanoseconds")] {
        let vt = crate::pprof::ValueType {
            r#type: b.s(t),
            unit: b.s(u),
        };
        b.p.sample_type.push(vt);
    }
    let (cpu, ns) = (b.s("cpu"), b.s("nanoseconds"));
    b.p.period_type = Some(crate::pprof::ValueType {
        r#type: cpu,
        unit: ns,
    });
    b.p.default_sample_type = cpu;
    let comment = b.s("converted by heapprofd-rs from Perfetto CPU-time samples");
    b.p.comment.push(comment);
    if let Some(exe) = main_executable(data, profiles[0].pid) {
        b.mapping(exe);
    }
    let (pid_key, tid_key, thread_key) = (b.s("pid"), b.s("tid"), b.s("thread"));
    for p in &profiles {
        let names = data.processes.get(&p.pid).map(|i| &i.threads);
        for s in &p.stacks {
            let name = names
                .and_then(|n| n.get(&s.tid))
                .filter(|n| !n.is_empty())
                .cloned()
                .unwrap_or_else(|| s.tid.to_string());
            let label = vec![
                Label {
                    key: pid_key,
                    num: i64::from(p.pid),
                    ..Default::default()
                },
                Label {
                    key: tid_key,
                    num: i64::from(s.tid),
                    ..Default::default()
                },
                Label {
                    key: thread_key,
                    str: b.s(&name),
                    ..Default::default()
                },
            ];
            b.sample(&s.frames, vec![to_i64(s.samples), to_i64(s.weight)], label);
        }
    }
    // The timer's period: a sample weighs it times one plus its signal's
    // overruns, so the smallest mean weight of a stack is the closest.
    b.p.period = profiles
        .iter()
        .flat_map(|p| p.stacks.iter())
        .filter_map(|s| s.weight.checked_div(s.samples))
        .min()
        .map_or(0, to_i64);
    Some(b.p)
}
