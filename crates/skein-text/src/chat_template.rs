//! Hugging Face chat templates (the Jinja `chat_template` of tokenizer_config.json) rendered with
//! minijinja, set up to behave like the Jinja environment transformers renders them in, so that
//! a prompt built here is the prompt the checkpoint was trained on.

use anyhow::{anyhow, bail, Context, Result};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Deserializer, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// One chat message, in the shape HF templates expect. Optional fields that are `None` are left
/// out of the template context (not set to null), so `is defined` tests behave as in Python.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// `null` reads as empty here; [`Message::content_is_null`] says the sender gave none.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Thinking text kept apart from `content` by templates of reasoning models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The sender gave no content (`null`, as an OpenAI client does for a message of tool
    /// calls alone): the template sees `content` as none, as transformers 4 passed it.
    /// Templates that test `content is none` (DeepSeek's, written for it) render the calls
    /// only then. transformers 5 leaves such a key out instead, which such a template reads as
    /// content.
    #[serde(skip)]
    pub content_is_null: bool,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
    /// A tool result answering the call `tool_call_id` (if the template uses ids).
    pub fn tool(content: impl Into<String>, tool_call_id: Option<String>) -> Self {
        Self {
            tool_call_id,
            ..Self::new("tool", content)
        }
    }
}

/// The messages as a template reads them: `content` null where the sender gave none.
fn template_messages(messages: &[Message]) -> Result<Vec<serde_json::Value>> {
    messages
        .iter()
        .map(|m| {
            let mut v = serde_json::to_value(m).context("a message as template input")?;
            if m.content_is_null {
                v["content"] = serde_json::Value::Null;
            }
            Ok(v)
        })
        .collect()
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// An assistant's tool call, OpenAI-shaped (`{"type": "function", "function": {...}}`), which is
/// what HF templates unwrap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// An object (what HF templates expect) or a JSON string (what OpenAI APIs send).
    pub arguments: serde_json::Value,
}

