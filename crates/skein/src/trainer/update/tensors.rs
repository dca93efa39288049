//! Rows → padded tensors for one micro-batch, and per-token log-probs of the targets.
//!
//! A row is prompt ++ response token ids, exactly as sampled. Position t of the logits predicts
//! token t+1, so every per-token tensor here is [rows, T-1] and aligned with `input[:, 1:]`.

use crate::model::Transformer;
use crate::trainer::batch::TrainRow;
use tch::{Device, Kind, Tensor};

pub struct MicroBatch {
    pub input: Tensor,
    pub targets: Tensor,
    pub mask: Tensor,
    pub weights: Tensor,
    pub advantages: Tensor,
    pub behavior_logp: Tensor,
    pub old_logp: Tensor,
    pub ref_logp: Tensor,
    pub old_values: Tensor,
    pub returns: Tensor,
    pub is_weight: Tensor,
}

impl MicroBatch {
    pub fn new(rows: &[&TrainRow], device: Device) -> Self {
        let b = rows.len();
        let t = rows
            .iter()
            .map(|r| r.tokens.len())
            .max()
            .unwrap_or(2)
            .max(2);
        let mut input = vec![0i64; b * t];
        let n = b * (t - 1);
        let (mut mask, mut weights, mut adv, mut blp) =
            (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        let (mut old, mut reference) = (vec![0f32; n], vec![0f32; n]);
        let (mut values, mut returns) = (vec![0f32; n], vec![0f32; n]);
        let mut is_weight = vec![1f32; n];
        for (i, r) in rows.iter().enumerate() {
            for (j, &tok) in r.tokens.iter().enumerate() {
                input[i * t + j] = tok as i64;
            }
            for (k, &m) in r.loss_mask.iter().enumerate() {
                // Response token k sits at position prompt_len + k, predicted from the one before.
                let at = i * (t - 1) + r.prompt_len + k - 1;
                let m = m as f32;
                mask[at] = m;
                weights[at] = m * r.weight as f32;
                adv[at] = r.advantages[k];
                blp[at] = r.behavior_logp[k];
                old[at] = r.old_logp.get(k).copied().unwrap_or(0.0);
                reference[at] = r.ref_logp.get(k).copied().unwrap_or(0.0);
                values[at] = r.old_values.get(k).copied().unwrap_or(0.0);
                returns[at] = r.returns.get(k).copied().unwrap_or(0.0);
                is_weight[at] = r.is_weight.get(k).copied().unwrap_or(1.0);
            }
        }
        let shape = [b as i64, t as i64 - 1];
        let tensor = |v: &[f32]| Tensor::from_slice(v).view(shape).to_device(device);
        let input = Tensor::from_slice(&input)
            .view([b as i64, t as i64])
            .to_device(device);
        MicroBatch {
            targets: input.narrow(1, 1, t as i64 - 1),
            input,
            mask: tensor(&mask),
            weights: tensor(&weights),
            advantages: tensor(&adv),
            behavior_logp: tensor(&blp),
            old_logp: tensor(&old),
            ref_logp: tensor(&reference),
            old_values: tensor(&values),
            returns: tensor(&returns),
            is_weight: tensor(&is_weight),
        }
    }
}

/// Log-probs of `targets` under the model at `temperature`, and optionally the entropy of each
/// position's distribution. Both [rows, T-1].
pub fn token_logprobs(
    net: &Transformer,
    mb: &MicroBatch,
    temperature: f64,
    with_entropy: bool,
) -> (Tensor, Option<Tensor>) {
    let t = mb.input.size()[1];
    let logits = net
        .forward(&mb.input)
        .narrow(1, 0, t - 1)
        .to_kind(Kind::Float);
    let logits = if temperature > 0.0 && temperature != 1.0 {
        logits / temperature
    } else {
        logits
    };
    let logp_all = logits.log_softmax(-1, Kind::Float);
    let logp = logp_all
        .gather(2, &mb.targets.unsqueeze(2), false)
        .squeeze_dim(2);
    let entropy =
        with_entropy.then(|| -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, Kind::Float));
    (logp, entropy)
}

/// Per-token values of a [rows, T-1] tensor at each row's response positions.
pub fn response_values(values: &Tensor, rows: &[&TrainRow]) -> Vec<Vec<f32>> {
    let flat = Vec::<f32>::try_from(
        values
            .to_kind(Kind::Float)
            .to_device(Device::Cpu)
            .contiguous()
            .view([-1]),
    )
    .unwrap_or_default();
    let width = values.size()[1] as usize;
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            let start = i * width + r.prompt_len - 1;
            flat[start..start + r.loss_mask.len()].to_vec()
        })
        .collect()
}

/// Micro-batches of `indices` into `rows`, shortest rows first, each within `max_tokens`
/// padded tokens: sorting keeps a long-tail row from padding a batch of short ones. The loss
/// does not depend on the split (each token's weight holds the global counts), so any order
/// is sound.
pub fn micro_batches(rows: &[TrainRow], indices: &[usize], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut sorted = indices.to_vec();
    sorted.sort_by_key(|&i| rows[i].tokens.len());
    let lens: Vec<usize> = sorted.iter().map(|&i| rows[i].tokens.len()).collect();
    split_by_tokens(&lens, max_tokens)
        .into_iter()
        .map(|r| sorted[r].to_vec())
        .collect()
}

/// Splits row indices into micro-batches of at most `max_tokens` padded tokens each
/// (a single longer row still gets a micro-batch of its own).
pub fn split_by_tokens(lens: &[usize], max_tokens: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut longest = 0;
    for (i, &len) in lens.iter().enumerate() {
        let l = longest.max(len);
        if i > start && l * (i - start + 1) > max_tokens {
            out.push(start..i);
            start = i;
            longest = len;
        } else {
            longest = l;
        }
    }
    if start < lens.len() {
        out.push(start..lens.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_respects_the_padded_token_budget() {
        let parts = split_by_tokens(&[4, 4, 4, 10, 1, 1], 12);
        assert_eq!(parts, vec![0..3, 3..4, 4..6]);
        assert!(split_by_tokens(&[], 8).is_empty());
    }

    #[test]
    fn response_tokens_align_with_their_predicting_position() {
        let row = TrainRow {
            tokens: vec![5, 6, 7, 8],
            prompt_len: 2,
            loss_mask: vec![1, 0],
            behavior_logp: vec![-0.5, -0.7],
            advantages: vec![2.0, 2.0],
            weight: 0.25,
            ..Default::default()
        };
        let mb = MicroBatch::new(&[&row], Device::Cpu);
        assert_eq!(
            Vec::<i64>::try_from(mb.targets.view([-1])).unwrap(),
            vec![6, 7, 8]
        );
        // target 7 (first response token) is at index 1; target 8 is masked out.
        assert_eq!(
            Vec::<f32>::try_from(mb.mask.view([-1])).unwrap(),
            vec![0.0, 1.0, 0.0]
        );
        assert_eq!(
            Vec::<f32>::try_from(mb.weights.view([-1])).unwrap(),
            vec![0.0, 0.25, 0.0]
        );
        assert_eq!(
            Vec::<f32>::try_from(mb.behavior_logp.view([-1])).unwrap(),
            vec![0.0, -0.5, -0.7]
        );
    }
}
