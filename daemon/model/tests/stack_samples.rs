//! Stack samples through the trace: written as `PerfSample` packets (with
//! the named event's tag and the per-thread totals in extensions), read
//! back per (process, event), by stack and thread, with the losses of
//! threads that exited and the samples whose walk failed (`unwind_error`).

use heapprofd_model::messages::StackUnwindError;
use heapprofd_model::profile::{Interner, Profile, StackSample};
use heapprofd_model::trace::{ClockReadings, TraceWriter, read_trace};

#[test]
fn samples_round_trip_with_events_threads_and_losses() {
    let interner = Interner::new();
    let mut profile = Profile::new(&interner);
    let clocks = ClockReadings {
        boottime_ns: 2_000_000_000,
        monotonic_coarse_ns: 1_000_000_000,
        monotonic_ns: 1_000_000_000,
        realtime_ns: 0,
    };
    let mut writer = TraceWriter::new(Vec::new(), clocks).unwrap();
    profile.add_process(7, vec!["./app".into()], true);
    let main = interner.intern_frame(None, 0x10, Some("main"), None, None);
    let hot = interner.intern_frame(None, 0x20, Some("hot"), None, None);
    let cold = interner.intern_frame(None, 0x30, Some("cold"), None, None);
    let (hot_cs, cold_cs) = (
        profile.intern_callsite(&[main, hot]),
        profile.intern_callsite(&[main, cold]),
    );
    let at = |t: u64, tid: u32, tag: u64, period: u64, callsite| StackSample {
        timestamp_ns: 1_000_000_000 + t,
        cpu_time_ns: t,
        tid,
        tag,
        period,
        callsite,
        biased: false,
        unwind_error: None,
    };
    for i in 0..9 {
        profile.stack_sample(7, at(i, 70, 0, 10_000_000, hot_cs), 0, 0);
    }
    // A sample whose walk stopped early: written with its unwind_error.
    let failed = StackSample {
        unwind_error: Some(StackUnwindError::UnwindErrorMemoryInvalid),
        ..at(20, 71, 0, 20_000_000, cold_cs)
    };
    profile.stack_sample(7, failed, 1, 2);
    // A thread that exited with losses no sample carried.
    profile.sample_losses(7, 0, 72, 0, 3);
    profile.set_event_name(7, 5, "page-faults-ish".into());
    profile.stack_sample(7, at(30, 70, 5, 100, cold_cs), 0, 0);
    writer.dump(&mut profile, &interner, 1_000_000_100).unwrap();
    assert!(
        profile.processes().all(|p| p.samples.pending().is_empty()),
        "written samples are not kept"
    );
    let data = read_trace(writer.finish().unwrap().as_slice()).unwrap();
    assert!(data.warnings.is_empty(), "{:?}", data.warnings);
    assert_eq!(data.samples.len(), 2, "{:#?}", data.samples);
    let cpu = &data.samples[0];
    assert_eq!((cpu.pid, cpu.tag, cpu.event.as_str()), (7, 0, "cpu-time"));
    let names = |s: &heapprofd_model::trace::SampledStack| {
        s.frames
            .iter()
            .map(|f| f.display_name())
            .collect::<Vec<_>>()
    };
    assert_eq!(cpu.stacks.len(), 2);
    assert_eq!(names(&cpu.stacks[0]), ["main", "hot"]);
    assert_eq!(
        (
            cpu.stacks[0].tid,
            cpu.stacks[0].samples,
            cpu.stacks[0].weight
        ),
        (70, 9, 90_000_000)
    );
    assert_eq!(cpu.unwind_errors, 1, "the failed walk's unwind_error");
    assert_eq!(cpu.threads[&71].lost_overrun, 1);
    assert_eq!(cpu.threads[&71].lost_dropped, 2);
    assert_eq!(cpu.threads[&70].weight, 90_000_000);
    assert_eq!(
        (cpu.threads[&72].samples, cpu.threads[&72].lost_dropped),
        (0, 3)
    );
    let ev = &data.samples[1];
    assert_eq!((ev.tag, ev.event.as_str()), (5, "page-faults-ish"));
    assert_eq!(names(&ev.stacks[0]), ["main", "cold"]);
    assert_eq!(ev.stacks[0].weight, 100);
}
