//! verl's parquet layout: columns `prompt` (a list of `{role, content}` structs, or a string),
//! `data_source`, `reward_model` (a struct with `ground_truth`) and optionally `extra_info`.
//! Records are read with parquet's row API and converted to JSON, then validated exactly as a
//! JSONL line is.

use crate::error::DataError;
use crate::row::{from_json, PromptRow};
use crate::rows::{ReadOptions, Rows};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, FloatType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::record::{Field, Row};
use parquet::schema::parser::parse_message_type;
use serde_json::Value;
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

const REQUIRED: [&str; 3] = ["prompt", "data_source", "reward_model"];

/// Reads the prompt rows of a verl-layout parquet file.
pub fn read(file: &Path, opts: &ReadOptions) -> Result<Rows<PromptRow>, DataError> {
    let f = File::open(file).map_err(|e| DataError::file(file, format!("cannot open: {e}")))?;
    // The decoder works on untrusted bytes; should it panic on a corrupt file, that is this
    // file's error, not the end of the run.
    catch_unwind(AssertUnwindSafe(|| read_file(f, file, opts))).unwrap_or_else(|_| {
        Err(DataError::file(
            file,
            "the parquet decoder failed on this file (is it corrupt?)",
        ))
    })
}

fn read_file(f: File, file: &Path, opts: &ReadOptions) -> Result<Rows<PromptRow>, DataError> {
    let reader = SerializedFileReader::new(f)
        .map_err(|e| DataError::file(file, format!("not a readable parquet file: {e}")))?;
    let root = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema();
    let columns: Vec<&str> = root.get_fields().iter().map(|t| t.name()).collect();
    if let Some(missing) = REQUIRED.iter().find(|c| !columns.contains(c)) {
        return Err(DataError::file(
            file,
            format!(
                "no column `{missing}` (the file has: {}); a verl-layout file has `prompt`, \
                 `data_source`, `reward_model` and optionally `extra_info`",
                columns.join(", ")
            ),
        ));
    }
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| DataError::file(file, format!("cannot read records: {e}")))?;
    let mut out = Rows::default();
    for (i, record) in rows.enumerate() {
        // A record that does not decode leaves the reader in no state to go on: always fatal.
        let record =
            record.map_err(|e| DataError::row(file, i + 1, format!("cannot decode: {e}")))?;
        out.push(from_json(&record_json(&record)), file, i + 1, opts)?;
    }
    Ok(out)
}

/// A record as JSON, as parquet's own `to_json_value` gives it, except for byte arrays
/// without a string annotation: some writers store text that way, and parquet's base64 of it
/// would be read as a prompt or a ground truth no answer ever matches. Those holding UTF-8
/// are that text; others (an image in `extra_info`) stay base64.
fn record_json(record: &Row) -> Value {
    Value::Object(
        record
            .get_column_iter()
            .map(|(name, field)| (name.clone(), field_json(field)))
            .collect(),
    )
}

fn field_json(field: &Field) -> Value {
    match field {
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(text) => Value::String(text.to_string()),
            Err(_) => field.to_json_value(),
        },
        // A float32 by its shortest text (1.1, not the 1.100000023841858 its f64 widening
        // prints): a numeric ground truth is compared with answers as written.
        Field::Float(f) => f
            .to_string()
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Field::Group(row) => record_json(row),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_json).collect()),
        // Map keys are as parquet writes them; their values may be text stored as bytes.
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(key, value)| {
                    let key = match field_json(key) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, field_json(value))
                })
                .collect(),
        ),
        other => other.to_json_value(),
    }
}

