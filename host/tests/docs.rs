//! Every example in README.md, CHANGELOG.md and docs/*.md works when copied:
//!
//! - a ```toml block is a whole `delay.toml`, or a fragment of one (some
//!   tables) that loads once the tables it lacks are added: a `[broker]` of
//!   the family the fragment needs and one `[strategies.seconds]`. Either way
//!   it goes through `Config::parse`, and then every strategy whose planner is
//!   a built-in or a file in the repository is loaded, which runs the
//!   planner's own check of its table. A planner the reader builds first
//!   (`my-steps/planner.wasm`) can only be parsed, not loaded.
//! - a ```json block says what it is in its info string: `json POST
//!   /v1/messages`, `json POST /v1/messages:batch` (each of its messages) and
//!   `json PATCH /v1/messages/{id}` are request bodies, read by the handler's
//!   own parser; `json answer` is an answer, which must be
//!   JSON. A `curl … -d '…'` to `/v1/messages` in a shell block is a request
//!   body too.
//! - a line of a ```sh, ```bash or ```console block that runs `hourglass …` or
//!   `cargo run … -- …` names subcommands the binary has, and only flags its
//!   `--help` lists.
//!
//! Failures name the file and line and say what is wrong; all are reported at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hourglass::config::Config;
use hourglass::planner::PlannerSource;
use hourglass::scheduler::strategies::Strategies;
use hourglass::service::http;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The documents whose examples a reader copies.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut all = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    all.extend(docs);
    all
}

/// One fenced code block.
struct Block {
    /// The fence's info string: its language first, then what the block is.
    info: String,
    /// The line of the opening fence (1-based).
    fence_line: usize,
    text: String,
}

impl Block {
    fn language(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }
}

/// The fenced blocks of a markdown text, indented ones (in a list) included.
fn blocks(markdown: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<&str>)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((index + 1, indent, info.trim().to_string(), Vec::new()));
                }
            }
            Some((fence_line, fence_indent, info, lines)) => {
                if trimmed.trim_end() == "```" {
                    let text = lines.iter().map(|l| format!("{}\n", strip_indent(l, *fence_indent))).collect();
                    found.push(Block { info: std::mem::take(info), fence_line: *fence_line, text });
                    open = None;
                } else {
                    lines.push(line);
                }
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    found
}

fn strip_indent(line: &str, indent: usize) -> &str {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    &line[spaces.min(indent)..]
}

/// What the walk checked, to report and to make sure it checked something.
#[derive(Default)]
struct Tally {
    whole_configs: usize,
    fragments: usize,
    configs_loaded: usize,
    json_requests: usize,
    json_answers: usize,
    cli_lines: usize,
    synopses: usize,
}

struct Checker {
    failures: Vec<String>,
    tally: Tally,
    planner_cache: tempfile::TempDir,
    help: Help,
}

impl Checker {
    fn fail(&mut self, file: &str, line: usize, what: String) {
        self.failures.push(format!("{file}:{line}: {what}"));
    }

    fn check(&mut self, path: &Path) {
        let markdown = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = path.strip_prefix(repo_root()).unwrap().display().to_string();
        self.check_synopses(&file, &markdown);
        for block in blocks(&markdown) {
            match block.language() {
                "toml" => self.check_toml(path, &file, &block),
                "json" => self.check_json(&file, &block),
                "sh" | "bash" | "console" => self.check_shell(&file, &block),
                _ => {}
            }
        }
    }

    fn check_toml(&mut self, path: &Path, file: &str, block: &Block) {
        let table: toml::Table = match block.text.parse() {
            Ok(table) => table,
            Err(e) => return self.fail(file, block.fence_line, format!("not TOML: {e}")),
        };
        let (text, whole) = completed(&block.text, &table);
        if whole {
            self.tally.whole_configs += 1
        } else {
            self.tally.fragments += 1
        }
        // Blank lines in front keep the parser's line numbers the markdown's.
        let padded = format!("{}{text}", "\n".repeat(block.fence_line));
        let what = if whole { "this delay.toml" } else { "this fragment, completed with a [broker] and a strategy," };
        let mut config = match Config::parse(path, padded) {
            Ok(config) => config,
            Err(e) => return self.fail(file, block.fence_line, format!("{what} does not load: {e}")),
        };
        let loadable = config.strategies.values().all(|s| match &s.planner {
            PlannerSource::Builtin(_) => true,
            PlannerSource::File(wasm) => wasm.exists(),
        });
        if loadable {
            config.cache_dir = Some(self.planner_cache.path().to_path_buf());
            match Strategies::load(&config) {
                Ok(_) => self.tally.configs_loaded += 1,
                Err(e) => self.fail(file, block.fence_line, format!("{what} parses, but a planner refuses its table: {e}")),
            }
        }
    }

