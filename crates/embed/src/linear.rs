//! A dense layer, `y = x Wᵀ + b`, with its weights laid out once for the
//! product: columns of Wᵀ in panels of [`NR`] (each panel the whole depth,
//! contiguous), so a block of up to [`MR`] input rows times one panel is
//! summed in registers while the panel streams through once. Texts are a
//! few dozen tokens, too few rows for a general matrix product to pay for
//! re-packing the weights on every call.

/// Outputs per panel: two AVX registers of f32, or one AVX-512 register
/// of 32-bit sums.
const NR: usize = 16;
/// Input rows summed at once: 2 × MR accumulators, 2 weight loads and a
/// broadcast fit the 16 AVX registers.
const MR: usize = 6;
/// Input rows summed at once in bytes: one accumulator a row, the
/// panel's 64 bytes of a group of four inputs loaded once for all of them.
const MR_BYTES: usize = 8;

/// How a layer's weights are held and its products summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Half-precision weights widened in registers, every sum in f32
    /// (plain f32 where the CPU lacks AVX2, FMA and F16C): the vectors
    /// within 2·10⁻⁴ of an f32 forward pass.
    Half,
    /// Weights as signed bytes (one scale an output), each row of inputs
    /// as unsigned bytes (its own scale and zero point), summed exactly in
    /// 32-bit integers by AVX-512 VNNI: a fourth of the instructions of
    /// `Half` and half its bytes; a vector moves by about 1 % (its cosine
    /// to the exact one above 0.99, crates/embed/tests/reference.rs).
    Bytes,
}

impl Precision {
    /// `Bytes` where the CPU has AVX-512 VNNI, else `Half`.
    pub fn fastest() -> Precision {
        #[cfg(target_arch = "x86_64")]
        if vnni() {
            return Precision::Bytes;
        }
        Precision::Half
    }
}

pub struct Linear {
    /// Panel `p` holds, for each input `k`, the weights of outputs
    /// `p·NR .. p·NR+NR` (zero past the last output).
    panels: Panels,
    bias: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

/// The panels as the CPU reads them best. A text of a few words is too
/// few rows to reuse each weight much: its product streams the weights
/// from memory, so halving their bytes (IEEE half precision, widened to
/// f32 in registers, every sum in f32) nearly halves its time; the vectors
/// move by about 10⁻⁴ (crates/embed/tests/reference.rs).
enum Panels {
    /// Any CPU: plain f32 and the loop the compiler vectorises.
    Single(Vec<f32>),
    /// x86-64 with AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Half(Vec<u16>),
    /// x86-64 with AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    Bytes(Bytes),
}

/// A layer's weights as signed bytes: output `o`'s weight `k` is about
/// `scales[o] · q[o][k]`.
#[cfg(target_arch = "x86_64")]
struct Bytes {
    /// Panel `p` holds, for each group `g` of four inputs, the four
    /// weights `4g .. 4g+4` of each of its NR outputs in turn: the order
    /// VPDPBUSD sums a 32-bit lane's four byte products in.
    panels: Vec<i8>,
    /// Per output (zero past the last).
    scales: Vec<f32>,
    /// Per output, the sum of its bytes: what an input row's zero point
    /// adds to its products, taken off again.
    sums: Vec<i32>,
    /// The inputs rounded up to a group of four (the extra weights zero).
    depth: usize,
}

type Block = [[f32; NR]; MR];

impl Linear {
    /// A layer of `weight` (`outputs` rows of `inputs`, as PyTorch stores
    /// it) and `bias`, held in `precision` where the CPU can sum it so.
    pub fn new(
        weight: &[f32],
        bias: Vec<f32>,
        inputs: usize,
        outputs: usize,
        precision: Precision,
    ) -> Linear {
        assert_eq!(bias.len(), outputs);
        #[cfg(target_arch = "x86_64")]
        if precision == Precision::Bytes && vnni() {
            return Linear {
                panels: Panels::Bytes(Bytes::new(weight, inputs, outputs)),
                bias,
                inputs,
                outputs,
            };
        }
        let _ = precision;
        let panels = packed(weight, inputs, outputs);
        #[cfg(target_arch = "x86_64")]
        let panels = if fused() {
            // SAFETY: the CPU has F16C (`fused`).
            Panels::Half(unsafe { avx::to_half(&panels) })
        } else {
            Panels::Single(panels)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let panels = Panels::Single(panels);
        Linear {
            panels,
            bias,
            inputs,
            outputs,
        }
    }

    /// `x` (`n` rows of `inputs`) through the layer: `n` rows of `outputs`.
    pub fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        assert_eq!(x.len(), n * self.inputs);
        #[cfg(target_arch = "x86_64")]
        if let Panels::Bytes(bytes) = &self.panels {
            return self.apply_bytes(bytes, x, n);
        }
        let mut y = vec![0.0f32; n * self.outputs];
        for p in 0..self.outputs.div_ceil(NR) {
            let first = p * NR;
            let columns = NR.min(self.outputs - first);
            let mut row = 0;
            while row < n {
                let rows = MR.min(n - row);
                let mut sums: Block = [[0.0; NR]; MR];
                self.block(&x[row * self.inputs..], rows, p, &mut sums);
                for (i, sum) in sums.iter().take(rows).enumerate() {
                    let out = &mut y[(row + i) * self.outputs + first..][..columns];
                    for (c, v) in out.iter_mut().enumerate() {
                        *v = sum[c] + self.bias[first + c];
                    }
                }
                row += rows;
            }
        }
        y
    }

