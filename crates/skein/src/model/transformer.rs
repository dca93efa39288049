//! The decoder: embeddings, N blocks of (RMSNorm → GQA attention with RoPE → RMSNorm → SwiGLU),
//! a final norm and the LM head. Parameter names follow the Hugging Face layout exactly
//! (`model.layers.0.self_attn.q_proj.weight`, …) so checkpoints load and save without renaming.

use super::attention::{Spans, Varlen};
use super::config::ModelConfig;
use super::fused::{Fused, Storage};
use super::kv_cache::KvCache;
use super::lora::{LoraConfig, Projection};
use super::rope::{self, Rope};
use anyhow::Result;
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn shared(&self) -> Self {
        RmsNorm {
            weight: self.weight.shallow_clone(),
            eps: self.eps,
        }
    }

    fn new(p: nn::Path, dim: usize, eps: f64) -> Self {
        RmsNorm {
            weight: p.ones("weight", &[dim as i64]),
            eps,
        }
    }

    /// On CUDA libtorch's fused kernel, one launch where the steps below take six to eight
    /// (a decode step runs two norms per layer); elsewhere the steps, which the CPU's
    /// `rms_norm` runs one by one anyway.
    fn forward(&self, x: &Tensor) -> Tensor {
        if x.device().is_cuda() {
            self.fused(x)
        } else {
            self.by_steps(x)
        }
    }

    /// Hugging Face's: normalised in float32, cast back, then scaled by the weight.
    fn by_steps(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let var = xf.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        (xf * (var + self.eps).rsqrt()).to_kind(kind) * &self.weight
    }

    /// The same in one op, which scales by the weight before casting back: in low precision
    /// it can differ from [`by_steps`](Self::by_steps) by one rounding.
    fn fused(&self, x: &Tensor) -> Tensor {
        let dim = *x
            .size()
            .last()
            .expect("hidden states have a last dimension");
        x.rms_norm([dim], Some(&self.weight), self.eps)
    }
}

