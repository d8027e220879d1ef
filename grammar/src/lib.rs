//! Structured output: a [`GrammarSpec`] (a JSON schema, any JSON object, a regex or a list of
//! choices) compiled by [llguidance](https://github.com/guidance-ai/llguidance) into a
//! [`Constraint`] that says, before every draw, which tokens keep the output inside the grammar.
//!
//! The gateway compiles each request's spec once to turn an unsupported schema into a 400 before
//! anything runs, and sends the spec to the worker in its wire form ([`GrammarSpec::wire_kind`],
//! [`GrammarSpec::wire_text`]); the worker compiles it again, asks for a [`TokenMask`] while the
//! step's forward pass runs, lets the sampler draw only allowed tokens, and feeds each drawn token
//! back with [`Constraint::accept`]. The output ends when the grammar is complete.
//!
//! ```
//! use grammar::{Compiler, GrammarSpec};
//! # let tokenizer = grammar::testing::byte_tokenizer();
//! let compiler = Compiler::new(&tokenizer, 260, &[256]).unwrap();
//! let mut c = compiler.compile(&GrammarSpec::Choice(vec!["yes".into(), "no".into()])).unwrap();
//! let mask = c.mask().unwrap();
//! assert!(mask.allows(u32::from(b'y')) && !mask.allows(u32::from(b'x')));
//! for b in b"no" {
//!     c.accept(u32::from(*b)).unwrap();
//! }
//! assert!(c.is_finished());
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use thiserror::Error;
use tokenizers::Tokenizer;

pub mod testing;
mod vocab;

pub use vocab::{VocabStyle, token_bytes};

/// Longest grammar source accepted (a schema, a regex, the choices as JSON), in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 64 * 1024;

/// What the output must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this JSON schema (its text).
    JsonSchema(String),
    /// Text matching this regular expression (Rust `regex` syntax), in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// A grammar that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GrammarError {
    /// The grammar compiler refused it (an unsupported schema keyword, a bad regex, …).
    #[error("{0}")]
    Unsupported(String),
    /// The source is over [`MAX_GRAMMAR_BYTES`].
    #[error("the grammar is {bytes} bytes; at most {MAX_GRAMMAR_BYTES} are accepted")]
    TooLarge { bytes: usize },
    /// A choice list that is empty or has an empty string.
    #[error("choices must be a non-empty list of non-empty strings")]
    BadChoices,
    /// The wire form names no known kind, or its text does not parse.
    #[error("grammar wire form: {0}")]
    Wire(String),
    /// The tokenizer cannot back a grammar (no end-of-sequence id, a vocabulary too large).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar failed while the output was being generated (a token it did not allow).
    #[error("grammar: {0}")]
    Matcher(String),
}

impl GrammarSpec {
    /// The spec's kind on the wire (never 0, which means "no grammar").
    pub fn wire_kind(&self) -> u32 {
        match self {
            Self::JsonObject => 1,
            Self::JsonSchema(_) => 2,
            Self::Regex(_) => 3,
            Self::Choice(_) => 4,
        }
    }

    /// The spec's text on the wire: the schema, the regex, the choices as a JSON array.
    pub fn wire_text(&self) -> String {
        match self {
            Self::JsonObject => String::new(),
            Self::JsonSchema(s) | Self::Regex(s) => s.clone(),
            Self::Choice(c) => serde_json::Value::from(c.clone()).to_string(),
        }
    }

    /// The spec from its wire form.
    pub fn from_wire(kind: u32, text: &str) -> Result<Self, GrammarError> {
        Ok(match kind {
            1 => Self::JsonObject,
            2 => Self::JsonSchema(text.to_owned()),
            3 => Self::Regex(text.to_owned()),
            4 => Self::Choice(
                serde_json::from_str(text).map_err(|e| GrammarError::Wire(e.to_string()))?,
            ),
            _ => return Err(GrammarError::Wire(format!("unknown grammar kind {kind}"))),
        })
    }