    /// [`Linear::apply`] with byte weights: each row of `x` to bytes, its
    /// products summed in integers, then scaled back and the bias added.
    #[cfg(target_arch = "x86_64")]
    fn apply_bytes(&self, w: &Bytes, x: &[f32], n: usize) -> Vec<f32> {
        let depth = w.depth;
        let mut q = vec![0u8; n * depth];
        let rows: Vec<(f32, i32)> = (x.chunks_exact(self.inputs))
            .zip(q.chunks_exact_mut(depth))
            // SAFETY: `Bytes` exists only where the CPU has AVX-512F.
            .map(|(row, out)| unsafe { avx::quantized(row, out) })
            .collect();
        let mut y = vec![0.0f32; n * self.outputs];
        let mut sums = [[0i32; NR]; MR_BYTES];
        for p in 0..self.outputs.div_ceil(NR) {
            let panel = &w.panels[p * depth * NR..(p + 1) * depth * NR];
            let first = p * NR;
            let columns = NR.min(self.outputs - first);
            let mut row = 0;
            while row < n {
                let count = MR_BYTES.min(n - row);
                let x = &q[row * depth..(row + count) * depth];
                // SAFETY: `Bytes` exists only where the CPU has AVX-512
                // VNNI; `x` is `count` rows of `depth` bytes and the panel
                // `depth × NR`, which is all it reads.
                unsafe {
                    match count {
                        1 => avx::bytes::<1>(x, depth, panel, &mut sums),
                        2 => avx::bytes::<2>(x, depth, panel, &mut sums),
                        3 => avx::bytes::<3>(x, depth, panel, &mut sums),
                        4 => avx::bytes::<4>(x, depth, panel, &mut sums),
                        5 => avx::bytes::<5>(x, depth, panel, &mut sums),
                        6 => avx::bytes::<6>(x, depth, panel, &mut sums),
                        7 => avx::bytes::<7>(x, depth, panel, &mut sums),
                        _ => avx::bytes::<8>(x, depth, panel, &mut sums),
                    }
                }
                let outputs = first..first + columns;
                let (bias, scales) = (&self.bias[outputs.clone()], &w.scales[outputs.clone()]);
                for (i, sum) in sums.iter().take(count).enumerate() {
                    let (scale, zero) = rows[row + i];
                    let out = &mut y[(row + i) * self.outputs + first..][..columns];
                    let parts = (out.iter_mut().zip(sum)).zip(w.sums[outputs.clone()].iter());
                    for (((v, sum), weights), (b, s)) in parts.zip(bias.iter().zip(scales)) {
                        *v = (sum - zero * weights) as f32 * (scale * s) + b;
                    }
                }
                row += count;
            }
        }
        y
    }

