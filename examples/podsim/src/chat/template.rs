//! The served model's chat template: where it comes from, compiled once, rendered the way
//! transformers renders it.
//!
//! Source, in vLLM's order: `--chat-template` (a file, or the template text itself), else the
//! model folder (MODEL, when it is a local folder: `chat_template.jinja`, else the
//! `chat_template` of `tokenizer_config.json`), else the built-in default, Llama 3.1's layout
//! (`tools/chat_templates/llama3.jinja`). Special tokens (`bos_token`, `eos_token`, ...) come
//! from the folder's `tokenizer_config.json`, else Llama 3.1's.
//!
//! The environment is transformers': `trim_blocks` and `lstrip_blocks` on, loop controls,
//! `raise_exception`, Python's `tojson`, `strftime_now`, and Python's string and dict methods
//! (`.strip()`, `.items()`). A template that does not compile is kept with its error: as on vLLM,
//! the server starts and every chat request gets a 400 naming the error. Rendering has a step
//! budget, so a template cannot run away with the pod.

use std::fmt;
use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::{pyjson, strftime, ChatError};

/// Llama 3.1 instruct's layout, the default when neither a flag nor the model folder gives one.
pub const BUILTIN_TEMPLATE: &str = include_str!("../../../../tools/chat_templates/llama3.jinja");
/// The built-in template's special tokens (Llama 3.1's).
pub const BUILTIN_BOS_TOKEN: &str = "<|begin_of_text|>";
pub const BUILTIN_EOS_TOKEN: &str = "<|eot_id|>";

/// Template steps one render may take (minijinja fuel: instructions plus about one per 64 bytes
/// built). A conversation of 8 MiB in small messages takes a few million.
const RENDER_FUEL: u64 = 40_000_000;

/// Special tokens transformers hands to every template, by their `tokenizer_config.json` keys.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// How message contents reach the template (vLLM's `--chat-template-content-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ContentFormatArg {
    /// `openai` when the template loops over a message's content, else `string`.
    #[default]
    Auto,
    /// Content is one string (text parts joined).
    String,
    /// Content is a list of parts (`{"type": "text", "text": ...}`).
    Openai,
}

/// The content format one template takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    String,
    Openai,
}

/// One named template: its content format, or why it did not compile.
#[derive(Debug, Clone)]
struct Compiled {
    name: String,
    outcome: Result<ContentFormat, String>,
}

/// A compiled chat template (or a set of named ones, as `tokenizer_config.json` may list).
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    templates: Vec<Compiled>,
    special_tokens: Vec<(String, String)>,
    origin: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("templates", &self.templates)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

/// The error a template raises with `raise_exception(message)`: reported as the message alone.
#[derive(Debug)]
struct RaisedByTemplate;

impl fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("raised by the chat template")
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message).with_source(RaisedByTemplate))
}

/// A render or compile error as the client reads it: a template's own `raise_exception`
/// message verbatim, anything else with its kind and line.
fn describe(err: &Error) -> String {
    let raised = std::error::Error::source(err).is_some_and(|s| s.is::<RaisedByTemplate>());
    match (raised, err.detail()) {
        (true, Some(detail)) => detail.to_string(),
        _ => err.to_string(),
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // transformers compiles chat templates with trim_blocks and lstrip_blocks on.
    if let Ok(syntax) = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime::strftime_now);
    env.set_fuel(Some(RENDER_FUEL));
    // Jinja2 prints Python's `True`, `False`, `None` and float reprs.
    env.set_formatter(|out, state, value| {
        let python = match value.kind() {
            ValueKind::Bool => Some(if value.is_true() { "True" } else { "False" }.to_string()),
            ValueKind::None => Some("None".to_string()),
            ValueKind::Number if !value.is_integer() => Some(pyjson::python_float(
                f64::try_from(value.clone()).unwrap_or(f64::NAN),
            )),
            _ => None,
        };
        match python {
            Some(text) => out
                .write_str(&text)
                .map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write the rendering")),
            None => minijinja::escape_formatter(out, state, value),
        }
    });
    env
}

/// vLLM's and SGLang's detection of the content format: a `for` loop over
/// `message['content']` (or `message.content`, `msg…`, `m…`) means the template takes parts.
pub fn detect_content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = rest.get(start + 2..).unwrap_or_default();
        let end = after.find("%}").unwrap_or(after.len());
        let block = after
            .get(..end)
            .unwrap_or_default()
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if let Some(iter) = block
            .strip_prefix("for ")
            .and_then(|b| b.split_once(" in "))
            .map(|(_, iter)| iter.trim_start())
        {
            let iterates_content = ["message", "msg", "m"].iter().any(|var| {
                iter.strip_prefix(var).is_some_and(|access| {
                    let access = access.trim_start();
                    access.starts_with(".content")
                        || access
                            .strip_prefix('[')
                            .map(str::trim_start)
                            .is_some_and(|a| {
                                a.starts_with("'content'") || a.starts_with("\"content\"")
                            })
                })
            });
            if iterates_content {
                return ContentFormat::Openai;
            }
        }
        rest = after.get(end..).unwrap_or_default();
    }
    ContentFormat::String
}