impl ToolCall {
    pub fn function(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Self {
            id: None,
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

const DEFAULT_NAME: &str = "default";
const TOOL_USE_NAME: &str = "tool_use";

/// A compiled chat template (or a set of named ones, as tokenizer_config.json may hold).
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template used when `tools` are given: `tool_use` when the set has one.
    with_tools: String,
    bos_token: String,
    eos_token: String,
    /// The tokenizer's other special tokens (`pad_token`, `unk_token`…), which transformers
    /// passes to a template beside `bos_token` and `eos_token`.
    other_tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field(
                "templates",
                &self.env.templates().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles one template source. `bos_token`/`eos_token` are the strings templates see.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        Self::named(
            vec![(DEFAULT_NAME.into(), source.into())],
            bos_token,
            eos_token,
        )
    }

    /// Compiles named templates (HF's list form). Renders `default`, or `tool_use` when tools
    /// are passed and it exists; a single template is used for everything.
    pub fn named(
        templates: Vec<(String, String)>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        let mut env = hf_environment();
        for (name, source) in &templates {
            env.add_template_owned(name.clone(), without_generation_tags(source))
                .map_err(|e| anyhow!("chat template `{name}`: {e:#}"))?;
        }
        let has = |n: &str| templates.iter().any(|(name, _)| name == n);
        let default = if has(DEFAULT_NAME) {
            DEFAULT_NAME.to_string()
        } else if templates.len() == 1 {
            templates[0].0.clone()
        } else {
            bail!(
                "chat templates have no `{DEFAULT_NAME}` among {} named ones",
                templates.len()
            )
        };
        if default != DEFAULT_NAME {
            let source = templates[0].1.clone();
            env.add_template_owned(DEFAULT_NAME, source)?;
        }
        let with_tools = if has(TOOL_USE_NAME) {
            TOOL_USE_NAME
        } else {
            DEFAULT_NAME
        };
        Ok(Self {
            env,
            with_tools: with_tools.to_string(),
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
            other_tokens: Vec::new(),
        })
    }

    /// The template with the tokenizer's other special tokens as variables: (name, token)
    /// pairs such as `("pad_token", "<|im_end|>")`.
    pub fn with_special_tokens(mut self, tokens: Vec<(String, String)>) -> Self {
        self.other_tokens = tokens;
        self
    }

    /// Reads the `chat_template` value of tokenizer_config.json: a string, or a list of
    /// `{"name", "template"}` objects. `None` when the value is null.
    pub fn from_config_value(
        value: &serde_json::Value,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Option<Self>> {
        match value {
            serde_json::Value::Null => Ok(None),
            serde_json::Value::String(s) => Self::new(s, bos_token, eos_token).map(Some),
            serde_json::Value::Array(items) => {
                let mut named = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let field = |k: &str| {
                        item.get(k)
                            .and_then(|v| v.as_str())
                            .map(str::to_string)
                            .with_context(|| format!("chat_template[{i}] has no string `{k}`"))
                    };
                    named.push((field("name")?, field("template")?));
                }
                Self::named(named, bos_token, eos_token).map(Some)
            }
            other => bail!("chat_template must be a string or a list, not {other}"),
        }
    }

    /// The eos string templates see (it ends an assistant turn in most templates).
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders the conversation. `tools` is the list of tool schemas (JSON), passed to the
    /// template as `tools`; `add_generation_prompt` appends the assistant turn opener.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`render`](Self::render) with extra template variables (e.g. `enable_thinking`), as
    /// transformers passes extra keyword arguments of `apply_chat_template`.
    pub fn render_with(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let name = if tools.is_some() {
            &self.with_tools
        } else {
            DEFAULT_NAME
        };
        let template = self.env.get_template(name)?;
        let mut ctx: std::collections::BTreeMap<&str, Value> = extra
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from_serialize(v)))
            .collect();
        ctx.insert(
            "messages",
            Value::from_serialize(template_messages(messages)?),
        );
        // As transformers passes them: `tools` and `documents` are none when not given
        // (defined, so `tools is not none` is the test that tells), and every special token
        // the tokenizer has is a variable.
        ctx.insert(
            "tools",
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        ctx.entry("documents").or_insert(Value::from(()));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        for (name, token) in &self.other_tokens {
            ctx.insert(name.as_str(), Value::from(token.as_str()));
        }
        ctx.insert("bos_token", Value::from(self.bos_token.as_str()));
        ctx.insert("eos_token", Value::from(self.eos_token.as_str()));
        template
            .render(ctx)
            .map_err(|e| anyhow!("rendering chat template: {}", describe(&e)))
    }

    /// Checks, as a model's template is loaded, that it frames a prompt: it renders an
    /// ordinary conversation (one user message), and with `add_generation_prompt` the prompt
    /// ends where the assistant's reply begins. A template that ignores the flag passes when
    /// it opens the reply itself (Llama 2's and Mistral's `[INST] … [/INST]`: the reply follows
    /// the prompt, at most whitespace between); one that writes an opener before a reply
    /// (ChatML's `<|im_start|>assistant\n`) that a prompt does not end with is refused: the
    /// model would be trained to write the opener as part of its answer. A failure to render
    /// is the template's, not any data row's. `origin` names the template's file.
    pub fn check_prompts(&self, origin: &str) -> Result<()> {
        let question = [Message::user(PROBE_QUESTION)];
        let fails = |e: anyhow::Error| {
            e.context(format!(
                "{origin}: the chat template fails on an ordinary conversation (a user's \
                 question, and a reply to it), so it would fail on every prompt; fix the template"
            ))
        };
        let prompt = self.render(&question, None, false).map_err(fails)?;
        if self.render(&question, None, true).map_err(fails)? != prompt {
            return Ok(());
        }
        let answered = [question[0].clone(), Message::assistant(PROBE_REPLY)];
        let whole = self.render(&answered, None, false).map_err(fails)?;
        let opener = whole
            .strip_prefix(prompt.as_str())
            .and_then(|rest| rest.find(PROBE_REPLY).map(|at| &rest[..at]));
        let what = match opener {
            Some(gap) if gap.trim().is_empty() => return Ok(()),
            Some(opener) => format!(
                "it writes {opener:?} before an assistant's reply, but a prompt does not end \
                 with it: the model would be left to write it as part of its answer, and be \
                 trained to; add \
                 `{{%- if add_generation_prompt %}}{{{{- {opener:?} }}}}{{%- endif %}}` at the \
                 end of the template"
            ),
            None => "a prompt renders the same with and without it, and is not how the \
                     conversation with the assistant's reply begins, so it would not end with \
                     the assistant's opener; add `{% if add_generation_prompt %}` … the \
                     opener … `{% endif %}` at the end of the template"
                .to_string(),
        };
        bail!("{origin}: the chat template ignores `add_generation_prompt`: {what}")
    }
}

/// The conversation [`ChatTemplate::check_prompts`] renders: a question, and a reply to it.
const PROBE_QUESTION: &str = "What is 2+3?";
const PROBE_REPLY: &str = "2+3 is 5.";

/// The error message plus minijinja's cause chain (the `raise_exception` text is in there).
fn describe(e: &Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// `source` with transformers' `{% generation %}` … `{% endgeneration %}` (which mark the
/// assistant's spans for `return_assistant_tokens_mask`, and render nothing) as a block that
/// renders its body as it is, `{% if true %}` … `{% endif %}`: minijinja has no such tag, and
/// the block keeps the tags' whitespace control (`{%-`, `-%}`).
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let replaced = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replaced {
            Some(statement) => out.push_str(&format!("{{%{open} {statement} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// An environment configured like the one transformers renders chat templates in.
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Python str/dict/list methods (`.strip()`, `.startswith()`, `.items()`, `.get()`, ...).
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as transformers defines it: Python's `json.dumps` with `ensure_ascii=False` by
/// default and its spacing (`", "`, `": "`), not minijinja's compact, HTML-escaped one. The
/// spacing matters: it is part of the prompt the model sees.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.to_string()),
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson separators must be two strings",
            ))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = PyJson {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

struct PyJson {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Array(items) if !items.is_empty() => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push(']');
            }
            J::Object(map) if !map.is_empty() => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    self.separate(i, depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out);
                }
                self.close(depth, out);
                out.push('}');
            }
            J::String(s) => self.string(s, out),
            // Empty containers, numbers, bools and null print as serde_json does, which is
            // how Python prints them too.
            other => out.push_str(&other.to_string()),
        }
    }

    fn separate(&self, index: usize, depth: usize, out: &mut String) {
        if index > 0 {
            out.push_str(&self.item_sep);
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn close(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = serde_json::Value::String(s.to_string()).to_string();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}

/// transformers exposes `strftime_now(format)` (templates put today's date in the system
/// prompt). UTC, with the common directives; anything else is an error, not a guess.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs).map(Value::from)
}

fn strftime(format: &str, unix_secs: u64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (unix_secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let secs_of_day = unix_secs % 86_400;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.unwrap_or(' ')
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ChatML template with tool support in the style of Qwen2.5 instruct models (written for
    /// this test): system prompt with tool signatures, tool calls as JSON in tags, consecutive
    /// tool results grouped in one user turn.
    const QWEN_STYLE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}
{{- messages[0]['content'] }}
{%- else %}
{{- 'You are a helpful agent.' }}
{%- endif %}
{{- "\n\n# Tools\n\nFunction signatures, one per line, inside <tools></tools>:\n<tools>" }}
{%- for tool in tools %}
{{- "\n" }}{{- tool | tojson }}
{%- endfor %}
{{- "\n</tools>\n\nTo call one, reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n" }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>system\nYou are a helpful agent.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content.strip() + '<|im_end|>' + '\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}
{{- '\n' + message.content }}
{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}
{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- elif message.role != "system" %}
{{- raise_exception('unknown role: ' + message.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

    fn qwen() -> ChatTemplate {
        ChatTemplate::new(QWEN_STYLE, None, Some("<|im_end|>")).unwrap()
    }

    /// transformers' `{% generation %}` marks the assistant's spans and renders nothing (as
    /// assistant-only-loss setups save it): such a template loads, and its tags trim the
    /// whitespace their `-` asks for, as any block tag's would.
    #[test]
    fn generation_tags_render_their_body_as_it_is() {
        let marked = "{% for m in messages %}[{{ m.role }}] {%- generation -%}  {{ m.content }}\
            {% endgeneration %} |{% endfor %}";
        let messages = [Message::user("2+2?"), Message::assistant("4")];
        let text = ChatTemplate::new(marked, None, None)
            .unwrap()
            .render(&messages, None, false)
            .unwrap();
        assert_eq!(text, "[user]2+2? |[assistant]4 |");
        assert_eq!(
            without_generation_tags("a{%- generation -%}b{%+ endgeneration %}c{% if x %}"),
            "a{%- if true -%}b{%+ endif %}c{% if x %}"
        );
    }

    #[test]
    fn renders_plain_chatml_with_default_system() {
        let text = qwen()
            .render(&[Message::user("  What is 2+2? ")], None, true)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful agent.<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn generation_prompt_is_optional() {
        let msgs = [Message::system("Be brief."), Message::user("hi")];
        let text = qwen().render(&msgs, None, false).unwrap();
        assert!(text.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"));
        assert!(text.ends_with("<|im_start|>user\nhi<|im_end|>\n"), "{text}");
    }

    #[test]
    fn renders_tools_tool_calls_and_grouped_results() {
        let tools = json!([{"type": "function", "function": {"name": "add",
            "description": "Add two numbers", "parameters": {"type": "object",
            "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}}}]);
        let mut call = Message::assistant("");
        call.tool_calls = Some(vec![
            ToolCall::function("add", json!({"b": 2, "a": 1})),
            ToolCall::function("add", json!({"b": 4, "a": 3})),
        ]);
        let msgs = [
            Message::user("Add 1+2 and 3+4"),
            call,
            Message::tool("3", None),
            Message::tool("7", None),
            Message::assistant("3 and 7"),
        ];
        let text = qwen().render(&msgs, Some(&tools), false).unwrap();
        // Python's spacing and the caller's key order, as transformers' tojson writes it.
        assert!(
            text.contains(
                "\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \
             \"Add two numbers\", \"parameters\": {\"type\": \"object\", \"properties\": \
             {\"b\": {\"type\": \"integer\"}, \"a\": {\"type\": \"integer\"}}}}}\n</tools>"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "<|im_start|>assistant\n<tool_call>\n{\"name\": \"add\", \"arguments\": \
             {\"b\": 2, \"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \
             \"arguments\": {\"b\": 4, \"a\": 3}}\n</tool_call><|im_end|>\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n\
             </tool_response><|im_end|>\n<|im_start|>assistant\n3 and 7<|im_end|>\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let err = qwen()
            .render(&[Message::new("robot", "beep")], None, false)
            .unwrap_err();
        assert!(err.to_string().contains("unknown role: robot"), "{err}");
    }

    #[test]
    fn python_methods_and_special_tokens_work() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.content.startswith('x') %}\
                   {{ m.content.upper() }}{% endif %}{% for k, v in m.items() %}\
                   {{ k }}={{ m.get(k) }};{% endfor %}{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, Some("<s>"), Some("</s>")).unwrap();
        let text = t.render(&[Message::user("xy")], None, false).unwrap();
        assert_eq!(text, "<s>XYrole=user;content=xy;</s>");
    }

    #[test]
    fn extra_variables_reach_the_template() {
        let t = ChatTemplate::new("{{ 'on' if enable_thinking else 'off' }}", None, None).unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), json!(true));
        assert_eq!(t.render_with(&[], None, false, &extra).unwrap(), "on");
        assert_eq!(t.render(&[], None, false).unwrap(), "off");
    }

    #[test]
    fn tojson_follows_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true, \
             separators=[',', ':']) }}|{{ s | tojson }}|{{ s | tojson(ensure_ascii=true) }}",
            None,
            None,
        )
        .unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), json!({"b": [1, 2.5], "a": {}, "c": null}));
        extra.insert("s".into(), json!("é<\"\n"));
        let out = t.render_with(&[], None, false, &extra).unwrap();
        let parts: Vec<_> = out.split('|').collect();
        assert_eq!(parts[0], r#"{"b": [1, 2.5], "a": {}, "c": null}"#);
        assert_eq!(
            parts[1],
            "{\n  \"b\": [\n    1,\n    2.5\n  ],\n  \"a\": {},\n  \"c\": null\n}"
        );
        assert_eq!(parts[2], r#"{"a":{},"b":[1,2.5],"c":null}"#);
        assert_eq!(parts[3], "\"é<\\\"\\n\"");
        assert_eq!(parts[4], "\"\\u00e9<\\\"\\n\"");
    }

    #[test]
    fn named_templates_pick_tool_use_when_tools_are_given() {
        let value = json!([
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools:{{ tools | length }}"}
        ]);
        let t = ChatTemplate::from_config_value(&value, None, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.render(&[], None, false).unwrap(), "plain");
        assert_eq!(
            t.render(&[], Some(&json!([1, 2])), false).unwrap(),
            "tools:2"
        );
        assert!(ChatTemplate::from_config_value(&json!(null), None, None)
            .unwrap()
            .is_none());
        let err = ChatTemplate::from_config_value(&json!([{"name": "x"}]), None, None).unwrap_err();
        assert!(err.to_string().contains("`template`"), "{err}");
    }

    #[test]
    fn syntax_errors_are_reported_not_panics() {
        let err = ChatTemplate::new("{% for m in messages %}", None, None).unwrap_err();
        assert!(err.to_string().contains("chat template"), "{err}");
    }

    #[test]
    fn messages_deserialize_from_openai_shapes() {
        let m: Message = serde_json::from_value(json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}))
        .unwrap();
        assert_eq!(m.content, "");
        let calls = m.tool_calls.unwrap();
        assert_eq!(calls[0].function.arguments, json!("{\"x\": 1}"));
        assert_eq!(calls[0].id.as_deref(), Some("c1"));
    }

    /// The variables a template sees besides the messages are transformers' (5.24, with
    /// SmolLM2's tokenizer and no tools): `tools` and `documents` defined and none, and the
    /// tokenizer's other special tokens defined.
    #[test]
    fn tools_documents_and_special_tokens_are_defined_as_transformers_defines_them() {
        let probe = "{% for v in [tools is defined, tools is none, tools is not none, \
                     documents is defined, pad_token is defined, unk_token is defined] %}\
                     {{ 'T' if v else 'F' }}{% endfor %}";
        let t = ChatTemplate::new(probe, Some("<|im_start|>"), Some("<|im_end|>"))
            .unwrap()
            .with_special_tokens(vec![
                ("unk_token".into(), "<|endoftext|>".into()),
                ("pad_token".into(), "<|im_end|>".into()),
            ]);
        let text = t.render(&[Message::user("hi")], None, false).unwrap();
        assert_eq!(text, "TTFTTT");
        let tools = serde_json::json!([{"type": "function"}]);
        let text = t
            .render(&[Message::user("hi")], Some(&tools), false)
            .unwrap();
        assert_eq!(text, "TFTTTT");
    }

    /// A message sent with `content: null` reaches the template as none: DeepSeek's template
    /// renders an assistant's calls only when its content is none.
    #[test]
    fn null_content_reaches_the_template_as_none() {
        let src = "{% for m in messages %}{% if m.content is none %}[none]{% else %}\
                   [{{ m.content }}]{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let null = Message {
            content_is_null: true,
            ..Message::assistant("")
        };
        let text = t.render(
            &[Message::user("hi"), null, Message::assistant("")],
            None,
            false,
        );
        assert_eq!(text.unwrap(), "[hi][none][]");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %B %m %%", 1_709_211_909).unwrap(),
            "29 Feb 2024 13:05:09 February 02 %"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert!(strftime("%Q", 0).is_err());
    }
}