    fn check_json(&mut self, file: &str, block: &Block) {
        let kind = block.info.strip_prefix("json").unwrap_or("").trim();
        match kind {
            "POST /v1/messages" | "POST /v1/messages:batch" | "PATCH /v1/messages/{id}" => {
                self.check_request(file, block.fence_line, kind, block.text.as_bytes())
            }
            "answer" => match serde_json::from_str::<serde_json::Value>(&block.text) {
                Ok(_) => self.tally.json_answers += 1,
                Err(e) => self.fail(file, block.fence_line, format!("this answer is not JSON: {e}")),
            },
            _ => self.fail(
                file,
                block.fence_line,
                format!(
                    "a json block must say what it is: ```json POST /v1/messages, ```json POST /v1/messages:batch, ```json PATCH /v1/messages/{{id}} or ```json answer (found {:?})",
                    block.info
                ),
            ),
        }
    }

    fn check_request(&mut self, file: &str, line: usize, endpoint: &str, body: &[u8]) {
        self.tally.json_requests += 1;
        let read = if endpoint.starts_with("PATCH") {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            http::reschedule_request(body, now, default_cancel_retention_ms()).map(drop)
        } else if endpoint.ends_with(":batch") {
            http::batch_request(body).and_then(|messages| messages.into_iter().find_map(Result::err).map_or(Ok(()), Err))
        } else {
            http::schedule_request(body).map(drop)
        };
        if let Err(e) = read {
            self.fail(file, line, format!("{endpoint} refuses this body with 400 ({e}): {}", String::from_utf8_lossy(body)));
        }
    }

    fn check_shell(&mut self, file: &str, block: &Block) {
        for (offset, line) in logical_lines(&block.text) {
            let line_number = block.fence_line + 1 + offset;
            for command in commands(&line) {
                if let Some(args) = hourglass_args(&command) {
                    self.tally.cli_lines += 1;
                    if let Err(e) = self.help.check(&args) {
                        self.fail(file, line_number, format!("`{}`: {e}", command.join(" ")));
                    }
                }
                if command.first().is_some_and(|c| c == "curl") {
                    self.check_curl(file, line_number, &command);
                }
            }
        }
    }

    /// A command's synopsis in a table row (docs/cli.md's reference):
    /// `hourglass parked list|replay|drop [--queue Q] …`. Its subcommands
    /// must exist, and each flag must be in the help of one of them.
    fn check_synopses(&mut self, file: &str, markdown: &str) {
        let mut in_block = false;
        for (index, line) in markdown.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
            }
            if in_block || !line.starts_with('|') {
                continue;
            }
            for synopsis in line.split('`').skip(1).step_by(2).filter(|code| code.starts_with("hourglass ")) {
                self.tally.synopses += 1;
                if let Err(e) = self.help.check_synopsis(synopsis) {
                    self.fail(file, index + 1, format!("`{synopsis}`: {e}"));
                }
            }
        }
    }

    /// A `curl` that sends a body to `/v1/messages`: the body is a request example.
    fn check_curl(&mut self, file: &str, line: usize, command: &[String]) {
        let Some(at) = command.iter().position(|a| a == "-d" || a == "--data") else { return };
        let Some(body) = command.get(at + 1) else { return self.fail(file, line, "curl -d without a body".into()) };
        let Some(url) = command.iter().find(|a| a.contains("/v1/")) else { return };
        let method = command.iter().position(|a| a == "-X").and_then(|i| command.get(i + 1)).map_or("POST", String::as_str);
        let path = url.split_once("/v1/").map(|(_, p)| p).unwrap_or("");
        match (method, path.split('/').count()) {
            ("POST", 1) if path.starts_with("messages:batch") => self.check_request(file, line, "POST /v1/messages:batch", body.as_bytes()),
            ("POST", 1) if path.starts_with("messages") => self.check_request(file, line, "POST /v1/messages", body.as_bytes()),
            ("PATCH", 2) if path.starts_with("messages/") => self.check_request(file, line, "PATCH /v1/messages/{id}", body.as_bytes()),
            _ => {}
        }
    }
}

/// The block as a whole config: as it is when it has a `[broker]` and a
/// strategy, else with what it lacks added (`true`: it was whole).
fn completed(text: &str, table: &toml::Table) -> (String, bool) {
    let mut added = String::new();
    if !table.contains_key("broker") {
        let strategies = table.get("strategies").and_then(toml::Value::as_table);
        let plans_sqs = strategies.is_some_and(|s| s.values().any(|t| t.get("planner").and_then(toml::Value::as_str) == Some("sqs-cycles")));
        let serves_sqs = table.get("service").and_then(|s| s.get("sqs_ingress")).is_some();
        // Delayed exchanges, redelivery and cancellation are RabbitMQ's, so that is the family unless the fragment is SQS's.
        let kind = if plans_sqs || serves_sqs { "sqs" } else { "rabbitmq" };
        added += &format!("\n[broker]\nkind = \"{kind}\"\n");
    }
    if !table.contains_key("strategies") {
        added += "\n[strategies.seconds]\nplanner = \"binary-levels\"\n";
    }
    let whole = added.is_empty();
    (format!("{text}{added}"), whole)
}

