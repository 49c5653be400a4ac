//! A plugin that fails says why in its own language's terms, first: the Python exception with
//! the traceback of the plugin's source, the Rust panic's message, the first line a C, Go or
//! JavaScript plugin wrote to stderr; the wasm trap and its frames come after. Each plugin here
//! is a `lsgd-host new` schedule project whose policy function is made to fail from step 3 on,
//! built with its own `./build.sh` as a user builds it, and traced from the command line.

use crate::scaffold::{build_project, lsgd, new_project, text};

/// A short trace: the plugin fails at its fourth call.
const SHAPE: &[&str] = &[
    "--epochs",
    "1",
    "--steps-per-epoch",
    "6",
    "--global-batch",
    "256",
];

/// A schedule project in `lang` whose source file `file` gets `edit` applied, built.
fn failing_plugin(lang: &str, file: &str, edit: impl FnOnce(String) -> String) -> String {
    let name = format!("failing-{lang}");
    let (dir, _) = new_project(lang, "schedule", &name);
    let source = dir.join(file);
    let text = std::fs::read_to_string(&source).unwrap();
    let edited = edit(text.clone());
    assert_ne!(edited, text, "{lang}: the edit did not apply to {file}");
    std::fs::write(&source, edited).unwrap();
    build_project(lang, &dir, &name).display().to_string()
}

/// The lines of the error `lsgd-host trace` stops with for `plugin` (a failing schedule).
fn fault_lines(plugin: &str) -> Vec<String> {
    let o = lsgd(&[&["trace", "--schedule", plugin], SHAPE].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let at = err
        .find("error: ")
        .unwrap_or_else(|| panic!("no error line in\n{err}"));
    err[at + "error: ".len()..]
        .lines()
        .map(str::to_string)
        .collect()
}

/// The fault's first line is `plugin P: learning-rate at step 3: trapped: HEADLINE`, and the
/// wasm trap comes after everything the guest said.
fn assert_leads_with(lines: &[String], plugin: &str, headline: &str) {
    let all = lines.join("\n");
    assert_eq!(
        lines[0],
        format!("plugin {plugin}: learning-rate at step 3: trapped: {headline}"),
        "{all}"
    );
    let trap = lines.iter().position(|l| l.starts_with("  wasm trap: "));
    assert!(
        trap.is_some(),
        "no wasm trap line after the guest's:\n{all}"
    );
}

#[test]
fn a_python_exception_is_the_fault_with_its_traceback() {
    let plugin = failing_plugin("python", "app.py", |s| {
        s.replace(
            "        ratio = 1.0 if",
            "        if s.step >= 3:\n            raise ValueError(f\"step {s.step} is past the end\")\n        ratio = 1.0 if",
        )
    });
    let lines = fault_lines(&plugin);
    assert_leads_with(&lines, &plugin, "ValueError: step 3 is past the end");
    let all = lines.join("\n");
    assert_eq!(lines[1], "  Traceback (most recent call last):", "{all}");
    // componentize-py keeps the frames (file, line, function), not the source text.
    assert!(
        lines[2].trim_start().starts_with("File \"")
            && lines[2].contains("app.py\", line ")
            && lines[2].ends_with(", in learning_rate"),
        "the frame of the plugin's own source:\n{all}"
    );
    assert!(!all.contains("filesystem_preopens"), "{all}");
}

#[test]
fn a_rust_panic_message_is_the_first_line() {
    let plugin = failing_plugin("rust", "src/lib.rs", |s| {
        s.replace(
            "    fn learning_rate(s: TrainState) -> f64 {\n",
            "    fn learning_rate(s: TrainState) -> f64 {\n        assert!(s.step < 3, \"step {} is past the end\", s.step);\n",
        )
    });
    let lines = fault_lines(&plugin);
    let first = &lines[0];
    let want = format!(
        "plugin {plugin}: learning-rate at step 3: trapped: step 3 is past the end (panicked at src/lib.rs:"
    );
    assert!(first.starts_with(&want), "{}", lines.join("\n"));
    assert!(lines.iter().any(|l| l.starts_with("  wasm trap: ")));
}

#[test]
fn a_c_plugins_stderr_is_the_fault() {
    let plugin = failing_plugin("c", "plugin.c", |s| {
        s.replace("#include \"lsgd_kit.h\"\n", "#include \"lsgd_kit.h\"\n#include <stdio.h>\n#include <stdlib.h>\n")
            .replace(
                "  double ratio = s->reference_batch",
                "  if (s->step >= 3) {\n    fprintf(stderr, \"step %llu is past the end\\n\", (unsigned long long)s->step);\n    abort();\n  }\n  double ratio = s->reference_batch",
            )
    });
    assert_leads_with(&fault_lines(&plugin), &plugin, "step 3 is past the end");
}

#[test]
fn a_go_panic_is_the_fault_with_its_stack() {
    let plugin = failing_plugin("go", "plugin.go", |s| {
        s.replace(
            "func learningRate(s *State) float64 {\n",
            "func learningRate(s *State) float64 {\n\tif s.Step >= 3 {\n\t\tpanic(\"step 3 is past the end\")\n\t}\n",
        )
    });
    let lines = fault_lines(&plugin);
    assert_leads_with(&lines, &plugin, "panic: step 3 is past the end");
    let all = lines.join("\n");
    assert!(all.contains("goroutine "), "{all}");
    assert!(all.contains("learningRate"), "{all}");
}

#[test]
fn a_javascript_error_is_the_fault() {
    let plugin = failing_plugin("js", "plugin.js", |s| {
        s.replace(
            "  learningRate(s) {\n",
            "  learningRate(s) {\n    if (s.step >= 3n) throw new RangeError(`step ${s.step} is past the end`);\n",
        )
    });
    let lines = fault_lines(&plugin);
    assert_leads_with(
        &lines,
        &plugin,
        "step 3 is past the end (thrown in learningRate)",
    );
    assert!(
        lines[1].starts_with("    at learningRate (") && lines[1].contains("plugin.js:"),
        "{}",
        lines.join("\n")
    );
}
