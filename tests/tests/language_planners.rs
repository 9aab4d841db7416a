//! Planners written in Python and JavaScript (examples/python-planner with
//! componentize-py, examples/js-planner with componentize-js, both built by
//! scripts/test): each passes `check-planner`, and a message each plans
//! arrives on RabbitMQ at its due time, beside one planned by the built-in
//! binary levels.

use std::path::PathBuf;
use std::time::Duration;

use hourglass::config::Config;
use hourglass::scheduler::ScheduleRequest;
use hourglass_e2e::*;

/// A Python runtime takes 13–16 MiB to start (the default limit is 16), and
/// instantiating either runtime on a loaded machine can pass the default second.
const RUNTIME_LIMITS: &str = "memory_limit_mib = 64\nstart_timeout = \"10s\"";

/// How late a message may arrive: one TTL queue, dead-lettered once (the
/// binary levels' window, tests/tests/early.rs).
const ON_TIME_MS: u64 = 100;

/// The example planners: (folder, the name its planner describes).
const LANGUAGES: [&str; 2] = ["python-planner", "js-planner"];

fn planner_wasm(example: &str) -> PathBuf {
    let path = repo_root().join(format!("examples/{example}/planner.wasm"));
    assert!(path.exists(), "{} is missing: build it with examples/{example}/build (scripts/test does)", path.display());
    path
}

#[test]
fn the_python_and_javascript_planners_pass_check_planner() {
    for example in LANGUAGES {
        check(example);
    }
}

fn check(example: &str) {
    let config = std::env::temp_dir().join(format!("{}.toml", unique("py-check")));
    std::fs::write(&config, "base = \"1s\"\ncap = \"64s\"\n").unwrap();
    let output = std::process::Command::new(hourglass_binary())
        .args(["check-planner", planner_wasm(example).to_str().unwrap(), "--planner-config", config.to_str().unwrap()])
        .args(["--memory-limit-mib", "64", "--start-timeout", "10s", "--horizon", "1m", "--samples", "50"])
        .output()
        .unwrap();
    std::fs::remove_file(&config).ok();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{example}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("delays delivered as promised"), "{example}: {stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_planned_in_python_and_javascript_arrive_on_rabbitmq_at_their_due_time() {
    let (python, js, levels) = (unique("py-backoff"), unique("js-backoff"), unique("py-levels"));
    let text = format!(
        "default_strategy = \"python\"\n{}",
        config_text(
            &format!("planner = \"binary-levels\"\nprefix = \"{levels}\""),
            &format!(
                "[strategies.python]\nplanner = \"{}\"\nprefix = \"{python}\"\ncap = \"8s\"\n{RUNTIME_LIMITS}\n\n\
                 [strategies.js]\nplanner = \"{}\"\nprefix = \"{js}\"\ncap = \"8s\"\n{RUNTIME_LIMITS}\n",
                planner_wasm("python-planner").display(),
                planner_wasm("js-planner").display()
            ),
        )
    );
    let config = Config::parse(std::path::Path::new("python.toml"), text).unwrap();
    // Deletes what the test declares, also when it fails.
    let cleanup = Cleanup::declared(&topologies_of(&config, &["python", "js", "main"]));
    let connection = connect().await;
    let mut destination = Destination::declare(&connection, "py-planner").await;
    cleanup.queue(&destination.name);
    let scheduler = scheduler(&config).await;
    let request = |strategy: &str, body: &str| ScheduleRequest {
        destination: destination.name.clone(),
        delay_ms: 2_000,
        body: body.as_bytes().to_vec(),
        strategy: Some(strategy.to_string()),
        ..Default::default()
    };
    let from_python = scheduler.schedule(request("python", "from python")).await.expect("the Python planner plans");
    let from_js = scheduler.schedule(request("js", "from javascript")).await.expect("the JavaScript planner plans");
    let from_rust = scheduler.schedule(request("main", "from rust")).await.expect("the built-in planner plans");
    assert_eq!((from_python.delivers_after_ms, from_js.delivers_after_ms), (2_000, 2_000), "2 s is a bucket of its own");

    let received = destination.receive(3, Duration::from_secs(10)).await;
    for (body, due) in [("from python", from_python.due_at_ms), ("from javascript", from_js.due_at_ms), ("from rust", from_rust.due_at_ms)] {
        let got = received.iter().find(|r| r.delivery.data == body.as_bytes()).unwrap_or_else(|| panic!("{body} did not arrive"));
        let late = got.at_ms as i64 - due as i64;
        eprintln!("{body}: {late} ms late");
        assert!((0..=ON_TIME_MS as i64).contains(&late), "{body} arrived {late} ms after its due time (window 0..{ON_TIME_MS})");
    }
}

/// `hourglass new-planner` in each language: the project it writes passes its
/// own test, builds with its `./build` and passes `check-planner` as generated.
// One test per language, so the three builds (the slowest part of the suite) run side by side.
#[test]
fn a_new_rust_planner_project_builds_and_passes_check_planner() {
    new_planner_project_builds_and_passes_check_planner("rust", &["cargo", "test", "--quiet"], &[]);
}

#[test]
fn a_new_python_planner_project_builds_and_passes_check_planner() {
    new_planner_project_builds_and_passes_check_planner("python", &["python3", "-m", "unittest"], &["--memory-limit-mib", "64", "--start-timeout", "10s"]);
}

#[test]
fn a_new_javascript_planner_project_builds_and_passes_check_planner() {
    new_planner_project_builds_and_passes_check_planner("js", &["node", "--test"], &["--start-timeout", "10s"]);
}

/// `hourglass new-planner --lang <language>`, then the project's own test (`test`),
/// its build script, and `check-planner` with the flags its README gives.
fn new_planner_project_builds_and_passes_check_planner(language: &str, test: &[&str], check_flags: &[&str]) {
    let project = std::env::temp_dir().join(unique("new-planner")).join(language);
    let run = |program: &std::path::Path, args: &[&str]| {
        let mut command = std::process::Command::new(program);
        command.args(args).current_dir(&project);
        // The Rust project builds where reruns find it, and with the
        // workspace's lock so it resolves to versions already downloaded.
        command.env("CARGO_TARGET_DIR", repo_root().join("target/new-planner"));
        let output = command.output().unwrap_or_else(|e| panic!("{language}: {}: {e}", program.display()));
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "{language}: {} {args:?} failed:\n{text}", program.display());
        text
    };
    let created = std::process::Command::new(hourglass_binary())
        .args(["new-planner", "my-steps", "--lang", language, "--dir", project.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(created.status.success(), "{language}: {}", String::from_utf8_lossy(&created.stderr));
    if language == "rust" {
        std::fs::copy(repo_root().join("Cargo.lock"), project.join("Cargo.lock")).unwrap();
    }
    run(std::path::Path::new(test[0]), &test[1..]);
    run(&project.join("build"), &[]);
    let wasm = project.join("planner.wasm");
    let config = project.join("planner.toml");
    let mut args = vec!["check-planner", wasm.to_str().unwrap(), "--planner-config", config.to_str().unwrap()];
    args.extend(check_flags);
    let checked = run(&hourglass_binary(), &args);
    assert!(checked.contains(&format!("planner {}: all", wasm.display())) && checked.contains("delivered as promised"), "{language}: {checked}");
    std::fs::remove_dir_all(project.parent().unwrap()).ok();
}
