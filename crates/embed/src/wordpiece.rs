//! BERT's tokenizer: the text normalised (control characters dropped, white
//! space made spaces, CJK ideographs set apart, accents stripped and letters
//! lowercased for an uncased model), split at white space and at every
//! punctuation character, and each word cut into the longest pieces the
//! vocabulary has, greedily from the left (`##` marks a piece that continues
//! a word). The same steps as the reference implementation (Hugging Face's
//! `BertNormalizer`, `BertPreTokenizer` and `WordPiece`), so a model sees
//! the ids it was trained on.

use std::collections::HashMap;

use unicode_general_category::{get_general_category, GeneralCategory as G};
use unicode_normalization::UnicodeNormalization;

/// A word longer than this (in characters) is one unknown token.
const MAX_WORD_CHARS: usize = 100;

pub struct WordPiece {
    ids: HashMap<String, u32>,
    unknown: u32,
    pub(crate) cls: u32,
    pub(crate) sep: u32,
    lowercase: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    #[error("the vocabulary has no {0} token")]
    Missing(&'static str),
    #[error("the vocabulary is empty")]
    Empty,
}

impl WordPiece {
    /// A tokenizer of `vocab` (`vocab.txt`: one token a line, its id the
    /// line's number from 0).
    pub fn new(vocab: &str, lowercase: bool) -> Result<WordPiece, VocabError> {
        let ids: HashMap<String, u32> = (vocab.lines())
            .enumerate()
            .map(|(id, token)| (token.trim_end_matches('\r').to_string(), id as u32))
            .collect();
        if ids.is_empty() {
            return Err(VocabError::Empty);
        }
        let special = |name: &'static str| ids.get(name).copied().ok_or(VocabError::Missing(name));
        Ok(WordPiece {
            unknown: special("[UNK]")?,
            cls: special("[CLS]")?,
            sep: special("[SEP]")?,
            ids,
            lowercase,
        })
    }

    /// The ids of `text` between `[CLS]` and `[SEP]`, at most `max` in all
    /// (what does not fit is cut off).
    pub fn encode(&self, text: &str, max: usize) -> Vec<u32> {
        let mut ids = vec![self.cls];
        let room = max.saturating_sub(2);
        'words: for word in words(&self.normalize(text)) {
            for id in self.pieces(&word) {
                if ids.len() > room {
                    break 'words;
                }
                ids.push(id);
            }
        }
        ids.push(self.sep);
        ids
    }

    fn normalize(&self, text: &str) -> String {
        let mut clean = String::with_capacity(text.len());
        for c in text.chars() {
            if c == '\0' || c == '\u{fffd}' || is_control(c) {
                continue;
            }
            if is_whitespace(c) {
                clean.push(' ');
            } else if is_cjk(c) {
                clean.push(' ');
                clean.push(c);
                clean.push(' ');
            } else {
                clean.push(c);
            }
        }
        if !self.lowercase {
            return clean;
        }
        (clean.nfd())
            .filter(|c| get_general_category(*c) != G::NonspacingMark)
            .flat_map(char::to_lowercase)
            .collect()
    }

    /// `word`'s pieces, longest first from the left; one unknown token if
    /// some part of it is in no piece.
    fn pieces(&self, word: &str) -> Vec<u32> {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > MAX_WORD_CHARS {
            return vec![self.unknown];
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut candidate = String::new();
        while start < chars.len() {
            let mut end = chars.len();
            let found = loop {
                if end == start {
                    break None;
                }
                candidate.clear();
                if start > 0 {
                    candidate.push_str("##");
                }
                let to = chars.get(end).map_or(word.len(), |(at, _)| *at);
                candidate.push_str(&word[chars[start].0..to]);
                if let Some(id) = self.ids.get(&candidate) {
                    break Some(*id);
                }
                end -= 1;
            };
            match found {
                Some(id) => pieces.push(id),
                None => return vec![self.unknown],
            }
            start = end;
        }
        pieces
    }
}

/// The words of normalised text: split at spaces, each punctuation
/// character a word of its own.
fn words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c == ' ' || is_punctuation(c) {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            if c != ' ' {
                words.push(c.to_string());
            }
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r')
        && matches!(
            get_general_category(c),
            G::Control | G::Format | G::Surrogate | G::PrivateUse | G::Unassigned
        )
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(
            get_general_category(c),
            G::ConnectorPunctuation
                | G::DashPunctuation
                | G::OpenPunctuation
                | G::ClosePunctuation
                | G::InitialPunctuation
                | G::FinalPunctuation
                | G::OtherPunctuation
        )
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: &str =
        "[PAD]\n[UNK]\n[CLS]\n[SEP]\nun\n##aff\n##able\nrun\n##ning\n,\n!\ncafe\n中\n";

    #[test]
    fn words_are_cut_into_the_longest_pieces_the_vocabulary_has() {
        let t = WordPiece::new(VOCAB, true).unwrap();
        assert_eq!(
            t.encode("UnAffable running!", 64),
            [2, 4, 5, 6, 7, 8, 10, 3]
        );
        // Accents stripped, punctuation its own word, control characters gone.
        assert_eq!(t.encode("Café,\u{7}中x", 64), [2, 11, 9, 12, 1, 3]);
        // A word with a part no piece covers is one unknown token.
        assert_eq!(t.encode("unaffablex", 64), [2, 1, 3]);
        // Cut off to fit, [SEP] kept.
        assert_eq!(t.encode("run run run run", 4), [2, 7, 7, 3]);
        assert_eq!(t.encode("", 8), [2, 3]);
    }

    #[test]
    fn a_cased_model_keeps_case_and_accents() {
        let t = WordPiece::new(VOCAB, false).unwrap();
        assert_eq!(t.encode("Run run", 8), [2, 1, 7, 3]);
    }

    #[test]
    fn a_vocabulary_without_its_special_tokens_is_refused() {
        let e = WordPiece::new("[PAD]\n[UNK]\n", true).err().unwrap();
        assert_eq!(e.to_string(), "the vocabulary has no [CLS] token");
    }
}
