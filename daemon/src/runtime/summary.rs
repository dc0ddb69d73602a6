//! What `record` prints at the end: the model's per-process summary data
//! with the trace file, as text.

use std::path::{Path, PathBuf};

use heapprofd_model::summary::{ProcessSummary, ProcessWarning};

use heapprofd_report::human_bytes;
use heapprofd_report::units::human_count;

/// What `record` prints at the end.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The trace file.
    pub output_path: PathBuf,
    /// Bytes written to it.
    pub trace_bytes: u64,
    /// Every process the daemon heard of (profiled, or said to run
    /// unprofiled: `not_profiled`, or not attached: `not_attached`).
    pub processes: Vec<ProcessSummary>,
    /// Sampling interval.
    pub interval: u64,
    /// The trace holds each heap at its peak (`--dump-at-max`), not at
    /// the end: the summary says both.
    pub dump_at_max: bool,
    /// The summary was already shown (record keeps waiting for CMD).
    pub already_printed: bool,
}

/// A warning of the summary, with what to do about it.
fn warning_text(w: &ProcessWarning) -> String {
    match w {
        ProcessWarning::SamplesDropped(n) => format!(
            "{n} samples dropped because the ring buffer was full \
             (use a larger --shmem-size or a larger --interval)"
        ),
        ProcessWarning::BlockTimeout => {
            "the program waited longer than the --block-client timeout; its profile ended early"
                .into()
        }
        ProcessWarning::BufferCorrupt => {
            "its ring buffer was corrupt; some records were lost".into()
        }
        ProcessWarning::HeapLimit(n) => format!(
            "it named more than {} heaps; {n} records of the others were dropped \
             (flagged hit_guardrail in the trace)",
            heapprofd_model::profile::MAX_HEAPS_PER_PROCESS
        ),
        ProcessWarning::ContextOverflow(n) => format!(
            "the client had no room for {n} user contexts (over 4095 alive, or over their size \
             limits); their samples are under heapprofd.context=overflow"
        ),
        ProcessWarning::IntervalRaised {
            samples,
            from,
            to,
            thinned,
        } => format!(
            "{samples} samples were taken at a raised interval (up to {}, from {}){} while the \
             profiler fell behind; the totals are still estimates of the whole run, with more \
             variance (--fixed-interval keeps {} and makes the program wait instead)",
            human_bytes(*to),
            human_bytes(*from),
            if *thinned > 0 {
                format!(" and {thinned} thinned away")
            } else {
                String::new()
            },
            human_bytes(*from)
        ),
        ProcessWarning::UnwindErrors { errors, samples } => {
            format!("{errors} of {samples} stacks could not be fully unwound")
        }
        ProcessWarning::RejectedConcurrent => {
            "another profile samples it differently; not profiled here \
             (flagged rejected_concurrent in the trace)"
                .into()
        }
        ProcessWarning::Guardrail => "it hit a guardrail of the profile \
             (max_heapprofd_cpu_secs or max_heapprofd_memory_kb); its profile ended there \
             (flagged hit_guardrail in the trace)"
            .into(),
        ProcessWarning::ThenUnprofiled(why) => {
            format!("after that it ran unprofiled: {}", why.describe())
        }
    }
}

impl Summary {
    /// Human-readable text for the end of `record`; the first line follows
    /// the logger's `heapprofd-rs: `.
    pub fn render(&self, output: &Path) -> String {
        let mut s = String::new();
        let profiled: Vec<&ProcessSummary> =
            self.processes.iter().filter(|p| p.profiled()).collect();
        let total = |f: fn(&ProcessSummary) -> u64| profiled.iter().map(|p| f(p)).sum::<u64>();
        let samples = total(|p| p.samples);
        let (alloc, freed) = (total(|p| p.allocated), total(|p| p.freed));
        let estimated: f64 = profiled.iter().map(|p| p.estimated_allocations).sum();
        // Exact when every heap of every process was sampled at 1 (custom
        // heaps may have their own intervals).
        let exact = if profiled.is_empty() {
            self.interval == 1
        } else {
            profiled.iter().all(|p| p.exact)
        };
        let counted = if exact {
            format!(
                "{} allocations (every allocation recorded)",
                human_count(samples)
            )
        } else if self.interval == 1 {
            format!(
                "{} samples, ~{} allocations est.",
                human_count(samples),
                human_count(estimated.round() as u64)
            )
        } else {
            format!(
                "{} samples (1 per {} on average), ~{} allocations est.",
                human_count(samples),
                human_bytes(self.interval),
                human_count(estimated.round() as u64)
            )
        };
        s.push_str(&format!(
            "{} process{}, {counted}: allocated {}, freed {}, unreleased {}{}\n",
            profiled.len(),
            if profiled.len() == 1 { "" } else { "es" },
            human_bytes(alloc),
            human_bytes(freed),
            human_bytes(alloc.saturating_sub(freed)),
            if self.dump_at_max { " at the end" } else { "" },
        ));
        if self.dump_at_max {
            s.push_str(&format!(
                "the trace holds the heap at its peak (--dump-at-max): {} unreleased at the \
                 peak, what `report` shows\n",
                human_bytes(total(|p| p.peak_unreleased)),
            ));
        }
        for p in &self.processes {
            let cmd = if p.cmdline.is_empty() {
                "?".to_string()
            } else {
                p.cmdline.join(" ")
            };
            let cmd: String = cmd.chars().take(70).collect();
            if let Some(why) = p.not_profiled {
                s.push_str(&format!(
                    "  pid {:<7} not profiled: {}  {cmd}\n",
                    p.pid,
                    why.describe()
                ));
                continue;
            }
            if let Some(why) = &p.not_attached {
                s.push_str(&format!("  pid {:<7} not profiled: {why}  {cmd}\n", p.pid));
                continue;
            }
            let what = if p.exact { "allocations" } else { "samples" };
            s.push_str(&format!(
                "  pid {:<7} {:>8} {what:<11}  allocated {:>10}  unreleased {:>10}  {cmd}\n",
                p.pid,
                p.samples,
                human_bytes(p.allocated),
                human_bytes(p.allocated.saturating_sub(p.freed)),
            ));
            if self.dump_at_max {
                let when = p.peak_after_ns.map_or(String::new(), |ns| {
                    format!(", {:.2} s after its first allocation", ns as f64 / 1e9)
                });
                s.push_str(&format!(
                    "    peak (in the trace): {} unreleased{when}\n",
                    human_bytes(p.peak_unreleased)
                ));
            }
            for w in &p.warnings {
                s.push_str(&format!("    warning: {}\n", warning_text(w)));
            }
        }
        if profiled.is_empty() && self.processes.is_empty() {
            s.push_str(
                "  no process connected: did the command allocate at all, and is it dynamically \
                 linked (static binaries cannot be preloaded)?\n",
            );
        }
        s.push_str(&format!(
            "trace: {} ({}). Open it in https://ui.perfetto.dev or run: heapprofd-rs report {}",
            output.display(),
            human_bytes(self.trace_bytes),
            output.display()
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_interval_names_the_samples_thinned_away() {
        let text = |thinned| {
            warning_text(&ProcessWarning::IntervalRaised {
                samples: 5,
                from: 4096,
                to: 4096 << 10,
                thinned,
            })
        };
        let head = "5 samples were taken at a raised interval (up to 4.00 MiB, from 4.00 KiB)";
        assert!(
            text(0).starts_with(&format!("{head} while the profiler")),
            "{}",
            text(0)
        );
        assert!(
            text(9).starts_with(&format!("{head} and 9 thinned away while the profiler")),
            "{}",
            text(9)
        );
    }
}