    /// The spec vLLM's `structured_outputs` object asks for: exactly one of `json` (a schema, as
    /// an object or its text), `regex`, `choice` (a list of strings) or `json_object: true`. The
    /// error names the offending member.
    pub fn from_structured_outputs(value: &serde_json::Value) -> Result<Self, String> {
        let obj = value
            .as_object()
            .ok_or("structured_outputs must be an object")?;
        let mut specs = Vec::new();
        for (key, v) in obj {
            let spec = match key.as_str() {
                "json" => match v {
                    serde_json::Value::String(text) => Self::JsonSchema(text.clone()),
                    serde_json::Value::Object(_) | serde_json::Value::Bool(_) => {
                        Self::JsonSchema(v.to_string())
                    }
                    serde_json::Value::Null => continue,
                    _ => return Err("structured_outputs.json must be a JSON schema".into()),
                },
                "regex" => match v {
                    serde_json::Value::String(rx) => Self::Regex(rx.clone()),
                    serde_json::Value::Null => continue,
                    _ => return Err("structured_outputs.regex must be a string".into()),
                },
                "choice" => match v {
                    serde_json::Value::Array(items) => Self::Choice(
                        items
                            .iter()
                            .map(|c| c.as_str().map(str::to_owned))
                            .collect::<Option<_>>()
                            .ok_or("structured_outputs.choice must be a list of strings")?,
                    ),
                    serde_json::Value::Null => continue,
                    _ => return Err("structured_outputs.choice must be a list of strings".into()),
                },
                "json_object" => match v {
                    serde_json::Value::Bool(true) => Self::JsonObject,
                    serde_json::Value::Bool(false) | serde_json::Value::Null => continue,
                    _ => return Err("structured_outputs.json_object must be a boolean".into()),
                },
                other => {
                    return Err(format!(
                        "structured_outputs.{other} is not supported (json, regex, choice and \
                         json_object are)"
                    ));
                }
            };
            specs.push(spec);
        }
        match specs.len() {
            1 => Ok(specs.remove(0)),
            0 => Err(
                "structured_outputs names no constraint (json, regex, choice or json_object)"
                    .into(),
            ),
            _ => Err(
                "structured_outputs must name exactly one of json, regex, choice and json_object"
                    .into(),
            ),
        }
    }

    fn source_len(&self) -> usize {
        match self {
            Self::JsonObject => 0,
            Self::JsonSchema(s) | Self::Regex(s) => s.len(),
            Self::Choice(c) => c.iter().map(|s| s.len() + 3).sum(),
        }
    }

    /// llguidance's form. JSON is compact-spaced (`", "`, `": "`) with no free whitespace unless
    /// the schema's own `x-guidance` options say otherwise: free whitespace lets a weak model pad
    /// forever instead of closing the object.
    fn to_llguidance(&self) -> Result<TopLevelGrammar, GrammarError> {
        if self.source_len() > MAX_GRAMMAR_BYTES {
            return Err(GrammarError::TooLarge {
                bytes: self.source_len(),
            });
        }
        Ok(match self {
            Self::JsonObject => TopLevelGrammar::from_json_schema(with_json_layout(
                serde_json::json!({"type": "object"}),
            )),
            Self::JsonSchema(text) => {
                let schema: serde_json::Value = serde_json::from_str(text).map_err(|e| {
                    GrammarError::Unsupported(format!("the schema is not JSON: {e}"))
                })?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Unsupported(
                        "a JSON schema must be an object or a boolean".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_json_layout(schema))
            }
            Self::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Self::Choice(choices) => {
                if choices.is_empty() || choices.iter().any(String::is_empty) {
                    return Err(GrammarError::BadChoices);
                }
                let alternatives: Vec<String> =
                    choices.iter().map(|c| regex_syntax::escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("(?:{})", alternatives.join("|")))
            }
        })
    }
}

fn with_json_layout(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// Compiles grammars against one tokenizer's vocabulary. Build once per model; cheap to share.
#[derive(Clone)]
pub struct Compiler {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish_non_exhaustive()
    }
}

/// The tokenizer side llguidance needs: the vocabulary's trie and a way to tokenize bytes.
struct HfTokenizerEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for HfTokenizerEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => match self.tokenizer.encode_fast(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => self.trie.greedy_tokenize(s),
            },
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

impl Compiler {
    /// A compiler over `tokenizer`'s vocabulary for a model with `vocab_size` logits (ids beyond
    /// the tokenizer's are never allowed) whose generation ends at any of `eos_token_ids`.
    pub fn new(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        eos_token_ids: &[u32],
    ) -> Result<Self, GrammarError> {
        let &eos = eos_token_ids.first().ok_or_else(|| {
            GrammarError::Tokenizer("the model names no end-of-sequence token".into())
        })?;
        let vocab_size = vocab_size.max(tokenizer.get_vocab_size(true));
        let n = u32::try_from(vocab_size)
            .ok()
            .filter(|&n| n < 1 << 24)
            .ok_or_else(|| GrammarError::Tokenizer(format!("vocabulary of {vocab_size} tokens")))?;
        if eos >= n {
            return Err(GrammarError::Tokenizer(format!(
                "end-of-sequence id {eos} is outside the vocabulary of {vocab_size}"
            )));
        }
        let words = token_bytes(tokenizer, vocab_size);
        let info = TokRxInfo::new(n, eos);
        let factory = catch_unwind(AssertUnwindSafe(|| {
            let env: TokEnv = Arc::new(HfTokenizerEnv {
                trie: TokTrie::from(&info, &words),
                tokenizer: tokenizer.clone(),
            });
            ParserFactory::new_simple(&env).map(|mut f| {
                f.quiet();
                *f.limits_mut() = ParserLimits {
                    verbose_errors: false,
                    ..ParserLimits::default()
                };
                f
            })
        }))
        .map_err(|_| GrammarError::Tokenizer("building the token trie panicked".into()))?
        .map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        Ok(Self {
            factory: Arc::new(factory),
            vocab_size,
            eos_token_ids: eos_token_ids.to_vec(),
        })
    }

