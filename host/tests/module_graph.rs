//! The import rules of `host/src`, checked on its source text:
//!
//! * no cycle between the top-level modules, and none between the child
//!   modules of any folder (`broker/sqs/{send, batcher, …}`,
//!   `planner/{runtime, instance, …}`): modules in a cycle cannot be read,
//!   tested or moved one without the other;
//! * lapin is used only under `broker/rabbitmq/`, the AWS SDK only under
//!   `broker/sqs/`, async-nats only under `broker/nats/`.
//!
//! A file `a.rs` or a folder `a/` is the child `a` of its folder; a folder's
//! `mod.rs` is the folder itself, not a child. Every path naming a module of
//! the crate (`crate::`, `super::`, `self::`, inside `use` groups too) is
//! resolved to the module it reaches, through `pub use` re-exports; code in
//! child `a` reaching into child `b` of the same folder is an edge `a → b` of
//! that folder. The binary's `cli/` sits beside the library's modules, and its
//! `hourglass::` paths count as `crate::`.
//!
//! Test code is left out: `mod tests { … }` blocks and `tests.rs` files. A
//! unit test importing a sibling is a real dependency of the test build, but a
//! cycle through test-only code does not tie together the modules the product
//! is built from. Comments and string literals are skipped; macros are not
//! expanded, and glob re-exports (`pub use a::*`) are not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// Module path from the crate root: `["broker", "sqs", "send"]`; the root is empty.
type ModulePath = Vec<String>;

/// Where the first use making an edge was seen: `host/src/broker/sqs/send.rs:12`.
type Location = String;

struct Token {
    text: String,
    line: usize,
}

struct SourceFile {
    /// Path from `host/src`, with `/` separators.
    relative: String,
    /// The module the file's code is in (a `mod.rs` is its folder's module).
    module: ModulePath,
    /// `main.rs` and `cli/`: the binary, where `hourglass::` is the library.
    in_binary: bool,
    /// The file's code without comments, string literals and test modules.
    tokens: Vec<Token>,
}

/// One path to something of the crate, as written in a file.
struct Reference {
    segments: Vec<String>,
    line: usize,
    /// `pub use … [as alias]`: the name it is re-exported under.
    reexported_as: Option<String>,
}

#[test]
fn no_import_cycles_and_broker_libraries_only_in_their_folders() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source_root = manifest_dir.join("src");
    let shown_root = Path::new(manifest_dir.file_name().unwrap()).join("src");

    let files: Vec<SourceFile> = rust_files(&source_root).iter().filter_map(|path| read_source_file(&source_root, path)).collect();
    let children = child_modules(&source_root);
    let references: Vec<Vec<Reference>> = files.iter().map(references_in).collect();

    // Re-exports first: `super::PlannerRuntime` reaches `runtime`, not `planner`'s mod.rs.
    let mut reexports: BTreeMap<ModulePath, BTreeMap<String, ModulePath>> = BTreeMap::new();
    for (file, file_references) in files.iter().zip(&references) {
        for reference in file_references {
            if let (Some(name), Some(target)) = (&reference.reexported_as, resolve(file, &reference.segments, &children)) {
                reexports.entry(file.module.clone()).or_default().insert(name.clone(), target);
            }
        }
    }

    // Edges per folder (the root's key is empty): (from child, to child) → first location.
    let mut edges: BTreeMap<ModulePath, BTreeMap<(String, String), Location>> = BTreeMap::new();
    for (file, file_references) in files.iter().zip(&references) {
        for reference in file_references {
            let Some(target) = resolve(file, &reference.segments, &children) else { continue };
            let target = follow_reexports(target, &children, &reexports);
            let shared = file.module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (file.module.get(shared), target.get(shared)) else { continue };
            let folder = file.module[..shared].to_vec();
            let is_child = |name: &String| children.get(&folder).is_some_and(|names| names.contains(name));
            if is_child(from) && is_child(to) {
                let location = format!("{}:{}", shown_root.join(&file.relative).display(), reference.line);
                edges.entry(folder).or_default().entry((from.clone(), to.clone())).or_insert(location);
            }
        }
    }

    // A parser that found nothing would pass every rule: make sure it reads the tree.
    for (folder, from, to) in [("", "service", "scheduler"), ("", "cli", "service"), ("broker/sqs", "pump", "send")] {
        let folder: ModulePath = folder.split('/').filter(|s| !s.is_empty()).map(String::from).collect();
        let found = edges.get(&folder).is_some_and(|e| e.contains_key(&(from.to_string(), to.to_string())));
        assert!(found, "the check no longer sees the edge {from} → {to} in {}: is it still reading the source?", folder_name(&folder));
    }

    let mut problems = String::new();
    for (folder, folder_edges) in &edges {
        for cycle in cycles(folder_edges) {
            writeln!(problems, "cycle in {}: {}", folder_name(folder), cycle.join(", ")).unwrap();
            for member in &cycle {
                // One edge per member staying inside the cycle: together they show where to cut.
                let ((from, to), location) = folder_edges.iter().find(|((from, to), _)| from == member && cycle.contains(to)).unwrap();
                writeln!(problems, "    {from} → {to}  ({location})").unwrap();
            }
        }
    }
    for file in &files {
        for (library, allowed_folder) in
            [("lapin", "broker/rabbitmq/"), ("aws_sdk_sqs", "broker/sqs/"), ("aws_config", "broker/sqs/"), ("async_nats", "broker/nats/")]
        {
            if file.relative.starts_with(allowed_folder) {
                continue;
            }
            let used_at = file.tokens.windows(2).find(|pair| pair[0].text == library && pair[1].text == "::");
            if let Some(pair) = used_at {
                writeln!(problems, "{}:{} uses {library} outside {allowed_folder}", shown_root.join(&file.relative).display(), pair[0].line).unwrap();
            }
        }
    }
    assert!(problems.is_empty(), "import rules of {} broken (see ARCHITECTURE.md, \"Dependencies\"):\n{problems}", shown_root.display());
}

