//! `hourglass new-planner`: start a planner project in Rust, Python or JavaScript.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::ValueEnum;
use hourglass::scaffold::{self, Language};

#[derive(Clone, Copy, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

#[derive(clap::Args)]
pub struct Args {
    /// The planner's name: lowercase letters, digits and '-'.
    pub name: String,
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// The project's folder (default: ./NAME); it must not exist.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The planner SDK a Rust project depends on (default: planners/sdk of the checkout this host was built from).
    #[arg(long, value_name = "DIR")]
    pub sdk: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let language = match args.lang {
        Lang::Rust => Language::Rust,
        Lang::Python => Language::Python,
        Lang::Js => Language::JavaScript,
    };
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(&args.name));
    let files = scaffold::create(&args.name, language, &dir, args.sdk.as_deref())?;
    println!("created {} ({} files)", dir.display(), files.len());
    println!("next: cd {} && ./build && hourglass check-planner planner.wasm --planner-config planner.toml (README.md says more)", dir.display());
    Ok(ExitCode::SUCCESS)
}
