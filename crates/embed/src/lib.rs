//! Sentence embeddings from a local sentence-transformers model of the BERT
//! family (such as `all-MiniLM-L6-v2`): the folder sentence-transformers
//! saves, read from disk, nothing fetched. A text becomes unit-length
//! vector (the mean of the encoder's last hidden states), so the dot product
//! of two is their cosine similarity.
//!
//! What is read from the folder: `config.json` (the architecture),
//! `model.safetensors` (F32 weights), `vocab.txt`, and where present
//! `tokenizer_config.json` (`do_lower_case`), `sentence_bert_config.json`
//! (`max_seq_length`) and `1_Pooling/config.json` (which must pool by the
//! mean: other poolings are refused, not approximated).

mod bert;
mod linear;
mod tensors;
mod wordpiece;

use std::path::{Path, PathBuf};

use bert::{Bert, Config};
use tensors::Tensors;
use wordpiece::WordPiece;

pub use linear::Precision;
pub use tensors::TensorError;
pub use wordpiece::VocabError;

/// A model, loaded: turns text into vectors.
pub struct Encoder {
    bert: Bert,
    tokenizer: WordPiece,
    max_tokens: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path} is not valid: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: {error}")]
    Tensors { path: PathBuf, error: TensorError },
    #[error("{path}: {error}")]
    Vocab { path: PathBuf, error: VocabError },
    #[error("the model is not one this encoder runs: {0}")]
    Unsupported(String),
}

#[derive(serde::Deserialize)]
struct TokenizerConfig {
    #[serde(default = "yes")]
    do_lower_case: bool,
}

#[derive(serde::Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

#[derive(serde::Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(serde::Deserialize)]
struct Pooling {
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

fn yes() -> bool {
    true
}

impl Encoder {
    /// The model in `folder` (see the crate doc for what it must hold),
    /// its products in the CPU's fastest [`Precision`].
    pub fn load(folder: &Path) -> Result<Encoder, LoadError> {
        Encoder::load_with(folder, Precision::fastest())
    }

    /// The model in `folder`, its products in `precision` where the CPU
    /// can sum them so (else in half precision).
    pub fn load_with(folder: &Path, precision: Precision) -> Result<Encoder, LoadError> {
        let read = |name: &str| -> Result<Vec<u8>, LoadError> {
            let path = folder.join(name);
            std::fs::read(&path).map_err(|error| LoadError::Read { path, error })
        };
        let json = |name: &str| -> Result<Option<serde_json::Value>, LoadError> {
            let path = folder.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|error| LoadError::Json { path, error }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(LoadError::Read { path, error }),
            }
        };
        fn parse<T: serde::de::DeserializeOwned>(
            folder: &Path,
            name: &str,
            value: serde_json::Value,
        ) -> Result<T, LoadError> {
            serde_json::from_value(value).map_err(|error| LoadError::Json {
                path: folder.join(name),
                error,
            })
        }
        let config: Config = match json("config.json")? {
            Some(v) => {
                // Another architecture's fields are not BERT's: say which.
                let kind = v.get("model_type").and_then(|t| t.as_str());
                if let Some(kind) = kind.filter(|t| *t != "bert") {
                    return Err(LoadError::Unsupported(format!(
                        "config.json: model_type {kind:?} (only \"bert\" models are run)"
                    )));
                }
                parse(folder, "config.json", v)?
            }
            None => {
                return Err(LoadError::Read {
                    path: folder.join("config.json"),
                    error: std::io::ErrorKind::NotFound.into(),
                })
            }
        };
        check(&config)?;
        let lowercase = match json("tokenizer_config.json")? {
            Some(v) => parse::<TokenizerConfig>(folder, "tokenizer_config.json", v)?.do_lower_case,
            None => true,
        };
        let mut max_tokens = config.max_position_embeddings;
        if let Some(v) = json("sentence_bert_config.json")? {
            let sentence: SentenceConfig = parse(folder, "sentence_bert_config.json", v)?;
            max_tokens = max_tokens.min(sentence.max_seq_length.unwrap_or(max_tokens));
        }
        if let Some(v) = json("modules.json")? {
            let modules: Vec<Module> = parse(folder, "modules.json", v)?;
            let known = ["Transformer", "Pooling", "Normalize"]
                .map(|m| format!("sentence_transformers.models.{m}"));
            if let Some(other) = modules.iter().find(|m| !known.contains(&m.kind)) {
                return Err(LoadError::Unsupported(format!(
                    "modules.json has a {} module (only Transformer, Pooling and Normalize are run)",
                    other.kind
                )));
            }
        }
        if let Some(v) = json("1_Pooling/config.json")? {
            let pooling: Pooling = parse(folder, "1_Pooling/config.json", v)?;
            if !pooling.pooling_mode_mean_tokens {
                return Err(LoadError::Unsupported(
                    "1_Pooling/config.json pools otherwise than by the mean".into(),
                ));
            }
        }
        let vocab = String::from_utf8_lossy(&read("vocab.txt")?).into_owned();
        let tokenizer = WordPiece::new(&vocab, lowercase).map_err(|error| LoadError::Vocab {
            path: folder.join("vocab.txt"),
            error,
        })?;
        if vocab.lines().count() > config.vocab_size {
            return Err(LoadError::Unsupported(format!(
                "vocab.txt has more tokens than the model's vocab_size {}",
                config.vocab_size
            )));
        }
        let path = folder.join("model.safetensors");
        let tensors =
            Tensors::parse(read("model.safetensors")?).map_err(|error| LoadError::Tensors {
                path: path.clone(),
                error,
            })?;
        let bert = Bert::load(config, &tensors, precision)
            .map_err(|error| LoadError::Tensors { path, error })?;
        Ok(Encoder {
            bert,
            tokenizer,
            max_tokens,
        })
    }