impl ChatTemplate {
    /// The built-in default: Llama 3.1's layout and special tokens.
    pub fn builtin() -> Self {
        Self::new(
            vec![("default".into(), BUILTIN_TEMPLATE.into())],
            builtin_special_tokens(),
            ContentFormatArg::Auto,
            "built-in Llama 3.1 template".into(),
        )
    }

    /// Templates by name (one, or several as a `tokenizer_config.json` list gives them), with the
    /// special tokens the template sees. Compile errors are kept and reported when rendering.
    pub fn new(
        templates: Vec<(String, String)>,
        special_tokens: Vec<(String, String)>,
        format: ContentFormatArg,
        origin: String,
    ) -> Self {
        let mut env = environment();
        let templates = templates
            .into_iter()
            .map(|(name, source)| {
                let detected = match format {
                    ContentFormatArg::Auto => detect_content_format(&source),
                    ContentFormatArg::String => ContentFormat::String,
                    ContentFormatArg::Openai => ContentFormat::Openai,
                };
                let outcome = env
                    .add_template_owned(template_name(&name), source)
                    .map(|()| detected)
                    .map_err(|e| describe(&e));
                Compiled { name, outcome }
            })
            .collect();
        Self {
            env,
            templates,
            special_tokens,
            origin,
        }
    }

    /// The template vLLM would use: `--chat-template` (a readable file, else the text itself
    /// when it looks like a template), else the model folder's, else the built-in one.
    /// Errors read `flag: value: rule`.
    pub fn load(
        flag: Option<&str>,
        model_path: &str,
        format: ContentFormatArg,
    ) -> Result<Self, String> {
        let folder = ModelFolder::read(Path::new(model_path))?;
        let special_tokens = folder
            .as_ref()
            .map(|f| f.special_tokens.clone())
            .filter(|t| !t.is_empty())
            .unwrap_or_else(builtin_special_tokens);
        if let Some(flag) = flag {
            let source = match std::fs::read_to_string(flag) {
                Ok(text) => text,
                Err(_) if flag.contains(['{', '}', '\n']) => flag.to_string(),
                Err(e) => {
                    return Err(format!(
                        "--chat-template: {flag}: looks like a file path, but it failed to be opened: {e}"
                    ))
                }
            };
            return Ok(Self::new(
                vec![("default".into(), source)],
                special_tokens,
                format,
                format!("--chat-template {flag}"),
            ));
        }
        match folder {
            Some(folder) if !folder.templates.is_empty() => Ok(Self::new(
                folder.templates,
                special_tokens,
                format,
                folder.origin,
            )),
            _ => Ok(Self {
                special_tokens,
                ..Self::new(
                    vec![("default".into(), BUILTIN_TEMPLATE.into())],
                    Vec::new(),
                    format,
                    "built-in Llama 3.1 template".into(),
                )
            }),
        }
    }

    /// Where the template came from (for the startup line).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Compile errors, by template name (printed at startup; chat requests get them as 400s).
    pub fn compile_errors(&self) -> impl Iterator<Item = (&str, &str)> {
        self.templates.iter().filter_map(|t| match &t.outcome {
            Err(e) => Some((t.name.as_str(), e.as_str())),
            Ok(_) => None,
        })
    }

    /// The special tokens every render sees, as template variables.
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// The template a request uses: the only one, or with `tools` the `tool_use` one when
    /// present, else `default` (transformers' choice among named templates).
    fn select(&self, with_tools: bool) -> Result<&Compiled, ChatError> {
        let by_name = |name: &str| self.templates.iter().find(|t| t.name == name);
        let chosen = match self.templates.as_slice() {
            [only] => Some(only),
            _ if with_tools => by_name("tool_use").or_else(|| by_name("default")),
            _ => by_name("default"),
        };
        chosen.ok_or_else(|| {
            ChatError::Template(
                "This model has multiple chat templates with no default specified! Please either pass a chat template or the name of the template you wish to use to the `chat_template` argument. Available template names are ".to_string()
                    + &self.templates.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
                    + ".",
            )
        })
    }

    /// The content format of the template a request uses.
    pub fn content_format(&self, with_tools: bool) -> Result<ContentFormat, ChatError> {
        let t = self.select(with_tools)?;
        t.outcome.clone().map_err(ChatError::Template)
    }

    /// Renders the selected template with `context`.
    pub fn render(&self, with_tools: bool, context: Value) -> Result<String, ChatError> {
        let t = self.select(with_tools)?;
        if let Err(e) = &t.outcome {
            return Err(ChatError::Template(e.clone()));
        }
        self.env
            .get_template(&template_name(&t.name))
            .and_then(|template| template.render(context))
            .map_err(|e| ChatError::Template(describe(&e)))
    }
}

/// The environment's name of a template: what error messages show (`in chat_template:12`).
fn template_name(name: &str) -> String {
    if name == "default" {
        "chat_template".into()
    } else {
        format!("chat_template/{name}")
    }
}

