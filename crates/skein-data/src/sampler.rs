//! Which row comes next: epoch after epoch, each a permutation of the rows derived from the
//! seed and the epoch number alone. The whole state is one number, the rows drawn so far, so a
//! checkpoint stores it and a resumed run draws exactly what the uninterrupted one would have.

use skein_tasks::TaskRng;

#[derive(Debug, Clone)]
pub struct Sampler {
    len: usize,
    seed: u64,
    shuffle: bool,
    drawn: u64,
    /// The permutation of `order_epoch`, computed when an epoch starts.
    order: Vec<usize>,
    order_epoch: Option<u64>,
}

impl Sampler {
    /// A sampler over `len` rows (`len` > 0; an empty split never gets this far).
    pub fn new(len: usize, seed: u64, shuffle: bool) -> Self {
        Sampler {
            len: len.max(1),
            seed,
            shuffle,
            drawn: 0,
            order: Vec::new(),
            order_epoch: None,
        }
    }

    /// Rows drawn so far: the whole state a checkpoint needs.
    pub fn position(&self) -> u64 {
        self.drawn
    }

    /// Continues from `position` (a value of [`position`](Self::position)).
    pub fn seek(&mut self, position: u64) {
        self.drawn = position;
    }

    /// The epoch the next row belongs to (0-based).
    pub fn epoch(&self) -> u64 {
        self.drawn / self.len as u64
    }

    /// The index of the next row.
    pub fn next_index(&mut self) -> usize {
        let epoch = self.epoch();
        let i = (self.drawn % self.len as u64) as usize;
        self.drawn += 1;
        if !self.shuffle {
            return i;
        }
        if self.order_epoch != Some(epoch) {
            self.order = permutation(self.len, self.seed, epoch);
            self.order_epoch = Some(epoch);
        }
        self.order[i]
    }
}

/// Fisher–Yates over 0..len, from a generator seeded by (seed, epoch).
fn permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut mix = TaskRng::new(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut rng = TaskRng::new(mix.next_u64());
    let mut order: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_is_a_permutation_and_epochs_differ() {
        let mut s = Sampler::new(50, 3, true);
        let e0: Vec<_> = (0..50).map(|_| s.next_index()).collect();
        let e1: Vec<_> = (0..50).map(|_| s.next_index()).collect();
        for e in [&e0, &e1] {
            let mut sorted = e.clone();
            sorted.sort();
            assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        }
        assert_ne!(e0, e1, "each epoch has its own order");
        assert_ne!(e0, (0..50).collect::<Vec<_>>(), "shuffled");
        let mut plain = Sampler::new(3, 3, false);
        let seq: Vec<_> = (0..7).map(|_| plain.next_index()).collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn same_seed_same_stream_and_a_seek_resumes_it() {
        let draw = |s: &mut Sampler, n| (0..n).map(|_| s.next_index()).collect::<Vec<_>>();
        let mut a = Sampler::new(17, 9, true);
        let full = draw(&mut a, 60);
        assert_eq!(draw(&mut Sampler::new(17, 9, true), 60), full);
        assert_ne!(
            draw(&mut Sampler::new(17, 10, true), 60),
            full,
            "the seed matters"
        );
        for cut in [0, 5, 17, 34, 41] {
            let mut first = Sampler::new(17, 9, true);
            let head = draw(&mut first, cut);
            let mut resumed = Sampler::new(17, 9, true);
            resumed.seek(first.position());
            let tail = draw(&mut resumed, 60 - cut);
            assert_eq!([head, tail].concat(), full, "resumed at {cut}");
        }
    }
}
