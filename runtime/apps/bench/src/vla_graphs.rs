//! A flow VLA's two graphs with random weights, shaped like SmolVLA at reduced size: the prefix
//! (a patch-embedding vision transformer, its tokens grouped four to one and projected into a
//! language model's width, the instruction's token embeddings and a state token, through the
//! language model's layers, ending in each action-expert layer's keys and values: the KV cache)
//! and the action expert (the noisy chunk and the flow time as tokens, self-attention, then
//! cross-attention to the cached keys and values, per layer). And the same network as one graph,
//! with the same weights, for the single-graph way a VLA used to be exported (the prefix
//! recomputed at every integration step). Untrained: it stands for a VLA's cost and its graphs'
//! interfaces, not its behaviour.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reflex_policies::onnx_write::{Attr, Dim, Elem, Graph, batch};

/// The network's sizes.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct VlaShape {
    /// Image side the vision encoder takes, pixels.
    pub image: u32,
    /// Patch side, pixels.
    pub patch: u32,
    /// Vision encoder width and layers.
    pub vision_width: usize,
    /// Vision encoder layers.
    pub vision_layers: usize,
    /// Language model width.
    pub width: usize,
    /// Language model layers.
    pub layers: usize,
    /// Attention heads of the language model (and of the vision encoder).
    pub heads: usize,
    /// Action expert width.
    pub expert_width: usize,
    /// Action expert layers (one cached key/value pair each).
    pub expert_layers: usize,
    /// Action expert heads.
    pub expert_heads: usize,
    /// Instruction tokens.
    pub tokens: usize,
    /// Vocabulary of the token embedding.
    pub vocab: usize,
    /// State values.
    pub state_dim: usize,
    /// Actions per chunk.
    pub chunk_len: usize,
    /// Action dimension.
    pub action_dim: usize,
}

impl VlaShape {
    /// SmolVLA's proportions reduced to run on a small CPU: SmolVLA (Shukor et al. 2025) takes
    /// 16 layers of SmolVLM2-500M (960 wide) and an expert at 0.75 of that width, 48 instruction
    /// tokens and 50-action chunks; here a 224-pixel ViT (patch 16, 384 wide, 6 layers), a
    /// 576-wide language model of 8 layers (SmolVLM-256M's width), an expert 0.75 as wide (432,
    /// 8 layers), 48 tokens, 50 actions.
    pub fn reduced_smolvla(state_dim: usize, action_dim: usize, vocab: usize) -> Self {
        VlaShape {
            image: 224,
            patch: 16,
            vision_width: 384,
            vision_layers: 6,
            width: 576,
            layers: 8,
            heads: 6,
            expert_width: 432,
            expert_layers: 8,
            expert_heads: 6,
            tokens: 48,
            vocab,
            state_dim,
            chunk_len: 50,
            action_dim,
        }
    }

    /// The same architecture at a size that builds and runs in moments (tests).
    pub fn tiny(state_dim: usize, action_dim: usize, vocab: usize) -> Self {
        VlaShape {
            image: 32,
            patch: 8,
            vision_width: 32,
            vision_layers: 1,
            width: 48,
            layers: 1,
            heads: 2,
            expert_width: 32,
            expert_layers: 2,
            expert_heads: 2,
            tokens: 8,
            ..Self::reduced_smolvla(state_dim, action_dim, vocab)
        }
    }

    /// Tokens in the prefix: image tokens (patches grouped four to one), instruction, state.
    pub fn prefix_len(&self) -> usize {
        let side = (self.image / self.patch) as usize;
        side * side / 4 + self.tokens + 1
    }

    /// Weights in the prefix graph and in the expert (matrices and embeddings; norms and biases
    /// left out).
    pub fn parameters(&self) -> (usize, usize) {
        let (dv, d, de) = (self.vision_width, self.width, self.expert_width);
        let p = (self.patch * self.patch * 3) as usize;
        let block = |w: usize| 12 * w * w;
        let prefix = p * dv
            + self.vision_layers * block(dv)
            + 4 * dv * d
            + self.vocab * d
            + self.state_dim * d
            + self.layers * block(d)
            + self.expert_layers * 2 * d * de;
        let expert = self.action_dim * de
            + de * de
            + self.expert_layers * (block(de) + 2 * de * de)
            + de * self.action_dim;
        (prefix, expert)
    }
}

