//! Karmarkar–Karp (largest differencing) into k parts of equal item count.
//!
//! Items are sorted by cost and dealt k at a time into partial solutions of k singleton parts.
//! The two partial solutions with the largest spread are merged repeatedly, pairing the
//! heaviest part of one with the lightest of the other, so every merge cancels as much
//! imbalance as it can and every part keeps the same number of items.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Partial {
    /// (sum, items), heaviest first.
    parts: Vec<(u64, Vec<usize>)>,
}

impl Partial {
    fn spread(&self) -> u64 {
        self.parts[0].0 - self.parts[self.parts.len() - 1].0
    }
}

struct BySpread(Partial, usize);

impl PartialEq for BySpread {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for BySpread {}
impl PartialOrd for BySpread {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for BySpread {
    // Larger spread first; ties by creation order, so the result is deterministic.
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.spread().cmp(&o.0.spread()).then(o.1.cmp(&self.1))
    }
}

/// Splits `costs` (length a multiple of k) into k parts of `costs.len() / k` items each,
/// balancing their sums. Returns item indices per part.
pub fn equal_size_partitions(costs: &[u64], k: usize) -> Vec<Vec<usize>> {
    let k = k.max(1);
    if costs.is_empty() {
        return vec![Vec::new(); k];
    }
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]).then(a.cmp(&b)));
    let mut heap = BinaryHeap::new();
    for (n, chunk) in order.chunks(k).enumerate() {
        let mut parts: Vec<(u64, Vec<usize>)> =
            chunk.iter().map(|&i| (costs[i], vec![i])).collect();
        parts.resize_with(k, || (0, Vec::new()));
        parts.sort_by_key(|p| std::cmp::Reverse(p.0));
        heap.push(BySpread(Partial { parts }, n));
    }
    let mut counter = heap.len();
    while heap.len() > 1 {
        let BySpread(a, _) = heap.pop().expect("two partials");
        let BySpread(b, _) = heap.pop().expect("two partials");
        let (mut big, small) = if a.parts.iter().map(|p| p.1.len()).sum::<usize>()
            >= b.parts.iter().map(|p| p.1.len()).sum::<usize>()
        {
            (a, b)
        } else {
            (b, a)
        };
        // Pair big's i-th heaviest with small's i-th lightest.
        for (i, (sum, mut items)) in small.parts.into_iter().rev().enumerate() {
            // Saturating: costs past u64 stay the largest, never wrap to small ones.
            big.parts[i].0 = big.parts[i].0.saturating_add(sum);
            big.parts[i].1.append(&mut items);
        }
        big.parts.sort_by_key(|p| std::cmp::Reverse(p.0));
        heap.push(BySpread(big, counter));
        counter += 1;
    }
    let BySpread(last, _) = heap.pop().expect("one partial");
    last.parts.into_iter().map(|(_, items)| items).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_have_equal_counts_and_close_sums() {
        let costs: Vec<u64> = (0..64).map(|i| (i * i * 37 % 1000) as u64 + 1).collect();
        let parts = equal_size_partitions(&costs, 4);
        assert!(parts.iter().all(|p| p.len() == 16));
        let sums: Vec<u64> = parts
            .iter()
            .map(|p| p.iter().map(|&i| costs[i]).sum())
            .collect();
        let (max, mean) = (
            *sums.iter().max().unwrap() as f64,
            sums.iter().sum::<u64>() as f64 / 4.0,
        );
        assert!(max / mean < 1.02, "{sums:?}");
        let mut all: Vec<usize> = parts.concat();
        all.sort();
        assert_eq!(all, (0..64).collect::<Vec<_>>());
    }
}
