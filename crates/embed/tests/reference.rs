//! The encoder against an independent reference: Hugging Face's tokenizer
//! and a numpy forward pass of the same model (benches/search/reference.py
//! wrote benches/search/reference.json). Needs the model `make model`
//! fetches.

use std::path::PathBuf;

use bundlevisor_embed::{dot, Encoder, LoadError, Precision};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> Encoder {
    let folder = root().join("target/models/all-minilm-l6-v2");
    Encoder::load(&folder).unwrap_or_else(|e| panic!("{e} (run `make model` first)"))
}

fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("benches/search/reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn every_text_is_tokenized_as_the_reference_tokenizer_does() {
    let encoder = model();
    let reference = reference();
    let tokens = reference["tokens"].as_array().unwrap();
    assert!(tokens.len() > 400);
    let mut wrong = Vec::new();
    for entry in tokens {
        let text = entry["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(entry["ids"].clone()).unwrap();
        let got = encoder.token_ids(text);
        if got != want {
            wrong.push(format!("{text:?}\n  got  {got:?}\n  want {want:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `encoder`'s vectors against the reference's: each value within
/// `tolerance`, each vector's cosine to the reference's at least `cosine`.
fn matches_the_reference(encoder: &Encoder, tolerance: f32, cosine: f32) {
    assert_eq!(encoder.dimensions(), 384);
    assert_eq!(encoder.max_tokens(), 256);
    let reference = reference();
    let mut vectors = Vec::new();
    for entry in reference["embeddings"].as_array().unwrap() {
        let text = entry["text"].as_str().unwrap();
        let want: Vec<f32> = serde_json::from_value(entry["vector"].clone()).unwrap();
        let got = encoder.embed(text);
        let worst = (got.iter().zip(&want))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let shown: String = text.chars().take(40).collect();
        let near = dot(&got, &want);
        println!("{shown:?}: off by up to {worst:.1e}, cosine {near:.5}");
        assert!(worst < tolerance, "{text:?}: off by up to {worst}");
        assert!(near >= cosine, "{text:?}: cosine {near}");
        assert!((dot(&got, &got) - 1.0).abs() < 1e-5, "unit length");
        vectors.push(got);
    }
    // What the vectors are for: like sentences near, unlike ones apart.
    let eating = encoder.embed("A man is eating a piece of bread.");
    let n = vectors.len();
    let (food, movie) = (&vectors[n - 2], &vectors[n - 1]);
    assert!(dot(&eating, food) > 0.7, "{}", dot(&eating, food));
    assert!(dot(&eating, movie) < 0.1, "{}", dot(&eating, movie));
}

#[test]
fn half_precision_vectors_match_the_reference_forward_pass() {
    let folder = root().join("target/models/all-minilm-l6-v2");
    let encoder = Encoder::load_with(&folder, Precision::Half).unwrap();
    matches_the_reference(&encoder, 2e-4, 0.99999);
}

/// What the daemon runs: bytes where the CPU has AVX-512 VNNI, else half
/// precision. Each layer's inputs and weights rounded to 8 bits moves a
/// text's vector to a cosine of 0.998–0.999 with the exact one; the text
/// of no words ([CLS] and [SEP] alone, nothing to average the rounding
/// over) moves most, to 0.9935.
#[test]
fn the_fastest_vectors_stay_next_to_the_reference_forward_pass() {
    matches_the_reference(&model(), 2.5e-2, 0.99);
}

#[test]
fn a_folder_that_is_not_a_model_is_refused_with_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("embed-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = Encoder::load(&dir).err().unwrap();
    assert!(matches!(e, LoadError::Read { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
    let real = root().join("target/models/all-minilm-l6-v2");
    for file in ["config.json", "vocab.txt"] {
        std::fs::copy(real.join(file), dir.join(file)).unwrap();
    }
    std::fs::write(dir.join("model.safetensors"), b"not tensors").unwrap();
    let e = Encoder::load(&dir).err().unwrap().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("not a safetensors file"),
        "{e}"
    );
    let config = std::fs::read_to_string(real.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"gelu\"", "\"relu\""),
    )
    .unwrap();
    let e = Encoder::load(&dir).err().unwrap().to_string();
    assert!(e.contains("hidden_act \"relu\""), "{e}");
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"bert\"", "\"distilbert\""),
    )
    .unwrap();
    let e = Encoder::load(&dir).err().unwrap().to_string();
    assert!(
        e.contains("model_type \"distilbert\" (only \"bert\""),
        "{e}"
    );
    std::fs::write(dir.join("config.json"), &config).unwrap();
    std::fs::write(
        dir.join("modules.json"),
        r#"[{"type": "sentence_transformers.models.Transformer"}, {"type": "sentence_transformers.models.Dense"}]"#,
    )
    .unwrap();
    let e = Encoder::load(&dir).err().unwrap().to_string();
    assert!(
        e.contains("a sentence_transformers.models.Dense module"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