    /// Logits per row the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compiles `spec` into a fresh constraint, positioned at the start of the output.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let grammar = spec.to_llguidance()?;
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| GrammarError::Unsupported("the grammar compiler panicked".into()))?
            .map_err(|e| GrammarError::Unsupported(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Unsupported(e));
        }
        Ok(Constraint {
            matcher,
            eos_token_ids: self.eos_token_ids.clone(),
            vocab_size: self.vocab_size,
        })
    }
}

/// A [`Compiler`] being built on a thread of its own (over a 128k vocabulary that takes about a
/// second, which start-up should not wait for); the first grammar that needs it waits for it.
#[derive(Clone)]
pub struct BackgroundCompiler {
    cell: Arc<std::sync::OnceLock<Result<Compiler, GrammarError>>>,
}

impl std::fmt::Debug for BackgroundCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundCompiler")
            .field("ready", &self.cell.get().is_some())
            .finish()
    }
}

impl BackgroundCompiler {
    /// Starts building `Compiler::new(&tokenizer, vocab_size, &eos_token_ids)`.
    pub fn start(tokenizer: Tokenizer, vocab_size: usize, eos_token_ids: Vec<u32>) -> Self {
        let cell = Arc::new(std::sync::OnceLock::new());
        let fill = Arc::clone(&cell);
        let spawned = std::thread::Builder::new()
            .name("grammar-vocab".into())
            .spawn(move || {
                let _ = fill.set(Compiler::new(&tokenizer, vocab_size, &eos_token_ids));
            });
        if let Err(e) = spawned {
            let _ = cell.set(Err(GrammarError::Tokenizer(format!(
                "could not start the vocabulary thread: {e}"
            ))));
        }
        Self { cell }
    }

    /// A compiler that is ready already.
    pub fn ready(compiler: Compiler) -> Self {
        Self {
            cell: Arc::new(std::sync::OnceLock::from(Ok(compiler))),
        }
    }

    /// The compiler, waiting for it to be built.
    pub fn get(&self) -> Result<&Compiler, GrammarError> {
        self.cell.wait().as_ref().map_err(Clone::clone)
    }
}

/// One output's grammar state.
pub struct Constraint {
    matcher: Matcher,
    eos_token_ids: Vec<u32>,
    vocab_size: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens the next draw may pick. Every end-of-sequence id is allowed exactly when the
    /// output so far is complete.
    pub fn mask(&mut self) -> Result<TokenMask, GrammarError> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        let mut words = vob.as_slice().to_vec();
        words.resize(self.vocab_size.div_ceil(32), 0);
        let mut mask = TokenMask {
            words,
            len: self.vocab_size,
        };
        let first = self.eos_token_ids[0];
        if mask.allows(first) {
            for &eos in &self.eos_token_ids[1..] {
                mask.allow(eos);
            }
        }
        Ok(mask)
    }

    /// Moves the grammar past `token` (the one just drawn). An end-of-sequence id finishes it
    /// (and is a no-op once the grammar has finished by itself).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        let token = if self.eos_token_ids.contains(&token) {
            if self.matcher.is_stopped() && !self.matcher.is_error() {
                return Ok(());
            }
            self.eos_token_ids[0]
        } else {
            token
        };
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Matcher(e.to_string()))
    }

    /// Logits per row the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The grammar allows nothing more: the output is complete (or the grammar failed). A
    /// grammar with nothing left to extend finishes on its last token, before any EOS.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// A set of token ids, one bit each (bit `t % 32` of word `t / 32`: set means allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// A mask over `len` ids allowing just `tokens` (those below `len`).
    pub fn only(len: usize, tokens: &[u32]) -> Self {
        let mut mask = Self {
            words: vec![0; len.div_ceil(32)],
            len,
        };
        for &t in tokens {
            mask.allow(t);
        }
        mask
    }

    /// Whether `token` may be drawn.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.len && self.words[token as usize / 32] & (1 << (token % 32)) != 0
    }

    fn allow(&mut self, token: u32) {
        if (token as usize) < self.len {
            self.words[token as usize / 32] |= 1 << (token % 32);
        }
    }

    /// The bit words (`ceil(len / 32)` of them).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Token ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Covers no token id.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many tokens are allowed.
    pub fn count_allowed(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests;