/// Where attention reads its keys and values from.
pub enum AttnMode<'a> {
    /// A right-padded batch seen whole (training, log-prob recomputation): causal attention
    /// alone keeps every real token away from the padding that follows it.
    Causal,
    /// Packed lines (several rows, or a shared prefix and its continuations, end to end):
    /// `mask` [lines, 1, T, T] says which keys each query sees (true: attends), so no row sees
    /// another; the positions passed with it restart for each row.
    Masked(&'a Tensor),
    /// Packed lines whose attention runs span by span (variable-length attention by loop):
    /// each span only against its own keys, and a shared prefix's. Cheaper than `Masked` on
    /// wide lines, where a dense mask computes every query against every key.
    Spans(&'a Spans),
    /// Packed lines as variable-length sequences through one fused kernel per layer (CUDA):
    /// no mask and no loop over spans.
    Varlen(&'a Varlen),
    /// Prefill into a KV cache: like `Causal`, and the new keys/values are stored for `slots`.
    Prefill {
        cache: &'a mut KvCache,
        slots: &'a Tensor,
    },
    /// One new token per sequence: appended at `positions` of `slots`, attending to the cache.
    /// `mask` (additive) comes from `kv_cache::decode_mask`; `dense` says the slots are
    /// exactly 0..A.
    Decode {
        cache: &'a mut KvCache,
        slots: &'a Tensor,
        positions: &'a Tensor,
        mask: &'a Tensor,
        span: i64,
        dense: bool,
    },
}

struct Attention {
    q: Projection,
    k: Projection,
    v: Projection,
    o: Projection,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// The storage q, k and v's weights are views of.
    qkv_storage: Option<Storage>,
    /// q, k and v as one product (a decoding copy in [`DecodeForm::Fused`]).
    qkv: Option<Fused>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let (h, hd) = (cfg.hidden_size as i64, cfg.head_dim() as i64);
        let (heads, kv_heads) = (cfg.num_attention_heads as i64, cfg.kv_heads() as i64);
        let bias = cfg.qkv_bias();
        let norm = |name: &str| {
            cfg.qk_norm()
                .then(|| RmsNorm::new(&p / name, hd as usize, cfg.rms_norm_eps))
        };
        let mut attention = Attention {
            q: Projection::new(&p / "q_proj", h, heads * hd, bias),
            k: Projection::new(&p / "k_proj", h, kv_heads * hd, bias),
            v: Projection::new(&p / "v_proj", h, kv_heads * hd, bias),
            o: Projection::new(&p / "o_proj", heads * hd, h, false),
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            qkv_storage: None,
            qkv: None,
            heads,
            kv_heads,
            head_dim: hd,
        };
        attention.share_storage();
        attention
    }

    /// Puts q, k and v's weights into one storage ([`Storage::share`]).
    fn share_storage(&mut self) {
        self.qkv_storage = Storage::share(&mut [&mut self.q, &mut self.k, &mut self.v]);
    }

    /// Computes q, k and v with one product from their storage, while it holds them.
    fn fuse(&mut self) {
        self.qkv = self
            .qkv_storage
            .as_ref()
            .and_then(|s| Fused::new(s, &[&self.q, &self.k, &self.v]));
    }

    fn projections(&mut self) -> [(&'static str, &mut Projection); 4] {
        [
            ("q_proj", &mut self.q),
            ("k_proj", &mut self.k),
            ("v_proj", &mut self.v),
            ("o_proj", &mut self.o),
        ]
    }

    fn projection_refs(&self) -> [&Projection; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }

    /// The same attention with each projection replaced by `f` of it.
    fn map_projections(&self, f: &impl Fn(&Projection) -> Projection) -> Self {
        Attention {
            q: f(&self.q),
            k: f(&self.k),
            v: f(&self.v),
            o: f(&self.o),
            q_norm: self.q_norm.as_ref().map(RmsNorm::shared),
            k_norm: self.k_norm.as_ref().map(RmsNorm::shared),
            qkv_storage: self.qkv_storage.as_ref().map(Storage::shared),
            qkv: None,
            ..*self
        }
    }

    fn project(&self, lin: &Projection, norm: &Option<RmsNorm>, x: &Tensor, heads: i64) -> Tensor {
        let (b, t, _) = x.size3().expect("hidden states are [batch, time, hidden]");
        let y = lin.forward(x).view([b, t, heads, self.head_dim]);
        let y = match norm {
            Some(n) => n.forward(&y),
            None => y,
        };
        y.transpose(1, 2)
    }

    /// Queries, keys and values [B, heads, T, D] from one product. Without q/k norms the
    /// queries and keys lie side by side in it, head after head, and rotate in one pass: the
    /// same element-wise arithmetic as two. The rotation ends in a fused multiply-add.
    fn fused_queries_keys_values(
        &self,
        qkv: &Fused,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        let (b, t, _) = x.size3().expect("hidden states are [batch, time, hidden]");
        let (heads, kv_heads) = (self.heads, self.kv_heads);
        let y = qkv
            .forward(x)
            .view([b, t, heads + 2 * kv_heads, self.head_dim]);
        // The tables broadcast over the heads, here dimension 2.
        let (cos, sin) = (cos.transpose(1, 2), sin.transpose(1, 2));
        let v = y.narrow(2, heads + kv_heads, kv_heads);
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (None, None) => {
                let qk = rope::apply_fused(&y.narrow(2, 0, heads + kv_heads), &cos, &sin);
                (qk.narrow(2, 0, heads), qk.narrow(2, heads, kv_heads))
            }
            (q_norm, k_norm) => {
                let rotate = |part: Tensor, norm: &Option<RmsNorm>| {
                    let part = match norm {
                        Some(n) => n.forward(&part),
                        None => part,
                    };
                    rope::apply_fused(&part, &cos, &sin)
                };
                (
                    rotate(y.narrow(2, 0, heads), q_norm),
                    rotate(y.narrow(2, heads, kv_heads), k_norm),
                )
            }
        };
        (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    }

    /// `residual` plus the attention of `x`: the residual stream after this attention. A fused
    /// decoding copy adds the residual in the output projection's product.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        residual: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        layer: usize,
        mode: &mut AttnMode,
    ) -> Tensor {
        let (b, t, _) = x.size3().expect("hidden states are [batch, time, hidden]");
        let (q, k, v) = match &self.qkv {
            Some(qkv) => self.fused_queries_keys_values(qkv, x, cos, sin),
            None => (
                rope::apply(
                    &self.project(&self.q, &self.q_norm, x, self.heads),
                    cos,
                    sin,
                ),
                rope::apply(
                    &self.project(&self.k, &self.k_norm, x, self.kv_heads),
                    cos,
                    sin,
                ),
                self.project(&self.v, &None, x, self.kv_heads),
            ),
        };
        let gqa = self.heads != self.kv_heads;
        let out = match mode {
            AttnMode::Causal => Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<Tensor>,
                0.0,
                true,
                None,
                gqa,
            ),
            AttnMode::Masked(mask) => {
                Tensor::scaled_dot_product_attention(&q, &k, &v, Some(*mask), 0.0, false, None, gqa)
            }
            AttnMode::Spans(spans) => spans.attend(&q, &k, &v, gqa),
            AttnMode::Varlen(varlen) => varlen.attend(&q, &k, &v),
            AttnMode::Prefill { cache, slots } => {
                cache.store_prefix(layer, &k, &v, slots);
                Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    None::<Tensor>,
                    0.0,
                    true,
                    None,
                    gqa,
                )
            }
            AttnMode::Decode {
                cache,
                slots,
                positions,
                mask,
                span,
                dense,
            } => {
                let (keys, values) =
                    cache.append_and_read(layer, &k, &v, slots, positions, *span, *dense);
                super::attention::decode(&q, &keys, &values, mask)
            }
        };
        let out = out
            .transpose(1, 2)
            .reshape([b, t, self.heads * self.head_dim]);
        match self.qkv {
            Some(_) => self.o.forward_onto(&out, residual),
            None => self.o.forward(&out) + residual,
        }
    }
}

