//! The model's text side: its tokenizer and chat template, loaded from the model folder.

use std::path::Path;
use std::sync::Arc;

use grammar::BackgroundCompiler;
use tokenizers::Tokenizer;

use crate::chat::{ChatError, ChatTemplate, Message};
use crate::detok::SpecialIds;

/// The model's tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {message}")]
    Load { path: String, message: String },
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A GGUF file's metadata holds no tokenizer this reads (the error names file and key).
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

/// A tokenizer plus the model's chat template, when the model folder has them.
#[derive(Debug)]
pub struct TextModel {
    /// `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// The chat template of `tokenizer_config.json`.
    pub chat: Option<ChatTemplate>,
    /// Compiles structured-output grammars over this vocabulary, to refuse bad ones before they
    /// run (the worker compiles its own to sample with; this one's end-of-sequence id is nominal).
    pub grammar: BackgroundCompiler,
    /// The ids `skip_special_tokens` leaves out of streamed text.
    pub special: Arc<SpecialIds>,
}

impl TextModel {
    /// Loads `tokenizer.json` (and `tokenizer_config.json` when present) from `dir`, or the
    /// vocabulary and chat template of a `.gguf` file. Returns `None` when the folder has no
    /// tokenizer (token-id prompts only).
    pub fn load(dir: &Path) -> Result<Option<Self>, TokenizerError> {
        if gguf::is_gguf_path(dir) {
            return Self::load_gguf(dir).map(Some);
        }
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.exists() {
            return Ok(None);
        }
        let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| TokenizerError::Load {
            path: tok_path.display().to_string(),
            message: e.to_string(),
        })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let chat = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => {
                let config: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| TokenizerError::Load {
                        path: cfg_path.display().to_string(),
                        message: e.to_string(),
                    })?;
                ChatTemplate::from_tokenizer_config(&config)?
            }
            Err(_) => None,
        };
        Ok(Some(Self::new(tokenizer, chat)))
    }

    /// The tokenizer and chat template a GGUF file's metadata holds (`gguf::hf`).
    fn load_gguf(path: &Path) -> Result<Self, TokenizerError> {
        let file = gguf::GgufFile::open(path)?;
        let tokenizer: Tokenizer =
            file.hf_tokenizer()?
                .to_string()
                .parse()
                .map_err(|e: tokenizers::Error| TokenizerError::Load {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?;
        let config = file.hf_tokenizer_config()?;
        let chat = ChatTemplate::from_tokenizer_config(&config)?;
        Ok(Self::new(tokenizer, chat))
    }

    fn new(tokenizer: Tokenizer, chat: Option<ChatTemplate>) -> Self {
        let vocab = tokenizer.get_vocab_size(true);
        let grammar = BackgroundCompiler::start(
            tokenizer.clone(),
            vocab,
            vec![vocab.saturating_sub(1) as u32],
        );
        Self {
            special: Arc::new(SpecialIds::of(&tokenizer)),
            tokenizer,
            chat,
            grammar,
        }
    }

    /// Token ids of a text prompt (with the tokenizer's special tokens, e.g. BOS).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Token ids of a conversation: rendered with the chat template (which writes its own special
    /// tokens), then tokenized without adding more.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>, String> {
        let chat = self
            .chat
            .as_ref()
            .ok_or_else(|| "this model has no chat template".to_owned())?;
        let text = chat.render(messages).map_err(|e| e.to_string())?;
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The vocabulary's spelling of each token.
    pub fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .map(|&id| self.tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    }
}