fn folder_name(folder: &[String]) -> String {
    if folder.is_empty() { "the top level".to_string() } else { format!("{}/", folder.join("/")) }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
    found
}

/// The child module names of every folder, from the file tree: `a.rs` and `a/` are `a`.
fn child_modules(source_root: &Path) -> BTreeMap<ModulePath, BTreeSet<String>> {
    let mut children: BTreeMap<ModulePath, BTreeSet<String>> = BTreeMap::new();
    let mut folders = vec![(source_root.to_path_buf(), ModulePath::new())];
    while let Some((dir, module)) = folders.pop() {
        let names = children.entry(module.clone()).or_default();
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                names.insert(name.clone());
                folders.push((path, [module.clone(), vec![name]].concat()));
            } else if path.extension().is_some_and(|ext| ext == "rs") && !["mod", "lib", "main"].contains(&name.as_str()) {
                names.insert(name);
            }
        }
    }
    children
}

fn read_source_file(source_root: &Path, path: &Path) -> Option<SourceFile> {
    let relative = path.strip_prefix(source_root).unwrap().to_string_lossy().replace('\\', "/");
    let mut module: ModulePath = relative.trim_end_matches(".rs").split('/').map(String::from).collect();
    if ["mod", "lib", "main"].contains(&module.last().unwrap().as_str()) {
        module.pop();
    }
    if module.last().is_some_and(|name| name == "tests") {
        return None;
    }
    let in_binary = relative == "main.rs" || relative.starts_with("cli/");
    let tokens = without_test_modules(tokenize(&code_only(&fs::read_to_string(path).unwrap())));
    Some(SourceFile { relative, module, in_binary, tokens })
}