struct Mlp {
    gate: Projection,
    up: Projection,
    down: Projection,
    /// The storage gate and up's weights are views of.
    gate_up_storage: Option<Storage>,
    /// gate and up as one product (a decoding copy in [`DecodeForm::Fused`]).
    gate_up: Option<Fused>,
}

impl Mlp {
    fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let (h, i) = (cfg.hidden_size as i64, cfg.intermediate_size as i64);
        let mut mlp = Mlp {
            gate: Projection::new(&p / "gate_proj", h, i, false),
            up: Projection::new(&p / "up_proj", h, i, false),
            down: Projection::new(&p / "down_proj", i, h, false),
            gate_up_storage: None,
            gate_up: None,
        };
        mlp.share_storage();
        mlp
    }

    /// Puts gate and up's weights into one storage ([`Storage::share`]).
    fn share_storage(&mut self) {
        self.gate_up_storage = Storage::share(&mut [&mut self.gate, &mut self.up]);
    }

    /// Computes gate and up with one product from their storage, while it holds them.
    fn fuse(&mut self) {
        self.gate_up = self
            .gate_up_storage
            .as_ref()
            .and_then(|s| Fused::new(s, &[&self.gate, &self.up]));
    }

    fn projections(&mut self) -> [(&'static str, &mut Projection); 3] {
        [
            ("gate_proj", &mut self.gate),
            ("up_proj", &mut self.up),
            ("down_proj", &mut self.down),
        ]
    }

    fn projection_refs(&self) -> [&Projection; 3] {
        [&self.gate, &self.up, &self.down]
    }

    fn map_projections(&self, f: &impl Fn(&Projection) -> Projection) -> Self {
        Mlp {
            gate: f(&self.gate),
            up: f(&self.up),
            down: f(&self.down),
            gate_up_storage: self.gate_up_storage.as_ref().map(Storage::shared),
            gate_up: None,
        }
    }

    /// `residual` plus the MLP of `x`. A fused decoding copy adds the residual in the down
    /// projection's product.
    fn forward(&self, x: &Tensor, residual: &Tensor) -> Tensor {
        match &self.gate_up {
            Some(gate_up) => {
                let y = gate_up.forward(x);
                let width = self.gate.base().ws.size()[0];
                let hidden = y.narrow(-1, 0, width).silu() * y.narrow(-1, width, width);
                self.down.forward_onto(&hidden, residual)
            }
            None => {
                residual
                    + self
                        .down
                        .forward(&(self.gate.forward(x).silu() * self.up.forward(x)))
            }
        }
    }
}

struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// How a decoding copy computes ([`Transformer::for_decoding_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeForm {
    /// The CPU's: every projection on its own, and adapters in float32, as the trainer
    /// computes them there. The CPU's matrix products may round differently at another
    /// width, so this way the engine stays as close to the trainer's numbers as decoding one
    /// token at a time allows, and CPU runs compute what they always did.
    Separate,
    /// CUDA's, where a decode step costs its kernel launches: q, k and v as one product, gate
    /// and up as another (their weights share a storage, `model/fused.rs`), the queries and
    /// keys rotated in one pass that ends in a fused multiply-add, the residual adds inside
    /// the output projections' products, and adapters in the base's dtype, as the trainer
    /// computes them there. Per layer, ten kernels fewer than the separate form (three
    /// products, five of the rotation's, two adds; seven with q/k norms, whose queries and keys
    /// rotate apart), and six more with adapters on every projection. Another width of product
    /// and the fused sums may round differently, so the engine's numbers differ from the
    /// trainer's by round-off, as they do between any two GPU kernels.
    Fused,
}

impl DecodeForm {
    /// The form decoding takes on `device`: fused on CUDA, where it launches fewer kernels;
    /// separate elsewhere, where it keeps the trainer's numbers.
    pub fn for_device(device: tch::Device) -> Self {
        if device.is_cuda() {
            DecodeForm::Fused
        } else {
            DecodeForm::Separate
        }
    }
}

/// A decoder-only transformer (Qwen2 / Qwen3 / Llama) with its LM head.
pub struct Transformer {
    pub config: ModelConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<nn::Linear>,
    rope: Rope,
}

