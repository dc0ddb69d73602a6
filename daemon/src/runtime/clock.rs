//! Reading the trace's clocks together (the model takes the readings; only
//! the runtime makes system calls).

use heapprofd_model::trace::ClockReadings;
use nix::time::{ClockId, clock_gettime};

/// Reads BOOTTIME, MONOTONIC_COARSE, MONOTONIC and REALTIME now (a clock
/// that cannot be read gives 0).
pub fn read_clocks() -> ClockReadings {
    let read = |id: ClockId| {
        clock_gettime(id).map_or(0, |ts| {
            (ts.tv_sec() as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec() as u64)
        })
    };
    ClockReadings {
        boottime_ns: read(ClockId::CLOCK_BOOTTIME),
        monotonic_coarse_ns: read(ClockId::CLOCK_MONOTONIC_COARSE),
        monotonic_ns: read(ClockId::CLOCK_MONOTONIC),
        realtime_ns: read(ClockId::CLOCK_REALTIME),
    }
}