/// Random weights and the graph they go into.
struct Net<'g> {
    g: &'g mut Graph,
    rng: ChaCha8Rng,
}

impl Net<'_> {
    fn rnd(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| (self.rng.random::<f32>() * 2.0 - 1.0) * scale)
            .collect()
    }

    /// `x W + b`, `W` uniform with the fan-in's scale.
    fn lin(&mut self, x: &str, n_in: usize, n_out: usize) -> String {
        let w = self.rnd(n_in * n_out, (3.0 / n_in as f32).sqrt());
        let b = self.rnd(n_out, 0.02);
        self.g.linear(x, &w, &b, n_in, n_out)
    }

    fn norm(&mut self, x: &str, d: usize) -> String {
        let scale = self.g.constant("ln_s", &[d as i64], &vec![1.0; d]);
        let bias = self.g.constant("ln_b", &[d as i64], &vec![0.0; d]);
        self.g.op(
            "LayerNormalization",
            &[x, &scale, &bias],
            vec![("axis", Attr::Int(-1)), ("epsilon", Attr::Float(1e-5))],
        )
    }

    /// `[B, N, h dh]` to `[B, h, N, dh]` (queries, values) or `[B, h, dh, N]` (keys).
    fn split(&mut self, x: &str, h: usize, dh: usize, keys: bool) -> String {
        let r = self.g.reshape(x, &[0, -1, h as i64, dh as i64]);
        let perm = if keys {
            vec![0, 2, 3, 1]
        } else {
            vec![0, 2, 1, 3]
        };
        self.g
            .op("Transpose", &[&r], vec![("perm", Attr::Ints(perm))])
    }

    /// Scaled dot-product attention of split queries over split keys and values, merged back to
    /// `[B, N, d]` (the `1/sqrt(dh)` scale is in the query weights).
    fn attend(&mut self, q: &str, kt: &str, v: &str, d: usize) -> String {
        let s = self.g.op("MatMul", &[q, kt], vec![]);
        let p = self.g.op("Softmax", &[&s], vec![("axis", Attr::Int(-1))]);
        let o = self.g.op("MatMul", &[&p, v], vec![]);
        let o = self.g.op(
            "Transpose",
            &[&o],
            vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
        );
        self.g.reshape(&o, &[0, -1, d as i64])
    }

    fn query(&mut self, x: &str, d: usize, h: usize) -> String {
        let dh = d / h;
        let w = self.rnd(d * d, (3.0 / d as f32).sqrt() / (dh as f32).sqrt());
        let b = self.rnd(d, 0.02);
        let q = self.g.linear(x, &w, &b, d, d);
        self.split(&q, h, dh, false)
    }

    /// Pre-norm self-attention with its residual.
    fn self_attention(&mut self, x: &str, d: usize, h: usize) -> String {
        let n = self.norm(x, d);
        let q = self.query(&n, d, h);
        let k = self.lin(&n, d, d);
        let k = self.split(&k, h, d / h, true);
        let v = self.lin(&n, d, d);
        let v = self.split(&v, h, d / h, false);
        let o = self.attend(&q, &k, &v, d);
        let o = self.lin(&o, d, d);
        self.g.op("Add", &[x, &o], vec![])
    }

    /// Pre-norm MLP (4x, SiLU) with its residual.
    fn mlp(&mut self, x: &str, d: usize) -> String {
        let n = self.norm(x, d);
        let h = self.lin(&n, d, 4 * d);
        let h = self.g.silu(&h);
        let o = self.lin(&h, 4 * d, d);
        self.g.op("Add", &[x, &o], vec![])
    }
}

