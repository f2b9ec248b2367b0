//! A BERT encoder's forward pass over one sequence (no padding, so no
//! attention mask): embeddings, then per layer self-attention and a GELU
//! feed-forward block, each followed by a residual sum and layer norm.

use crate::linear::{Linear, Precision};
use crate::tensors::{TensorError, Tensors};

/// The architecture, from the model's `config.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    #[serde(default = "eps")]
    pub layer_norm_eps: f32,
    #[serde(default = "gelu")]
    pub hidden_act: String,
}

fn two() -> usize {
    2
}

fn eps() -> f32 {
    1e-12
}

fn gelu() -> String {
    "gelu".into()
}

struct Norm {
    gain: Vec<f32>,
    bias: Vec<f32>,
}

struct Layer {
    /// Query, key and value stacked: one product for all three.
    qkv: Linear,
    attention_out: Linear,
    attention_norm: Norm,
    intermediate: Linear,
    output: Linear,
    output_norm: Norm,
}

pub struct Bert {
    config: Config,
    words: Vec<f32>,
    positions: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
}

impl Bert {
    pub fn load(
        config: Config,
        tensors: &Tensors,
        precision: Precision,
    ) -> Result<Bert, TensorError> {
        let h = config.hidden_size;
        // Sentence-transformers saves the bare encoder; a full checkpoint
        // names it `bert.`.
        let prefix = if tensors.has("embeddings.LayerNorm.bias") {
            ""
        } else {
            "bert."
        };
        let get = |name: &str, shape: &[usize]| tensors.get(&format!("{prefix}{name}"), shape);
        let tensors = |name: &str, inputs: usize, outputs: usize| {
            Ok::<_, TensorError>((
                get(&format!("{name}.weight"), &[outputs, inputs])?,
                get(&format!("{name}.bias"), &[outputs])?,
            ))
        };
        let linear = |name: &str, inputs: usize, outputs: usize| -> Result<Linear, TensorError> {
            let (weight, bias) = tensors(name, inputs, outputs)?;
            Ok(Linear::new(&weight, bias, inputs, outputs, precision))
        };
        let norm = |name: &str| -> Result<Norm, TensorError> {
            Ok(Norm {
                gain: get(&format!("{name}.weight"), &[h])?,
                bias: get(&format!("{name}.bias"), &[h])?,
            })
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            let (q, k, v) = (
                tensors(&format!("{p}.attention.self.query"), h, h)?,
                tensors(&format!("{p}.attention.self.key"), h, h)?,
                tensors(&format!("{p}.attention.self.value"), h, h)?,
            );
            let qkv = Linear::new(
                &[q.0, k.0, v.0].concat(),
                [q.1, k.1, v.1].concat(),
                h,
                3 * h,
                precision,
            );
            layers.push(Layer {
                qkv,
                attention_out: linear(&format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                intermediate: linear(
                    &format!("{p}.intermediate.dense"),
                    h,
                    config.intermediate_size,
                )?,
                output: linear(&format!("{p}.output.dense"), config.intermediate_size, h)?,
                output_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            words: get("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            positions: get(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, h],
            )?,
            token_type: get(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab_size, h],
            )?,
            embedding_norm: norm("embeddings.LayerNorm")?,
            layers,
            config,
        })
    }

    /// The last layer's hidden states of `ids` (one row of `hidden_size`
    /// per token). `ids` must be in the vocabulary and no longer than
    /// `max_position_embeddings`.
    pub fn forward(&self, ids: &[u32]) -> Vec<f32> {
        let h = self.config.hidden_size;
        let n = ids.len();
        assert!(n <= self.config.max_position_embeddings);
        let mut x = vec![0.0f32; n * h];
        for (i, id) in ids.iter().enumerate() {
            let id = *id as usize;
            let row = &mut x[i * h..(i + 1) * h];
            let word = &self.words[id * h..(id + 1) * h];
            let position = &self.positions[i * h..(i + 1) * h];
            for j in 0..h {
                row[j] = word[j] + position[j] + self.token_type[j];
            }
        }
        self.normalize(&mut x, &self.embedding_norm);
        for layer in &self.layers {
            let context = self.attention(&x, layer, n);
            let mut attended = layer.attention_out.apply(&context, n);
            add(&mut attended, &x);
            self.normalize(&mut attended, &layer.attention_norm);
            let mut inner = layer.intermediate.apply(&attended, n);
            gelu_all(&mut inner);
            let mut out = layer.output.apply(&inner, n);
            add(&mut out, &attended);
            self.normalize(&mut out, &layer.output_norm);
            x = out;
        }
        x
    }

    fn attention(&self, x: &[f32], layer: &Layer, n: usize) -> Vec<f32> {
        let h = self.config.hidden_size;
        let heads = self.config.num_attention_heads;
        let d = h / heads;
        let qkv = layer.qkv.apply(x, n);
        let mut context = vec![0.0f32; n * h];
        let mut scores = vec![0.0f32; n * n];
        let stride = (3 * h) as isize;
        for head in 0..heads {
            let at = head * d;
            // scores = Q Kᵀ / √d, then each row a softmax.
            gemm(
                (n, d, n),
                1.0 / (d as f32).sqrt(),
                (&qkv[at..], stride, 1),
                (&qkv[h + at..], 1, stride),
                0.0,
                (&mut scores, n as isize, 1),
            );
            for row in scores.chunks_exact_mut(n) {
                softmax(row);
            }
            // context = scores V, into this head's columns.
            gemm(
                (n, n, d),
                1.0,
                (&scores, n as isize, 1),
                (&qkv[2 * h + at..], stride, 1),
                0.0,
                (&mut context[at..], h as isize, 1),
            );
        }
        context
    }

    fn normalize(&self, x: &mut [f32], norm: &Norm) {
        let h = self.config.hidden_size;
        let eps = self.config.layer_norm_eps;
        for row in x.chunks_exact_mut(h) {
            let mean = row.iter().sum::<f32>() / h as f32;
            let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h as f32;
            let scale = 1.0 / (variance + eps).sqrt();
            for (j, v) in row.iter_mut().enumerate() {
                *v = (*v - mean) * scale * norm.gain[j] + norm.bias[j];
            }
        }
    }

    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }
}