fn default_cancel_retention_ms() -> u64 {
    let text = "[broker]\nkind = \"rabbitmq\"\n[strategies.s]\nplanner = \"binary-levels\"\n".to_string();
    Config::parse(Path::new("delay.toml"), text).expect("the smallest RabbitMQ config loads").service.cancel.retention_ms()
}

/// Shell lines with `\` continuations joined, each with its offset in the block.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (offset, line) in text.lines().enumerate() {
        let (start, mut joined) = pending.take().unwrap_or((offset, String::new()));
        let line = line.strip_prefix("$ ").unwrap_or(line);
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                lines.push((start, joined));
            }
        }
    }
    lines.extend(pending);
    lines
}

/// The simple commands of a shell line: words split as the shell would
/// (quotes kept together), at `&&`, `||`, `|`, `;` and `&`, up to a comment.
fn commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    let end_word = |word: &mut String, in_word: &mut bool, commands: &mut Vec<Vec<String>>| {
        if *in_word {
            commands.last_mut().unwrap().push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, ' ' | '\t') => end_word(&mut word, &mut in_word, &mut commands),
            (None, '&' | '|' | ';') => {
                end_word(&mut word, &mut in_word, &mut commands);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                commands.push(Vec::new());
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut commands);
    commands.retain(|c| !c.is_empty());
    commands
}

/// The arguments given to hourglass, when the command runs it.
fn hourglass_args(command: &[String]) -> Option<Vec<String>> {
    match command.first()?.as_str() {
        "hourglass" => Some(command[1..].to_vec()),
        "cargo" if command.get(1).is_some_and(|a| a == "run") => {
            let dashes = command.iter().position(|a| a == "--")?;
            Some(command[dashes + 1..].to_vec())
        }
        _ => None,
    }
}

/// `--help` of the built binary, per subcommand path, asked once each.
struct Help {
    pages: BTreeMap<Vec<String>, String>,
}

impl Help {
    fn page(&mut self, path: &[String]) -> &str {
        self.pages.entry(path.to_vec()).or_insert_with(|| {
            let output = Command::new(env!("CARGO_BIN_EXE_hourglass")).args(path).arg("--help").output().expect("run hourglass --help");
            assert!(output.status.success(), "hourglass {} --help: {}", path.join(" "), String::from_utf8_lossy(&output.stderr));
            String::from_utf8(output.stdout).unwrap()
        })
    }

    /// Checks the arguments against the help of the subcommands they name.
    fn check(&mut self, args: &[String]) -> Result<(), String> {
        let mut path: Vec<String> = Vec::new();
        let mut words = args.iter();
        while let Some(word) = words.next() {
            let page = self.page(&path).to_string();
            if let Some(flag) = word.strip_prefix("--") {
                let name = flag.split('=').next().unwrap();
                let listed = |after: &str| page.contains(&format!("--{name}{after}"));
                if !(listed(" ") || listed("\n") || listed(",") || listed("=")) {
                    return Err(format!("`hourglass {}` has no --{name} (see its --help)", path.join(" ")));
                }
                if listed(" <") && !flag.contains('=') {
                    words.next();
                }
                continue;
            }
            if word.starts_with('-') {
                continue;
            }
            let subcommands = subcommands(&page);
            if subcommands.is_empty() {
                continue; // a positional argument of a leaf command
            }
            if !subcommands.contains(word) {
                return Err(format!("`hourglass {}` has no subcommand {word:?}; it has {}", path.join(" "), subcommands.join(", ")));
            }
            path.push(word.clone());
        }
        let page = self.page(&path).to_string();
        let missing = subcommands(&page);
        if !missing.is_empty() {
            return Err(format!("`hourglass {}` needs a subcommand: one of {}", path.join(" "), missing.join(", ")));
        }
        Ok(())
    }
}

