//! Chat templates: the model's Jinja template from `tokenizer_config.json`, rendered with minijinja.
//!
//! HuggingFace templates are written for Python's Jinja2; minijinja with its Python-compatibility
//! methods (`.strip()`, `.startswith()`, ...) renders the common ones. The context is the one
//! transformers passes: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and a
//! `raise_exception` function.

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, ErrorKind, Value, context};

/// Roles a chat message may have.
pub const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// A chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `chat_template` is neither a string nor a list of named templates.
    #[error("tokenizer_config.json: chat_template has an unexpected shape")]
    Shape,
    /// The template does not parse.
    #[error("chat template: {0}")]
    Syntax(String),
    /// Rendering failed (including the template's own `raise_exception`).
    #[error("chat template: {0}")]
    Render(String),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn special_token(config: &serde_json::Value, key: &str) -> String {
    match config.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => v
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_owned(),
        None => String::new(),
    }
}

fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// The template of a parsed `tokenizer_config.json`, or `None` when it has none.
    pub fn from_tokenizer_config(config: &serde_json::Value) -> Result<Option<Self>, ChatError> {
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let named = |name: &str| {
                    list.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(str::to_owned))
                            .flatten()
                    })
                };
                named("default").ok_or(ChatError::Shape)?
            }
            Some(_) => return Err(ChatError::Shape),
        };
        Self::new(
            source,
            special_token(config, "bos_token"),
            special_token(config, "eos_token"),
        )
        .map(Some)
    }

    /// A template from its source and special tokens.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        // transformers renders chat templates with trim_blocks and lstrip_blocks.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.add_template_owned("chat", source)
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages` with a generation prompt appended.
    pub fn render(&self, messages: &[Message]) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| ChatError::Render(e.to_string()))?;
        template
            .render(context! {
                messages => Value::from(messages.iter().map(|m| context! { role => m.role.as_str(), content => m.content.as_str() }).collect::<Vec<Value>>()),
                add_generation_prompt => true,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|e| ChatError::Render(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<Message> {
        vec![
            Message {
                role: "system".into(),
                content: " Be brief. ".into(),
            },
            Message {
                role: "user".into(),
                content: "Hi".into(),
            },
        ]
    }

    #[test]
    fn renders_a_chatml_template_with_python_methods() {
        let config = serde_json::json!({
            "bos_token": {"content": "<s>"},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        });
        let t = ChatTemplate::from_tokenizer_config(&config)
            .unwrap()
            .unwrap();
        assert_eq!(
            t.render(&msgs()).unwrap(),
            "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&msgs()).unwrap_err().to_string();
        assert!(err.contains("first must be user"), "{err}");
    }

    #[test]
    fn named_default_template_and_absence() {
        let config = serde_json::json!({"chat_template": [{"name": "default", "template": "x{{ messages|length }}"}]});
        let t = ChatTemplate::from_tokenizer_config(&config)
            .unwrap()
            .unwrap();
        assert_eq!(t.render(&msgs()).unwrap(), "x2");
        assert!(
            ChatTemplate::from_tokenizer_config(&serde_json::json!({}))
                .unwrap()
                .is_none()
        );
        assert!(ChatTemplate::new("{% if".into(), String::new(), String::new()).is_err());
    }
}
