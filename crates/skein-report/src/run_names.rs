//! Names for several runs shown together (`skein view`, `skein plot A B`): short, and
//! different for runs in different directories.

use std::path::{Path, PathBuf};

/// The runs' names: each directory's own name, or where two share one, each directory's path
/// from the deepest folder all of them are in.
pub fn run_names(canonical: &[PathBuf]) -> Vec<String> {
    let own: Vec<String> = canonical.iter().map(|d| own_name(d)).collect();
    let repeated = own.iter().enumerate().any(|(i, n)| own[..i].contains(n));
    if !repeated {
        return own;
    }
    let mut base = canonical[0].clone();
    while !canonical.iter().all(|d| d.starts_with(&base)) {
        if !base.pop() {
            break;
        }
    }
    // A run that is that folder itself would have an empty name: name them from above it.
    if canonical.contains(&base) {
        base.pop();
    }
    canonical
        .iter()
        .map(|d| match d.strip_prefix(&base) {
            Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
            _ => own_name(d),
        })
        .collect()
}

fn own_name(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(paths: &[&str]) -> Vec<String> {
        run_names(&paths.iter().map(PathBuf::from).collect::<Vec<_>>())
    }

    #[test]
    fn runs_are_named_by_directory_or_by_path_from_the_folder_they_share() {
        assert_eq!(named(&["/r/x/default", "/r/y/b"]), ["default", "b"]);
        assert_eq!(
            named(&["/r/x/default", "/r/y/default"]),
            ["x/default", "y/default"]
        );
        // One run inside another: named from the folder above the outer one.
        assert_eq!(named(&["/r/run", "/r/run/sub/run"]), ["run", "run/sub/run"]);
    }
}
