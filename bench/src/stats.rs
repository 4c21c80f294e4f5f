//! Samples and their order statistics: every figure the harness prints is a
//! median with a spread (p10–p90), or a tail percentile, never a mean.
#![forbid(unsafe_code)]

use std::time::Duration;

/// A set of measurements of one quantity, in any unit (µs, check-ins/s, …).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<f64>,
    sorted: bool,
}

impl Samples {
    /// No measurements yet.
    #[must_use]
    pub fn new() -> Self {
        Samples::default()
    }

    /// Adds one measurement.
    pub fn push(&mut self, value: f64) {
        self.values.push(value);
        self.sorted = false;
    }

    /// Adds a duration, in microseconds.
    pub fn push_micros(&mut self, d: Duration) {
        self.push(d.as_secs_f64() * 1e6);
    }

    /// Adds every measurement of `other`.
    pub fn extend(&mut self, other: &Samples) {
        self.values.extend_from_slice(&other.values);
        self.sorted = false;
    }

    /// How many measurements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The `p`-th percentile (0–100) by nearest rank: always one of the measured
    /// values, never an interpolation. `NaN` when there are no samples.
    pub fn percentile(&mut self, p: f64) -> f64 {
        if self.values.is_empty() {
            return f64::NAN;
        }
        if !self.sorted {
            self.values.sort_by(f64::total_cmp);
            self.sorted = true;
        }
        let n = self.values.len();
        // The epsilon keeps 99.9 % of 1000 at rank 999 despite binary fractions.
        let rank = (p * n as f64 / 100.0 - 1e-9).ceil() as usize;
        self.values[rank.clamp(1, n) - 1]
    }

    /// The median (nearest rank).
    pub fn median(&mut self) -> f64 {
        self.percentile(50.0)
    }

    /// The smallest measurement.
    pub fn min(&mut self) -> f64 {
        self.percentile(0.0)
    }

    /// The largest measurement.
    pub fn max(&mut self) -> f64 {
        self.percentile(100.0)
    }

    /// `median (p10–p90)` with `digits` decimals, for a table cell.
    pub fn summary(&mut self, digits: usize) -> String {
        format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            self.median(),
            self.percentile(10.0),
            self.percentile(90.0),
        )
    }
}

/// Formats a count per second with thousands separators, e.g. `21 345`.
#[must_use]
pub fn thousands(value: f64) -> String {
    let whole = value.round().max(0.0) as u64;
    let digits = whole.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('\u{202f}');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(values: &[f64]) -> Samples {
        let mut s = Samples::new();
        for v in values {
            s.push(*v);
        }
        s
    }

    #[test]
    fn percentiles_are_nearest_rank_values_in_any_insertion_order() {
        let mut s = of(&[5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 9.0, 8.0, 7.0, 6.0]);
        assert_eq!(s.median(), 5.0);
        assert_eq!(s.percentile(10.0), 1.0);
        assert_eq!(s.percentile(90.0), 9.0);
        assert_eq!(s.percentile(99.0), 10.0);
        assert_eq!(s.min(), 1.0);
        assert_eq!(s.max(), 10.0);
    }

    #[test]
    fn a_tail_percentile_of_many_samples_lands_in_the_tail() {
        let mut s = Samples::new();
        for i in 1..=1000 {
            s.push(f64::from(i));
        }
        assert_eq!(s.percentile(99.9), 999.0);
        assert_eq!(s.percentile(99.0), 990.0);
        assert_eq!(s.median(), 500.0);
    }

    #[test]
    fn adding_after_reading_keeps_the_order_statistics_right() {
        let mut s = of(&[3.0, 1.0]);
        assert_eq!(s.max(), 3.0);
        s.push(0.5);
        assert_eq!(s.min(), 0.5);
        s.extend(&of(&[7.0]));
        assert_eq!(s.max(), 7.0);
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn no_samples_give_nan_not_a_panic() {
        let mut s = Samples::new();
        assert!(s.is_empty());
        assert!(s.median().is_nan());
    }

    #[test]
    fn the_summary_cell_is_median_then_p10_to_p90() {
        let mut s = of(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(s.summary(1), "5.0 (1.0–9.0)");
    }

    #[test]
    fn durations_are_recorded_in_microseconds() {
        let mut s = Samples::new();
        s.push_micros(Duration::from_millis(2));
        assert_eq!(s.median(), 2000.0);
    }

    #[test]
    fn large_rates_get_thin_space_separators() {
        assert_eq!(thousands(21345.4), "21\u{202f}345");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_000_000.0), "1\u{202f}000\u{202f}000");
    }
}
