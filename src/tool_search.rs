//! Search over a workspace's tools, for agents that find tools by what they
//! want done instead of reading every tool's schema (the gateway's
//! `discovery = "search"`, docs/gateway.md). Ranking is `tantivy`'s BM25
//! over each tool's name, its bundle's name, its description and its
//! parameters' names and descriptions, in an index held in memory; names
//! are split at `_`, `-`, `.` and camelCase humps (and kept whole; in a
//! query, a capitalised name such as `GitHub` is not split), words are stemmed
//! (English) and stop words dropped, the same way for tools and queries.
//!
//! With a sentence-embedding model (`[search] model`, [`ToolIndex::with_encoder`])
//! each tool is also a vector of what its name and description mean, and a
//! query's nearest tools by cosine are fused with the BM25 ranking by
//! reciprocal rank fusion: an agent's words need not be the tool's. A tool
//! is embedded once per text, off the searching path
//! ([`ToolIndex::embed_pending`]); until it is, it ranks by its words alone.
//!
//! One index per workspace, kept in step with the bundles by [`ToolIndex::sync`]:
//! a bundle whose tools changed (another fingerprint) is re-indexed, one
//! gone is dropped. Nothing here reaches the network.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bundlevisor_embed::Encoder;

use rmcp::model::Tool;
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, BoostQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, STORED, STRING,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

/// The analyzer every searched field and every query goes through.
const ANALYZER: &str = "tools";

/// How much a match in each field counts (BM25 scores are multiplied):
/// a tool's name says most of what it does, its bundle names the product.
const BOOSTS: [(FieldKind, f32); 4] = [
    (FieldKind::Name, 1.0),
    (FieldKind::Bundle, 1.0),
    (FieldKind::Description, 1.0),
    (FieldKind::Params, 1.0),
];

/// How much of a query is read: what an agent says it wants done is a
/// sentence, not a document.
const MAX_QUERY_BYTES: usize = 1024;
const MAX_QUERY_WORDS: usize = 64;

/// Candidates looked at per hit asked for: hits the caller may not see
/// (another profile's, a refused tool) are skipped, not counted.
const OVERFETCH: usize = 8;

/// Reciprocal rank fusion of the two rankings: a tool's score is
/// `Σ weight / (RRF_K + rank)` over the rankings it is in (rank from 1),
/// over each ranking's first [`FUSED`] tools the caller may see. The
/// constants were chosen on half of benches/search's queries and measured
/// on the other half (docs/performance.md, "Tool search").
const RRF_K: f32 = 5.0;
const BM25_WEIGHT: f32 = 0.5;
const FUSED: usize = 50;

/// The least cosine of a tool found by meaning. With the model `make
/// model` fetches, the benchmark's expected tools score 0.02 to 0.83 (one
/// in twenty below 0.17) and the best tool for a query no tool answers
/// ("play some jazz music") 0.14 to 0.22: no floor tells them apart. This
/// one only leaves out what is plainly unrelated, and costs the fused
/// ranking none of the benchmark's hits (BM25 still finds those).
const MIN_SIMILARITY: f32 = 0.1;

#[derive(Clone, Copy)]
enum FieldKind {
    Name,
    Bundle,
    Description,
    Params,
}

struct Fields {
    /// The bundle's name as one term: what a bundle's re-index deletes by.
    bundle_key: Field,
    /// The tool's own name, as stored (returned with a hit).
    tool: Field,
    name: Field,
    bundle: Field,
    description: Field,
    params: Field,
}

impl Fields {
    fn of(&self, kind: FieldKind) -> Field {
        match kind {
            FieldKind::Name => self.name,
            FieldKind::Bundle => self.bundle,
            FieldKind::Description => self.description,
            FieldKind::Params => self.params,
        }
    }
}

/// A tool found: its bundle, its own name, and how well it matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub bundle: String,
    pub tool: String,
    pub score: f32,
}

/// A workspace's tools, searchable (see the module doc).
pub struct ToolIndex {
    reader: IndexReader,
    fields: Fields,
    analyzer: TextAnalyzer,
    state: Mutex<State>,
    encoder: Option<Arc<Encoder>>,
    /// Whether a thread is in [`ToolIndex::embed_pending`].
    embedding: AtomicBool,
    /// Set by [`ToolIndex::stop`]: embedding ends after the text at hand.
    stopped: AtomicBool,
}

