//! Reading and writing the JSON files of a model directory with errors that name the file and,
//! for a value of the wrong shape, the key.

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// Parses `path` as `T`; a type error names the path of the offending key (e.g. `eos_token_id`).
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Like [`read`] but `Ok(None)` when the file does not exist (optional files of a model dir).
pub(crate) fn read_optional<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    if path.exists() {
        read(path).map(Some)
    } else {
        Ok(None)
    }
}

pub(crate) fn parse<T: DeserializeOwned>(text: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let inner = e.into_inner();
        if key == "." {
            anyhow::anyhow!("{inner}")
        } else {
            anyhow::anyhow!("key `{key}`: {inner}")
        }
    })
}

/// Writes pretty JSON with a trailing newline, creating the parent directory.
pub(crate) fn write<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Outer {
        #[allow(dead_code)]
        inner: Inner,
    }
    #[derive(serde::Deserialize, Debug)]
    struct Inner {
        #[allow(dead_code)]
        n: u32,
    }

    #[test]
    fn type_errors_name_the_key() {
        let err = parse::<Outer>(r#"{"inner": {"n": "x"}}"#).unwrap_err();
        assert!(err.to_string().contains("key `inner.n`"), "{err}");
    }

    #[test]
    fn read_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.json");
        std::fs::write(&path, "{").unwrap();
        let err = read::<Outer>(&path).unwrap_err();
        assert!(format!("{err:#}").contains("broken.json"), "{err:#}");
        assert!(read_optional::<Outer>(&dir.path().join("absent.json"))
            .unwrap()
            .is_none());
    }
}
