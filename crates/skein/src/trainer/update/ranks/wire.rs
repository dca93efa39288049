//! A compact binary encoding of training rows, for sending a step's rows to other ranks.
//! Little-endian, length-prefixed vectors; floats travel as their bits, so a row arrives
//! exactly as it left (JSON would round-trip them too, at several times the size and time).

use crate::trainer::batch::TrainRow;
use anyhow::{bail, Result};
use skein_plan::KeptSets;

pub fn encode_rows(rows: &[TrainRow]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u64(rows.len() as u64);
    for r in rows {
        w.u32s(&r.tokens);
        w.u64(r.prompt_len as u64);
        w.bytes(&r.loss_mask);
        for v in [
            &r.behavior_logp,
            &r.advantages,
            &r.old_logp,
            &r.ref_logp,
            &r.old_values,
            &r.returns,
        ] {
            w.f32s(v);
        }
        w.u64(r.versions.len() as u64);
        for &v in &r.versions {
            w.u64(v);
        }
        w.f32s(&r.importance_weights);
        w.u64(r.loss_weight.to_bits());
        w.bytes(&r.value_mask);
        w.u64(r.value_loss_weight.to_bits());
        w.u32s(&r.kept.ends);
        w.u32s(&r.kept.ids);
    }
    w.0
}

pub fn decode_rows(bytes: &[u8]) -> Result<Vec<TrainRow>> {
    let mut r = Reader { bytes, at: 0 };
    let n = r.len()?;
    let mut rows = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        let tokens = r.u32s()?;
        let prompt_len = r.u64()? as usize;
        let loss_mask = r.bytes()?.to_vec();
        let mut floats = [(); 6].map(|_| Vec::new());
        for f in &mut floats {
            *f = r.f32s()?;
        }
        let [behavior_logp, advantages, old_logp, ref_logp, old_values, returns] = floats;
        let versions = (0..r.len()?).map(|_| r.u64()).collect::<Result<_>>()?;
        let importance_weights = r.f32s()?;
        let loss_weight = f64::from_bits(r.u64()?);
        let value_mask = r.bytes()?.to_vec();
        let value_loss_weight = f64::from_bits(r.u64()?);
        let kept = KeptSets {
            ends: r.u32s()?,
            ids: r.u32s()?,
        };
        if kept
            .ends
            .last()
            .is_some_and(|&end| end as usize != kept.ids.len())
        {
            bail!(
                "a row's kept sets end at id {:?} of {}",
                kept.ends.last(),
                kept.ids.len()
            );
        }
        rows.push(TrainRow {
            tokens,
            prompt_len,
            loss_mask,
            behavior_logp,
            advantages,
            old_logp,
            ref_logp,
            old_values,
            returns,
            versions,
            importance_weights,
            loss_weight,
            value_mask,
            value_loss_weight,
            kept,
        });
    }
    if r.at != bytes.len() {
        bail!("{} bytes left over after {n} rows", bytes.len() - r.at);
    }
    Ok(rows)
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
    }
    fn u32s(&mut self, v: &[u32]) {
        self.u64(v.len() as u64);
        v.iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn f32s(&mut self, v: &[f32]) {
        self.u64(v.len() as u64);
        v.iter()
            .for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!("rows truncated at byte {} (wanted {n} more)", self.at);
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into()?))
    }
    fn len(&mut self) -> Result<usize> {
        Ok(self.u64()? as usize)
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
    fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.len()?;
        let b = self.take(n.saturating_mul(4))?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.len()?;
        let b = self.take(n.saturating_mul(4))?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seed: u32) -> TrainRow {
        let f = |k: u32| (0..3).map(|i| (seed * 10 + k + i) as f32 * -0.37).collect();
        TrainRow {
            tokens: vec![seed, 5, 9, 2],
            prompt_len: 1,
            loss_mask: vec![1, 0, 1],
            behavior_logp: f(1),
            advantages: f(2),
            old_logp: f(3),
            ref_logp: vec![],
            old_values: f(5),
            returns: f(6),
            versions: vec![7, 7, u64::MAX],
            importance_weights: vec![f32::NAN, 1.0, 0.5],
            loss_weight: 1.0 / 3.0,
            value_mask: vec![1, 0, 0],
            value_loss_weight: 0.1,
            kept: KeptSets {
                ends: vec![2, 2, 3],
                ids: vec![seed, 4, 9],
            },
        }
    }

    #[test]
    fn rows_round_trip_bit_for_bit() {
        let rows = vec![row(1), row(2), TrainRow::default()];
        let back = decode_rows(&encode_rows(&rows)).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in rows.iter().zip(&back) {
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert_eq!(a.loss_weight.to_bits(), b.loss_weight.to_bits());
            assert_eq!(a.importance_weights[..].len(), b.importance_weights.len());
        }
        assert!(back[0].importance_weights[0].is_nan());
    }

    #[test]
    fn truncated_or_padded_bytes_are_errors() {
        let bytes = encode_rows(&[row(1)]);
        let err = decode_rows(&bytes[..bytes.len() - 3]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_rows(&longer).is_err());
    }
}
