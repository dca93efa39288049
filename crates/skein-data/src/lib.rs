//! Datasets: JSONL and verl-layout parquet prompt files, read and validated row by row.
