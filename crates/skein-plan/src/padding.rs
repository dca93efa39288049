//! Padding rows: synthetic, minimal (1 prompt + 1 response token), inert (loss mask 0,
//! advantage 0, weight 0), each with a fresh id that no real row or group can have.

/// The multiple the row count must reach: lcm of the dp size and the mini-batch sizes.
pub fn padding_multiple(
    dp_size: usize,
    actor_mini_batch: usize,
    critic_mini_batch: Option<usize>,
) -> usize {
    let mut m = lcm(dp_size.max(1), actor_mini_batch.max(1));
    if let Some(c) = critic_mini_batch {
        m = lcm(m, c.max(1));
    }
    m
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    a / gcd(a, b) * b
}

/// The id of one padding row, unique within a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PaddingId(pub u64);

impl PaddingId {
    /// `pad-N`: real trajectory and group ids are validated never to start with `pad-`.
    pub fn name(&self) -> String {
        format!("pad-{}", self.0)
    }
}

/// Hands out padding ids that are never reused.
#[derive(Debug, Default)]
pub struct PaddingIds(u64);

impl PaddingIds {
    pub fn next_id(&mut self) -> PaddingId {
        self.0 += 1;
        PaddingId(self.0)
    }
}

/// Tokens a padding row costs: one prompt and one response token.
pub const PADDING_ROW_TOKENS: usize = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multiple_is_the_lcm_of_every_constraint() {
        assert_eq!(padding_multiple(2, 15, None), 30);
        assert_eq!(padding_multiple(4, 6, Some(10)), 60);
        assert_eq!(padding_multiple(8, 8, None), 8);
        let mut ids = PaddingIds::default();
        let (a, b) = (ids.next_id(), ids.next_id());
        assert_ne!(a, b);
    }
}
