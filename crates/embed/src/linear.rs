//! A dense layer, `y = x Wᵀ + b`, with its weights laid out once for the
//! product: columns of Wᵀ in panels of [`NR`] (each panel the whole depth,
//! contiguous), so a block of up to [`MR`] input rows times one panel is
//! summed in registers while the panel streams through once. Texts are a
//! few dozen tokens, too few rows for a general matrix product to pay for
//! re-packing the weights on every call.

/// Outputs per panel: two AVX registers of f32.
const NR: usize = 16;
/// Input rows summed at once: 2 × MR accumulators, 2 weight loads and a
/// broadcast fit the 16 AVX registers.
const MR: usize = 6;

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
}

type Block = [[f32; NR]; MR];

impl Linear {
    /// A layer of `weight` (`outputs` rows of `inputs`, as PyTorch stores
    /// it) and `bias`.
    pub fn new(weight: &[f32], bias: Vec<f32>, inputs: usize, outputs: usize) -> Linear {
        assert_eq!(bias.len(), outputs);
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
pub(crate) fn fused() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx {
    use std::arch::x86_64::*;

    use super::{Block, NR};

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
        ];
        for (n, inputs, outputs) in shapes {
            let x: Vec<f32> = (0..n * inputs).map(|_| next()).collect();
            let w: Vec<f32> = (0..inputs * outputs).map(|_| next()).collect();
            let b: Vec<f32> = (0..outputs).map(|_| next()).collect();
            let want = naive(&x, &w, &b, n, inputs);
            // Half-precision weights are off by up to 2⁻¹¹ of each. (On a
            // CPU without AVX2, FMA and F16C both layers are plain f32.)
            let single = Linear::single(&w, b.clone(), inputs, outputs);
            let fast = Linear::new(&w, b.clone(), inputs, outputs);
            for (layer, tolerance) in [(single, 1e-5), (fast, 1e-3 * inputs as f32)] {
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
}