/// Vectors of texts no tool has any more, kept this many at most: a
/// bundle that restarts (out of the index while it is not ready) or goes
/// back a version is not embedded again.
const RETIRED: usize = 4096;

struct State {
    writer: IndexWriter,
    /// Each indexed bundle's fingerprint ([`fingerprint`]).
    indexed: HashMap<String, u64>,
    /// Each indexed bundle's tools, with the keys of the texts they are
    /// embedded by (only with an encoder; see [`views`]).
    meanings: HashMap<String, Vec<(String, Vec<u64>)>>,
    /// Vectors by text key, shared by tools of the same text.
    vectors: HashMap<u64, Arc<[f32]>>,
    /// Vectors no tool has any more, by text key (at most [`RETIRED`]).
    retired: HashMap<u64, Arc<[f32]>>,
    /// Bumped by every change of `meanings` or `vectors`.
    generation: u64,
    /// Texts still to embed, by key, in the order they came.
    pending: VecDeque<(u64, String)>,
    /// The embedded tools laid out for a scan; `None` after a change.
    flat: Option<Arc<Flat>>,
}

/// The embedded tools laid out for a scan: every distinct vector one
/// after another, and each tool with the rows of its texts (a tool of
/// one text, or one embedded so far, names its row twice).
struct Flat {
    matrix: Vec<f32>,
    tools: Vec<(String, String, [usize; 2])>,
}

#[derive(Debug, thiserror::Error)]
#[error("the tool index failed: {0}")]
pub struct SearchError(#[from] tantivy::TantivyError);

fn analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(StopWordFilter::new(Language::English).expect("English stop words"))
        .filter(Stemmer::new(Language::English))
        .build()
}