fn builtin_special_tokens() -> Vec<(String, String)> {
    vec![
        ("bos_token".into(), BUILTIN_BOS_TOKEN.into()),
        ("eos_token".into(), BUILTIN_EOS_TOKEN.into()),
    ]
}

/// What a local model folder says about chat: its templates and special tokens.
struct ModelFolder {
    templates: Vec<(String, String)>,
    special_tokens: Vec<(String, String)>,
    origin: String,
}

impl ModelFolder {
    /// `None` when MODEL is not a local folder (a hub name): nothing to read.
    fn read(dir: &Path) -> Result<Option<Self>, String> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: serde_json::Value = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("MODEL: {}: not valid JSON: {e}", config_path.display()))?,
            Err(_) => serde_json::Value::Null,
        };
        let special_tokens = SPECIAL_TOKEN_KEYS
            .iter()
            .filter_map(|key| {
                let token = match config.get(key)? {
                    serde_json::Value::String(s) => s.clone(),
                    // An AddedToken: {"content": "<s>", "lstrip": false, ...}
                    other => other.get("content")?.as_str()?.to_string(),
                };
                Some((key.to_string(), token))
            })
            .collect();
        let jinja_path = dir.join("chat_template.jinja");
        let (templates, origin) = if let Ok(text) = std::fs::read_to_string(&jinja_path) {
            (
                vec![("default".to_string(), text)],
                jinja_path.display().to_string(),
            )
        } else {
            let templates = match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => vec![("default".to_string(), s.clone())],
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .filter_map(|t| {
                        Some((
                            t.get("name")?.as_str()?.to_string(),
                            t.get("template")?.as_str()?.to_string(),
                        ))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            (templates, config_path.display().to_string())
        };
        Ok(Some(Self {
            templates,
            special_tokens,
            origin,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_format_follows_loops_over_message_content() {
        assert_eq!(
            detect_content_format(BUILTIN_TEMPLATE),
            ContentFormat::String
        );
        assert_eq!(
            detect_content_format(
                "{% for message in messages %}{%- for part in message['content'] -%}{{ part.text }}{% endfor %}{% endfor %}"
            ),
            ContentFormat::Openai
        );
        assert_eq!(
            detect_content_format("{% for c in msg.content %}{{ c }}{% endfor %}"),
            ContentFormat::Openai
        );
        assert_eq!(
            detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ContentFormat::String
        );
    }

    #[test]
    fn raise_exception_reads_as_its_message_and_other_errors_name_the_line() {
        let t = ChatTemplate::new(
            vec![(
                "default".into(),
                "line one\n{{ raise_exception('roles must alternate') }}".into(),
            )],
            Vec::new(),
            ContentFormatArg::Auto,
            "test".into(),
        );
        assert_eq!(
            t.render(false, Value::from(())),
            Err(ChatError::Template("roles must alternate".into()))
        );
        let t = ChatTemplate::new(
            vec![("default".into(), "a\n{{ 1 + }}".into())],
            Vec::new(),
            ContentFormatArg::Auto,
            "test".into(),
        );
        let (_, error) = t.compile_errors().next().unwrap();
        assert!(error.contains("chat_template:2"), "{error}");
        assert!(
            matches!(t.render(false, Value::from(())), Err(ChatError::Template(e)) if e.contains("syntax error"))
        );
    }

    #[test]
    fn a_model_folder_gives_named_templates_and_its_special_tokens() {
        let dir = std::env::temp_dir().join(format!("podsim-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"bos_token": {"content": "<B>"}, "eos_token": "<E>", "chat_template": [
                {"name": "default", "template": "{{ bos_token }}plain"},
                {"name": "tool_use", "template": "{{ bos_token }}tools:{{ tools | length }}{{ eos_token }}"}]}"#,
        )
        .unwrap();
        let path = dir.to_str().unwrap();
        let t = ChatTemplate::load(None, path, ContentFormatArg::Auto).unwrap();
        let ctx = |tools: Value| {
            let mut pairs: Vec<(String, Value)> = t
                .special_tokens()
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect();
            pairs.push(("tools".into(), tools));
            Value::from_pairs(pairs)
        };
        assert_eq!(t.render(false, ctx(Value::from(()))).unwrap(), "<B>plain");
        assert_eq!(
            t.render(true, ctx(Value::from(vec![1, 2]))).unwrap(),
            "<B>tools:2<E>"
        );
        // chat_template.jinja wins over tokenizer_config.json's template.
        std::fs::write(dir.join("chat_template.jinja"), "{{ bos_token }}file").unwrap();
        let t = ChatTemplate::load(None, path, ContentFormatArg::Auto).unwrap();
        assert_eq!(t.render(false, ctx(Value::from(()))).unwrap(), "<B>file");
        // Not a folder (a hub name): the built-in template with Llama 3.1's tokens.
        let t = ChatTemplate::load(None, "org/not-a-folder", ContentFormatArg::Auto).unwrap();
        assert_eq!(t.special_tokens(), builtin_special_tokens().as_slice());
        std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
        assert!(ChatTemplate::load(None, path, ContentFormatArg::Auto)
            .unwrap_err()
            .starts_with("MODEL: "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