/// Writes rows in verl's layout (snappy-compressed). `extra_info` is stored as JSON text.
pub fn write(file: &Path, rows: &[PromptRow]) -> Result<(), DataError> {
    let schema = "message verl {
        optional group prompt (LIST) {
            repeated group list {
                optional group element {
                    optional binary content (STRING);
                    optional binary role (STRING);
                }
            }
        }
        optional binary data_source (STRING);
        optional group reward_model { optional binary ground_truth (STRING); }
        optional binary extra_info (STRING);
    }";
    let (mut content, mut role) = (Leaf::default(), Leaf::default());
    let (mut source, mut truth, mut extra) = (Leaf::default(), Leaf::default(), Leaf::default());
    for row in rows {
        for (i, m) in row.prompt.iter().enumerate() {
            let rep = i16::from(i > 0);
            content.push_bytes(&m.content, 4, rep);
            role.push_bytes(&m.role, 4, rep);
        }
        if row.prompt.is_empty() {
            content.push_null(1, 0);
            role.push_null(1, 0);
        }
        source.push_bytes(&row.data_source, 1, 0);
        truth.push_bytes(&row.ground_truth, 2, 0);
        match &row.extra_info {
            serde_json::Value::Null => extra.push_null(0, 0),
            v => extra.push_bytes(&v.to_string(), 1, 0),
        }
    }
    write_columns(file, schema, vec![content, role, source, truth, extra])
}

/// One leaf column's values with their definition and repetition levels (the Dremel
/// encoding: a null or empty list has a level and no value).
#[derive(Debug, Clone, Default)]
pub struct Leaf {
    pub bytes: Vec<ByteArray>,
    pub longs: Vec<i64>,
    pub floats: Vec<f32>,
    pub def: Vec<i16>,
    pub rep: Vec<i16>,
}

impl Leaf {
    pub fn push_bytes(&mut self, s: &str, def: i16, rep: i16) {
        self.bytes.push(ByteArray::from(s.as_bytes().to_vec()));
        self.def.push(def);
        self.rep.push(rep);
    }

    pub fn push_long(&mut self, v: i64, def: i16, rep: i16) {
        self.longs.push(v);
        self.def.push(def);
        self.rep.push(rep);
    }

    pub fn push_float(&mut self, v: f32, def: i16, rep: i16) {
        self.floats.push(v);
        self.def.push(def);
        self.rep.push(rep);
    }

    pub fn push_null(&mut self, def: i16, rep: i16) {
        self.def.push(def);
        self.rep.push(rep);
    }
}

/// Writes one row group of raw leaf columns, in schema order, under a schema in parquet's
/// message syntax (a building block for [`write`] and for test files of any shape). Binary
/// leaves take `bytes`, INT64 leaves `longs`, FLOAT leaves `floats`.
pub fn write_columns(file: &Path, schema: &str, leaves: Vec<Leaf>) -> Result<(), DataError> {
    write_columns_compressed(file, schema, leaves, Compression::SNAPPY)
}

/// [`write_columns`] with another codec.
pub fn write_columns_compressed(
    file: &Path,
    schema: &str,
    leaves: Vec<Leaf>,
    compression: Compression,
) -> Result<(), DataError> {
    let err = |e: parquet::errors::ParquetError| DataError::file(file, format!("writing: {e}"));
    let schema = Arc::new(parse_message_type(schema).map_err(err)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(compression)
            .build(),
    );
    let f = File::create(file).map_err(|e| DataError::file(file, format!("cannot create: {e}")))?;
    let mut writer = SerializedFileWriter::new(f, schema, props).map_err(err)?;
    let mut group = writer.next_row_group().map_err(err)?;
    let mut leaves = leaves.into_iter();
    while let Some(mut col) = group.next_column().map_err(err)? {
        let leaf = leaves
            .next()
            .ok_or_else(|| DataError::file(file, "fewer leaves than the schema has columns"))?;
        let (def, rep) = (Some(&leaf.def[..]), Some(&leaf.rep[..]));
        use parquet::column::writer::ColumnWriter;
        let (is_long, is_float) = match col.untyped() {
            ColumnWriter::Int64ColumnWriter(_) => (true, false),
            ColumnWriter::FloatColumnWriter(_) => (false, true),
            _ => (false, false),
        };
        if is_long {
            col.typed::<Int64Type>()
                .write_batch(&leaf.longs, def, rep)
                .map_err(err)?;
        } else if is_float {
            col.typed::<FloatType>()
                .write_batch(&leaf.floats, def, rep)
                .map_err(err)?;
        } else {
            col.typed::<ByteArrayType>()
                .write_batch(&leaf.bytes, def, rep)
                .map_err(err)?;
        }
        col.close().map_err(err)?;
    }
    group.close().map_err(err)?;
    writer.close().map_err(err)?;
    Ok(())
}