impl Transformer {
    /// Creates the parameters under `root` (randomly initialised; load weights afterwards).
    pub fn new(root: &nn::Path, cfg: &ModelConfig) -> Result<Self> {
        cfg.validate()?;
        let p = root / "model";
        let h = cfg.hidden_size;
        let embed = (&p / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size as i64, h as i64],
            nn::Init::Randn {
                mean: 0.0,
                stdev: 0.02,
            },
        );
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let l = &p / "layers" / i;
                Block {
                    input_norm: RmsNorm::new(&l / "input_layernorm", h, cfg.rms_norm_eps),
                    attn: Attention::new(&l / "self_attn", cfg),
                    post_norm: RmsNorm::new(&l / "post_attention_layernorm", h, cfg.rms_norm_eps),
                    mlp: Mlp::new(&l / "mlp", cfg),
                }
            })
            .collect();
        let lm_head = (!cfg.tie_word_embeddings).then(|| {
            nn::linear(
                root / "lm_head",
                h as i64,
                cfg.vocab_size as i64,
                nn::LinearConfig {
                    bias: false,
                    ..Default::default()
                },
            )
        });
        Ok(Transformer {
            config: cfg.clone(),
            embed,
            blocks,
            norm: RmsNorm::new(&p / "norm", h, cfg.rms_norm_eps),
            lm_head,
            rope: Rope::new(cfg, &cfg.rope()?, root.device()),
        })
    }

    pub fn max_positions(&self) -> i64 {
        self.rope.max_positions()
    }

    /// The dtype of the weights and of the hidden states (adapters aside).
    pub fn kind(&self) -> Kind {
        self.embed.kind()
    }

    /// Gives the projections `cfg.targets` of every layer a LoRA adapter under `root` (the
    /// root the model was built under).
    pub fn attach_adapters(&mut self, root: &nn::Path, cfg: &LoraConfig) {
        for (i, block) in self.blocks.iter_mut().enumerate() {
            let layer = root / "model" / "layers" / i;
            let attn = block.attn.projections().map(|(n, p)| ("self_attn", n, p));
            let mlp = block.mlp.projections().map(|(n, p)| ("mlp", n, p));
            for (part, name, proj) in attn.into_iter().chain(mlp) {
                if cfg.targets.iter().any(|t| t == name) {
                    proj.attach(&layer / part / name, cfg);
                }
            }
        }
    }

    /// Frozen copies of `source`'s adapters, registered under `root` with the names its own
    /// have ([`Projection::attach_frozen_copy`]); `source` has this model's architecture.
    pub fn attach_frozen_adapter_copies(&mut self, root: &nn::Path, source: &Transformer) {
        for (i, (block, from)) in self.blocks.iter_mut().zip(&source.blocks).enumerate() {
            let layer = root / "model" / "layers" / i;
            let attn = block
                .attn
                .projections()
                .into_iter()
                .map(|(n, p)| ("self_attn", n, p));
            let mlp = block
                .mlp
                .projections()
                .into_iter()
                .map(|(n, p)| ("mlp", n, p));
            let sources = from
                .attn
                .projection_refs()
                .into_iter()
                .chain(from.mlp.projection_refs());
            for ((part, name, proj), of) in attn.chain(mlp).zip(sources) {
                proj.attach_frozen_copy(&layer / part / name, of);
            }
        }
    }

    /// RL's passes run without adapter dropout ([`Projection::stop_dropout`]).
    pub fn stop_adapter_dropout(&mut self) {
        self.for_each_projection(Projection::stop_dropout);
    }

    /// The largest dropout probability any adapter runs with now.
    pub fn adapter_dropout(&self) -> f64 {
        self.blocks
            .iter()
            .flat_map(|b| {
                b.attn
                    .projection_refs()
                    .into_iter()
                    .chain(b.mlp.projection_refs())
            })
            .map(Projection::dropout)
            .fold(0.0, f64::max)
    }

    /// Folds every adapter into its base weight and restarts it from zero.
    pub fn merge_adapters(&mut self) {
        self.for_each_projection(Projection::merge);
    }

    fn for_each_projection(&mut self, mut f: impl FnMut(&mut Projection)) {
        for block in &mut self.blocks {
            let attn = block.attn.projections().map(|(_, p)| p);
            let mlp = block.mlp.projections().map(|(_, p)| p);
            for proj in attn.into_iter().chain(mlp) {
                f(proj);
            }
        }
    }

    /// The same frozen weights (shared, not copied) with no adapters: the LoRA policy's KL
    /// reference.
    pub fn base_only(&self) -> Self {
        self.map_projections(&Projection::base_only)
    }

    /// The same weights for decoding, without gradients, in the [`DecodeForm`] of the
    /// device: the base shared, adapters as [`Projection::for_decoding`] makes them. Made once
    /// per engine run, since it does not follow later updates of the adapters.
    ///
    /// The adapters' products are in the dtype the trainer computes them in on the device:
    /// on CUDA the base's, with two kernels per projection where the trainable form launches
    /// up to five (its casts of the weights, a scale, the products); on the CPU float32, as
    /// the trainer's, whose input a low-precision base casts.
    pub fn for_decoding(&self) -> Self {
        self.for_decoding_as(DecodeForm::for_device(self.device()))
    }

    /// [`for_decoding`](Self::for_decoding) in `form`, whatever the device.
    pub fn for_decoding_as(&self, form: DecodeForm) -> Self {
        match form {
            DecodeForm::Separate => self.for_decoding_in(Kind::Float),
            DecodeForm::Fused => {
                let mut copy = self.for_decoding_in(self.kind());
                for block in &mut copy.blocks {
                    block.attn.fuse();
                    block.mlp.fuse();
                }
                copy
            }
        }
    }

    /// A decoding copy with the adapters in `kind`, each projection on its own.
    pub fn for_decoding_in(&self, kind: Kind) -> Self {
        self.map_projections(&|p| p.for_decoding(kind))
    }

    /// Whether every layer's q/k/v and gate/up weights are views of their group's storage,
    /// as [`DecodeForm::Fused`] needs.
    #[cfg(test)]
    pub fn shares_storage(&self) -> bool {
        self.blocks.iter().all(|b| {
            let attn = &b.attn;
            let mlp = &b.mlp;
            attn.qkv_storage
                .as_ref()
                .is_some_and(|s| s.holds(&[&attn.q, &attn.k, &attn.v]))
                && mlp
                    .gate_up_storage
                    .as_ref()
                    .is_some_and(|s| s.holds(&[&mlp.gate, &mlp.up]))
        })
    }

    /// Puts the weights of q, k and v, and of gate and up, into one storage per layer again
    /// ([`Storage::share`]): after a cast of the var store, which gives each its own.
    pub fn share_storage(&mut self) {
        for block in &mut self.blocks {
            block.attn.share_storage();
            block.mlp.share_storage();
        }
    }

    /// The device of the weights.
    pub fn device(&self) -> tch::Device {
        self.embed.device()
    }

    /// The same structure with every projection replaced by `f` of it; everything else shared.
    fn map_projections(&self, f: &impl Fn(&Projection) -> Projection) -> Self {
        Transformer {
            config: self.config.clone(),
            embed: self.embed.shallow_clone(),
            blocks: self
                .blocks
                .iter()
                .map(|b| Block {
                    input_norm: b.input_norm.shared(),
                    attn: b.attn.map_projections(f),
                    post_norm: b.post_norm.shared(),
                    mlp: b.mlp.map_projections(f),
                })
                .collect(),
            norm: self.norm.shared(),
            lm_head: self.lm_head.as_ref().map(|h| nn::Linear {
                ws: h.ws.shallow_clone(),
                bs: h.bs.as_ref().map(Tensor::shallow_clone),
            }),
            rope: self.rope.shared(),
        }
    }

    /// Final hidden states [B, T, hidden] for `input_ids` [B, T] at `positions` [B, T].
    pub fn hidden(&self, input_ids: &Tensor, positions: &Tensor, mut mode: AttnMode) -> Tensor {
        let mut x = self.embed_tokens(input_ids);
        let (cos, sin) = self.rope_tables(positions, x.kind());
        for i in 0..self.layers() {
            x = self.block_forward(i, &x, &cos, &sin, &mut mode);
        }
        self.final_norm(&x)
    }

    /// Decoder layers (blocks).
    pub(super) fn layers(&self) -> usize {
        self.blocks.len()
    }

    /// Token embeddings [B, T, hidden]: the first layer's input.
    pub(super) fn embed_tokens(&self, input_ids: &Tensor) -> Tensor {
        self.embed.embedding_lookup(input_ids)
    }

    /// The rotary tables of `positions`, shared by every layer of one forward.
    pub(super) fn rope_tables(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        self.rope.tables(positions, kind)
    }

    /// Decoder layer `i` on its input `x`: the residual stream after its attention and MLP.
    /// One function for the forward and for the recomputation of activation checkpointing
    /// (`super::checkpoint`), so both compute exactly the same thing.
    pub(super) fn block_forward(
        &self,
        i: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mode: &mut AttnMode,
    ) -> Tensor {
        let block = &self.blocks[i];
        // Each residual add is out of place: `+=` on a tensor autograd has saved breaks
        // backward.
        let x = block
            .attn
            .forward(&block.input_norm.forward(x), x, cos, sin, i, mode);
        block.mlp.forward(&block.post_norm.forward(&x), &x)
    }

    /// The norm after the last layer.
    pub(super) fn final_norm(&self, x: &Tensor) -> Tensor {
        self.norm.forward(x)
    }

    /// Vocabulary logits for hidden states.
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => hidden.matmul(&self.embed.tr()),
        }
    }

    /// Logits [B, T, vocab] of a right-padded batch, positions 0..T.
    pub fn forward(&self, input_ids: &Tensor) -> Tensor {
        let positions = positions_like(input_ids);
        self.logits(&self.hidden(input_ids, &positions, AttnMode::Causal))
    }
}