    /// The first `rows` rows of `x` times panel `p`, into `sums`.
    fn block(&self, x: &[f32], rows: usize, p: usize, sums: &mut Block) {
        assert!((1..=MR).contains(&rows) && x.len() >= rows * self.inputs);
        let depth = self.inputs * NR;
        match &self.panels {
            #[cfg(target_arch = "x86_64")]
            Panels::Half(panels) => {
                let panel = &panels[p * depth..(p + 1) * depth];
                // SAFETY: `Half` exists only where the CPU has AVX2, FMA
                // and F16C; the rows and the panel lie in their slices
                // (asserted and sliced above), which is all it reads.
                unsafe {
                    match rows {
                        1 => avx::block::<1>(x, self.inputs, panel, sums),
                        2 => avx::block::<2>(x, self.inputs, panel, sums),
                        3 => avx::block::<3>(x, self.inputs, panel, sums),
                        4 => avx::block::<4>(x, self.inputs, panel, sums),
                        5 => avx::block::<5>(x, self.inputs, panel, sums),
                        _ => avx::block::<6>(x, self.inputs, panel, sums),
                    }
                }
            }
            Panels::Single(panels) => {
                let panel = &panels[p * depth..(p + 1) * depth];
                for (i, sum) in sums.iter_mut().take(rows).enumerate() {
                    let x = &x[i * self.inputs..(i + 1) * self.inputs];
                    for (k, weights) in panel.chunks_exact(NR).enumerate() {
                        for c in 0..NR {
                            sum[c] += x[k] * weights[c];
                        }
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Panels::Bytes(_) => unreachable!("byte layers are applied by apply_bytes"),
        }
    }

    /// The layer with plain f32 panels, whatever the CPU has (tests).
    #[cfg(test)]
    fn single(weight: &[f32], bias: Vec<f32>, inputs: usize, outputs: usize) -> Linear {
        Linear {
            panels: Panels::Single(packed(weight, inputs, outputs)),
            bias,
            inputs,
            outputs,
        }
    }
}

/// `weight` (`outputs` rows of `inputs`) as panels (see [`Linear`]).
fn packed(weight: &[f32], inputs: usize, outputs: usize) -> Vec<f32> {
    assert_eq!(weight.len(), inputs * outputs);
    let mut panels = vec![0.0f32; outputs.div_ceil(NR) * inputs * NR];
    for (o, row) in weight.chunks_exact(inputs).enumerate() {
        let (p, c) = (o / NR, o % NR);
        let panel = &mut panels[p * inputs * NR..(p + 1) * inputs * NR];
        for (k, w) in row.iter().enumerate() {
            panel[k * NR + c] = *w;
        }
    }
    panels
}

#[cfg(target_arch = "x86_64")]
impl Bytes {
    fn new(weight: &[f32], inputs: usize, outputs: usize) -> Bytes {
        assert_eq!(weight.len(), inputs * outputs);
        let depth = inputs.div_ceil(4) * 4;
        let padded = outputs.div_ceil(NR) * NR;
        let mut panels = vec![0i8; padded * depth];
        let (mut scales, mut sums) = (vec![0.0f32; padded], vec![0i32; padded]);
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let largest = row.iter().fold(0.0f32, |m, w| m.max(w.abs()));
            let scale = if largest > 0.0 { largest / 127.0 } else { 1.0 };
            scales[o] = scale;
            let (p, c) = (o / NR, o % NR);
            let panel = &mut panels[p * depth * NR..(p + 1) * depth * NR];
            for (k, w) in row.iter().enumerate() {
                let q = (w / scale).round().clamp(-127.0, 127.0) as i8;
                panel[(k / 4) * NR * 4 + c * 4 + k % 4] = q;
                sums[o] += i32::from(q);
            }
        }
        Bytes {
            panels,
            scales,
            sums,
            depth,
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn fused() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx {
    use std::arch::x86_64::*;

    use super::{Block, MR_BYTES, NR};

    /// `values` in half precision (rounded to nearest); a multiple of 8.
    ///
    /// # Safety
    /// The CPU must have F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn to_half(values: &[f32]) -> Vec<u16> {
        assert_eq!(values.len() % 8, 0);
        let mut half = vec![0u16; values.len()];
        for (from, to) in values.chunks_exact(8).zip(half.chunks_exact_mut(8)) {
            // SAFETY: eight values read, eight written.
            unsafe {
                let v = _mm256_loadu_ps(from.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(to.as_mut_ptr().cast(), h);
            }
        }
        half
    }

    /// The dot product of `a` and `b` (of one length).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let mut sums = [_mm256_setzero_ps(); 4];
        let (a32, b32) = (a.chunks_exact(32), b.chunks_exact(32));
        let mut tail: f32 = (a32.remainder().iter())
            .zip(b32.remainder())
            .map(|(x, y)| x * y)
            .sum();
        for (x, y) in a32.zip(b32) {
            for (i, sum) in sums.iter_mut().enumerate() {
                // SAFETY: each chunk is 32 values: 8 read at 8·i, i < 4.
                unsafe {
                    let (x, y) = (x.as_ptr().add(8 * i), y.as_ptr().add(8 * i));
                    *sum = _mm256_fmadd_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y), *sum);
                }
            }
        }
        let mut lanes = [0.0f32; 8];
        let total = _mm256_add_ps(
            _mm256_add_ps(sums[0], sums[1]),
            _mm256_add_ps(sums[2], sums[3]),
        );
        // SAFETY: eight lanes written to eight values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
        tail += lanes.iter().sum::<f32>();
        tail
    }

    /// `R` rows of `x` (each `inputs` long) times `panel` (`inputs` × NR,
    /// half precision).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `x` must hold `R × inputs`
    /// values and `panel` `inputs × NR`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block<const R: usize>(x: &[f32], inputs: usize, panel: &[u16], sums: &mut Block) {
        let mut low = [_mm256_setzero_ps(); R];
        let mut high = [_mm256_setzero_ps(); R];
        let (x, w) = (x.as_ptr(), panel.as_ptr());
        for k in 0..inputs {
            // SAFETY: k < inputs, so k·NR + 15 < inputs·NR (the panel) and
            // i·inputs + k < R·inputs (the rows), as the caller promised.
            unsafe {
                let w0 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(k * NR).cast()));
                let w1 = _mm256_cvtph_ps(_mm_loadu_si128(w.add(k * NR + 8).cast()));
                for i in 0..R {
                    let v = _mm256_set1_ps(*x.add(i * inputs + k));
                    low[i] = _mm256_fmadd_ps(v, w0, low[i]);
                    high[i] = _mm256_fmadd_ps(v, w1, high[i]);
                }
            }
        }
        for i in 0..R {
            // SAFETY: each row of `sums` is NR = 16 values.
            unsafe {
                _mm256_storeu_ps(sums[i].as_mut_ptr(), low[i]);
                _mm256_storeu_ps(sums[i].as_mut_ptr().add(8), high[i]);
            }
        }
    }