impl Help {
    fn check_synopsis(&mut self, synopsis: &str) -> Result<(), String> {
        let words: Vec<String> = synopsis
            .replace("\\|", "|")
            .split_whitespace()
            .skip(1)
            .map(|w| w.trim_matches(|c| matches!(c, '[' | ']' | '…')).to_string())
            .filter(|w| !w.is_empty())
            .collect();
        // Leading words that are subcommands (or alternatives of them, `list|replay|drop`) make the paths.
        let mut paths: Vec<Vec<String>> = vec![Vec::new()];
        for word in words.iter().take_while(|w| !w.starts_with('-')) {
            let known = subcommands(self.page(&paths[0]));
            let alternatives: Vec<&str> = word.split('|').collect();
            if known.is_empty() || !alternatives.iter().all(|a| known.iter().any(|k| k == a)) {
                break;
            }
            paths = paths.iter().flat_map(|p| alternatives.iter().map(move |a| [p.clone(), vec![a.to_string()]].concat())).collect();
        }
        for path in &paths {
            let missing = subcommands(self.page(path));
            if !missing.is_empty() {
                return Err(format!("`hourglass {}` needs a subcommand: one of {}", path.join(" "), missing.join(", ")));
            }
        }
        for flag in words.iter().flat_map(|w| w.split('|')).filter_map(|w| w.strip_prefix("--")) {
            let listed = paths.iter().any(|path| {
                let page = self.page(path);
                [" ", "\n", ",", "="].iter().any(|after| page.contains(&format!("--{flag}{after}")))
            });
            if !listed {
                let names: Vec<String> = paths.iter().map(|p| p.join(" ")).collect();
                return Err(format!("--{flag} is in no --help of `hourglass {}`", names.join("`, `hourglass ")));
            }
        }
        Ok(())
    }
}

/// The subcommands a help page lists (none for a leaf command).
fn subcommands(page: &str) -> Vec<String> {
    let Some((_, rest)) = page.split_once("Commands:\n") else { return Vec::new() };
    rest.lines()
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_example_in_the_docs_works_as_copied() {
    let mut checker =
        Checker { failures: Vec::new(), tally: Tally::default(), planner_cache: tempfile::tempdir().unwrap(), help: Help { pages: BTreeMap::new() } };
    for document in documents() {
        checker.check(&document);
    }
    let Checker { failures, tally, .. } = checker;
    println!(
        "checked: {} whole configs and {} fragments ({} loaded with their planners), {} JSON requests, {} JSON answers, {} command lines, {} command synopses",
        tally.whole_configs, tally.fragments, tally.configs_loaded, tally.json_requests, tally.json_answers, tally.cli_lines, tally.synopses
    );
    assert!(failures.is_empty(), "{} examples do not work as copied:\n{}", failures.len(), failures.join("\n"));
    // A walk that found nothing would pass the checks above: the docs have examples of every kind.
    for (kind, count) in [
        ("whole configs", tally.whole_configs),
        ("fragments", tally.fragments),
        ("JSON requests", tally.json_requests),
        ("JSON answers", tally.json_answers),
        ("command lines", tally.cli_lines),
        ("command synopses", tally.synopses),
    ] {
        assert!(count > 0, "no {kind} found in the docs: is the walk reading them?");
    }
}

/// The checks themselves catch what they are for.
#[test]
fn the_checks_catch_a_broken_example() {
    let mut help = Help { pages: BTreeMap::new() };
    let args = |line: &str| hourglass_args(&commands(line)[0]).unwrap();
    assert!(help.check(&args("hourglass --config x.toml parked list --queue q --limit 5")).is_ok());
    assert!(help.check(&args("cargo run --release -- simulate --to destination --delay 10s")).is_ok());
    let unknown_flag = help.check(&args("hourglass simulate --to d --delay 1s --colour")).unwrap_err();
    assert!(unknown_flag.contains("--colour"), "{unknown_flag}");
    assert!(help.check(&args("hourglass parked")).unwrap_err().contains("needs a subcommand"));
    assert!(help.check(&args("hourglass simulat --to d")).unwrap_err().contains("no subcommand"));
    assert!(help.check_synopsis("hourglass parked list\\|drop [--queue Q] [--all]").is_ok());
    assert!(help.check_synopsis("hourglass parked list\\|replay [--colour]").unwrap_err().contains("--colour"));

    assert_eq!(commands("a 'b c' && d # e")[..], [vec!["a".to_string(), "b c".into()], vec!["d".into()]]);

    let fragment = "[service]\nheader_read_timeout = \"10s\"\n";
    let (text, whole) = completed(fragment, &fragment.parse().unwrap());
    assert!(!whole);
    assert!(Config::parse(Path::new("delay.toml"), text).is_ok());
    let misplaced = "[service.canary]\nheader_read_timeout = \"10s\"\n";
    let (text, _) = completed(misplaced, &misplaced.parse().unwrap());
    assert!(Config::parse(Path::new("delay.toml"), text).unwrap_err().to_string().contains("header_read_timeout"));

    assert!(http::schedule_request(br#"{"destination": "orders", "delay": "3s"}"#).is_ok());
    assert_eq!(http::schedule_request(br#"{"destination": "orders", "delay": "3 parsecs"}"#).unwrap_err().field, "delay");
}
