//! A released WIT version is frozen: changing it would silently break every plugin built
//! against it. Grow the contract in a new folder (wit/v0.2.0/) instead; see wit/README.md.

use crate::common::root;

/// blake3 of wit/v0.1.0/policy.wit as released.
const V0_1_0: &str = "a51efbe37051bafde88a727a09e681d5f0af67261c37ed7006d2622521e9799b";

/// blake3 of wit/v0.2.0/policy.wit as released (0.1.0 plus the codec interface).
const V0_2_0: &str = "1ffdf89111e3736419512e5e437008608f75eba58f3e298b510c01d98dd1ceee";

/// blake3 of wit/v0.3.0/policy.wit as released (0.2.0 plus layer-rate and state, and the
/// label-smoothing world without codec).
const V0_3_0: &str = "6e21bf65c38a92bcf12657dc6804023457b207e766c63cf57593fbff89afae54";

/// blake3 of wit/v0.4.0/policy.wit as released (0.3.0 plus the schedule's momentum and codec
/// state across steps).
const V0_4_0: &str = "229d39ea46f2d7ad7cf554e997effb85a77f08cae82098db2e4248b66e74783c";

/// blake3 of wit/v0.5.0/policy.wit as released (0.4.0 plus the sync kind: `plan`,
/// `outer-step` and the sync worlds).
const V0_5_0: &str = "407d0a20f8af0e8e146f07f86a6f73f08e2fd49b03e1196741aef6f50badcc62";

#[test]
fn wit_v0_5_0_is_frozen() {
    let text = std::fs::read(root().join("wit/v0.5.0/policy.wit")).unwrap();
    assert_eq!(
        blake3::hash(&text).to_hex().as_str(),
        V0_5_0,
        "wit/v0.5.0 is released and frozen; put changes in a new version folder"
    );
}

#[test]
fn wit_v0_4_0_is_frozen() {
    let text = std::fs::read(root().join("wit/v0.4.0/policy.wit")).unwrap();
    assert_eq!(
        blake3::hash(&text).to_hex().as_str(),
        V0_4_0,
        "wit/v0.4.0 is released and frozen; put changes in a new version folder"
    );
}

#[test]
fn wit_v0_3_0_is_frozen() {
    let text = std::fs::read(root().join("wit/v0.3.0/policy.wit")).unwrap();
    assert_eq!(
        blake3::hash(&text).to_hex().as_str(),
        V0_3_0,
        "wit/v0.3.0 is released and frozen; put changes in a new version folder"
    );
}

#[test]
fn wit_v0_2_0_is_frozen() {
    let text = std::fs::read(root().join("wit/v0.2.0/policy.wit")).unwrap();
    assert_eq!(
        blake3::hash(&text).to_hex().as_str(),
        V0_2_0,
        "wit/v0.2.0 is released and frozen; put changes in a new version folder"
    );
}

#[test]
fn wit_v0_1_0_is_frozen() {
    let text = std::fs::read(root().join("wit/v0.1.0/policy.wit")).unwrap();
    assert_eq!(
        blake3::hash(&text).to_hex().as_str(),
        V0_1_0,
        "wit/v0.1.0 is released and frozen; put changes in a new version folder"
    );
}
