//! Search over a workspace's tools, for agents that find tools by what they
//! want done instead of reading every tool's schema (the gateway's
//! `discovery = "search"`, docs/gateway.md). Ranking is `tantivy`'s BM25
//! over each tool's name, its bundle's name, its description and its
//! parameters' names and descriptions, in an index held in memory; names
//! are split at `_`, `-`, `.` and camelCase humps, words are stemmed
//! (English) and stop words dropped, the same way for tools and queries.
//!
//! One index per workspace, kept in step with the bundles by [`ToolIndex::sync`]:
//! a bundle whose tools changed (another fingerprint) is re-indexed, one
//! gone is dropped. Nothing here reaches the network.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

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
}

struct State {
    writer: IndexWriter,
    /// Each indexed bundle's fingerprint ([`fingerprint`]).
    indexed: HashMap<String, u64>,
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
            }),
        })
    }

    /// Brings the index in step with `bundles` (each bundle's name and
    /// tools): a bundle whose tools changed is indexed again, one not
    /// listed any more is dropped. Cheap when nothing changed (each list is
    /// fingerprinted, nothing is written).
    pub fn sync<'a>(
        &self,
        bundles: impl IntoIterator<Item = (&'a str, &'a [Tool])>,
    ) -> Result<(), SearchError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = std::collections::HashSet::new();
        // The fingerprints take effect once the changes are committed: a
        // failed sync is done again by the next one.
        let mut indexed = state.indexed.clone();
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
                changed = true;
            }
            let gone: Vec<String> = (indexed.keys())
                .filter(|b| !seen.contains(*b))
                .cloned()
                .collect();
            for bundle in gone {
                state.writer.delete_term(self.bundle_term(&bundle));
                indexed.remove(&bundle);
                changed = true;
            }
            if changed {
                state.writer.commit()?;
                self.reader.reload()?;
            }
            Ok(())
        })();
        match written {
            Ok(()) => state.indexed = indexed,
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
    /// (bundle, tool), best first. A query with no searchable word finds
    /// nothing.
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
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for (kind, boost) in BOOSTS {
            let field = self.fields.of(kind);
            for word in &words {
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
        doc.add_text(f.name, split_words(&tool.name));
        if let Some(title) = &tool.title {
            doc.add_text(f.name, split_words(title));
        }
        doc.add_text(f.bundle, split_words(bundle));
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
        let mut end = MAX_QUERY_BYTES.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let text = split_words(&text[..end]);
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

/// A tool's parameters as text: each property's name (split) and
/// description, one level deep.
fn parameters(tool: &Tool) -> String {
    let mut text = String::new();
    let Some(serde_json::Value::Object(properties)) = tool.input_schema.get("properties") else {
        return text;
    };
    for (name, schema) in properties {
        text.push_str(&split_words(name));
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

    #[test]
    fn identifiers_are_split_into_words() {
        assert_eq!(split_words("createPullRequest"), "create Pull Request");
        assert_eq!(split_words("get_v2Items"), "get_v2 Items");
        assert_eq!(split_words("HTTPServer"), "HTTPServer");
    }
}
