//! The compiled-component cache: a second load is a deserialisation, a damaged entry is
//! recompiled, and no cache at all still works; codecs and policies are compiled by engines
//! that differ in NaN canonicalisation, each with its own cache entries.

use lsgd_host::plugin::{Cache, EngineOptions, Limits, Origin, Runtime};

use crate::common::*;

#[test]
fn second_load_comes_from_the_cache() {
    let dir = scratch("cache-hit");
    let rt = Runtime::new(Cache::new(Some(dir.clone())), Limits::default()).unwrap();
    let first = rt.load(&plugin_path("cosine"), None).unwrap();
    assert!(matches!(first.facts().origin, Origin::Compiled(_)));
    let second = rt.load(&plugin_path("cosine"), None).unwrap();
    assert!(matches!(second.facts().origin, Origin::Cached(_)));
    assert_eq!(entries(&dir).len(), 1);
    // Beside the entry, how long it took to compile, for `inspect`.
    let recorded = rt
        .cache()
        .compile_time(rt.engine(), &std::fs::read(plugin_path("cosine")).unwrap());
    let Origin::Compiled(took) = first.facts().origin else {
        unreachable!("checked above")
    };
    let recorded = recorded.expect("the compile time is kept beside the entry");
    assert!(
        (recorded.as_secs_f64() - took.as_secs_f64()).abs() < 1e-6,
        "{recorded:?} {took:?}"
    );
}

/// The compiled components in a cache directory (not the compile times beside them).
fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect()
}

#[test]
fn damaged_entry_is_recompiled() {
    let dir = scratch("cache-damaged");
    let rt = Runtime::new(Cache::new(Some(dir.clone())), Limits::default()).unwrap();
    rt.load(&plugin_path("poly"), None).unwrap();
    let entry = entries(&dir).pop().unwrap();
    std::fs::write(&entry, b"garbage").unwrap();
    let p = rt.load(&plugin_path("poly"), None).unwrap();
    assert!(matches!(p.facts().origin, Origin::Compiled(_)));
    // ... and the entry is good again.
    let p = rt.load(&plugin_path("poly"), None).unwrap();
    assert!(matches!(p.facts().origin, Origin::Cached(_)));
}

#[test]
fn no_cache_compiles_every_time() {
    let rt = Runtime::new(Cache::new(None), Limits::default()).unwrap();
    for _ in 0..2 {
        let p = rt.load(&plugin_path("constant"), None).unwrap();
        assert!(matches!(p.facts().origin, Origin::Compiled(_)));
    }
}

#[test]
fn codecs_compile_without_canonical_nans_unless_asked() {
    let dir = scratch("cache-nans");
    let rt = Runtime::new(Cache::new(Some(dir.clone())), Limits::default()).unwrap();
    let codec = rt.load(&plugin_path("codec-int8"), None).unwrap();
    assert!(!codec.facts().canonical_nans);
    // A codec in C (another toolchain, another component layout) is recognised the same way.
    assert!(
        !rt.load(&plugin_path("codec-int8-c"), None)
            .unwrap()
            .facts()
            .canonical_nans
    );
    for policy in ["warmup", "lars", "warmup-c"] {
        let p = rt.load(&plugin_path(policy), None).unwrap();
        assert!(p.facts().canonical_nans, "{policy}");
    }
    let canonical = Runtime::with_options(
        Cache::new(Some(dir.clone())),
        Limits::default(),
        EngineOptions {
            canonical_codec_nans: true,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let codec = canonical.load(&plugin_path("codec-int8"), None).unwrap();
    assert!(codec.facts().canonical_nans);
    // Compiled again, not the other engine's code from the cache.
    assert!(matches!(codec.facts().origin, Origin::Compiled(_)));
    assert!(matches!(
        canonical
            .load(&plugin_path("warmup"), None)
            .unwrap()
            .facts()
            .origin,
        Origin::Cached(_)
    ));
}
