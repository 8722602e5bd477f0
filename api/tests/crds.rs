//! `deploy/crds/` is exactly what the types generate (controller-rs's crdgen check): edit
//! the types, then regenerate with `TIDEPOOL_UPDATE_CRDS=1 cargo test -p tidepool-api`.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::path::PathBuf;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

#[test]
fn deploy_crds_match_the_types() {
    let update = std::env::var_os("TIDEPOOL_UPDATE_CRDS").is_some();
    let mut drifted = Vec::new();
    for (crd, file) in tidepool_api::crds().iter().zip(tidepool_api::CRD_FILES) {
        let path = crds_dir().join(file);
        let want = tidepool_api::crd_yaml(crd);
        if update {
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            drifted.push(path.display().to_string());
        }
    }
    assert!(
        drifted.is_empty(),
        "{drifted:?} differ from the types; regenerate with \
         `TIDEPOOL_UPDATE_CRDS=1 cargo test -p tidepool-api` and review the diff"
    );
}

#[test]
fn the_kustomization_lists_every_crd() {
    let k = std::fs::read_to_string(crds_dir().join("Kustomization")).unwrap();
    for file in tidepool_api::CRD_FILES {
        assert!(k.contains(&format!("- {file}")), "{file} missing from {k}");
    }
}

/// The schema carries what the engine relies on the server for.
#[test]
fn the_schemas_declare_formats_maps_and_subresources() {
    let yaml = tidepool_api::crds_yaml();
    for needle in [
        "format: cidr",
        "x-kubernetes-map-type: granular",
        "x-kubernetes-list-type: map",
        "jsonPath: .spec.nodeUID",
        "- marked-for-release",
        "- ready-for-release",
        "- sandbox-replaced",
        "- stale",
    ] {
        assert!(yaml.contains(needle), "{needle} missing");
    }
    for crd in tidepool_api::crds() {
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
        assert_eq!(crd.spec.scope, "Cluster");
        assert!(v.served && v.storage);
    }
}