/// `c = alpha a b + beta c` for an `m×k` `a` and a `k×n` `b`, each a slice
/// with its row and column strides; every element reached is checked to lie
/// in its slice before the product runs.
fn gemm(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: (&[f32], isize, isize),
    b: (&[f32], isize, isize),
    beta: f32,
    c: (&mut [f32], isize, isize),
) {
    /// The index of a matrix's furthest element, if its strides are not
    /// negative and nothing overflows.
    fn last(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<usize> {
        let (rs, cs) = (usize::try_from(rs).ok()?, usize::try_from(cs).ok()?);
        (rows - 1)
            .checked_mul(rs)?
            .checked_add((cols - 1).checked_mul(cs)?)
    }
    assert!(m > 0 && k > 0 && n > 0);
    let inside = |len: usize, last: Option<usize>| last.is_some_and(|l| l < len);
    assert!(inside(a.0.len(), last(m, k, a.1, a.2)));
    assert!(inside(b.0.len(), last(k, n, b.1, b.2)));
    assert!(inside(c.0.len(), last(m, n, c.1, c.2)));
    // SAFETY: the strides are non-negative and the furthest element of each
    // matrix lies inside its slice (asserted above); `c` is borrowed
    // mutably, so it overlaps neither `a` nor `b`.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.0.as_ptr(),
            a.1,
            a.2,
            b.0.as_ptr(),
            b.1,
            b.2,
            beta,
            c.0.as_mut_ptr(),
            c.1,
            c.2,
        );
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = exp(*v - max);
        sum += *v;
    }
    row.iter_mut().for_each(|v| *v /= sum);
}

/// [`gelu_erf`] of every value, eight at a time where the CPU has AVX2
/// (the same arithmetic, so the same results, as one at a time).
fn gelu_all(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::linear::fused() {
        // SAFETY: the CPU has AVX2 and FMA (`fused`).
        unsafe { gelu_wide(values) };
        return;
    }
    values.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_wide(values: &mut [f32]) {
    values.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

/// GELU as BERT defines it, `x · Φ(x) = x/2 · (1 + erf(x/√2))`, with erf
/// from Abramowitz and Stegun 7.1.26 (error below 1.5·10⁻⁷) over a
/// polynomial `exp`: plain arithmetic a loop over a row vectorises, where a
/// library `erf` costs as much as the layer's products.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let erf = 1.0 - poly * exp(-z * z);
    let erf = if x < 0.0 { -erf } else { erf };
    0.5 * x * (1.0 + erf)
}

/// `e^x` for `x ≤ 0` (GELU's and softmax's): `x = n·ln 2 + r` with
/// `|r| ≤ ln 2 / 2`, `e^r` by its Taylor polynomial to r⁷ (relative error
/// near 10⁻⁷), times `2^n` put in the exponent bits; below −87 it is 0.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.max(-87.0);
    // Rounded to the nearest integer by adding and taking away 1.5·2²³
    // (plain arithmetic, where `round` is a call without SSE4.1).
    const ROUND: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // ln 2 in two parts (Cody and Waite), so `r` keeps its precision.
    let r = (x - n * 0.693_359_4) + n * 2.121_944_4e-4;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_product_follows_the_strides() {
        // a = [[1,2],[3,4]], b = aᵀ read through strides.
        let a = [1.0, 2.0, 3.0, 4.0];
        let mut c = [1.0; 4];
        gemm((2, 2, 2), 1.0, (&a, 2, 1), (&a, 1, 2), 1.0, (&mut c, 2, 1));
        assert_eq!(c, [6.0, 12.0, 12.0, 26.0]);
    }

    #[test]
    fn softmax_and_gelu_are_the_textbook_ones() {
        let mut row = [0.0, (2.0f32).ln()];
        softmax(&mut row);
        assert!((row[0] - 1.0 / 3.0).abs() < 1e-6 && (row[1] - 2.0 / 3.0).abs() < 1e-6);
        // Against the library's erf, over where GELU's inputs lie.
        let mut x = -12.0f32;
        while x < 12.0 {
            let exact = 0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2));
            assert!((gelu_erf(x) - exact).abs() < 2e-6, "gelu({x})");
            let e = exp(-x.abs());
            assert!(
                (e - (-x.abs()).exp()).abs() <= 3e-7 * (-x.abs()).exp(),
                "exp(-{x})"
            );
            x += 0.01;
        }
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(exp(-200.0), (-87.0f32).exp());
    }
}
