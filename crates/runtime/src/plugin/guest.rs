//! What a guest said before it failed, in its own terms: its stderr read as a Python traceback,
//! a Rust panic or plain lines (C, Go, JavaScript), so that a fault leads with the exception or
//! panic message the plugin's author wrote, and the wasm backtrace comes after it.

/// A guest's account of its failure, read from its stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestReport {
    /// The line that says what went wrong: `ValueError: warmup_epochs must be > 0`, a Rust
    /// panic's message with its location, `panic: …` from Go.
    pub headline: String,
    /// What explains it: the traceback of the plugin's own source, the rest of the message.
    pub details: Vec<String>,
}

/// The most lines of plain stderr kept under the headline.
const MAX_DETAIL_LINES: usize = 40;

/// Reads `stderr` as a Python traceback, a Rust panic or plain lines; `None` when the guest
/// wrote nothing but blanks.
pub fn report(stderr: &str) -> Option<GuestReport> {
    if stderr.trim().is_empty() {
        return None;
    }
    python(stderr)
        .or_else(|| javascript(stderr))
        .or_else(|| rust_panic(stderr))
        .or_else(|| Some(plain(stderr)))
}

/// The last traceback CPython printed: its exception line(s) are the headline, its frames the
/// details. componentize-py's own panic after it ("Python function threw …") is dropped.
fn python(stderr: &str) -> Option<GuestReport> {
    const START: &str = "Traceback (most recent call last):";
    let at = stderr.rfind(START)?;
    let mut lines = stderr[at + START.len()..].lines().skip(1).peekable();
    let mut frames = Vec::new();
    while let Some(line) = lines.next_if(|l| l.starts_with(' ') || l.is_empty()) {
        if !line.is_empty() {
            frames.push(line.trim_end().to_string());
        }
    }
    let message: Vec<&str> = lines
        .take_while(|l| !l.starts_with("thread '") && !l.trim().is_empty())
        .collect();
    let (first, rest) = message.split_first()?;
    let mut details = vec!["Traceback (most recent call last):".to_string()];
    details.extend(frames);
    details.extend(rest.iter().map(|l| l.trim_end().to_string()));
    Some(GuestReport {
        headline: first.trim().to_string(),
        details,
    })
}

/// An exception that escaped a componentize-qjs (QuickJS) export, which its runtime reports as a
/// Rust panic: `Failed to call 'learningRate': Exception(Exception { message: Some("…"), stack:
/// Some("    at learningRate (/plugin.js:12:5)\n") })`. The message leads, naming the function;
/// the stack's lines follow.
fn javascript(stderr: &str) -> Option<GuestReport> {
    const CALL: &str = "Failed to call '";
    let at = stderr.find(CALL)?;
    let rest = &stderr[at + CALL.len()..];
    let (function, rest) = rest.split_once("': Exception(Exception { message: ")?;
    let (message, rest) = debug_option_str(rest)?;
    let rest = rest.strip_prefix(", stack: ")?;
    let (stack, _) = debug_option_str(rest)?;
    let message = message.unwrap_or_else(|| "(no message)".into());
    Some(GuestReport {
        headline: format!("{message} (thrown in {function})"),
        details: stack
            .unwrap_or_default()
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("  {}", l.trim_start()))
            .collect(),
    })
}