trait EmbeddingLookup {
    fn embedding_lookup(&self, ids: &Tensor) -> Tensor;
}

impl EmbeddingLookup for Tensor {
    fn embedding_lookup(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(self, ids, -1, false, false)
    }
}

/// Positions 0..T for every row of a [B, T] batch.
pub fn positions_like(input_ids: &Tensor) -> Tensor {
    let (b, t) = input_ids.size2().expect("input ids are [batch, time]");
    Tensor::arange(t, (Kind::Int64, input_ids.device()))
        .unsqueeze(0)
        .expand([b, t], false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused norm CUDA runs computes Hugging Face's: to round-off in float32, within one
    /// rounding in bfloat16 (libtorch's CPU runs the same function, step by step).
    #[test]
    fn the_fused_norm_is_the_stepwise_one() {
        tch::manual_seed(5);
        for (kind, tolerance) in [(Kind::Float, 1e-6), (Kind::BFloat16, 1.0 / 128.0)] {
            let x =
                (Tensor::randn([3, 5, 64], (Kind::Float, tch::Device::Cpu)) * 3.0).to_kind(kind);
            let norm = RmsNorm {
                weight: (Tensor::rand([64], (Kind::Float, tch::Device::Cpu)) + 0.5).to_kind(kind),
                eps: 1e-6,
            };
            let (fused, steps) = (norm.fused(&x), norm.by_steps(&x));
            assert_eq!(fused.kind(), kind);
            let relative = ((&fused - &steps).abs() / (steps.abs() + 1e-3))
                .to_kind(Kind::Float)
                .max()
                .double_value(&[]);
            assert!(relative <= tolerance, "{kind:?}: {relative}");
        }
    }
}