impl ToolIndex {
    pub fn new() -> Result<ToolIndex, SearchError> {
        let mut schema = Schema::builder();
        let text = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(ANALYZER)
                .set_index_option(IndexRecordOption::WithFreqs),
        );
        let fields = Fields {
            bundle_key: schema.add_text_field("bundle_key", STRING | STORED),
            tool: schema.add_text_field("tool", STORED),
            name: schema.add_text_field("name", text.clone()),
            bundle: schema.add_text_field("bundle", text.clone()),
            description: schema.add_text_field("description", text.clone()),
            params: schema.add_text_field("params", text),
        };
        let index = Index::create_in_ram(schema.build());
        index.tokenizers().register(ANALYZER, analyzer());
        // One indexing thread with the smallest budget: tool lists are small.
        let writer = index.writer_with_num_threads(1, 15_000_000)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(ToolIndex {
            reader,
            fields,
            analyzer: analyzer(),
            state: Mutex::new(State {
                writer,
                indexed: HashMap::new(),
                meanings: HashMap::new(),
                vectors: HashMap::new(),
                retired: HashMap::new(),
                generation: 0,
                pending: VecDeque::new(),
                flat: None,
            }),
            encoder: None,
            embedding: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        })
    }

    /// An index that also ranks by meaning, with `encoder`'s vectors.
    pub fn with_encoder(encoder: Arc<Encoder>) -> Result<ToolIndex, SearchError> {
        let mut index = ToolIndex::new()?;
        index.encoder = Some(encoder);
        Ok(index)
    }

    /// How many tools wait to be embedded (0 without an encoder).
    pub fn pending(&self) -> usize {
        self.lock().pending.len()
    }

    /// Ends embedding for good, after the text at hand (the daemon
    /// stopping: it waits for its blocking work).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Embeds the tools waiting for it, one at a time and outside the
    /// index's lock (searches go on meanwhile, by words); returns at once
    /// when another thread is at it. Slow work: call it off the async
    /// runtime.
    pub fn embed_pending(&self) {
        let Some(encoder) = &self.encoder else {
            return;
        };
        loop {
            if self.embedding.swap(true, Ordering::AcqRel) {
                return;
            }
            // The flag is lowered however this ends, a panic included.
            struct Lowered<'a>(&'a AtomicBool);
            impl Drop for Lowered<'_> {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let lowered = Lowered(&self.embedding);
            while !self.stopped.load(Ordering::Acquire) {
                let Some((key, text)) = self.lock().pending.pop_front() else {
                    break;
                };
                let vector: Arc<[f32]> = encoder.embed(&text).into();
                let mut state = self.lock();
                // Kept only if a tool still has this text.
                if (state.meanings.values().flatten()).any(|(_, keys)| keys.contains(&key)) {
                    state.vectors.insert(key, vector);
                    state.changed();
                }
            }
            drop(lowered);
            // A text queued after the last look is not left behind.
            if self.stopped.load(Ordering::Acquire) || self.pending() == 0 {
                return;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the index in step with `bundles` (each bundle's name and
    /// tools): a bundle whose tools changed is indexed again, one not
    /// listed any more is dropped. Cheap when nothing changed (each list is
    /// fingerprinted, nothing is written).
    pub fn sync<'a>(
        &self,
        bundles: impl IntoIterator<Item = (&'a str, &'a [Tool])>,
    ) -> Result<(), SearchError> {
        let mut state = self.lock();
        let mut seen = std::collections::HashSet::new();
        // The fingerprints take effect once the changes are committed: a
        // failed sync is done again by the next one.
        let mut indexed = state.indexed.clone();
        let mut meanings = state.meanings.clone();
        let mut texts = HashMap::new();
        let mut changed = false;
        let written = (|| -> Result<(), SearchError> {
            for (bundle, tools) in bundles {
                seen.insert(bundle.to_string());
                let print = fingerprint(tools);
                if indexed.get(bundle) == Some(&print) {
                    continue;
                }
                state.writer.delete_term(self.bundle_term(bundle));
                for tool in tools {
                    state.writer.add_document(self.document(bundle, tool))?;
                }
                indexed.insert(bundle.to_string(), print);
                if self.encoder.is_some() {
                    meanings.insert(bundle.to_string(), meanings_of(bundle, tools, &mut texts));
                }
                changed = true;
            }
            let gone: Vec<String> = (indexed.keys())
                .filter(|b| !seen.contains(*b))
                .cloned()
                .collect();
            for bundle in gone {
                state.writer.delete_term(self.bundle_term(&bundle));
                indexed.remove(&bundle);
                meanings.remove(&bundle);
                changed = true;
            }
            if changed {
                state.writer.commit()?;
                self.reader.reload()?;
            }
            Ok(())
        })();
        match written {
            Ok(()) => {
                state.indexed = indexed;
                if changed {
                    state.meanings = meanings;
                    state.queue(texts);
                    state.changed();
                }
            }
            Err(e) => {
                let _ = state.writer.rollback();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether [`ToolIndex::sync`] of `bundles` would change anything
    /// (fingerprints only: cheap, nothing is written).
    pub fn stale<'a>(&self, bundles: impl IntoIterator<Item = (&'a str, &'a [Tool])>) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut listed = 0;
        for (bundle, tools) in bundles {
            listed += 1;
            if state.indexed.get(bundle) != Some(&fingerprint(tools)) {
                return true;
            }
        }
        listed != state.indexed.len()
    }

    /// The `limit` best tools for `query` among those `visible` admits
    /// (bundle, tool), best first: by BM25, fused with the ranking by
    /// meaning when there is an encoder and embedded tools. A query with no
    /// searchable word (only stop words, say) finds nothing.
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        visible: impl Fn(&str, &str) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        let words = self.words(query);
        if words.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let Some(meant) = self.ranked_by_meaning(query, FUSED.max(limit), &visible) else {
            return self.ranked_by_words(&words, limit, &visible);
        };
        let worded = self.ranked_by_words(&words, FUSED.max(limit), &visible)?;
        let mut fused: HashMap<(String, String), f32> = HashMap::new();
        for (ranking, weight) in [(meant, 1.0), (worded, BM25_WEIGHT)] {
            for (rank, hit) in ranking.into_iter().enumerate() {
                *fused.entry((hit.bundle, hit.tool)).or_default() +=
                    weight / (RRF_K + rank as f32 + 1.0);
            }
        }
        let mut hits: Vec<Hit> = (fused.into_iter())
            .map(|((bundle, tool), score)| Hit {
                bundle,
                tool,
                score,
            })
            .collect();
        hits.sort_by(|a, b| {
            (b.score.total_cmp(&a.score))
                .then_with(|| (&a.bundle, &a.tool).cmp(&(&b.bundle, &b.tool)))
        });
        hits.truncate(limit);
        Ok(hits)
    }

    /// The `wanted` visible tools nearest `query` by meaning, none below
    /// [`MIN_SIMILARITY`]; `None` without an encoder, or while tools are
    /// being embedded (a ranking of some tools by meaning and the others
    /// by words would favour the first).
    fn ranked_by_meaning(
        &self,
        query: &str,
        wanted: usize,
        visible: &impl Fn(&str, &str) -> bool,
    ) -> Option<Vec<Hit>> {
        let encoder = self.encoder.as_ref()?;
        if self.pending() > 0 || self.embedding.load(Ordering::Acquire) {
            return None;
        }
        let flat = self.flat();
        if flat.tools.is_empty() {
            return None;
        }
        let query = encoder.embed(capped(query));
        let rows: Vec<f32> = (flat.matrix.chunks_exact(query.len()))
            .map(|vector| bundlevisor_embed::dot(&query, vector))
            .collect();
        // A tool is as near as its nearer text.
        let mut scored: Vec<(f32, &str, &str)> = (flat.tools.iter())
            .map(|(bundle, tool, [a, b])| (rows[*a].max(rows[*b]), bundle.as_str(), tool.as_str()))
            .filter(|(score, _, _)| *score >= MIN_SIMILARITY)
            .collect();
        // The best first, ties by name; only as many sorted as are looked
        // at (more when the caller may not see enough of them).
        let order = |a: &(f32, &str, &str), b: &(f32, &str, &str)| {
            b.0.total_cmp(&a.0)
                .then_with(|| (a.1, a.2).cmp(&(b.1, b.2)))
        };
        let mut looked = wanted.saturating_mul(OVERFETCH).min(scored.len());
        let hits = loop {
            if looked < scored.len() {
                scored.select_nth_unstable_by(looked, order);
            }
            scored[..looked].sort_unstable_by(order);
            let hits: Vec<Hit> = (scored[..looked].iter())
                .filter(|(_, bundle, tool)| visible(bundle, tool))
                .take(wanted)
                .map(|(score, bundle, tool)| Hit {
                    bundle: bundle.to_string(),
                    tool: tool.to_string(),
                    score: *score,
                })
                .collect();
            if hits.len() == wanted || looked == scored.len() {
                break hits;
            }
            looked = looked.saturating_mul(4).min(scored.len());
        };
        Some(hits)
    }

    /// The `limit` best visible tools for `words` by BM25.
    fn ranked_by_words(
        &self,
        words: &[String],
        limit: usize,
        visible: &impl Fn(&str, &str) -> bool,
    ) -> Result<Vec<Hit>, SearchError> {
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for (kind, boost) in BOOSTS {
            let field = self.fields.of(kind);
            for word in words {
                let term = TermQuery::new(
                    Term::from_field_text(field, word),
                    IndexRecordOption::WithFreqs,
                );
                clauses.push((
                    Occur::Should,
                    Box::new(BoostQuery::new(Box::new(term), boost)),
                ));
            }
        }
        let query = BooleanQuery::new(clauses);
        let searcher = self.reader.searcher();
        let mut wanted = limit.saturating_mul(OVERFETCH);
        loop {
            let top = searcher.search(&query, &TopDocs::with_limit(wanted).order_by_score())?;
            let exhausted = top.len() < wanted;
            let mut hits = Vec::with_capacity(limit);
            for (score, address) in top {
                let doc: TantivyDocument = searcher.doc(address)?;
                let text = |field| {
                    doc.get_first(field)
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_string()
                };
                let (bundle, tool) = (text(self.fields.bundle_key), text(self.fields.tool));
                if visible(&bundle, &tool) {
                    hits.push(Hit {
                        bundle,
                        tool,
                        score,
                    });
                    if hits.len() == limit {
                        return Ok(hits);
                    }
                }
            }
            if exhausted {
                return Ok(hits);
            }
            wanted = wanted.saturating_mul(4);
        }
    }

    /// How many tools are indexed.
    pub fn len(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bundle_term(&self, bundle: &str) -> Term {
        Term::from_field_text(self.fields.bundle_key, bundle)
    }

    fn document(&self, bundle: &str, tool: &Tool) -> TantivyDocument {
        let f = &self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_text(f.bundle_key, bundle);
        doc.add_text(f.tool, &tool.name);
        doc.add_text(f.name, whole_and_split(&tool.name));
        if let Some(title) = &tool.title {
            doc.add_text(f.name, whole_and_split(title));
        }
        doc.add_text(f.bundle, whole_and_split(bundle));
        doc.add_text(
            f.description,
            tool.description.as_deref().unwrap_or_default(),
        );
        doc.add_text(f.params, parameters(tool));
        doc
    }

    /// The analyzed words of `text`, as the index holds them: at most
    /// [`MAX_QUERY_WORDS`] of its first [`MAX_QUERY_BYTES`].
    fn words(&self, text: &str) -> Vec<String> {
        let mut analyzer = self.analyzer.clone();
        let text = identifiers_split(capped(text));
        let mut stream = analyzer.token_stream(&text);
        let mut seen = std::collections::HashSet::new();
        let mut words = Vec::new();
        while let Some(token) = stream.next() {
            if words.len() == MAX_QUERY_WORDS {
                break;
            }
            if seen.insert(token.text.clone()) {
                words.push(token.text.clone());
            }
        }
        words
    }
}

/// What is read of a query: its first [`MAX_QUERY_BYTES`].
fn capped(text: &str) -> &str {
    let mut end = MAX_QUERY_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl ToolIndex {
    /// The embedded tools laid out for a scan, laid out again after a
    /// change — outside the lock: only the names and the vectors' handles
    /// are taken under it.
    fn flat(&self) -> Arc<Flat> {
        type Snapshot = Vec<(String, String, Vec<(u64, Arc<[f32]>)>)>;
        let (generation, snapshot): (u64, Snapshot) = {
            let state = self.lock();
            if let Some(flat) = &state.flat {
                return flat.clone();
            }
            let snapshot = (state.meanings.iter())
                .flat_map(|(bundle, tools)| tools.iter().map(move |t| (bundle, t)))
                .map(|(bundle, (tool, keys))| {
                    let vectors = (keys.iter())
                        .filter_map(|k| Some((*k, state.vectors.get(k)?.clone())))
                        .collect();
                    (bundle.clone(), tool.clone(), vectors)
                })
                .collect();
            (state.generation, snapshot)
        };
        let mut rows: HashMap<u64, usize> = HashMap::new();
        let mut flat = Flat {
            matrix: Vec::new(),
            tools: Vec::new(),
        };
        for (bundle, tool, vectors) in snapshot {
            let found: Vec<usize> = (vectors.iter())
                .map(|(key, vector)| {
                    let count = rows.len();
                    *rows.entry(*key).or_insert_with(|| {
                        flat.matrix.extend_from_slice(vector);
                        count
                    })
                })
                .collect();
            if let Some(first) = found.first() {
                let second = found.get(1).unwrap_or(first);
                flat.tools.push((bundle, tool, [*first, *second]));
            }
        }
        let flat = Arc::new(flat);
        let mut state = self.lock();
        if state.generation == generation {
            state.flat = Some(flat.clone());
        }
        flat
    }
}

impl State {
    /// What the scan was laid out from changed.
    fn changed(&mut self) {
        self.generation += 1;
        self.flat = None;
    }

    /// Drops the vectors and queued texts no tool has any more, and queues
    /// those of `texts` (key to text) not embedded yet.
    fn queue(&mut self, texts: HashMap<u64, String>) {
        let live: std::collections::HashSet<u64> = (self.meanings.values().flatten())
            .flat_map(|(_, keys)| keys.iter().copied())
            .collect();
        let gone: Vec<u64> = (self.vectors.keys())
            .filter(|k| !live.contains(k))
            .copied()
            .collect();
        if self.retired.len() + gone.len() > RETIRED {
            self.retired.clear();
        }
        for key in gone {
            if let Some(vector) = self.vectors.remove(&key) {
                self.retired.insert(key, vector);
            }
        }
        self.pending.retain(|(k, _)| live.contains(k));
        let queued: std::collections::HashSet<u64> = self.pending.iter().map(|(k, _)| *k).collect();
        for (key, text) in texts {
            if let Some(vector) = self.retired.remove(&key) {
                self.vectors.insert(key, vector);
            } else if !self.vectors.contains_key(&key) && !queued.contains(&key) {
                self.pending.push_back((key, text));
            }
        }
    }
}

/// Each of `bundle`'s tools with the keys of the texts it is embedded by
/// ([`views`]); the texts go into `texts`.
fn meanings_of(
    bundle: &str,
    tools: &[Tool],
    texts: &mut HashMap<u64, String>,
) -> Vec<(String, Vec<u64>)> {
    let mut keys_of = |tool: &Tool| -> Vec<u64> {
        let mut keys = Vec::new();
        for text in views(bundle, tool) {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut hasher);
            let key = hasher.finish();
            if !keys.contains(&key) {
                keys.push(key);
                texts.insert(key, text);
            }
        }
        keys
    };
    (tools.iter())
        .map(|tool| (tool.name.to_string(), keys_of(tool)))
        .collect()
}

/// The texts a tool is embedded by, each its bundle's and its own name as
/// words and its title, then: its whole description (what a model reads of
/// it: the first few hundred words), and its first sentence alone — a long
/// description's vector is the mean of much, its summary says what the
/// tool is for.
fn views(bundle: &str, tool: &Tool) -> [String; 2] {
    let words = |name: &str| split_words(name).replace(['_', '-', '.', '/', '@'], " ");
    let mut head = format!("{}: {}.", words(bundle).trim(), words(&tool.name).trim());
    if let Some(title) = &tool.title {
        head.push(' ');
        head.push_str(title);
        head.push('.');
    }
    let description = tool.description.as_deref().unwrap_or_default().trim();
    let first = (description.split_inclusive(['\n', '.']))
        .scan(String::new(), |sentence, part| {
            sentence.push_str(part);
            // A sentence ends at a line's end or a full stop before a space.
            let done = part.ends_with('\n')
                || sentence.len() >= description.len()
                || description[sentence.len()..].starts_with(char::is_whitespace);
            Some(done.then(|| sentence.trim().to_string()))
        })
        .flatten()
        .find(|s| !s.is_empty())
        .unwrap_or_default();
    [description, &first].map(|text| format!("{head} {text}").trim_end().to_string())
}

/// Identifiers split into words: `createPullRequest`, `create_pull_request`
/// and `create-pull-request` all read `create pull request` (the tokenizer
/// splits at every character that is not a letter or digit).
fn split_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut previous: Option<char> = None;
    for c in text.chars() {
        if c.is_uppercase() && previous.is_some_and(|p| p.is_lowercase() || p.is_ascii_digit()) {
            out.push(' ');
        }
        out.push(c);
        previous = Some(c);
    }
    out
}

/// An identifier as itself and, if it has humps, as its words too
/// (`listIssues` → `listIssues list Issues`: `listissues`, `list`,
/// `issues` once analyzed), so a query may name it either way.
fn whole_and_split(text: &str) -> String {
    let split = split_words(text);
    if split.len() == text.len() {
        split
    } else {
        format!("{text} {split}")
    }
}

/// A query's words, those that read as identifiers (`createPullRequest`:
/// a lower-case start, then humps) also split. A capitalised word with
/// humps is a name (`GitHub`, `PostgreSQL`, `JavaScript`) and kept
/// whole: split, `GitHub` would also be `git` and rank the git server's
/// tools above GitHub's.
fn identifiers_split(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for word in text.split_inclusive(char::is_whitespace) {
        if word.starts_with(char::is_lowercase) {
            out.push_str(&whole_and_split(word.trim_end()));
            out.push(' ');
        } else {
            out.push_str(word);
        }
    }
    out
}

/// A tool's parameters as text: each property's name (split) and
/// description, one level deep.
fn parameters(tool: &Tool) -> String {
    let mut text = String::new();
    let Some(serde_json::Value::Object(properties)) = tool.input_schema.get("properties") else {
        return text;
    };
    for (name, schema) in properties {
        text.push_str(&whole_and_split(name));
        text.push(' ');
        if let Some(description) = schema.get("description").and_then(|d| d.as_str()) {
            text.push_str(description);
            text.push(' ');
        }
    }
    text
}

/// What identifies a bundle's tool list for the index: names, titles,
/// descriptions and parameters' names.
fn fingerprint(tools: &[Tool]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for tool in tools {
        tool.name.hash(&mut hasher);
        tool.title.hash(&mut hasher);
        tool.description.hash(&mut hasher);
        if let Some(serde_json::Value::Object(p)) = tool.input_schema.get("properties") {
            for (name, schema) in p {
                name.hash(&mut hasher);
                schema
                    .get("description")
                    .and_then(|d| d.as_str())
                    .hash(&mut hasher);
            }
        }
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, params: serde_json::Value) -> Tool {
        let schema = serde_json::json!({"type": "object", "properties": params});
        let serde_json::Value::Object(schema) = schema else {
            unreachable!()
        };
        Tool::new(
            name.to_string(),
            description.to_string(),
            std::sync::Arc::new(schema),
        )
    }

    fn names(hits: &[Hit]) -> Vec<String> {
        hits.iter()
            .map(|h| format!("{}/{}", h.bundle, h.tool))
            .collect()
    }

    #[test]
    fn tools_are_found_by_words_of_their_names_descriptions_and_parameters() {
        let index = ToolIndex::new().unwrap();
        let github = [
            tool(
                "create_pull_request",
                "Create a new pull request in a GitHub repository",
                serde_json::json!({"head": {"description": "The branch with the changes"}}),
            ),
            tool(
                "listIssues",
                "List issues in a repository",
                serde_json::json!({}),
            ),
        ];
        let time = [tool(
            "get_current_time",
            "Get the current time in a timezone",
            serde_json::json!({"timezone": {"description": "IANA name, e.g. Asia/Tokyo"}}),
        )];
        index
            .sync([("github", &github[..]), ("time", &time[..])])
            .unwrap();
        assert_eq!(index.len(), 3);
        let all = |_: &str, _: &str| true;
        let found = index.search("open a pull request", 2, all).unwrap();
        assert_eq!(names(&found)[0], "github/create_pull_request");
        let found = index.search("which issues are open", 1, all).unwrap();
        assert_eq!(names(&found), ["github/listIssues"], "camelCase split");
        let found = index.search("clock in Tokyo", 1, all).unwrap();
        assert_eq!(names(&found), ["time/get_current_time"], "parameter text");
        assert!(index.search("the of a", 5, all).unwrap().is_empty());
        // What the caller may not see is skipped, not counted.
        let hidden = |b: &str, _: &str| b != "github";
        let found = index.search("pull request issues", 5, hidden).unwrap();
        assert!(names(&found).iter().all(|n| !n.starts_with("github/")));
    }

    #[test]
    fn a_changed_bundle_is_indexed_again_and_a_gone_one_dropped() {
        let index = ToolIndex::new().unwrap();
        let v1 = [tool(
            "send_message",
            "Send a chat message",
            serde_json::json!({}),
        )];
        let other = [tool(
            "get_forecast",
            "Weather forecast",
            serde_json::json!({}),
        )];
        index
            .sync([("chat", &v1[..]), ("weather", &other[..])])
            .unwrap();
        let all = |_: &str, _: &str| true;
        assert_eq!(
            names(&index.search("message", 5, all).unwrap()),
            ["chat/send_message"]
        );
        let v2 = [tool(
            "post_message",
            "Post a message to a channel",
            serde_json::json!({}),
        )];
        assert!(!index.stale([("chat", &v1[..]), ("weather", &other[..])]));
        assert!(index.stale([("chat", &v2[..]), ("weather", &other[..])]));
        assert!(index.stale([("chat", &v1[..])]), "a bundle gone");
        index.sync([("chat", &v2[..])]).unwrap();
        assert_eq!(
            index.len(),
            1,
            "the old version and the gone bundle dropped"
        );
        assert_eq!(
            names(&index.search("message", 5, all).unwrap()),
            ["chat/post_message"]
        );
        assert!(index.search("forecast", 5, all).unwrap().is_empty());
    }

    /// The model `make model` fetches.
    fn encoder() -> Arc<Encoder> {
        let folder = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/models/all-minilm-l6-v2"
        );
        let encoder = Encoder::load(std::path::Path::new(folder));
        Arc::new(encoder.unwrap_or_else(|e| panic!("{e} (run `make model`)")))
    }

    #[test]
    fn with_a_model_a_tool_is_found_by_what_it_means_once_embedded() {
        let index = ToolIndex::with_encoder(encoder()).unwrap();
        let time = [tool(
            "get_current_time",
            "Get the current time in a specific timezone. Names are IANA's.",
            serde_json::json!({}),
        )];
        let github = [tool(
            "create_issue",
            "Create a new issue in a GitHub repository",
            serde_json::json!({}),
        )];
        index
            .sync([("time", &time[..]), ("github", &github[..])])
            .unwrap();
        let all = |_: &str, _: &str| true;
        // No word of the query is a word of the tool: by words, nothing.
        let query = "what hour is it in Paris right now?";
        assert!(index.search(query, 5, all).unwrap().is_empty());
        assert_eq!(
            index.pending(),
            3,
            "one view of a one-sentence tool, two of the other"
        );
        // Until every tool is embedded, the ranking is by words alone.
        let found = index.search("create a new issue", 5, all).unwrap();
        assert_eq!(names(&found), ["github/create_issue"]);
        index.embed_pending();
        assert_eq!(index.pending(), 0);
        let found = index.search(query, 1, all).unwrap();
        assert_eq!(names(&found), ["time/get_current_time"]);
        // Both rankings agree: the fused one too.
        let found = index.search("file a bug report on GitHub", 2, all).unwrap();
        assert_eq!(names(&found)[0], "github/create_issue");
        // What the caller may not see is never found by meaning either
        // (the same query found it just above).
        let bug = "file a bug report on GitHub";
        let hidden = |b: &str, _: &str| b != "github";
        assert!(names(&index.search(bug, 5, hidden).unwrap())
            .iter()
            .all(|n| !n.starts_with("github/")));
        // A gone bundle's vectors go with it; a changed tool is embedded again.
        let time2 = [tool(
            "now",
            "Tell the current time in a specific timezone",
            serde_json::json!({}),
        )];
        index.sync([("time", &time2[..])]).unwrap();
        assert_eq!(index.pending(), 1);
        index.embed_pending();
        let found = index.search("what time is it in Tokyo?", 5, all).unwrap();
        assert_eq!(names(&found), ["time/now"]);
        let found = index.search(bug, 5, all).unwrap();
        assert!(
            names(&found).iter().all(|n| !n.starts_with("github/")),
            "only what is indexed"
        );
        let state = index.lock();
        assert_eq!(state.vectors.len(), 1, "the old vectors set aside");
        assert_eq!(state.retired.len(), 3);
        drop(state);
        // A bundle back (after a restart, say) is not embedded again.
        index
            .sync([("time", &time2[..]), ("github", &github[..])])
            .unwrap();
        assert_eq!(index.pending(), 0);
        let found = index.search(bug, 1, all).unwrap();
        assert_eq!(names(&found), ["github/create_issue"]);
    }

    #[test]
    fn a_stopped_index_embeds_nothing_more() {
        let index = ToolIndex::with_encoder(encoder()).unwrap();
        let time = [tool("now", "Tell the time", serde_json::json!({}))];
        index.sync([("time", &time[..])]).unwrap();
        index.stop();
        index.embed_pending();
        assert_eq!(index.pending(), 1);
    }

    #[test]
    fn a_tools_views_are_its_whole_description_and_its_first_sentence() {
        let t = tool(
            "read_text_file",
            "Read a file as text, e.g. a log. Handles encodings.\nOnly in allowed folders.",
            serde_json::json!({}),
        );
        let [whole, first] = views("@acme/files", &t);
        assert_eq!(
            whole,
            "acme files: read text file. Read a file as text, e.g. a log. Handles encodings.\nOnly in allowed folders."
        );
        assert_eq!(
            first,
            "acme files: read text file. Read a file as text, e.g."
        );
        let bare = tool("ping", "", serde_json::json!({}));
        assert_eq!(
            views("x", &bare),
            ["x: ping.", "x: ping."].map(String::from)
        );
    }

    /// A query's `GitHub` is GitHub, not `git` and `hub`: split, it ranked
    /// the git server's tools above GitHub's for most questions about
    /// GitHub (benches/search's queries).
    #[test]
    fn a_capitalised_name_in_a_query_is_not_split() {
        let index = ToolIndex::new().unwrap();
        let github = [tool(
            "list_commits",
            "Get list of commits of a branch in a GitHub repository",
            serde_json::json!({}),
        )];
        let git = [
            tool("git_log", "Shows the commit logs", serde_json::json!({})),
            tool("git_branch", "List Git branches", serde_json::json!({})),
        ];
        index
            .sync([("github", &github[..]), ("git", &git[..])])
            .unwrap();
        let all = |_: &str, _: &str| true;
        let found = index.search("what landed on the main branch on GitHub", 1, all);
        assert_eq!(names(&found.unwrap()), ["github/list_commits"]);
        // An identifier in a query is still read as its words.
        let found = index.search("gitLog", 1, all).unwrap();
        assert_eq!(names(&found), ["git/git_log"]);
    }

    #[test]
    fn identifiers_are_split_into_words() {
        assert_eq!(split_words("createPullRequest"), "create Pull Request");
        assert_eq!(split_words("get_v2Items"), "get_v2 Items");
        assert_eq!(split_words("HTTPServer"), "HTTPServer");
        assert_eq!(whole_and_split("listIssues"), "listIssues list Issues");
        assert_eq!(whole_and_split("list_issues"), "list_issues");
        assert_eq!(
            identifiers_split("find listIssues on GitHub\tnow"),
            "find listIssues list Issues on GitHub\tnow "
        );
    }
}