/// Reads a Rust `Debug` rendering of an `Option<String>` (`None` or `Some("…")` with its
/// escapes) from the start of `text`; returns it and the text after it.
fn debug_option_str(text: &str) -> Option<(Option<String>, &str)> {
    if let Some(rest) = text.strip_prefix("None") {
        return Some((None, rest));
    }
    let body = text.strip_prefix("Some(\"")?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                return body[i + 1..]
                    .strip_prefix(')')
                    .map(|rest| (Some(out), rest));
            }
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                'u' => {
                    let hex: String = chars
                        .by_ref()
                        .map(|(_, c)| c)
                        .skip_while(|c| *c == '{')
                        .take_while(|c| *c != '}')
                        .collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// A Rust panic, `thread '…' panicked at LOCATION:` and the message on the lines after it (or
/// the pre-1.73 form `panicked at 'MESSAGE', LOCATION`): the message, then where.
fn rust_panic(stderr: &str) -> Option<GuestReport> {
    let lines: Vec<&str> = stderr.lines().collect();
    let i = lines.iter().position(|l| l.contains(" panicked at "))?;
    let after = &lines[i][lines[i].find(" panicked at ")? + " panicked at ".len()..];
    if let Some(old) = after.strip_prefix('\'') {
        let (message, location) = old.rsplit_once("', ")?;
        return Some(GuestReport {
            headline: format!("{message} (panicked at {location})"),
            details: Vec::new(),
        });
    }
    let location = after.strip_suffix(':').unwrap_or(after);
    let message: Vec<&str> = lines[i + 1..]
        .iter()
        .copied()
        .take_while(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let (first, rest) = match message.split_first() {
        Some((first, rest)) => (first.trim(), rest),
        None => ("(no message)", &[][..]),
    };
    Some(GuestReport {
        headline: format!("{first} (panicked at {location})"),
        details: rest
            .iter()
            .map(|l| l.trim_end().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    })
}

/// Anything else: the first non-blank line, then the rest (at most [`MAX_DETAIL_LINES`], the
/// last ones, where a runtime's final words are).
fn plain(stderr: &str) -> GuestReport {
    let mut lines = stderr
        .lines()
        .map(str::trim_end)
        .skip_while(|l| l.trim().is_empty());
    let headline = lines.next().unwrap_or_default().trim().to_string();
    let mut details: Vec<String> = lines.map(str::to_string).collect();
    while details.last().is_some_and(|l| l.trim().is_empty()) {
        details.pop();
    }
    if details.len() > MAX_DETAIL_LINES {
        let cut = details.len() - MAX_DETAIL_LINES;
        details.drain(..cut);
        details.insert(0, format!("… ({cut} earlier lines left out)"));
    }
    GuestReport { headline, details }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_traceback_leads_with_its_exception_and_keeps_its_frames() {
        let stderr = "Traceback (most recent call last):\n  File \"/p/app.py\", line 61, in \
                      learning_rate\n    raise ValueError(f\"bad epoch {e}\")\nValueError: bad \
                      epoch 3.5\nthread '<unnamed>' panicked at src/lib.rs:1:1:\nPython \
                      function threw an unexpected exception\n";
        let r = report(stderr).unwrap();
        assert_eq!(r.headline, "ValueError: bad epoch 3.5");
        assert_eq!(
            r.details,
            [
                "Traceback (most recent call last):",
                "  File \"/p/app.py\", line 61, in learning_rate",
                "    raise ValueError(f\"bad epoch {e}\")",
            ]
        );
    }

    #[test]
    fn a_rust_panic_leads_with_its_message_then_where() {
        let stderr = "\nthread '<unnamed>' panicked at tests/guests/bad-schedule/src/lib.rs:90:13:\n\
                      bad-schedule: trap requested\nsecond line\nnote: run with \
                      `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let r = report(stderr).unwrap();
        assert_eq!(
            r.headline,
            "bad-schedule: trap requested (panicked at tests/guests/bad-schedule/src/lib.rs:90:13)"
        );
        assert_eq!(r.details, ["second line"]);
        let old = report("thread 'main' panicked at 'boom', src/lib.rs:3:5\n").unwrap();
        assert_eq!(old.headline, "boom (panicked at src/lib.rs:3:5)");
    }

    #[test]
    fn a_javascript_exception_leads_with_its_message_and_keeps_its_stack() {
        let stderr = "\nthread '<unnamed>' panicked at crates/runtime/src/interpreter.rs:51:31:\n\
                      Failed to call 'learningRate': Exception(Exception { message: \
                      Some(\"step 3 is \\\"past\\\" the end \\u{e9}\"), stack: Some(\"    at \
                      learningRate (/js/plugin.js:56:75)\\n    at f (/js/kit.js:2:1)\\n\") })\n\
                      note: run with `RUST_BACKTRACE=1` environment variable to display a \
                      backtrace\n";
        let r = report(stderr).unwrap();
        assert_eq!(
            r.headline,
            "step 3 is \"past\" the end \u{e9} (thrown in learningRate)"
        );
        assert_eq!(
            r.details,
            [
                "  at learningRate (/js/plugin.js:56:75)",
                "  at f (/js/kit.js:2:1)"
            ]
        );
        let bare = "Failed to call 'epsilon': Exception(Exception { message: None, stack: None })";
        assert_eq!(
            report(bare).unwrap().headline,
            "(no message) (thrown in epsilon)"
        );
    }

    #[test]
    fn other_languages_lead_with_their_first_line() {
        let go = "panic: warmup: negative epoch\n\ngoroutine 1 [running]:\nmain.lr(...)\n";
        let r = report(go).unwrap();
        assert_eq!(r.headline, "panic: warmup: negative epoch");
        assert_eq!(r.details, ["", "goroutine 1 [running]:", "main.lr(...)"]);
        assert_eq!(report(" \n\n"), None);
        let long: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let r = report(&long).unwrap();
        assert_eq!(r.details.len(), MAX_DETAIL_LINES + 1);
        assert_eq!(r.details[0], "… (59 earlier lines left out)");
        assert_eq!(r.details.last().unwrap(), "line 99");
    }
}