/// The source with comments and string and char literals blanked out; newlines stay, so lines keep their numbers.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let is_ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut code = String::with_capacity(source.len());
    let blank_until = |code: &mut String, from: usize, to: usize| {
        code.extend(chars[from..to.min(chars.len())].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let at = |i: usize, text: &str| text.chars().enumerate().all(|(k, c)| chars.get(i + k) == Some(&c));
    let mut i = 0;
    while i < chars.len() {
        let previous_is_ident = i > 0 && is_ident_char(chars[i - 1]);
        let end = if at(i, "//") {
            (i..chars.len()).find(|&j| chars[j] == '\n').unwrap_or(chars.len())
        } else if at(i, "/*") {
            // Block comments nest.
            let (mut depth, mut j) = (0, i);
            while j < chars.len() {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if chars[i] == 'r' && (!previous_is_ident || (chars[i - 1] == 'b' && (i < 2 || !is_ident_char(chars[i - 2])))) {
            // A raw string r"…" or r#"…"#; anything else starting with r (r#ident, a name) is code.
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                let closing: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                (i + 2 + hashes..chars.len()).find(|&j| at(j, &closing)).map_or(chars.len(), |j| j + closing.len())
            } else {
                i
            }
        } else if chars[i] == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if chars[i] == '\'' && chars.get(i + 1) == Some(&'\\') {
            (i + 3..chars.len()).find(|&j| chars[j] == '\'').map_or(chars.len(), |j| j + 1)
        } else if chars[i] == '\'' && chars.get(i + 2) == Some(&'\'') {
            i + 3
        } else {
            i // code, or a lifetime's quote
        };
        if end > i {
            blank_until(&mut code, i, end);
            i = end;
        } else {
            code.push(chars[i]);
            i += 1;
        }
    }
    code
}

/// Identifiers, numbers, `::`, and every other character on its own.
fn tokenize(code: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    for (index, line) in code.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let start = i;
            if chars[i].is_alphanumeric() || chars[i] == '_' {
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            } else if chars[i] == ':' && chars.get(i + 1) == Some(&':') {
                i += 2;
            } else if chars[i].is_whitespace() {
                i += 1;
                continue;
            } else {
                i += 1;
            }
            tokens.push(Token { text: chars[start..i].iter().collect(), line: index + 1 });
        }
    }
    tokens
}

fn without_test_modules(tokens: Vec<Token>) -> Vec<Token> {
    let mut in_test_module = vec![false; tokens.len()];
    let mut i = 0;
    while i < tokens.len() {
        let opens_tests = tokens[i].text == "mod" && tokens.get(i + 1).is_some_and(|t| t.text == "tests") && tokens.get(i + 2).is_some_and(|t| t.text == "{");
        if !opens_tests {
            i += 1;
            continue;
        }
        let start = i;
        let mut depth = 0;
        i += 2;
        while i < tokens.len() {
            match tokens[i].text.as_str() {
                "{" => depth += 1,
                "}" => depth -= 1,
                _ => {}
            }
            i += 1;
            if depth == 0 {
                break;
            }
        }
        in_test_module[start..i].fill(true);
    }
    tokens.into_iter().zip(in_test_module).filter(|(_, skipped)| !skipped).map(|(token, _)| token).collect()
}

fn is_identifier(text: &str) -> bool {
    text.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// Every `use` path (groups expanded) and every other path starting at `crate`, `super` or `self`.
fn references_in(file: &SourceFile) -> Vec<Reference> {
    let tokens = &file.tokens;
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut references = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if text(i) == "use" {
            // `pub use` and `pub(crate) use` re-export; a private `use` only imports.
            let public = text(i.wrapping_sub(1)) == "pub" || (text(i.wrapping_sub(1)) == ")" && (2..=4).any(|back| text(i.wrapping_sub(back)) == "pub"));
            i += 1;
            if text(i) == "::" {
                i += 1;
            }
            let mut paths = Vec::new();
            parse_use_tree(tokens, &mut i, &[], &mut paths);
            for UsePath { segments, name, line } in paths {
                let segments = if file.in_binary && segments.first().is_some_and(|s| s == "hourglass") {
                    [vec!["crate".to_string()], segments[1..].to_vec()].concat()
                } else {
                    segments
                };
                references.push(Reference { segments, line, reexported_as: public.then_some(name) });
            }
        } else if starts_crate_path(file, tokens, i) {
            let mut segments = vec![if text(i) == "hourglass" { "crate".to_string() } else { text(i).to_string() }];
            let mut line = tokens[i].line;
            i += 1;
            while text(i) == "::" && is_identifier(text(i + 1)) {
                segments.push(text(i + 1).to_string());
                line = tokens[i + 1].line;
                i += 2;
            }
            references.push(Reference { segments, line, reexported_as: None });
            continue;
        }
        i += 1;
    }
    references
}

fn starts_crate_path(file: &SourceFile, tokens: &[Token], i: usize) -> bool {
    let roots: &[&str] = if file.in_binary { &["crate", "super", "self", "hourglass"] } else { &["crate", "super", "self"] };
    roots.contains(&tokens[i].text.as_str()) && tokens.get(i + 1).is_some_and(|t| t.text == "::") && (i == 0 || tokens[i - 1].text != "::")
}

/// One leaf of a `use` tree: its full path, the name it brings in, and the line of that name.
struct UsePath {
    segments: Vec<String>,
    name: String,
    line: usize,
}

