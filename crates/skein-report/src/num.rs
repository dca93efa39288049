//! Short, readable numbers for tick labels and log lines.

/// `v` in at most about six characters: integers stay whole, small and huge values switch to
/// scientific notation, everything else keeps three significant digits.
pub fn compact(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        format!("{v}")
    } else if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else if v.fract() == 0.0 || a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        // Three significant digits below 1: 0.123, 0.0123.
        let digits = (2 - a.log10().floor() as i32).clamp(3, 6) as usize;
        let s = format!("{v:.digits$}");
        s.trim_end_matches('0').to_string()
    }
}

/// A tick label for `v` on an axis whose ticks are `step` apart: enough decimals to tell
/// neighbouring ticks apart, no more.
pub fn tick(v: f64, step: f64) -> String {
    let a = v.abs().max(step.abs());
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let decimals = if step > 0.0 && step.is_finite() {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        3
    };
    let s = format!("{v:.decimals$}");
    // "-0" and "-0.00" read as noise.
    if s.trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        s.trim_start_matches('-').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_keeps_a_few_significant_digits() {
        assert_eq!(compact(812.0), "812");
        assert_eq!(compact(0.53), "0.53");
        assert_eq!(compact(0.012345), "0.0123");
        assert_eq!(compact(4.567), "4.57");
        assert_eq!(compact(2.5e-5), "2.5e-5");
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(f64::NAN), "NaN");
    }

    #[test]
    fn tick_labels_have_the_decimals_their_spacing_needs() {
        assert_eq!(tick(0.25, 0.05), "0.25");
        assert_eq!(tick(200.0, 50.0), "200");
        assert_eq!(tick(-0.0001, 0.1), "0.0");
        assert_eq!(tick(3e-5, 1e-5), "3.0e-5");
    }
}
