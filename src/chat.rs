//! Chat prompts: the model's embedded Jinja template rendered with minijinja (Python string
//! methods through minijinja-contrib's pycompat), as transformers' `apply_chat_template` does.
//! The template emits `<bos>` itself, so the rendered text is encoded without adding specials.

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("the model has no chat template (tokenizer.chat_template); use a raw prompt")]
    NoTemplate,
    #[error("chat template error: {0}")]
    Template(String),
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).finish()
    }
}

fn raise_exception(msg: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatError> {
        let mut env = minijinja::Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string()).map_err(|e| ChatError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// Renders `messages` (OpenAI-shaped: role, content as a string or text parts, tool_calls,
    /// tool_call_id) with optional `tools`.
    pub fn render(&self, messages: &[Value], tools: Option<&[Value]>, add_generation_prompt: bool) -> Result<String, ChatError> {
        let tmpl = self.env.get_template("chat").map_err(|e| ChatError::Template(e.to_string()))?;
        let ctx = minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
            tools => tools.map(minijinja::Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        };
        tmpl.render(ctx).map_err(|e| ChatError::Template(format!("{e:#}")))
    }
}
