//! Whether a directory `/v1/reload` is asked to load speaks the served model's text. A reload
//! replaces the weights only: the tokenizer, chat template and stop ids stay those the server
//! started with, so weights trained with other text would be served through the wrong one,
//! answering 200 with prompts they never saw and completions that do not stop.

use crate::model::peft;
use anyhow::{bail, Context, Result};
use skein_text::{Message, Tokenizer};
use std::path::{Path, PathBuf};

/// The file whose presence says a directory carries its own tokenizer.
const TOKENIZER_FILE: &str = "tokenizer.json";

/// Refuses `dir` when the tokenizer it carries (its own, or for a LoRA adapter without one
/// its base's) differs from `served` in vocabulary, chat template or stop ids. A directory
/// with no tokenizer (weights alone) is taken as it is: the served text is the only one it has.
pub fn check_same_text(served: &Tokenizer, dir: &Path) -> Result<()> {
    let Some(text_dir) = text_dir_of(dir)? else {
        return Ok(());
    };
    let theirs = Tokenizer::from_dir(&text_dir)
        .with_context(|| format!("loading the tokenizer of {}", text_dir.display()))?;
    let differ = differences(served, &theirs)?;
    if !differ.is_empty() {
        bail!(
            "{}: differs from the served model in its {}, which a reload keeps (it replaces \
             the weights only); serve it with `skein serve --model {}` instead",
            text_dir.display(),
            differ.join(" and "),
            dir.display()
        );
    }
    Ok(())
}

/// The directory whose tokenizer comes with `dir`'s weights, if any.
fn text_dir_of(dir: &Path) -> Result<Option<PathBuf>> {
    if dir.join(TOKENIZER_FILE).is_file() {
        return Ok(Some(dir.to_path_buf()));
    }
    if dir.join(peft::CONFIG_FILE).is_file() {
        let base = peft::base_of(dir)?;
        return Ok(base.join(TOKENIZER_FILE).is_file().then_some(base));
    }
    Ok(None)
}

/// What of the text differs: `vocabulary` (the token of each id), `chat template` (what it
/// renders of one conversation, so a template reformatted but rendering the same passes) and
/// `stop ids`.
fn differences(served: &Tokenizer, theirs: &Tokenizer) -> Result<Vec<&'static str>> {
    let mut differ = Vec::new();
    if served.inner().get_vocab(true) != theirs.inner().get_vocab(true) {
        differ.push("vocabulary");
    }
    if probe_render(served)? != probe_render(theirs)? {
        differ.push("chat template");
    }
    let sorted = |t: &Tokenizer| {
        let mut ids = t.stop_token_ids();
        ids.sort_unstable();
        ids
    };
    if sorted(served) != sorted(theirs) {
        differ.push("stop ids");
    }
    Ok(differ)
}

/// What the tokenizer's chat template makes of a conversation with every common role, or its
/// error (a template that refuses a system message refuses it in both); `None` without one.
fn probe_render(t: &Tokenizer) -> Result<Option<String>> {
    let Some(template) = t.chat_template()? else {
        return Ok(None);
    };
    let conversation = [
        Message::system("You are terse."),
        Message::user("What is 2+3?"),
        Message::assistant("5"),
        Message::user("And 4+4?"),
    ];
    Ok(Some(match template.render(&conversation, None, true) {
        Ok(text) => text,
        Err(e) => format!("error: {e:#}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(dir: &Path, template: &str, eos: &str) {
        let t = Tokenizer::char_level("abc0123456789 +?").unwrap();
        t.save_dir(dir).unwrap();
        let path = dir.join("tokenizer_config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config["chat_template"] = template.into();
        config["eos_token"] = eos.into();
        std::fs::write(&path, config.to_string()).unwrap();
    }

    /// The same text passes; another template or another end token is named; a directory of
    /// weights alone is taken as it is.
    #[test]
    fn a_reload_with_other_text_is_refused_by_what_differs() {
        let root = std::env::temp_dir().join(format!("skein-reload-text-{}", std::process::id()));
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                      {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        // The same template written differently renders the same.
        let spaced = chatml.replace("{{ m.role }}", "{{m.role}}");
        let plain = "{% for m in messages %}{{ m.content }}\n{% endfor %}";
        let (a, b, c, d, bare) = (
            root.join("a"),
            root.join("b"),
            root.join("c"),
            root.join("d"),
            root.join("bare"),
        );
        saved(&a, chatml, "<|im_end|>");
        saved(&b, &spaced, "<|im_end|>");
        saved(&c, plain, "<|im_end|>");
        saved(&d, chatml, "<|endoftext|>");
        std::fs::create_dir_all(&bare).unwrap();
        let served = Tokenizer::from_dir(&a).unwrap();
        check_same_text(&served, &b).unwrap();
        check_same_text(&served, &bare).unwrap();
        let err = check_same_text(&served, &c).unwrap_err().to_string();
        assert!(err.contains("in its chat template,"), "{err}");
        assert!(err.contains("skein serve --model"), "{err}");
        let err = check_same_text(&served, &d).unwrap_err().to_string();
        assert!(err.contains("in its stop ids,"), "{err}");
        let other_vocab = root.join("e");
        Tokenizer::char_level("xyz")
            .unwrap()
            .save_dir(&other_vocab)
            .unwrap();
        let err = check_same_text(&served, &other_vocab)
            .unwrap_err()
            .to_string();
        assert!(err.contains("vocabulary"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
