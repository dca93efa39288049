use std::process::ExitCode;

fn main() -> ExitCode {
    skein::cli::main()
}
