//! A safetensors file written one tensor at a time. The header needs only each tensor's name,
//! dtype and shape, so a tensor computed for the file (a LoRA weight merged into float32) is
//! made, copied out and dropped before the next: a 7B model's merged weights never exist all
//! at once beside the model they come from.

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// What the header says of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub shape: Vec<i64>,
}

/// The safetensors name of a dtype a model's weights are stored in.
fn dtype_name(kind: Kind) -> Result<&'static str> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        other => bail!("no safetensors dtype for {other:?}"),
    })
}

/// Writes `entries`, in order, to `path`: the header first, then the data of `tensor(i)`
/// for each, which must have the entry's dtype and shape.
pub fn write_streamed(
    path: &Path,
    entries: &[Entry],
    mut tensor: impl FnMut(usize) -> Result<Tensor>,
) -> Result<()> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for e in entries {
        let numel: i64 = e.shape.iter().product();
        let end = offset + numel as usize * e.kind.elt_size_in_bytes();
        let about =
            json!({"dtype": dtype_name(e.kind)?, "shape": e.shape, "data_offsets": [offset, end]});
        header.insert(e.name.clone(), about);
        offset = end;
    }
    let mut text = Value::Object(header).to_string();
    // The data starts 8-byte aligned, as the reference writer pads it.
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(' ');
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let write = |out: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]| {
        out.write_all(bytes)
            .with_context(|| format!("writing {}", path.display()))
    };
    write(&mut out, &(text.len() as u64).to_le_bytes())?;
    write(&mut out, text.as_bytes())?;
    for (i, e) in entries.iter().enumerate() {
        let t = tensor(i)?;
        if t.kind() != e.kind || t.size() != e.shape {
            bail!(
                "{}: the tensor is {:?} {:?}, the header says {:?} {:?}",
                e.name,
                t.kind(),
                t.size(),
                e.kind,
                e.shape
            );
        }
        let t = t.to_device(Device::Cpu).contiguous();
        let numel = t.numel();
        let mut bytes = vec![0u8; numel * e.kind.elt_size_in_bytes()];
        t.f_copy_data_u8(&mut bytes, numel)
            .with_context(|| format!("copying {} out", e.name))?;
        write(&mut out, &bytes)?;
    }
    out.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file reads back as the tensors it was written from, in every stored dtype, and a
    /// tensor that is not what the header says is refused.
    #[test]
    fn a_streamed_file_reads_back_whole() {
        let path = std::env::temp_dir().join(format!("skein-stream-{}.st", std::process::id()));
        let tensors = [
            (
                "a.weight",
                Tensor::randn([3, 5], (Kind::Float, Device::Cpu)),
            ),
            (
                "b",
                Tensor::randn([7], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16),
            ),
            (
                "c",
                Tensor::randn([2, 2, 2], (Kind::Float, Device::Cpu)).to_kind(Kind::Half),
            ),
        ];
        let entries: Vec<Entry> = tensors
            .iter()
            .map(|(n, t)| Entry {
                name: n.to_string(),
                kind: t.kind(),
                shape: t.size(),
            })
            .collect();
        write_streamed(&path, &entries, |i| Ok(tensors[i].1.shallow_clone())).unwrap();
        let back: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&path)
            .unwrap()
            .into_iter()
            .collect();
        for (name, t) in &tensors {
            assert!(back[*name].equal(t), "{name}");
        }
        let wrong = write_streamed(&path, &entries, |_| Ok(tensors[0].1.shallow_clone()));
        assert!(wrong.unwrap_err().to_string().contains("the header says"));
        std::fs::remove_file(&path).ok();
    }
}