/// Reads one use tree (`a::b`, `a::{b, c::d}`, `a::*`, `a as b`) from `*i`, leaving `*i` after it.
fn parse_use_tree(tokens: &[Token], i: &mut usize, prefix: &[String], paths: &mut Vec<UsePath>) {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut segments = prefix.to_vec();
    loop {
        match text(*i) {
            "{" => {
                *i += 1;
                while !matches!(text(*i), "}" | "") {
                    parse_use_tree(tokens, i, &segments, paths);
                    if text(*i) == "," {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "*" => {
                // A glob brings in names this check does not know; the module itself is still used.
                *i += 1;
                let line = tokens[*i - 1].line;
                paths.push(UsePath { name: "*".to_string(), segments, line });
                return;
            }
            name if is_identifier(name) => {
                let line = tokens[*i].line;
                segments.push(name.to_string());
                *i += 1;
                if text(*i) == "::" {
                    *i += 1;
                    continue;
                }
                let mut name = name.to_string();
                if text(*i) == "as" {
                    name = text(*i + 1).to_string();
                    *i += 2;
                }
                if name == "self" {
                    name = segments[segments.len() - 2].clone();
                }
                paths.push(UsePath { segments, name, line });
                return;
            }
            _ => {
                // Not a use tree after all (e.g. `use` in a macro): step over the token.
                *i += 1;
                return;
            }
        }
    }
}

/// The module path a reference reaches (possibly ending in an item's name), or `None` when it is not
/// in the crate (another crate, a local name).
fn resolve(file: &SourceFile, segments: &[String], children: &BTreeMap<ModulePath, BTreeSet<String>>) -> Option<ModulePath> {
    let first = segments.first()?.as_str();
    let (mut target, rest) = match first {
        "crate" => (ModulePath::new(), &segments[1..]),
        "self" => (file.module.clone(), &segments[1..]),
        // In a folder's mod.rs, `use a::…` names its child `a`.
        "super" => (file.module.clone(), segments),
        _ if children.get(&file.module).is_some_and(|names| names.contains(first)) => (file.module.clone(), segments),
        _ => return None,
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                target.pop()?;
            }
            // `self` in a group (`use a::{self, b}`) is the path before it; a glob adds no name.
            "self" | "*" => {}
            name => target.push(name.to_string()),
        }
    }
    Some(target)
}

/// Replaces a re-exported name by the path it re-exports (`planner::PlannerRuntime` → `planner::runtime::PlannerRuntime`).
fn follow_reexports(
    mut target: ModulePath,
    children: &BTreeMap<ModulePath, BTreeSet<String>>,
    reexports: &BTreeMap<ModulePath, BTreeMap<String, ModulePath>>,
) -> ModulePath {
    // Bounded: re-exports of re-exports are followed, a (broken) loop of them is not.
    for _ in 0..8 {
        let replaced = (0..target.len()).find_map(|depth| {
            let (module, name) = (&target[..depth], &target[depth]);
            let is_child = children.get(module).is_some_and(|names| names.contains(name));
            let reexported = reexports.get(module).and_then(|names| names.get(name)).filter(|_| !is_child)?;
            Some([reexported.clone(), target[depth + 1..].to_vec()].concat())
        });
        match replaced {
            Some(next) if next != target => target = next,
            _ => break,
        }
    }
    target
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<(String, String), Location>) -> Vec<Vec<String>> {
    struct Search<'a> {
        successors: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        lowest: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        components: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, module: &'a str) {
            let index = self.index.len();
            self.index.insert(module, index);
            self.lowest.insert(module, index);
            self.stack.push(module);
            for next in self.successors.get(module).cloned().unwrap_or_default() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    self.lowest.insert(module, self.lowest[module].min(self.lowest[next]));
                } else if self.stack.contains(&next) {
                    self.lowest.insert(module, self.lowest[module].min(self.index[next]));
                }
            }
            if self.lowest[module] == index {
                let start = self.stack.iter().position(|&m| m == module).unwrap();
                let mut component: Vec<String> = self.stack.drain(start..).map(String::from).collect();
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut search = Search { successors: BTreeMap::new(), index: BTreeMap::new(), lowest: BTreeMap::new(), stack: Vec::new(), components: Vec::new() };
    for (from, to) in edges.keys() {
        search.successors.entry(from.as_str()).or_default().push(to.as_str());
    }
    let modules: Vec<&str> = search.successors.keys().copied().collect();
    for module in modules {
        if !search.index.contains_key(module) {
            search.visit(module);
        }
    }
    search.components
}
