//! `hourglass new-planner`: a ready-to-build planner project in Rust, Python
//! or JavaScript.
//!
//! Every language gets the same strategy (delays round up to configured steps,
//! one TTL queue per step), its WIT binding, one test that needs no host, a
//! `build` script that writes `planner.wasm`, a `planner.toml` for
//! `check-planner` and a README. The templates live in `host/templates/planner`
//! and are compiled into the binary, so a release build needs no checkout —
//! except for Rust, whose project depends on the SDK by path.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// The contract every planner is built against, copied into Python and
/// JavaScript projects (a Rust project gets it through the SDK).
const WIT: &str = include_str!("../../wit/planner.wit");

/// The SDK next to the host's sources, when the host was built from a checkout.
const SDK_IN_CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../planners/sdk");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    Rust,
    Python,
    JavaScript,
}

#[derive(Debug, Error)]
pub enum ScaffoldError {
    #[error("planner name {0:?}: use lowercase letters, digits and '-', starting with a letter (it names the package and its queues)")]
    Name(String),
    #[error("{}: already exists; choose another folder or remove it", .0.display())]
    Exists(PathBuf),
    #[error("the Rust planner SDK is not at {}; pass --sdk with the path to planners/sdk of an hourglass checkout", .0.display())]
    SdkMissing(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// One file of a project: its path inside the folder and its text.
struct File {
    path: &'static str,
    text: &'static str,
    executable: bool,
}

const fn file(path: &'static str, text: &'static str) -> File {
    File { path, text, executable: false }
}

const fn script(path: &'static str, text: &'static str) -> File {
    File { path, text, executable: true }
}

macro_rules! template {
    ($path:literal) => {
        include_str!(concat!("../templates/planner/", $path))
    };
}

impl Language {
    fn files(self) -> Vec<File> {
        let mut files = vec![file("README.md", template!("README.md")), file("planner.toml", template!("planner.toml"))];
        files.extend(match self {
            Language::Rust => vec![
                file("Cargo.toml", template!("rust/Cargo.toml")),
                file("src/lib.rs", template!("rust/src/lib.rs")),
                script("build", template!("rust/build")),
                file(".gitignore", template!("rust/gitignore")),
            ],
            Language::Python => vec![
                file("app.py", template!("python/app.py")),
                file("steps.py", template!("python/steps.py")),
                file("test_steps.py", template!("python/test_steps.py")),
                script("build", template!("python/build")),
                file(".gitignore", template!("python/gitignore")),
                file("wit/planner.wit", WIT),
            ],
            Language::JavaScript => vec![
                file("planner.js", template!("js/planner.js")),
                file("planner.test.js", template!("js/planner.test.js")),
                file("package.json", template!("js/package.json")),
                script("build", template!("js/build")),
                file(".gitignore", template!("js/gitignore")),
                file("wit/planner.wit", WIT),
            ],
        });
        files
    }

    /// README details: the language, where the strategy is, how to test it,
    /// and the sandbox room its runtime needs beyond the defaults.
    fn readme(self) -> [(&'static str, &'static str); 5] {
        match self {
            Language::Rust => [("language", "Rust"), ("source", "`src/lib.rs`"), ("test", "cargo test"), ("check_flags", ""), ("limits", "")],
            // Measured: a Python runtime needs 13–16 MiB to start (the default limit is 16).
            Language::Python => [
                ("language", "Python"),
                ("source", "`steps.py` (and its WIT glue in `app.py`)"),
                ("test", "python3 -m unittest"),
                ("check_flags", " \\\n    --memory-limit-mib 64 --start-timeout 10s"),
                ("limits", "\nmemory_limit_mib = 64\nstart_timeout = \"10s\""),
            ],
            Language::JavaScript => [
                ("language", "JavaScript"),
                ("source", "`planner.js`"),
                ("test", "node --test"),
                ("check_flags", " --start-timeout 10s"),
                ("limits", "\nstart_timeout = \"10s\""),
            ],
        }
    }
}

/// A checked planner name: it becomes a package name, a planner name and a
/// queue prefix, so it keeps to characters all three accept.
fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_fine = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if starts_well && rest_fine && name.len() <= 64 && !name.ends_with('-') { Ok(()) } else { Err(ScaffoldError::Name(name.to_string())) }
}

/// Where a Rust project finds the SDK: `sdk` if given, else the checkout the
/// host was built from.
fn sdk_path(sdk: Option<&Path>) -> Result<PathBuf, ScaffoldError> {
    let path = sdk.map_or_else(|| PathBuf::from(SDK_IN_CHECKOUT), Path::to_path_buf);
    std::fs::canonicalize(&path).ok().filter(|p| p.join("Cargo.toml").is_file()).ok_or(ScaffoldError::SdkMissing(path))
}

/// Writes a new planner project named `name` into `dir` (which must not
/// exist) and returns the files written.
pub fn create(name: &str, language: Language, dir: &Path, sdk: Option<&Path>) -> Result<Vec<PathBuf>, ScaffoldError> {
    check_name(name)?;
    if dir.exists() {
        return Err(ScaffoldError::Exists(dir.to_path_buf()));
    }
    let sdk = match language {
        Language::Rust => sdk_path(sdk)?.display().to_string(),
        _ => String::new(),
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let absolute = std::fs::canonicalize(dir).map_err(io(dir))?;
    let crate_name = name.replace('-', "_");
    let mut values = vec![("name", name), ("crate", crate_name.as_str()), ("sdk", sdk.as_str())];
    let shown_dir = absolute.display().to_string();
    values.push(("dir", shown_dir.as_str()));
    values.extend(language.readme());
    let mut written = Vec::new();
    for file in language.files() {
        let path = absolute.join(file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, fill(file.text, &values)).map_err(io(&path))?;
        if file.executable {
            make_executable(&path).map_err(io(&path))?;
        }
        written.push(path);
    }
    Ok(written)
}

/// Turns an I/O error into one that names the file.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScaffoldError + '_ {
    move |source| ScaffoldError::Io { path: path.to_path_buf(), source }
}

/// Replaces each `{{key}}` with its value.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    values.iter().fold(template.to_string(), |text, (key, value)| text.replace(&format!("{{{{{key}}}}}"), value))
}

#[cfg(unix)]
fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_cannot_name_a_package_and_its_queues_are_refused() {
        for bad in ["", "Steps", "1steps", "my_steps", "steps-", "my steps", "ünï"] {
            assert!(matches!(check_name(bad), Err(ScaffoldError::Name(_))), "{bad:?}");
        }
        for good in ["steps", "my-steps2"] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn every_placeholder_is_filled_in_every_language() {
        for language in [Language::Rust, Language::Python, Language::JavaScript] {
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("my-steps");
            let files = create("my-steps", language, &project, None).unwrap();
            assert!(files.iter().any(|f| f.ends_with("build")), "{language:?}: {files:?}");
            for path in files {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(!text.contains("{{"), "{language:?}: {} keeps a placeholder", path.display());
            }
            assert!(matches!(create("my-steps", language, &project, None), Err(ScaffoldError::Exists(_))));
        }
    }
}
