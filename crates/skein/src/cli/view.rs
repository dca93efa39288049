//! `skein view`: a local web page for reading runs: curves, a step's trajectories, one
//! trajectory token by token, and its group side by side.

use anyhow::Result;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args)]
pub struct ViewArgs {
    /// One run directory, or several whose curves are overlaid (e.g. dp 1 against dp 2).
    #[arg(required = true, value_name = "RUN_DIR")]
    run_dirs: Vec<PathBuf>,
    /// Address to listen on. The default, loopback, keeps the page on this machine.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8300)]
    port: u16,
}

pub fn run(args: &ViewArgs) -> Result<()> {
    skein_view::serve(&args.run_dirs, &args.host, args.port, |url| {
        // The address alone on stdout, for scripts; flushed at once, since it does not end.
        println!("{url}");
        let _ = std::io::stdout().flush();
        eprintln!(
            "skein view: serving {} run(s) at {url} (Ctrl-C stops)",
            args.run_dirs.len()
        );
    })
}
