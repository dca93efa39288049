//! The sampler's kept sets (top-k/top-p) of a micro-batch's response positions, laid out for
//! the LM head: where a token was drawn from a truncated distribution, its log-prob (and
//! entropy) is computed over the very ids the engine kept, renormalised, so π, π_old and π_ref
//! are of the distribution the behavior log-prob is of.

use tch::{Device, Kind, Tensor};

/// Kept sets by response position, in the order of `MicroBatch::response_index`.
pub struct KeptPositions {
    /// Per position, where its ids end among the pairs (host side, to slice a chunk's).
    ends: Vec<i64>,
    /// [positions] bool: the position has a kept set (else: the whole vocabulary).
    restricted: Tensor,
    /// [pairs] int64: each kept id's position, and the id.
    position: Tensor,
    id: Tensor,
}

impl KeptPositions {
    /// From each response position's kept ids (empty: the whole vocabulary); None when no
    /// position has a set, so untruncated sampling costs nothing here.
    pub fn new<'a>(sets: impl Iterator<Item = &'a [u32]>, device: Device) -> Option<Self> {
        let (mut ends, mut restricted, mut position, mut id) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (p, set) in sets.enumerate() {
            restricted.push(!set.is_empty());
            position.extend(std::iter::repeat_n(p as i64, set.len()));
            id.extend(set.iter().map(|&x| x as i64));
            ends.push(id.len() as i64);
        }
        if id.is_empty() {
            return None;
        }
        let on = |v: &[i64]| Tensor::from_slice(v).to_device(device);
        Some(KeptPositions {
            ends,
            restricted: Tensor::from_slice(&restricted).to_device(device),
            position: on(&position),
            id: on(&id),
        })
    }

    /// The same sets, sharing the tensors.
    pub fn shallow_clone(&self) -> Self {
        KeptPositions {
            ends: self.ends.clone(),
            restricted: self.restricted.shallow_clone(),
            position: self.position.shallow_clone(),
            id: self.id.shallow_clone(),
        }
    }

    /// [len, vocab] bool of the ids allowed at positions `start..start + len` (every id where
    /// a position has no set); None when none of them has one.
    pub fn allowed(&self, start: i64, len: i64, vocab: i64) -> Option<Tensor> {
        let first = if start == 0 {
            0
        } else {
            self.ends[start as usize - 1]
        };
        let last = self.ends[(start + len) as usize - 1];
        if last == first {
            return None;
        }
        let restricted = self.restricted.narrow(0, start, len);
        let mut allowed = restricted
            .logical_not()
            .unsqueeze(1)
            .expand([len, vocab], false)
            .contiguous();
        let rows = self.position.narrow(0, first, last - first) - start;
        let ids = self.id.narrow(0, first, last - first);
        let yes = Tensor::ones([], (Kind::Bool, allowed.device()));
        let _ = allowed.index_put_(&[Some(rows), Some(ids)], &yes, false);
        Some(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_allows_its_positions_kept_ids_and_everything_elsewhere() {
        let sets: [&[u32]; 4] = [&[], &[1, 3], &[], &[0]];
        let kept = KeptPositions::new(sets.into_iter(), Device::Cpu).unwrap();
        let allowed = kept.allowed(1, 3, 4).unwrap();
        let rows: Vec<Vec<bool>> = (0..3)
            .map(|r| Vec::<bool>::try_from(allowed.get(r)).unwrap())
            .collect();
        assert_eq!(
            rows,
            [
                vec![false, true, false, true],
                vec![true; 4],
                vec![true, false, false, false]
            ]
        );
        assert!(kept.allowed(0, 1, 4).is_none());
        assert!(KeptPositions::new([&[][..], &[]].into_iter(), Device::Cpu).is_none());
    }
}
