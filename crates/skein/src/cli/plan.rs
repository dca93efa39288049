//! `skein plan`: PPO mini-batches planned for a JSON batch, printed as JSON.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

/// `skein plan`: one-line error and exit status 2 on bad input, never partial output.
pub fn run(input: Option<PathBuf>) -> ExitCode {
    let text = match input.as_deref().filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
        }
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map(|_| s)
                .map_err(|e| format!("reading stdin: {e}"))
        }
    };
    match text.and_then(|t| skein_plan::cli::plan_json(&t).map_err(|e| e.to_string())) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", e.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
