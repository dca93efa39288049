//! The check of a command a run starts (an environment worker, a reward worker, an agent): a
//! typo in it would otherwise show only once the first step asks the process for something,
//! as every trajectory of every step failing.

use crate::Validator;
use std::path::Path;

/// Script files a command's arguments may name: an argument ending in one of these (and not
/// an option) must be a file.
const SCRIPT_EXTENSIONS: &[&str] = &["py", "sh", "js", "mjs", "rb", "pl", "lua", "jl", "r"];

impl Validator {
    /// `command` (the value of `key`) can start: a program that exists (a path to a file, or a
    /// name found on PATH), and every argument that names a script a file that exists
    /// (relative paths are from the directory skein runs in). `example` says what the key
    /// holds, for an empty command.
    pub fn command(&mut self, key: &str, command: &[String], example: &str) -> &mut Self {
        let Some(program) = command.first().filter(|p| !p.trim().is_empty()) else {
            return self.check(
                false,
                key,
                &format!("must name {example}"),
                format!("{command:?}"),
            );
        };
        let found = if program.contains('/') {
            Path::new(program).is_file()
        } else {
            on_path(program)
        };
        self.check(
            found,
            key,
            "names a program that does not exist (a path to a file, or a name on PATH)",
            program,
        );
        for (i, arg) in command.iter().enumerate().skip(1) {
            let path = Path::new(arg);
            let script = !arg.starts_with('-')
                && path
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| SCRIPT_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
            self.check(
                !script || path.is_file(),
                &format!("{key}[{i}]"),
                "no such file (relative paths are from the directory skein runs in)",
                arg,
            );
        }
        self
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}

#[cfg(test)]
mod tests {
    use crate::Validator;

    fn problems(command: &[&str]) -> String {
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let mut v = Validator::new();
        v.command("w.command", &command, "a program");
        v.finish().err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn a_command_that_can_start_passes() {
        assert_eq!(problems(&["sh", "-c", "true"]), "");
        assert_eq!(problems(&["/bin/sh", "Cargo.toml"]), "");
    }

    #[test]
    fn a_missing_program_or_script_is_named_by_key_and_index() {
        assert!(problems(&[]).contains("`w.command`: must name a program"));
        assert!(problems(&["no-such-program-anywhere"]).contains("`w.command`"));
        assert!(problems(&["/no/such/python"]).contains("/no/such/python"));
        let e = problems(&["sh", "-x", "/no/such/worker.py"]);
        assert!(e.contains("`w.command[2]`: no such file"), "{e}");
        // An option that looks like a script is not a path.
        assert_eq!(problems(&["sh", "--out=x.py"]), "");
    }
}