    /// `row` as unsigned bytes into `out` (the rest of `out` zero): each
    /// value about `scale · (byte − zero)`, the scale spanning the row's
    /// values and zero, so zero itself is exact. Its `(scale, zero)`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn quantized(row: &[f32], out: &mut [u8]) -> (f32, i32) {
        assert!(out.len() >= row.len());
        out.fill(0);
        let (mut low, mut high) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let chunks = row.len().div_ceil(16);
        // The lanes of chunk `c` inside the row (all 16 but in the last).
        let lanes = |c: usize| -> __mmask16 {
            let left = row.len() - 16 * c;
            if left >= 16 {
                !0
            } else {
                (1u16 << left) - 1
            }
        };
        for c in 0..chunks {
            // SAFETY: the mask reads only lanes inside the row; the others
            // are zero, which the span includes anyway.
            let v = unsafe { _mm512_maskz_loadu_ps(lanes(c), row.as_ptr().add(16 * c)) };
            low = _mm512_min_ps(low, v);
            high = _mm512_max_ps(high, v);
        }
        let (low, high) = (_mm512_reduce_min_ps(low), _mm512_reduce_max_ps(high));
        let scale = (high - low) / 255.0;
        if !(scale > 0.0 && scale.is_finite()) {
            // All zero (or not numbers): every product is zero.
            return (0.0, 0);
        }
        let inverse = 1.0 / scale;
        let zero = (-low * inverse).round().clamp(0.0, 255.0);
        let (times, plus) = (_mm512_set1_ps(inverse), _mm512_set1_ps(zero));
        let (floor, ceiling) = (_mm512_setzero_si512(), _mm512_set1_epi32(255));
        for c in 0..chunks {
            // SAFETY: as above for the row; the store writes the same
            // lanes' bytes, inside `out` (as long as the row).
            unsafe {
                let v = _mm512_maskz_loadu_ps(lanes(c), row.as_ptr().add(16 * c));
                // Rounded to nearest (the default rounding mode).
                let q = _mm512_cvtps_epi32(_mm512_fmadd_ps(v, times, plus));
                let q = _mm512_min_epi32(_mm512_max_epi32(q, floor), ceiling);
                _mm512_mask_cvtepi32_storeu_epi8(out.as_mut_ptr().add(16 * c).cast(), lanes(c), q);
            }
        }
        (scale, zero as i32)
    }

    /// `R` rows of byte inputs `x` (each `depth` long, a multiple of 4)
    /// times a byte `panel` (`depth × NR`, in groups of four inputs): a
    /// row's four inputs broadcast to every lane, VPDPBUSD adds each
    /// output's four products to its 32-bit sum.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512 VNNI; `x` must hold
    /// `R × depth` bytes and `panel` `depth × NR`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn bytes<const R: usize>(
        x: &[u8],
        depth: usize,
        panel: &[i8],
        sums: &mut [[i32; NR]; MR_BYTES],
    ) {
        assert!(R <= MR_BYTES && depth.is_multiple_of(4));
        let mut acc = [_mm512_setzero_si512(); R];
        let (x, w) = (x.as_ptr(), panel.as_ptr());
        for g in 0..depth / 4 {
            // SAFETY: g < depth / 4, so the panel's bytes 64·g .. 64·g+64
            // lie in its depth·NR, and a row's 4·g .. 4·g+4 in its depth.
            unsafe {
                let weights = _mm512_loadu_si512(w.add(g * 4 * NR).cast());
                for (i, sum) in acc.iter_mut().enumerate() {
                    let four = x.add(i * depth + 4 * g).cast::<i32>().read_unaligned();
                    *sum = _mm512_dpbusd_epi32(*sum, _mm512_set1_epi32(four), weights);
                }
            }
        }
        for (i, sum) in acc.iter().enumerate() {
            // SAFETY: each row of `sums` is NR = 16 lanes of 32 bits.
            unsafe { _mm512_storeu_si512(sums[i].as_mut_ptr().cast(), *sum) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook product, to check the panels and kernels against.
    fn naive(x: &[f32], w: &[f32], b: &[f32], n: usize, inputs: usize) -> Vec<f32> {
        let outputs = b.len();
        let mut y = vec![0.0; n * outputs];
        for i in 0..n {
            for o in 0..outputs {
                let dot: f32 = (0..inputs)
                    .map(|k| x[i * inputs + k] * w[o * inputs + k])
                    .sum();
                y[i * outputs + o] = dot + b[o];
            }
        }
        y
    }

    #[test]
    fn every_shape_gives_the_textbook_product() {
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        // Every block height from 1 to MR is met (7 = 6 + 1, 13 = 2·6 + 1,
        // 20 = 3·6 + 2, and 3, 4, 5 alone).
        let shapes = [
            (1, 1, 1),
            (7, 5, 17),
            (13, 33, 40),
            (6, 16, 16),
            (20, 9, 3),
            (3, 8, 20),
            (4, 7, 33),
            (5, 12, 16),
            (10, 40, 48),
        ];
        for (n, inputs, outputs) in shapes {
            let x: Vec<f32> = (0..n * inputs).map(|_| next()).collect();
            let w: Vec<f32> = (0..inputs * outputs).map(|_| next()).collect();
            let b: Vec<f32> = (0..outputs).map(|_| next()).collect();
            let want = naive(&x, &w, &b, n, inputs);
            // Half-precision weights are off by up to 2⁻¹¹ of each. (On a
            // CPU without AVX2, FMA and F16C both layers are plain f32.)
            let single = Linear::single(&w, b.clone(), inputs, outputs);
            let half = Linear::new(&w, b.clone(), inputs, outputs, Precision::Half);
            // Bytes: each product off by up to half a step of each
            // factor's scale (1/255 of the inputs' span, 1/127 of the
            // largest weight's), about 0.004 here.
            let bytes = Linear::new(&w, b.clone(), inputs, outputs, Precision::Bytes);
            let layers = [
                (single, 1e-5),
                (half, 1e-3 * inputs as f32),
                (bytes, 5e-3 * inputs as f32),
            ];
            #[cfg(target_arch = "x86_64")]
            assert_eq!(
                matches!(layers[2].0.panels, Panels::Bytes(_)),
                vnni(),
                "byte panels wherever the CPU sums bytes"
            );
            for (layer, tolerance) in layers {
                let got = layer.apply(&x, n);
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() < tolerance,
                        "{n}×{inputs}→{outputs}: {g} vs {e}"
                    );
                }
            }
        }
    }

    /// Rows the byte inputs' scale and zero point must get right: all
    /// zero, all of one sign (after GELU most values are), one far larger
    /// than the rest (BERT's outlier features).
    #[test]
    fn rows_of_zeros_of_one_sign_and_with_an_outlier_keep_their_products() {
        let (inputs, outputs) = (24, 20);
        let w: Vec<f32> = (0..inputs * outputs)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 16.0)
            .collect();
        let b: Vec<f32> = (0..outputs).map(|o| o as f32 / 10.0).collect();
        let mut x = vec![0.0f32; inputs];
        x.extend((0..inputs).map(|k| 0.25 + k as f32 / 8.0));
        x.extend((0..inputs).map(|k| -0.5 - k as f32 / 16.0));
        x.extend((0..inputs).map(|k| if k == 5 { 40.0 } else { k as f32 / 24.0 - 0.5 }));
        let n = x.len() / inputs;
        let want = naive(&x, &w, &b, n, inputs);
        let got = Linear::new(&w, b.clone(), inputs, outputs, Precision::Bytes).apply(&x, n);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            // A zero row gives the bias exactly; the others are off by up
            // to half a step of each factor's scale in each product.
            let row = i / outputs;
            let span = x[row * inputs..(row + 1) * inputs]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()));
            let tolerance = if row == 0 {
                0.0
            } else {
                inputs as f32 * (span / 255.0 + 0.5 / 127.0 * span)
            };
            assert!((g - e).abs() <= tolerance, "row {row}: {g} vs {e}");
        }
    }
}
