//! What each world of each contract version exports, read from the WIT with `wit-parser` (the
//! parser wasmtime's `bindgen!` uses) and compared with the table below. A world that gains or
//! loses an export, a new world or a new `wit/v*/` folder fails here until the table says so:
//! the table is the reviewed list of what a plugin of each world must export.

use std::path::Path;

use wit_parser::{Resolve, WorldItem, WorldKey};

use crate::common::root;

/// A world and the interfaces it exports, in the order the WIT lists them.
type World = (&'static str, &'static [&'static str]);

/// Every version folder of `wit/`, with every world of its package.
const VERSIONS: &[(&str, &[World])] = &[
    (
        "v0.1.0",
        &[
            ("schedule-plugin", &["plugin", "schedule"]),
            ("batch-size-plugin", &["plugin", "batch-size"]),
            ("label-smoothing-plugin", &["plugin", "label-smoothing"]),
            (
                "host-view",
                &["plugin", "schedule", "batch-size", "label-smoothing"],
            ),
        ],
    ),
    (
        "v0.2.0",
        &[
            ("schedule-plugin", &["plugin", "schedule"]),
            ("batch-size-plugin", &["plugin", "batch-size"]),
            // The frozen mistake (wit/README.md, "Mistakes in released versions"): `codec` does
            // not belong here. The host loads such a component as a label-smoothing plugin and
            // never calls its codec; 0.3.0 fixes the world.
            (
                "label-smoothing-plugin",
                &["plugin", "label-smoothing", "codec"],
            ),
            ("codec-plugin", &["plugin", "codec"]),
            (
                "host-view",
                &[
                    "plugin",
                    "schedule",
                    "batch-size",
                    "label-smoothing",
                    "codec",
                ],
            ),
        ],
    ),
    (
        "v0.3.0",
        &[
            ("schedule-plugin", &["plugin", "schedule"]),
            ("stateful-schedule-plugin", &["plugin", "schedule", "state"]),
            ("batch-size-plugin", &["plugin", "batch-size"]),
            (
                "stateful-batch-size-plugin",
                &["plugin", "batch-size", "state"],
            ),
            ("label-smoothing-plugin", &["plugin", "label-smoothing"]),
            (
                "stateful-label-smoothing-plugin",
                &["plugin", "label-smoothing", "state"],
            ),
            ("codec-plugin", &["plugin", "codec"]),
            ("layer-rate-plugin", &["plugin", "layer-rate"]),
            (
                "stateful-layer-rate-plugin",
                &["plugin", "layer-rate", "state"],
            ),
            (
                "host-view",
                &[
                    "plugin",
                    "schedule",
                    "batch-size",
                    "label-smoothing",
                    "codec",
                    "layer-rate",
                    "state",
                ],
            ),
        ],
    ),
    // 0.4.0: 0.3.0's worlds; its `schedule` interface gains `momentum`.
    (
        "v0.4.0",
        &[
            ("schedule-plugin", &["plugin", "schedule"]),
            ("stateful-schedule-plugin", &["plugin", "schedule", "state"]),
            ("batch-size-plugin", &["plugin", "batch-size"]),
            (
                "stateful-batch-size-plugin",
                &["plugin", "batch-size", "state"],
            ),
            ("label-smoothing-plugin", &["plugin", "label-smoothing"]),
            (
                "stateful-label-smoothing-plugin",
                &["plugin", "label-smoothing", "state"],
            ),
            ("codec-plugin", &["plugin", "codec"]),
            ("layer-rate-plugin", &["plugin", "layer-rate"]),
            (
                "stateful-layer-rate-plugin",
                &["plugin", "layer-rate", "state"],
            ),
            (
                "host-view",
                &[
                    "plugin",
                    "schedule",
                    "batch-size",
                    "label-smoothing",
                    "codec",
                    "layer-rate",
                    "state",
                ],
            ),
        ],
    ),
    // 0.5.0: 0.4.0's worlds plus the `sync` kind and its two worlds.
    (
        "v0.5.0",
        &[
            ("schedule-plugin", &["plugin", "schedule"]),
            ("stateful-schedule-plugin", &["plugin", "schedule", "state"]),
            ("batch-size-plugin", &["plugin", "batch-size"]),
            (
                "stateful-batch-size-plugin",
                &["plugin", "batch-size", "state"],
            ),
            ("label-smoothing-plugin", &["plugin", "label-smoothing"]),
            (
                "stateful-label-smoothing-plugin",
                &["plugin", "label-smoothing", "state"],
            ),
            ("codec-plugin", &["plugin", "codec"]),
            ("layer-rate-plugin", &["plugin", "layer-rate"]),
            (
                "stateful-layer-rate-plugin",
                &["plugin", "layer-rate", "state"],
            ),
            ("sync-plugin", &["plugin", "sync"]),
            ("stateful-sync-plugin", &["plugin", "sync", "state"]),
            (
                "host-view",
                &[
                    "plugin",
                    "schedule",
                    "batch-size",
                    "label-smoothing",
                    "codec",
                    "layer-rate",
                    "sync",
                    "state",
                ],
            ),
        ],
    ),
];

/// The version folders under `wit/`, sorted.
fn version_folders() -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(root().join("wit"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| n.starts_with('v'))
        .collect();
    found.sort();
    found
}

/// One world as parsed: its exports and imports as interface names (no package or version;
/// anything else as `func NAME`, `type NAME` or `interface NAME`).
struct Parsed {
    name: String,
    exports: Vec<String>,
    /// Imports other than the package's own types-only `types` interface.
    imports: Vec<String>,
}

/// The package in `dir` and its worlds.
fn worlds_of(dir: &Path) -> (String, Vec<Parsed>) {
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve
        .push_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()));
    let name = |key: &WorldKey, item: &WorldItem| match item {
        WorldItem::Interface { id, .. } => resolve.interfaces[*id]
            .name
            .clone()
            .unwrap_or_else(|| format!("interface {}", resolve.name_world_key(key))),
        WorldItem::Function(f) => format!("func {}", f.name),
        WorldItem::Type { .. } => format!("type {}", resolve.name_world_key(key)),
    };
    let package = resolve.packages[pkg].name.to_string();
    let worlds = resolve.packages[pkg]
        .worlds
        .values()
        .map(|&w| {
            let world = &resolve.worlds[w];
            let exports = world.exports.iter().map(|(k, i)| name(k, i)).collect();
            // `wit-parser` adds an import of the interface whose types the exports `use`: the
            // package's own `types`, which has no functions, so the host provides nothing for
            // it. Any other import would be something the host must provide.
            let imports = world
                .imports
                .iter()
                .filter(|(_, item)| match item {
                    WorldItem::Interface { id, .. } => {
                        let i = &resolve.interfaces[*id];
                        !(i.name.as_deref() == Some("types")
                            && i.package == Some(pkg)
                            && i.functions.is_empty())
                    }
                    _ => true,
                })
                .map(|(k, i)| name(k, i))
                .collect();
            Parsed {
                name: world.name.clone(),
                exports,
                imports,
            }
        })
        .collect();
    (package, worlds)
}

