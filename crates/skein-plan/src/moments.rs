//! Mean and standard deviation, computed one way wherever skein centres, scales or whitens
//! advantages (group baselines, REINFORCE++'s batch whitening, GAE's whitening over loss
//! tokens) and reports their spread.
//!
//! The convention: the **sample** standard deviation, the sum of squared deviations divided
//! by n − 1 (Bessel's correction), which is what `torch.std` computes by default and so what
//! GRPO's group normalisation is usually written with. A set of fewer than two values has no
//! spread: its standard deviation is 0. Whitening divides by `std + eps`, so a set of equal
//! values whitens to 0 instead of dividing by zero.

/// Count, mean and sample standard deviation of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub n: usize,
    pub mean: f64,
    pub std: f64,
}

impl Moments {
    /// The moments of `values` (two passes: the mean, then the deviations from it). An empty
    /// set has n = 0, mean 0 and std 0.
    pub fn of(values: impl Iterator<Item = f64> + Clone) -> Moments {
        let n = values.clone().count();
        let mean = values.clone().sum::<f64>() / n.max(1) as f64;
        let squares = values.map(|v| (v - mean).powi(2)).sum::<f64>();
        Moments {
            n,
            mean,
            std: if n > 1 {
                (squares / (n - 1) as f64).sqrt()
            } else {
                0.0
            },
        }
    }

    /// `v` whitened: (v − mean) / (std + eps).
    pub fn whiten(&self, v: f64, eps: f64) -> f64 {
        (v - self.mean) / (self.std + eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sample standard deviation: (0, 2, 4) has squared deviations 8 over n − 1 = 2, so 2; one
    /// value has none; equal values whiten to 0.
    #[test]
    fn the_standard_deviation_is_the_sample_one() {
        let m = Moments::of([0.0, 2.0, 4.0].into_iter());
        assert_eq!((m.n, m.mean, m.std), (3, 2.0, 2.0));
        assert_eq!(Moments::of([5.0].into_iter()).std, 0.0);
        let empty = Moments::of(std::iter::empty());
        assert_eq!((empty.n, empty.mean, empty.std), (0, 0.0, 0.0));
        let equal = Moments::of([3.0; 4].into_iter());
        assert_eq!(equal.whiten(3.0, 1e-6), 0.0);
        assert!((m.whiten(4.0, 0.0) - 1.0).abs() < 1e-15);
    }
}