/// The prefix: from the `image`, `tokens` and `state` inputs (added here) to each expert layer's
/// cached keys `[B, h, dh, P]` and values `[B, h, P, dh]`.
fn prefix(g: &mut Graph, v: &VlaShape, seed: u64) -> Vec<(String, String)> {
    let s = v.image as i64;
    let image = g.input(
        "image",
        Elem::F32,
        vec![batch(), Dim::Fixed(3), Dim::Fixed(s), Dim::Fixed(s)],
    );
    let tokens = g.input(
        "tokens",
        Elem::I64,
        vec![batch(), Dim::Fixed(v.tokens as i64)],
    );
    let state = g.input(
        "state",
        Elem::F32,
        vec![batch(), Dim::Fixed(v.state_dim as i64)],
    );
    let mut n = Net {
        g,
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let (dv, d, p) = (v.vision_width, v.width, v.patch as usize);
    let patches = (v.image as usize / p).pow(2);
    let wc = n.rnd(dv * 3 * p * p, (3.0 / (3 * p * p) as f32).sqrt());
    let bc = n.rnd(dv, 0.02);
    let wc =
        n.g.constant("patch_w", &[dv as i64, 3, p as i64, p as i64], &wc);
    let bc = n.g.constant("patch_b", &[dv as i64], &bc);
    let x = n.g.op(
        "Conv",
        &[&image, &wc, &bc],
        vec![
            ("kernel_shape", Attr::Ints(vec![p as i64, p as i64])),
            ("strides", Attr::Ints(vec![p as i64, p as i64])),
        ],
    );
    let x = n.g.reshape(&x, &[0, dv as i64, -1]);
    let x = n.g.op(
        "Transpose",
        &[&x],
        vec![("perm", Attr::Ints(vec![0, 2, 1]))],
    );
    let pos = n.rnd(patches * dv, 0.02);
    let pos =
        n.g.constant("vis_pos", &[1, patches as i64, dv as i64], &pos);
    let mut x = n.g.op("Add", &[&x, &pos], vec![]);
    for _ in 0..v.vision_layers {
        x = n.self_attention(&x, dv, v.heads);
        x = n.mlp(&x, dv);
    }
    // Four neighbouring patch tokens to one (SmolVLM's pixel shuffle cuts image tokens likewise).
    let x = n.norm(&x, dv);
    let x = n.g.reshape(&x, &[0, (patches / 4) as i64, 4 * dv as i64]);
    let vis = n.lin(&x, 4 * dv, d);
    let table = n.rnd(v.vocab * d, 1.0);
    let table = n.g.constant("embed", &[v.vocab as i64, d as i64], &table);
    let lang =
        n.g.op("Gather", &[&table, &tokens], vec![("axis", Attr::Int(0))]);
    let st = n.lin(&state, v.state_dim, d);
    let st = n.g.reshape(&st, &[0, 1, d as i64]);
    let mut x = n.g.concat(&[&vis, &lang, &st], 1);
    for _ in 0..v.layers {
        x = n.self_attention(&x, d, v.heads);
        x = n.mlp(&x, d);
    }
    let x = n.norm(&x, d);
    let (de, he) = (v.expert_width, v.expert_heads);
    (0..v.expert_layers)
        .map(|_| {
            let k = n.lin(&x, d, de);
            let k = n.split(&k, he, de / he, true);
            let val = n.lin(&x, d, de);
            let val = n.split(&val, he, de / he, false);
            (k, val)
        })
        .collect()
}

/// The action expert: from the noisy chunk `x_t`, the flow time `t` (inputs added here) and the
/// cached keys and values to the velocity `[B, T, A]`.
fn expert(g: &mut Graph, v: &VlaShape, cache: &[(String, String)], seed: u64) -> String {
    let (t, a) = (v.chunk_len as i64, v.action_dim as i64);
    let x_t = g.input(
        "x_t",
        Elem::F32,
        vec![batch(), Dim::Fixed(t), Dim::Fixed(a)],
    );
    let time = g.input("t", Elem::F32, vec![batch(), Dim::Fixed(1)]);
    let mut n = Net {
        g,
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let (de, he) = (v.expert_width, v.expert_heads);
    let x = n.lin(&x_t, v.action_dim, de);
    // The flow time as a sinusoidal embedding through a layer, added to every action token.
    let half = de / 2;
    let freqs: Vec<f32> = (0..half)
        .map(|i| (-(10000f32).ln() * i as f32 / half as f32).exp())
        .collect();
    let fr = n.g.constant("freqs", &[1, half as i64], &freqs);
    let tf = n.g.op("MatMul", &[&time, &fr], vec![]);
    let (sin, cos) = (n.g.op("Sin", &[&tf], vec![]), n.g.op("Cos", &[&tf], vec![]));
    let te = n.g.concat(&[&sin, &cos], 1);
    let te = n.lin(&te, 2 * half, de);
    let te = n.g.silu(&te);
    let te = n.g.reshape(&te, &[0, 1, de as i64]);
    let pos = n.rnd(v.chunk_len * de, 0.02);
    let pos = n.g.constant("act_pos", &[1, t, de as i64], &pos);
    let x = n.g.op("Add", &[&x, &te], vec![]);
    let mut x = n.g.op("Add", &[&x, &pos], vec![]);
    for (k, val) in cache {
        x = n.self_attention(&x, de, he);
        let q_in = n.norm(&x, de);
        let q = n.query(&q_in, de, he);
        let o = n.attend(&q, k, val, de);
        let o = n.lin(&o, de, de);
        x = n.g.op("Add", &[&x, &o], vec![]);
        x = n.mlp(&x, de);
    }
    let x = n.norm(&x, de);
    n.lin(&x, de, v.action_dim)
}

fn velocity_output(g: &mut Graph, v: &VlaShape, out: &str) {
    g.output(
        out,
        "velocity",
        Elem::F32,
        vec![
            batch(),
            Dim::Fixed(v.chunk_len as i64),
            Dim::Fixed(v.action_dim as i64),
        ],
    );
}

/// The names of the cached keys and values as the prefix graph returns them and the expert
/// takes them: `k0`, `v0`, `k1`, ...
pub fn cache_names(v: &VlaShape) -> Vec<String> {
    (0..v.expert_layers)
        .flat_map(|l| [format!("k{l}"), format!("v{l}")])
        .collect()
}

/// The two graphs (prefix, expert) and the single graph, with the same weights from `seed`.
pub struct VlaGraphs {
    /// Observation inputs to the cached keys and values.
    pub prefix: Vec<u8>,
    /// Cached keys and values, noisy chunk and time to the velocity.
    pub expert: Vec<u8>,
    /// Everything in one graph: observation inputs, noisy chunk and time to the velocity.
    pub single: Vec<u8>,
}

/// Builds [`VlaGraphs`] for `v` from `seed`.
pub fn build(v: &VlaShape, seed: u64) -> VlaGraphs {
    let (ps, es) = (seed, seed.wrapping_add(1));
    let (p_head, dh, plen) = (
        v.expert_heads as i64,
        (v.expert_width / v.expert_heads) as i64,
        v.prefix_len() as i64,
    );
    let mut g = Graph::new();
    let cache = prefix(&mut g, v, ps);
    for ((k, val), names) in cache.iter().zip(cache_names(v).chunks(2)) {
        let kd = vec![
            batch(),
            Dim::Fixed(p_head),
            Dim::Fixed(dh),
            Dim::Fixed(plen),
        ];
        let vd = vec![
            batch(),
            Dim::Fixed(p_head),
            Dim::Fixed(plen),
            Dim::Fixed(dh),
        ];
        g.output(k, &names[0], Elem::F32, kd);
        g.output(val, &names[1], Elem::F32, vd);
    }
    let prefix_bytes = g.to_bytes("vla_prefix", "reflex");

    let mut g = Graph::new();
    let inputs: Vec<(String, String)> = cache_names(v)
        .chunks(2)
        .map(|n| {
            let k = g.input(
                &n[0],
                Elem::F32,
                vec![
                    batch(),
                    Dim::Fixed(p_head),
                    Dim::Fixed(dh),
                    Dim::Fixed(plen),
                ],
            );
            let val = g.input(
                &n[1],
                Elem::F32,
                vec![
                    batch(),
                    Dim::Fixed(p_head),
                    Dim::Fixed(plen),
                    Dim::Fixed(dh),
                ],
            );
            (k, val)
        })
        .collect();
    let out = expert(&mut g, v, &inputs, es);
    velocity_output(&mut g, v, &out);
    let expert_bytes = g.to_bytes("vla_expert", "reflex");

    let mut g = Graph::new();
    let cache = prefix(&mut g, v, ps);
    let out = expert(&mut g, v, &cache, es);
    velocity_output(&mut g, v, &out);
    VlaGraphs {
        prefix: prefix_bytes,
        expert: expert_bytes,
        single: g.to_bytes("vla_single", "reflex"),
    }
}