#[test]
fn every_version_folder_is_in_the_table() {
    let listed: Vec<&str> = VERSIONS.iter().map(|(v, _)| *v).collect();
    for folder in version_folders() {
        assert!(
            listed.contains(&folder.as_str()),
            "wit/{folder}/ is not in tests/all/worlds.rs: add it to VERSIONS with every world \
             it defines and the interfaces each exports"
        );
    }
    for v in listed {
        assert!(
            root().join("wit").join(v).is_dir(),
            "VERSIONS lists {v}, but there is no wit/{v}/"
        );
    }
}

#[test]
fn every_world_exports_what_the_table_says_and_imports_nothing() {
    for folder in version_folders() {
        let Some((_, table)) = VERSIONS.iter().find(|(v, _)| *v == folder) else {
            continue; // every_version_folder_is_in_the_table reports it
        };
        let (package, worlds) = worlds_of(&root().join("wit").join(&folder));
        assert_eq!(
            package,
            format!("lsgd:policy@{}", &folder[1..]),
            "wit/{folder}/ declares another package"
        );
        for Parsed {
            name: world,
            exports,
            imports,
        } in &worlds
        {
            let Some((_, expected)) = table.iter().find(|(w, _)| w == world) else {
                panic!(
                    "wit/{folder}/ defines world `{world}` (exports {exports:?}), which is not in \
                     tests/all/worlds.rs: add it to the table of {folder}"
                );
            };
            assert_eq!(
                exports, expected,
                "wit/{folder}/ world `{world}`: exports differ from the table in tests/all/worlds.rs"
            );
            assert!(
                imports.is_empty(),
                "wit/{folder}/ world `{world}` imports {imports:?}: a world imports nothing but `types`"
            );
        }
        for (world, _) in *table {
            assert!(
                worlds.iter().any(|w| w.name == *world),
                "tests/all/worlds.rs lists world `{world}` for {folder}, but wit/{folder}/ does not \
                 define it"
            );
        }
    }
}
