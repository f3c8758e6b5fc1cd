//! Durations of the bring-up phases, for the boot report.
//!
//! Times are CLOCK_MONOTONIC relative to the start of /init; the start itself is also recorded
//! on CLOCK_BOOTTIME, which is the kernel's share of the boot.

use hawser_attestation::report::PhaseTiming;

use crate::platform::console::{boottime_seconds, monotonic_seconds};

/// Records named phases.
#[derive(Debug, Clone)]
pub struct PhaseTimer {
    origin_s: f64,
    boottime_at_origin_s: f64,
    phases: Vec<PhaseTiming>,
}

impl Default for PhaseTimer {
    fn default() -> Self {
        Self::start()
    }
}

impl PhaseTimer {
    /// Starts the clock: call first thing in /init.
    pub fn start() -> Self {
        Self {
            origin_s: monotonic_seconds(),
            boottime_at_origin_s: boottime_seconds(),
            phases: Vec::new(),
        }
    }

    /// Milliseconds since [`PhaseTimer::start`].
    pub fn elapsed_ms(&self) -> f64 {
        (monotonic_seconds() - self.origin_s) * 1e3
    }

    /// CLOCK_BOOTTIME at start, in milliseconds.
    pub fn started_at_boottime_ms(&self) -> f64 {
        self.boottime_at_origin_s * 1e3
    }

    /// Runs `f` as phase `name`.
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let start_ms = self.elapsed_ms();
        let output = f();
        self.record(name, start_ms);
        output
    }

    /// Records phase `name` from `start_ms` until now.
    pub fn record(&mut self, name: &str, start_ms: f64) {
        let duration_ms = self.elapsed_ms() - start_ms;
        tracing::debug!("phase {name} took {duration_ms:.3} ms");
        self.phases.push(PhaseTiming {
            name: name.to_owned(),
            start_ms: round_us(start_ms),
            duration_ms: round_us(duration_ms),
        });
    }

    /// Records phase `name` that ran from `start_ms` to `end_ms` (on another thread, alongside
    /// other phases), in start order among the phases.
    pub fn record_span(&mut self, name: &str, start_ms: f64, end_ms: f64) {
        let phase = PhaseTiming {
            name: name.to_owned(),
            start_ms: round_us(start_ms),
            duration_ms: round_us(end_ms - start_ms),
        };
        let at = self
            .phases
            .iter()
            .position(|p| p.start_ms > phase.start_ms)
            .unwrap_or(self.phases.len());
        self.phases.insert(at, phase);
    }

    /// The phases recorded so far, in order.
    pub fn phases(&self) -> &[PhaseTiming] {
        &self.phases
    }
}

/// Milliseconds rounded to microseconds: the report stays short and readable.
fn round_us(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_are_recorded_in_order_with_plausible_durations() {
        let mut timer = PhaseTimer::start();
        timer.time("first", || std::thread::sleep(Duration::from_millis(20)));
        let answer = timer.time("second", || 42);
        assert_eq!(answer, 42);
        let phases = timer.phases();
        assert_eq!(phases.len(), 2);
        assert_eq!(
            (phases[0].name.as_str(), phases[1].name.as_str()),
            ("first", "second")
        );
        assert!(phases[0].duration_ms >= 20.0 && phases[0].duration_ms < 2000.0);
        assert!(phases[1].start_ms >= phases[0].start_ms + phases[0].duration_ms);
        assert!(timer.started_at_boottime_ms() > 0.0);
    }
}