    /// `text` as a unit vector of [`Encoder::dimensions`] values. Text past
    /// the model's longest sequence is not read.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let ids = self.token_ids(text);
        let states = self.bert.forward(&ids);
        let h = self.bert.hidden_size();
        let mut mean = vec![0.0f32; h];
        for row in states.chunks_exact(h) {
            mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
        }
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        mean.iter_mut().for_each(|v| *v /= norm);
        mean
    }

    /// The token ids the model reads of `text`, `[CLS]` and `[SEP]`
    /// included.
    pub fn token_ids(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, self.max_tokens)
    }

    /// How many values a vector has.
    pub fn dimensions(&self) -> usize {
        self.bert.hidden_size()
    }

    /// How many tokens of a text are read (with `[CLS]` and `[SEP]`).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
}

/// The dot product of two vectors of one length (their cosine, for
/// [`Encoder::embed`]'s).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if linear::fused() {
        // SAFETY: the CPU has AVX2 and FMA (`fused`).
        return unsafe { linear::avx::dot(a, b) };
    }
    // Eight running sums, so the loop vectorises.
    let mut sums = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = (a8.remainder().iter())
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            sums[i] += x[i] * y[i];
        }
    }
    sums.iter().sum::<f32>() + tail
}

fn check(config: &Config) -> Result<(), LoadError> {
    let refuse = |why: String| Err(LoadError::Unsupported(why));
    if config.hidden_act != "gelu" {
        return refuse(format!(
            "hidden_act {:?} (only \"gelu\" is run)",
            config.hidden_act
        ));
    }
    if config.hidden_size == 0
        || config.num_attention_heads == 0
        || !config
            .hidden_size
            .is_multiple_of(config.num_attention_heads)
    {
        return refuse(format!(
            "hidden_size {} is not a positive multiple of num_attention_heads {}",
            config.hidden_size, config.num_attention_heads
        ));
    }
    if config.max_position_embeddings < 2 || config.type_vocab_size == 0 {
        return refuse("max_position_embeddings below 2 or no token types".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_products_of_every_length_are_right() {
        for n in [0, 1, 7, 8, 31, 32, 33, 384, 385] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
            let want: f64 = (a.iter().zip(&b))
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = super::dot(&a, &b);
            assert!(
                (f64::from(got) - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{n}: {got} vs {want}"
            );
        }
    }
}
